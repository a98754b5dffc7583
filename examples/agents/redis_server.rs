//! The Redis a `--fleet` run shares: `--redis HOST:PORT`, `--redis-cluster HOST:PORT[,...]` (a
//! Redis Cluster's seed nodes), or a private `redis-server` the parent starts on a free loopback
//! port (`admission_testkit::redis_servers::PrivateServer`: under a watchdog, so that it dies with the
//! parent however the parent dies, and its directory with it) and stops at the end, and for
//! `--chaos` kills and starts again (then with an append-only file, fsynced every second or
//! before each reply) or pauses (the private clusters of `--chaos kill-master` and `failover` are
//! `admission_testkit::redis_servers`'s too); and the count of script calls (`INFO commandstats`, on a
//! cluster summed over its masters), from which the round trips per admitted lease are read.

use std::fmt;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use admission_testkit::redis_servers;
use anyhow::{Context as _, bail};

/// Where the fleet's Redis listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl FromStr for Endpoint {
    type Err = String;

    /// `HOST:PORT`, also written `redis://HOST:PORT/`.
    fn from_str(text: &str) -> Result<Endpoint, String> {
        let rest = text.trim();
        let rest = rest.strip_prefix("redis://").unwrap_or(rest);
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let Some((host, port)) = rest.rsplit_once(':') else {
            return Err(format!("{text:?} is not HOST:PORT"));
        };
        if host.is_empty() || host.contains(['/', '@']) {
            return Err(format!(
                "{text:?}: the host is empty or not a plain host name"
            ));
        }
        match port.parse::<u16>() {
            Ok(port) if port != 0 => Ok(Endpoint {
                host: host.to_owned(),
                port,
            }),
            _ => Err(format!(
                "{text:?}: the port is not a number from 1 to 65535"
            )),
        }
    }
}

/// A Redis Cluster's seed nodes, as `--redis-cluster` spells them: `HOST:PORT[,HOST:PORT...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNodes(pub Vec<Endpoint>);

impl fmt::Display for ClusterNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, node) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            write!(f, "{node}")?;
        }
        Ok(())
    }
}

impl FromStr for ClusterNodes {
    type Err = String;

    /// One or more `HOST:PORT`, comma separated (each also `redis://HOST:PORT/`); a node named
    /// twice counts once.
    fn from_str(text: &str) -> Result<ClusterNodes, String> {
        let mut nodes: Vec<Endpoint> = Vec::new();
        for part in text.split(',') {
            if part.trim().is_empty() {
                return Err(format!(
                    "{text:?}: an empty node; write HOST:PORT[,HOST:PORT...]"
                ));
            }
            let node: Endpoint = part.parse()?;
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        Ok(ClusterNodes(nodes))
    }
}

/// Where a fleet's cells live: one server, or a Redis Cluster (its seed nodes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetRedis {
    /// One server.
    Server(Endpoint),
    /// A Redis Cluster: the cluster client routes each cell's calls to the master of its slot.
    Cluster(ClusterNodes),
}

impl fmt::Display for FleetRedis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FleetRedis::Server(endpoint) => write!(f, "{endpoint}"),
            FleetRedis::Cluster(nodes) => write!(f, "the cluster of {nodes}"),
        }
    }
}

/// What to say when the fleet needs a Redis and none is there.
pub const INSTALL_HINT: &str = "--fleet needs Redis (7 or later): install redis-server \
     (`apt-get install redis-server`, or your platform's package) so that it is on PATH, \
     or pass --redis HOST:PORT (--redis-cluster HOST:PORT[,...]) to use a server (a cluster) \
     that is already running";

/// What a private server keeps on disk, which decides what a restart finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing (`--save '' --appendonly no`): a restart finds an empty server.
    None,
    /// An append-only file written before each reply and fsynced once a second (`--appendonly
    /// yes --appendfsync everysec`): a SIGKILLed process loses nothing it acknowledged (the page
    /// cache survives it), but the server promises nothing of the last second.
    EverySecond,
    /// An append-only file fsynced before each reply (`--appendonly yes --appendfsync always`):
    /// a restart loses nothing acknowledged, which the cells may be told
    /// (`Durability::fsync_always`).
    Always,
}

