//! `--chaos kill-master`'s Redis Cluster, and what the parent reads from any cluster.
//!
//! Without `--redis-cluster`, a `kill-master` run's parent starts a private cluster of six
//! `redis-server` nodes on free loopback ports (each port's cluster bus port, the port plus
//! 10,000, free too), each as `redis-server --port P --bind 127.0.0.1 --cluster-enabled yes
//! --cluster-node-timeout 1000 --repl-diskless-sync-delay 0 --dir DIR/P --save '' --appendonly no`
//! in a process group of its own (a Ctrl-C at the terminal reaches the fleet, not the nodes),
//! joins them with `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes` (three
//! masters, a replica each), and waits until every node says `cluster_state:ok` and the three
//! replicas say `master_link_status:up` (a replica that never synced cannot take over). A node
//! timeout of 1 s makes a replica take over 2 to 3 s after its master is killed; no
//! diskless-sync delay lets the replicas sync at once. Every node is SIGKILLed when the cluster
//! is dropped: at the end of the run, on an error, and after a forwarded signal alike.
//!
//! `CLUSTER NODES` is read for which master serves a slot ([`master_of_slot`]) and which masters
//! serve any ([`serving_masters`], whose `INFO commandstats` the parent sums).

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::redis_server::{self, ClusterNodes, Endpoint};

/// The cluster's nodes: three masters and three replicas.
pub const NODES: usize = 6;
/// Its replicas, one per master.
pub const REPLICAS: usize = NODES / 2;
/// What each node is started with besides its port, address, directory and no persistence.
const NODE_ARGS: [&str; 6] = [
    "--cluster-enabled",
    "yes",
    "--cluster-node-timeout",
    "1000",
    "--repl-diskless-sync-delay",
    "0",
];
/// How long `redis-cli --cluster create` may take.
const CREATE_WITHIN: Duration = Duration::from_secs(30);
/// How long the cluster may take, once created, to be ok with every replica in sync.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How often readiness and an election are polled.
const POLL: Duration = Duration::from_millis(50);
/// The bound on connecting to a node and on its reply to one command.
const QUERY_TIMEOUT: Duration = Duration::from_millis(500);

/// A node of the private cluster: its port, and its process until it is killed.
struct NodeProcess {
    port: u16,
    child: Option<Child>,
}

/// A six-node Redis Cluster of this run's own, every node SIGKILLed when dropped.
pub struct PrivateCluster {
    nodes: Vec<NodeProcess>,
    dir: tempfile::TempDir,
}

impl PrivateCluster {
    /// Starts six nodes of `binary` (`redis-server`), joins them with the `redis-cli` beside
    /// it (or on PATH) and waits until the cluster is ready (see the module docs).
    ///
    /// # Errors
    ///
    /// When a node cannot be started, the cluster cannot be created or is not ready in time;
    /// the nodes already started are stopped.
    pub fn start(binary: &Path) -> anyhow::Result<PrivateCluster> {
        let cli = find_cli(binary).context(
            "--chaos kill-master starts a Redis Cluster with redis-cli, which is not beside redis-server or on PATH (`apt-get install redis-tools`)",
        )?;
        let mut cluster = PrivateCluster {
            nodes: Vec::new(),
            dir: tempfile::tempdir().context("creating the cluster's directory")?,
        };
        for port in free_ports(NODES)? {
            let dir = cluster.dir.path().join(port.to_string());
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let child = redis_server::spawn_ready(binary, port, &dir, false, &NODE_ARGS)
                .with_context(|| format!("cluster node 127.0.0.1:{port}"))?;
            cluster.nodes.push(NodeProcess {
                port,
                child: Some(child),
            });
        }
        cluster.create(&cli)?;
        cluster.wait_ready()?;
        Ok(cluster)
    }

    /// Every node, killed or not: the seed nodes the fleet is given.
    pub fn nodes(&self) -> ClusterNodes {
        ClusterNodes(self.nodes.iter().map(|n| loopback(n.port)).collect())
    }

    /// The ports of the nodes still running.
    fn alive(&self) -> impl Iterator<Item = u16> + '_ {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
    }

    /// `redis-cli --cluster create` over the six nodes, bounded by [`CREATE_WITHIN`].
    fn create(&self, cli: &Path) -> anyhow::Result<()> {
        let log = self.dir.path().join("create.log");
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("the create log")?;
        let mut command = Command::new(cli);
        command.args(["--cluster", "create"]);
        for node in &self.nodes {
            command.arg(format!("127.0.0.1:{}", node.port));
        }
        let mut child = command
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", cli.display()))?;
        let deadline = Instant::now() + CREATE_WITHIN;
        let status = loop {
            if let Some(status) = child.try_wait().context("waiting for redis-cli")? {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "redis-cli --cluster create did not finish within {} s (see {})",
                    CREATE_WITHIN.as_secs(),
                    log.display()
                );
            }
            std::thread::sleep(POLL);
        };
        if !status.success() {
            let said = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = said.lines().rev().take(5).collect();
            bail!(
                "redis-cli --cluster create exited with {status}: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            );
        }
        Ok(())
    }

    /// Waits until every node says `cluster_state:ok` and [`REPLICAS`] nodes say
    /// `master_link_status:up`.
    fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let ok = self.alive().filter(|&p| node_ok(p)).count();
            let synced = self
                .alive()
                .filter(|&p| {
                    query::<String>(p, redis::cmd("INFO").arg("replication"))
                        .is_some_and(|info| info_field(&info, "master_link_status") == Some("up"))
                })
                .count();
            if ok == NODES && synced == REPLICAS {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the private Redis Cluster was not ready within {} s: {ok} of {NODES} nodes say cluster_state:ok, {synced} of {REPLICAS} replicas in sync",
                    READY_WITHIN.as_secs()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`, asked of the first node that answers).
    pub fn keyslot(&self, key: &str) -> Option<u16> {
        self.alive()
            .find_map(|p| query::<u16>(p, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)))
    }

    /// The cluster's nodes as the first running node that answers sees them (`CLUSTER NODES`).
    pub fn view(&self) -> Option<Vec<ClusterNode>> {
        self.alive()
            .find_map(|p| query::<String>(p, redis::cmd("CLUSTER").arg("NODES")))
            .map(|text| parse_nodes(&text))
    }

    /// Whether every running node says `cluster_state:ok`.
    pub fn all_ok(&self) -> bool {
        self.alive().all(node_ok)
    }

    /// SIGKILLs the node on `port`, as a crash would, and waits for it to be gone; false if no
    /// running node of the cluster listens there.
    pub fn kill(&mut self, port: u16) -> bool {
        let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) else {
            return false;
        };
        let Some(mut child) = node.child.take() else {
            return false;
        };
        let _ = child.kill();
        let _ = child.wait();
        true
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// `127.0.0.1:port`.
fn loopback(port: u16) -> Endpoint {
    Endpoint {
        host: "127.0.0.1".to_owned(),
        port,
    }
}

/// Whether the node on `port` says `cluster_state:ok`.
fn node_ok(port: u16) -> bool {
    query::<String>(port, redis::cmd("CLUSTER").arg("INFO"))
        .is_some_and(|info| info_field(&info, "cluster_state") == Some("ok"))
}

/// `command`'s reply from the node on loopback `port`, on a fresh connection bounded by
/// [`QUERY_TIMEOUT`]; `None` when it cannot be had.
fn query<T: redis::FromRedisValue>(port: u16, command: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut conn = client.get_connection_with_timeout(QUERY_TIMEOUT).ok()?;
    conn.set_read_timeout(Some(QUERY_TIMEOUT)).ok()?;
    conn.set_write_timeout(Some(QUERY_TIMEOUT)).ok()?;
    command.query(&mut conn).ok()
}

/// `redis-cli` beside `binary`, else on PATH.
fn find_cli(binary: &Path) -> Option<PathBuf> {
    let beside = binary.with_file_name("redis-cli");
    if beside.is_file() {
        return Some(beside);
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|p| p.join("redis-cli"))
        .find(|p| p.is_file())
}

/// The cluster bus port of a node listening on `port`: 10,000 above it, if that is a port.
pub fn bus_port(port: u16) -> Option<u16> {
    port.checked_add(10_000)
}

/// `n` free loopback ports whose bus ports are free too (each bound meanwhile, so that none is
/// picked twice nor is another's bus port).
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..n * 50 {
        if ports.len() == n {
            break;
        }
        let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
        let port = listener.local_addr().context("finding a free port")?.port();
        held.push(listener);
        if let Some(bus) = bus_port(port)
            && let Ok(bus_listener) = TcpListener::bind(("127.0.0.1", bus))
        {
            held.push(bus_listener);
            ports.push(port);
        }
    }
    if ports.len() < n {
        bail!(
            "found {} of {n} free ports with a free cluster bus port",
            ports.len()
        );
    }
    Ok(ports)
}

/// The value of `field` in an `INFO`-style reply (`field:value` lines).
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (name, value) = line.trim().split_once(':')?;
        (name == field).then_some(value)
    })
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's id.
    pub id: String,
    /// Where it takes clients.
    pub endpoint: Endpoint,
    /// Whether it is a master (else a replica).
    pub master: bool,
    /// Whether it is failing: `fail` (the cluster agreed) or `fail?` (this node suspects it).
    pub failing: bool,
    /// The slot ranges it serves, inclusive (a master's; importing and migrating slots left out).
    pub slots: Vec<(u16, u16)>,
}

impl ClusterNode {
    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|&(from, to)| (from..=to).contains(&slot))
    }
}

/// The nodes of a `CLUSTER NODES` reply: `id host:port@bus[,hostname] flags master ping pong
/// epoch link slot...` a line; lines that do not parse (a node without an address) are left out.
pub fn parse_nodes(text: &str) -> Vec<ClusterNode> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let address = fields[1].split(['@', ',']).next()?;
            let endpoint: Endpoint = address.parse().ok()?;
            let flags: Vec<&str> = fields[2].split(',').collect();
            let slots = fields[8..]
                .iter()
                .filter(|range| !range.starts_with('['))
                .filter_map(|range| {
                    let (from, to) = range.split_once('-').unwrap_or((range, range));
                    Some((from.parse().ok()?, to.parse().ok()?))
                })
                .collect();
            Some(ClusterNode {
                id: fields[0].to_owned(),
                endpoint,
                master: flags.contains(&"master"),
                failing: flags.iter().any(|f| matches!(*f, "fail" | "fail?")),
                slots,
            })
        })
        .collect()
}