impl Persistence {
    /// The server's arguments for it.
    fn args(self) -> &'static [&'static str] {
        match self {
            Persistence::None => &["--save", "", "--appendonly", "no"],
            Persistence::EverySecond => &[
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
            ],
            Persistence::Always => &[
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
        }
    }
}

/// A `redis-server` of this run's own (`admission_testkit::redis_servers::PrivateServer`), in a
/// temporary directory of its own: stopped when dropped, and, through its watchdog, when this
/// process dies however it dies (SIGKILL included), its directory removed with it. It runs in a
/// process group of its own, so that a Ctrl-C at the terminal reaches the fleet's processes,
/// which stop and give their leases back to it, and not the server itself.
pub struct PrivateRedis {
    server: redis_servers::PrivateServer,
    /// Where it listens.
    pub endpoint: Endpoint,
}

/// `redis-server` on PATH, if any.
pub fn find_binary() -> Option<PathBuf> {
    redis_servers::redis_server_on_path()
}

impl PrivateRedis {
    /// Starts `binary` on a free loopback port, keeping what `persistence` says, and waits until
    /// it says it is ready.
    ///
    /// # Errors
    ///
    /// When it cannot be started or exits before it is ready.
    pub fn start(binary: &Path, persistence: Persistence) -> anyhow::Result<PrivateRedis> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for redis-server")?
            .port();
        let server = redis_servers::PrivateServer::start(binary, port, persistence.args())
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(PrivateRedis {
            server,
            endpoint: Endpoint {
                host: "127.0.0.1".to_owned(),
                port,
            },
        })
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// Kills the server with SIGKILL, as a crash would, and waits for it to be gone.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Starts the server again on its port and directory (after [`PrivateRedis::kill`]) and
    /// waits until it is ready; with an append-only file it loads it first.
    ///
    /// # Errors
    ///
    /// As for [`PrivateRedis::start`].
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.server.restart().context("starting redis-server again")
    }
}

/// `CLIENT PAUSE` for `pause` on the server at `endpoint`: no client's command runs until it
/// ends (the pause begins when the server runs the command).
///
/// # Errors
///
/// When the server cannot be reached or refuses the command.
pub async fn pause_clients(endpoint: &Endpoint, pause: Duration) -> anyhow::Result<()> {
    let mut conn = connect(endpoint).await?;
    let millis = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(millis)
        .query_async(&mut conn)
        .await
        .with_context(|| format!("CLIENT PAUSE {millis} on {endpoint}"))?;
    Ok(())
}

/// A fresh connection to `endpoint`.
async fn connect(endpoint: &Endpoint) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://{endpoint}/"))
        .with_context(|| format!("a client of {endpoint}"))?;
    client
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("connecting to {endpoint}"))
}

/// The count of script calls, and which run of the server (of each master) counted them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptCalls {
    /// The server's `run_id` (on a cluster, its masters', sorted and comma separated): a new one
    /// after every restart or failover, whose counters start again at 0.
    pub run_id: String,
    /// Script calls (`FCALL`, `EVALSHA` and `EVAL`) since the server started (on a cluster,
    /// summed over its masters).
    pub calls: u64,
    /// Whether it was read from a cluster's masters.
    pub cluster: bool,
}

impl ScriptCalls {
    /// The reading of a cluster: each master's `(run_id, calls)`, in any order.
    pub fn of_masters(masters: impl IntoIterator<Item = (String, u64)>) -> ScriptCalls {
        let (mut run_ids, mut calls) = (Vec::new(), 0u64);
        for (run_id, n) in masters {
            run_ids.push(run_id);
            calls = calls.saturating_add(n);
        }
        run_ids.sort_unstable();
        ScriptCalls {
            run_id: run_ids.join(","),
            calls,
            cluster: true,
        }
    }