/// The master that serves `slot`, not failing; `None` while none does (its master failed and
/// no replica took over yet).
pub fn master_of_slot(nodes: &[ClusterNode], slot: u16) -> Option<&ClusterNode> {
    nodes
        .iter()
        .find(|n| n.master && !n.failing && n.serves(slot))
}

/// The masters that serve slots, not failing.
pub fn serving_masters(nodes: &[ClusterNode]) -> Vec<&ClusterNode> {
    nodes
        .iter()
        .filter(|n| n.master && !n.failing && !n.slots.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `CLUSTER NODES` of a private cluster, as a node printed it (ids shortened).
    const NODES_BEFORE: &str = "\
a1 127.0.0.1:40001@50001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:40002@50002 master - 0 1700000000000 2 connected 5461-10922
c3 127.0.0.1:40003@50003,node-c master - 0 1700000000000 3 connected 10923-16383
d4 127.0.0.1:40004@50004 slave c3 0 1700000000000 3 connected
e5 127.0.0.1:40005@50005 slave a1 0 1700000000000 1 connected
f6 127.0.0.1:40006@50006 slave b2 0 1700000000000 2 connected
";

    /// The same after 40002 was SIGKILLed and its replica 40006 took over its slots.
    const NODES_AFTER: &str = "\
a1 127.0.0.1:40001@50001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:40002@50002 master,fail - 1700000000000 1700000000000 2 disconnected
c3 127.0.0.1:40003@50003 master - 0 1700000000000 3 connected 10923-16383
d4 127.0.0.1:40004@50004 slave c3 0 1700000000000 3 connected
e5 127.0.0.1:40005@50005 slave a1 0 1700000000000 1 connected
f6 127.0.0.1:40006@50006 master - 0 1700000000000 7 connected 5461-10922
";

    #[test]
    fn cluster_nodes_are_parsed_with_their_roles_and_slots() {
        let nodes = parse_nodes(NODES_BEFORE);
        assert_eq!(nodes.len(), 6);
        assert_eq!(
            nodes[2],
            ClusterNode {
                id: "c3".into(),
                endpoint: "127.0.0.1:40003".parse().unwrap(),
                master: true,
                failing: false,
                slots: vec![(10_923, 16_383)],
            }
        );
        assert!(!nodes[3].master && nodes[3].slots.is_empty());
        // Single slots, importing and migrating entries, a node without an address, junk.
        let odd = parse_nodes(
            "x 127.0.0.1:7000@17000 master - 0 0 1 connected 5 7-9 [10->-y] [11-<-z]\n\
             y :0@0 master,noaddr - 0 0 0 disconnected\n\
             short line\n",
        );
        assert_eq!(odd.len(), 1);
        assert_eq!(odd[0].slots, [(5, 5), (7, 9)]);
        assert!(odd[0].serves(8) && !odd[0].serves(6) && !odd[0].serves(10));
        assert!(parse_nodes("").is_empty());
    }

    #[test]
    fn the_master_of_a_slot_is_the_one_serving_it_and_not_failing() {
        let before = parse_nodes(NODES_BEFORE);
        let port = |slot| master_of_slot(&before, slot).map(|n| n.endpoint.port);
        assert_eq!(port(0), Some(40_001));
        assert_eq!(port(5_461), Some(40_002));
        assert_eq!(port(10_922), Some(40_002));
        assert_eq!(port(16_383), Some(40_003));
        let serving: Vec<u16> = serving_masters(&before)
            .iter()
            .map(|n| n.endpoint.port)
            .collect();
        assert_eq!(serving, [40_001, 40_002, 40_003]);

        // After the failover the slot is the promoted replica's; the dead master serves none.
        let after = parse_nodes(NODES_AFTER);
        assert_eq!(
            master_of_slot(&after, 7_000).map(|n| n.endpoint.port),
            Some(40_006)
        );
        let serving: Vec<u16> = serving_masters(&after)
            .iter()
            .map(|n| n.endpoint.port)
            .collect();
        assert_eq!(serving, [40_001, 40_003, 40_006]);

        // While the master is suspected or failed and no replica took over: no master.
        let failing = NODES_BEFORE.replace(
            "b2 127.0.0.1:40002@50002 master",
            "b2 127.0.0.1:40002@50002 master,fail?",
        );
        let failing = parse_nodes(&failing);
        assert_eq!(master_of_slot(&failing, 7_000), None);
        assert_eq!(serving_masters(&failing).len(), 2);
    }

    #[test]
    fn info_fields_and_bus_ports() {
        let info = "# Cluster\r\ncluster_state:ok\r\ncluster_slots_assigned:16384\r\n";
        assert_eq!(info_field(info, "cluster_state"), Some("ok"));
        assert_eq!(info_field(info, "cluster_slots"), None);
        let replication =
            "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_link_status:up\r\n";
        assert_eq!(info_field(replication, "master_link_status"), Some("up"));
        assert_eq!(info_field("", "role"), None);
        assert_eq!(bus_port(6379), Some(16_379));
        assert_eq!(bus_port(55_535), Some(65_535));
        assert_eq!(bus_port(55_536), None);
    }
}