    /// The calls made from `earlier` to `self`; an error saying why when they cannot be told
    /// (the server restarted between the two readings, or a master of the cluster changed, and
    /// its counters with it).
    pub fn since(&self, earlier: &ScriptCalls) -> Result<u64, String> {
        if self.run_id == earlier.run_id {
            Ok(self.calls.saturating_sub(earlier.calls))
        } else if self.cluster || earlier.cluster {
            Err(
                "not counted: a master of the cluster changed during the run (a failover), and the counters with it"
                    .to_owned(),
            )
        } else {
            Err(
                "not counted: the server restarted during the run, and its counters with it"
                    .to_owned(),
            )
        }
    }
}

/// Script calls Redis has run (`FCALL`, `EVALSHA` and `EVAL`), from `INFO commandstats`, with
/// the `run_id` (`INFO server`) of the run that counted them: one server's, or the sum over the
/// masters that serve a cluster's slots (as the first seed node that answers lists them; a
/// replica's counters are left out, it runs no script of a client).
///
/// # Errors
///
/// When the server, the cluster or one of its masters cannot be reached.
pub async fn script_calls(redis: &FleetRedis) -> anyhow::Result<ScriptCalls> {
    match redis {
        FleetRedis::Server(endpoint) => {
            let (run_id, calls) = node_script_calls(endpoint).await?;
            Ok(ScriptCalls {
                run_id,
                calls,
                cluster: false,
            })
        }
        FleetRedis::Cluster(seeds) => {
            let text = cluster_nodes(seeds).await?;
            let nodes = redis_servers::parse_nodes(&text);
            let masters = redis_servers::serving_masters(&nodes);
            if masters.is_empty() {
                bail!("CLUSTER NODES on {seeds} lists no master serving slots");
            }
            let mut readings = Vec::new();
            for master in masters {
                let endpoint = Endpoint {
                    host: master.host.clone(),
                    port: master.port,
                };
                readings.push(node_script_calls(&endpoint).await?);
            }
            Ok(ScriptCalls::of_masters(readings))
        }
    }
}

/// `CLUSTER NODES` as the first of `seeds` that answers sees the cluster.
async fn cluster_nodes(seeds: &ClusterNodes) -> anyhow::Result<String> {
    let mut last = None;
    for seed in &seeds.0 {
        let reply = async {
            let mut conn = connect(seed).await?;
            redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut conn)
                .await
                .with_context(|| format!("CLUSTER NODES on {seed}"))
        };
        match reply.await {
            Ok(text) => return Ok(text),
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no seed node")))
}

/// One server's `run_id` and script calls.
async fn node_script_calls(endpoint: &Endpoint) -> anyhow::Result<(String, u64)> {
    let mut conn = connect(endpoint).await?;
    let server: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .with_context(|| format!("INFO server on {endpoint}"))?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .with_context(|| format!("INFO commandstats on {endpoint}"))?;
    Ok((
        run_id_in(&server).unwrap_or_default().to_owned(),
        script_calls_in(&info),
    ))
}

/// The `run_id` in an `INFO server` reply.
pub fn run_id_in(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("run_id:"))
}

/// The `calls` of `cmdstat_fcall` (the library's function, how the crate calls Redis) and of
/// `cmdstat_evalsha` and `cmdstat_eval` in an `INFO commandstats` reply, summed (a command never
/// run has no line: 0).
pub fn script_calls_in(info: &str) -> u64 {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.trim().split_once(':')?;
            if !matches!(name, "cmdstat_fcall" | "cmdstat_evalsha" | "cmdstat_eval") {
                return None;
            }
            fields
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_with_or_without_the_scheme() {
        let expected = Endpoint {
            host: "127.0.0.1".into(),
            port: 6379,
        };
        assert_eq!("127.0.0.1:6379".parse::<Endpoint>(), Ok(expected.clone()));
        assert_eq!(
            "redis://127.0.0.1:6379/".parse::<Endpoint>(),
            Ok(expected.clone())
        );
        assert_eq!(expected.to_string(), "127.0.0.1:6379");
        assert_eq!(
            "cache.internal:7000".parse::<Endpoint>().map(|e| e.port),
            Ok(7000)
        );
        for bad in [
            "",
            "6379",
            ":6379",
            "host:",
            "host:0",
            "host:65536",
            "host:x",
            "u@h:1",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn script_calls_sum_fcall_evalsha_and_eval() {
        let info = "# Commandstats\r\n\
            cmdstat_fcall:calls=100,usec=5678,usec_per_call=4.60,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_evalsha:calls=1234,usec=5678,usec_per_call=4.60,rejected_calls=0,failed_calls=2\r\n\
            cmdstat_eval:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_xread:calls=99,usec=1,usec_per_call=0.01,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_evalsha_ro:calls=7,usec=1,usec_per_call=0.14,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(script_calls_in(info), 1_337);
        assert_eq!(script_calls_in("# Commandstats\r\n"), 0);
    }

    #[test]
    fn calls_are_counted_within_one_run_of_the_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:4f2c9e\r\ntcp_port:6379\r\n";
        assert_eq!(run_id_in(info), Some("4f2c9e"));
        assert_eq!(run_id_in("# Server\r\n"), None);
        let reading = |run_id: &str, calls| ScriptCalls {
            run_id: run_id.into(),
            calls,
            cluster: false,
        };
        assert_eq!(reading("a", 2_914).since(&reading("a", 14)), Ok(2_900));
        // A restart starts the counters again: the difference means nothing.
        let restarted = reading("b", 900).since(&reading("a", 14)).unwrap_err();
        assert!(restarted.contains("the server restarted"), "{restarted}");
    }

    #[test]
    fn a_clusters_calls_are_summed_over_its_masters_and_a_failover_is_not_counted() {
        let masters = |readings: &[(&str, u64)]| {
            ScriptCalls::of_masters(readings.iter().map(|(id, n)| ((*id).to_owned(), *n)))
        };
        let before = masters(&[("c", 5), ("a", 10), ("b", 0)]);
        assert_eq!(
            before,
            ScriptCalls {
                run_id: "a,b,c".into(),
                calls: 15,
                cluster: true,
            }
        );
        // The same masters, listed in another order.
        let after = masters(&[("b", 400), ("c", 305), ("a", 1_010)]);
        assert_eq!(after.since(&before), Ok(1_700));
        // A replica took over from master c: its counters are not c's.
        let failed_over = masters(&[("a", 1_010), ("b", 400), ("d", 20)]);
        let why = failed_over.since(&before).unwrap_err();
        assert!(
            why.starts_with("not counted: a master of the cluster changed"),
            "{why}"
        );
        assert_eq!(masters(&[]).run_id, "");
    }

    #[test]
    fn cluster_nodes_parse_as_a_comma_separated_list() {
        let nodes: ClusterNodes = "127.0.0.1:7000,redis://127.0.0.1:7001/, 127.0.0.1:7000"
            .parse()
            .unwrap();
        assert_eq!(
            nodes.0.iter().map(|e| e.port).collect::<Vec<_>>(),
            [7000, 7001]
        );
        assert_eq!(nodes.to_string(), "127.0.0.1:7000,127.0.0.1:7001");
        let one: ClusterNodes = "cache:7000".parse().unwrap();
        assert_eq!(one.0.len(), 1);
        for bad in [
            "",
            ",",
            "127.0.0.1:7000,",
            "127.0.0.1:7000,,127.0.0.1:7001",
            "h:0",
            "h",
        ] {
            assert!(bad.parse::<ClusterNodes>().is_err(), "{bad:?} was accepted");
        }
        assert_eq!(
            FleetRedis::Cluster(nodes).to_string(),
            "the cluster of 127.0.0.1:7000,127.0.0.1:7001"
        );
        assert_eq!(
            FleetRedis::Server("127.0.0.1:6379".parse().unwrap()).to_string(),
            "127.0.0.1:6379"
        );
    }
}
