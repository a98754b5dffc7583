//! The integration services (Redis, a Redis Cluster, PostgreSQL) that the test steps may need,
//! started and stopped by the xtask itself: nothing runs before a session or a CI job, and nothing
//! is left behind.
//!
//! Each service gets a fresh temporary directory and free loopback ports (bind port 0, read it
//! back), so two runs on one machine never collide. Its address reaches the tests through an
//! environment variable:
//!
//! | service       | variable                  | value                                              |
//! |---------------|---------------------------|----------------------------------------------------|
//! | Redis         | `ADMISSION_REDIS_URL`     | `redis://127.0.0.1:PORT/`                          |
//! | Redis Cluster | `ADMISSION_REDIS_CLUSTER` | `127.0.0.1:P1,127.0.0.1:P2,...,127.0.0.1:P6`       |
//! | PostgreSQL    | `ADMISSION_PG_URL`        | `postgres://postgres@127.0.0.1:PORT/postgres`      |
//!
//! The Redis Cluster's value lists all six nodes (three masters, then three replicas, as
//! `redis-cli --cluster create` assigned them at start), comma separated, as `host:port` without a
//! scheme.
//!
//! A started service is stopped by its pids (SIGTERM for Redis and each cluster node, SIGINT, "fast
//! shutdown", for PostgreSQL; SIGKILL if one has not exited after a grace period) and its
//! directory removed, when [`Running::stop`] is called or, on any early return or panic, when the
//! [`Running`] value is dropped. A run killed by a signal (Ctrl-C) cannot clean up: the log line
//! printed at start names the pids and the directory.
//!
//! # Enabling a service
//!
//! [`REQUIRED`] lists what `cargo xtask ci` and `cargo xtask test` start around the test steps:
//! Redis and a Redis Cluster, for `admission-redis`, and PostgreSQL, for `admission-db`'s
//! providers over it (features `r2d2-postgres`, `deadpool-postgres`, `sqlx-postgres`). A test that
//! needs a service reads its variable; when it is unset (plain `cargo test`) it prints that it was
//! skipped and why, except under `CI=true`, where it fails. The xtask installs the packages it
//! is missing itself before it starts a service (`redis-server`, `redis-tools` for `redis-cli`,
//! `postgresql`), with apt-get as root or through passwordless sudo; `cargo xtask ci` checks
//! that before its first step. Where it cannot, it stops with the one command to run. `cargo xtask with-services -- CMD ...` starts all of [`ALL`], whatever
//! [`REQUIRED`] says, to run one command against them by hand.
//!
//! # How each service is started
//!
//! - Redis: `redis-server --port PORT --bind 127.0.0.1 --save '' --appendonly no --daemonize yes
//!   --pidfile DIR/redis.pid --logfile DIR/redis.log`, ready once it answers `PING`.
//! - Redis Cluster: six nodes on ports P1..P6, each picked with its cluster bus port (P + 10000)
//!   free too, each started as `redis-server --port P --bind 127.0.0.1 --cluster-enabled yes
//!   --cluster-config-file DIR/P/nodes.conf --cluster-node-timeout 1000 --repl-diskless-sync-delay 0
//!   --dir DIR/P --save '' --appendonly no --daemonize yes --pidfile DIR/P/r.pid --logfile
//!   DIR/P/r.log` and ready once it answers `PING`; then `redis-cli --cluster create 127.0.0.1:P1
//!   ... 127.0.0.1:P6 --cluster-replicas 1 --cluster-yes` (three masters, three replicas). The
//!   cluster is ready once every node's `CLUSTER INFO` shows `cluster_state:ok` and each of the
//!   three replicas has finished its first sync (`master_link_status:up`): a replica that has
//!   never synced does not take over when its master dies, so a test that kills a master needs
//!   that. A node timeout of 1 s makes a replica take over about 2 s after its master is killed
//!   (the default, 15 s, is too slow for a test), and no diskless-sync delay lets the replicas sync
//!   at once rather than after Redis's default 5 s.
//! - PostgreSQL: `initdb -D DIR/data -U postgres -A trust --no-sync -E UTF8 --locale=C.UTF-8`, then
//!   `pg_ctl -D DIR/data -l DIR/server.log -w -t 30 -o "-p PORT -c listen_addresses=127.0.0.1 -k
//!   DIR -c fsync=off" start`. `initdb` refuses to run as root, so as root both run through
//!   `runuser -u postgres --` and DIR is handed to that user. The binaries are looked up in
//!   `$PG_BIN`, then `/usr/lib/postgresql/15/bin` (Debian's place), then the newest
//!   `/usr/lib/postgresql/*/bin`, then `PATH`.

use std::ffi::OsString;
use std::fmt::{self, Write as _};
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

/// The services started around the test steps of `ci` and `test`: Redis and a Redis Cluster, for
/// `admission-redis`, and PostgreSQL, for `admission-db`'s providers over it. See the module docs.
pub(crate) const REQUIRED: &[Service] = &[Service::Redis, Service::RedisCluster, Service::Postgres];

/// Every service this module knows how to run.
pub(crate) const ALL: &[Service] = &[Service::Redis, Service::RedisCluster, Service::Postgres];

/// One kind of integration service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Service {
    /// A throwaway `redis-server` on loopback, no persistence.
    Redis,
    /// A throwaway Redis Cluster on loopback: six `redis-server` nodes, three masters and three
    /// replicas, no persistence.
    RedisCluster,
    /// A throwaway PostgreSQL cluster on loopback, user `postgres`, trust authentication.
    Postgres,
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Service::Redis => "redis",
            Service::RedisCluster => "redis-cluster",
            Service::Postgres => "postgres",
        })
    }
}

/// Services that are up; they are stopped by [`Running::stop`] or, failing that, on drop.
#[derive(Default)]
pub(crate) struct Running {
    /// Stopped in reverse order of start.
    instances: Vec<Instance>,
    /// What was asked for, in order.
    started: Vec<Service>,
}

impl Running {
    /// The services this started, in order.
    pub(crate) fn services(&self) -> &[Service] {
        &self.started
    }

    /// The environment variables that tell tests where the services listen.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        self.instances
            .iter()
            .map(|i| (i.env_var, i.url.clone()))
            .collect()
    }

    /// Whether no service is running (nothing was required).
    pub(crate) fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }

    /// Stops every service and removes its directory; reports the first failure.
    pub(crate) fn stop(mut self) -> Result<()> {
        let mut first_error = None;
        while let Some(mut instance) = self.instances.pop() {
            if let Err(e) = instance.stop() {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Each instance stops itself on drop; stop in reverse order of start.
        while let Some(instance) = self.instances.pop() {
            drop(instance);
        }
    }
}

/// The Debian packages behind `services` whose binaries `found` does not find, in a stable
/// order, each once: `redis-server` for Redis (it brings `redis-tools`), `redis-tools` for the
/// cluster's `redis-cli` too, `postgresql` for PostgreSQL's `initdb` and `pg_ctl`.
fn missing_packages(services: &[Service], found: &dyn Fn(&str) -> bool) -> Vec<&'static str> {
    let mut packages = Vec::new();
    let mut need = |binary: &str, package: &'static str| {
        if !found(binary) && !packages.contains(&package) {
            packages.push(package);
        }
    };
    for service in services {
        match service {
            Service::Redis => need("redis-server", "redis-server"),
            Service::RedisCluster => {
                need("redis-server", "redis-server");
                need("redis-cli", "redis-tools");
            }
            Service::Postgres => {
                need("initdb", "postgresql");
                need("pg_ctl", "postgresql");
            }
        }
    }
    packages
}

/// Whether `binary` can be run: PostgreSQL's tools where [`pg_bin`] looks for them, the others
/// on `PATH`.
pub(crate) fn binary_found(binary: &str) -> bool {
    let path = match binary {
        "initdb" | "pg_ctl" => pg_bin(binary),
        _ => PathBuf::from(binary),
    };
    if path.is_absolute() {
        return path.is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|dirs| std::env::split_paths(&dirs).any(|dir| dir.join(&path).is_file()))
}

/// Installs what `services` need and this machine lacks, with `apt-get` (as root, or through
/// passwordless `sudo`): exactly the missing packages, nothing when everything is there. Where
/// it cannot install (not root and no passwordless sudo, no apt-get, or apt-get failed), the
/// error names the one command to run.
pub(crate) fn ensure_installed(services: &[Service]) -> Result<()> {
    let packages = missing_packages(services, &binary_found);
    if packages.is_empty() {
        return Ok(());
    }
    let list = packages.join(" ");
    let manual = format!("sudo apt-get install -y {list}");
    if !binary_found("apt-get") {
        bail!(
            "the services need {list}, which are not installed, and this machine has no apt-get: \
             install them with its package manager and run again"
        );
    }
    let sudo: &[&str] = if is_root() {
        &[]
    } else if Command::new("sudo")
        .args(["-n", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
    {
        &["sudo", "-n"]
    } else {
        bail!(
            "the services need {list}, which are not installed; this xtask installs them itself \
             when run as root or with passwordless sudo. Run `{manual}` and run again"
        );
    };
    println!("==> services: installing {list} with apt-get (missing on this machine)");
    let apt = |args: &[&str]| -> Result<()> {
        let (program, rest) = match sudo.split_first() {
            Some((first, rest)) => (*first, [rest, &["apt-get"][..]].concat()),
            None => ("apt-get", Vec::new()),
        };
        let status = Command::new(program)
            .args(rest)
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
            .with_context(|| format!("could not run apt-get; run `{manual}` and run again"))?;
        if !status.success() {
            bail!(
                "apt-get {} failed ({status}); run `{manual}` and run again",
                args.join(" ")
            );
        }
        Ok(())
    };
    apt(&["update", "-qq"])?;
    let mut install = vec!["install", "-y", "-qq", "--no-install-recommends"];
    install.extend(&packages);
    apt(&install)?;
    let still = missing_packages(services, &binary_found);
    if !still.is_empty() {
        bail!(
            "apt-get installed {list}, yet {} still cannot be found; run `{manual}` and check",
            still.join(" ")
        );
    }
    Ok(())
}

/// Starts `services` in order, installing their packages first where they are missing
/// ([`ensure_installed`]). If one fails, those already started are stopped again.
pub(crate) fn start(services: &[Service]) -> Result<Running> {
    ensure_installed(services)?;
    let mut running = Running::default();
    for &service in services {
        // Dropped, and so cleaned up, if starting fails.
        let mut instance = Instance::new(service)?;
        match service {
            Service::Redis => start_redis(&mut instance),
            Service::RedisCluster => start_redis_cluster(&mut instance),
            Service::Postgres => start_postgres(&mut instance),
        }
        .with_context(|| format!("could not start {service}"))?;
        println!(
            "==> services: {service} at {} ({}, dir {})",
            instance.url,
            pid_list(&instance.pids()),
            instance.dir.display()
        );
        running.instances.push(instance);
        running.started.push(service);
    }
    Ok(running)
}

/// The number of nodes of the Redis Cluster.
const CLUSTER_NODES: usize = 6;

/// The number of replicas of the Redis Cluster: one per master, so three masters and three
/// replicas.
const CLUSTER_REPLICAS: usize = CLUSTER_NODES / 2;

/// How long the Redis Cluster may take, once `redis-cli --cluster create` is done, to show
/// `cluster_state:ok` on every node and have every replica synced (about 1 s here).
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// One service's directory, ports and processes; stopped and removed on [`Instance::stop`] or
/// drop.
struct Instance {
    service: Service,
    /// A scratch directory that holds the service's data, sockets and logs.
    dir: PathBuf,
    /// The ports the service listens on: one, or one per node of the Redis Cluster.
    ports: Vec<u16>,
    /// The service's daemons, in the order of `ports`: one (a Redis server, a PostgreSQL
    /// postmaster) or one per cluster node.
    daemons: Vec<Daemon>,
    /// The signal that asks a daemon to shut down cleanly.
    stop_signal: &'static str,
    env_var: &'static str,
    url: String,
    /// Set by the first `stop`, which makes later ones (and drop) do nothing.
    stopped: bool,
}

/// One process of a service, found through its pid file.
struct Daemon {
    /// Where the daemon writes its pid.
    pidfile: PathBuf,
    /// The daemon's pid once it is up. A daemon that failed half-way is found through `pidfile`.
    pid: Option<u32>,
}

impl Daemon {
    /// A daemon that has not started yet and will write its pid to `pidfile`.
    fn new(pidfile: PathBuf) -> Self {
        Self { pidfile, pid: None }
    }
}

impl Instance {
    /// A fresh directory and free ports for `service`; nothing runs yet.
    fn new(service: Service) -> Result<Self> {
        let dir = scratch_dir(&service.to_string())?;
        let ports = match service {
            Service::RedisCluster => free_cluster_ports(CLUSTER_NODES),
            Service::Redis | Service::Postgres => free_port().map(|port| vec![port]),
        };
        let ports = match ports {
            Ok(ports) => ports,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let port = ports[0];
        let (daemons, stop_signal, env_var, url) = match service {
            Service::Redis => (
                vec![Daemon::new(dir.join("redis.pid"))],
                "TERM",
                "ADMISSION_REDIS_URL",
                format!("redis://127.0.0.1:{port}/"),
            ),
            Service::RedisCluster => (
                ports
                    .iter()
                    .map(|port| Daemon::new(dir.join(port.to_string()).join("r.pid")))
                    .collect(),
                "TERM",
                "ADMISSION_REDIS_CLUSTER",
                ports
                    .iter()
                    .map(|port| format!("127.0.0.1:{port}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            Service::Postgres => (
                vec![Daemon::new(dir.join("data").join("postmaster.pid"))],
                // SIGINT is PostgreSQL's "fast shutdown": disconnect clients, then exit.
                "INT",
                "ADMISSION_PG_URL",
                format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            ),
        };
        Ok(Self {
            service,
            dir,
            ports,
            daemons,
            stop_signal,
            env_var,
            url,
            stopped: false,
        })
    }

    /// The pids of the daemons that are up, or that failed half-way but wrote their pid file.
    fn pids(&self) -> Vec<u32> {
        self.daemons
            .iter()
            .filter_map(|daemon| daemon.pid.or_else(|| read_pid(&daemon.pidfile)))
            .collect()
    }

    /// Signals the daemons (those that ever started), waits for them to exit, then removes the
    /// directory. Idempotent.
    fn stop(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.stopped, true) {
            return Ok(());
        }
        let pids = self.pids();
        if !pids.is_empty() {
            stop_pids(&pids, self.stop_signal, Duration::from_secs(20)).with_context(|| {
                format!(
                    "could not stop {} ({}, dir {})",
                    self.service,
                    pid_list(&pids),
                    self.dir.display()
                )
            })?;
        }
        // Only now: the directory (and its logs) stays if a process might still be running.
        let _ = fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("xtask: warning: {e:#}");
        }
    }
}

fn start_redis(instance: &mut Instance) -> Result<()> {
    let (dir, port) = (&instance.dir, instance.ports[0]);
    let daemon = &mut instance.daemons[0];
    let log = dir.join("redis.log");
    spawn_redis_server(dir, port, &daemon.pidfile, &log, &[])?;
    daemon.pid = Some(wait_redis_server(port, &daemon.pidfile, &log)?);
    Ok(())
}

/// Starts the six nodes, each in its own subdirectory `DIR/PORT`, joins them into a cluster of
/// three masters and three replicas, and waits until it is ready (see the module docs).
fn start_redis_cluster(instance: &mut Instance) -> Result<()> {
    let dir = &instance.dir;
    let node_dir = |port: u16| dir.join(port.to_string());
    let cluster_args = |port: u16| -> Vec<OsString> {
        let node_dir = node_dir(port);
        vec![
            "--cluster-enabled".into(),
            "yes".into(),
            "--cluster-config-file".into(),
            node_dir.join("nodes.conf").into(),
            "--cluster-node-timeout".into(),
            "1000".into(),
            "--repl-diskless-sync-delay".into(),
            "0".into(),
            "--dir".into(),
            node_dir.into(),
        ]
    };
    // Start every node before waiting for any: they come up side by side.
    for (&port, daemon) in instance.ports.iter().zip(&instance.daemons) {
        let node_dir = node_dir(port);
        fs::create_dir(&node_dir)
            .with_context(|| format!("could not create {}", node_dir.display()))?;
        spawn_redis_server(
            &node_dir,
            port,
            &daemon.pidfile,
            &node_dir.join("r.log"),
            &cluster_args(port),
        )
        .with_context(|| format!("cluster node 127.0.0.1:{port}"))?;
    }
    for (&port, daemon) in instance.ports.iter().zip(&mut instance.daemons) {
        let log = node_dir(port).join("r.log");
        let pid = wait_redis_server(port, &daemon.pidfile, &log)
            .with_context(|| format!("cluster node 127.0.0.1:{port}"))?;
        daemon.pid = Some(pid);
    }

    let mut create = Command::new("redis-cli");
    create
        .args(["--cluster", "create"])
        .args(
            instance
                .ports
                .iter()
                .map(|port| format!("127.0.0.1:{port}")),
        )
        .args(["--cluster-replicas", "1", "--cluster-yes"]);
    run_quiet_within(&mut create, dir, "cluster create", Duration::from_secs(60))?;

    wait_cluster_ready(&instance.ports, dir, CLUSTER_READY_TIMEOUT)
}

/// Runs `redis-server` on loopback port `port` with no persistence, daemonized, writing its pid
/// to `pidfile` and its log to `log`, plus `extra` arguments. Returns once the daemon has forked;
/// [`wait_redis_server`] waits for it to serve.
fn spawn_redis_server(
    dir: &Path,
    port: u16,
    pidfile: &Path,
    log: &Path,
    extra: &[OsString],
) -> Result<()> {
    let status = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "yes"])
        .arg("--pidfile")
        .arg(pidfile)
        .arg("--logfile")
        .arg(log)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(File::create(dir.join("redis-server.out"))?)
        .stderr(File::create(dir.join("redis-server.err"))?)
        .status()
        .context(
            "could not run `redis-server` (is it installed? `apt-get install redis-server`)",
        )?;
    if !status.success() {
        bail!(
            "redis-server exited with {status}; {}",
            tail(&dir.join("redis-server.err"), log)
        );
    }
    Ok(())
}

/// Waits up to 10 s for the `redis-server` started by [`spawn_redis_server`] to write its pid and
/// answer `PING`; returns its pid, or fails with the tail of its log.
fn wait_redis_server(port: u16, pidfile: &Path, log: &Path) -> Result<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = read_pid(pidfile)
            && redis_ping(port)
        {
            return Ok(pid);
        }
        if Instant::now() > deadline {
            bail!(
                "redis-server did not answer PING on port {port} within 10s; {}",
                tail(log, log)
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Polls the cluster's nodes until every one shows `cluster_state:ok` and [`CLUSTER_REPLICAS`] of
/// them are replicas whose link to their master is up, or fails after `timeout` naming the nodes
/// that were not ready, with the tail of the first one's log.
fn wait_cluster_ready(ports: &[u16], dir: &Path, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut not_ready = Vec::new();
        let mut replicas = 0;
        for &port in ports {
            match cluster_node_state(port) {
                Ok(NodeState::Master) => {}
                Ok(NodeState::Replica) => replicas += 1,
                Err(why) => not_ready.push((port, why)),
            }
        }
        if not_ready.is_empty() && replicas == CLUSTER_REPLICAS {
            return Ok(());
        }
        if Instant::now() > deadline {
            let mut message = format!("the Redis Cluster was not ready within {timeout:?}:");
            for (port, why) in &not_ready {
                let _ = write!(message, "\n  node 127.0.0.1:{port}: {why}");
            }
            if not_ready.is_empty() {
                let _ = write!(
                    message,
                    "\n  {replicas} of {} nodes are replicas, not {CLUSTER_REPLICAS}",
                    ports.len()
                );
            }
            let port = not_ready.first().map_or(ports[0], |(port, _)| *port);
            let log = dir.join(port.to_string()).join("r.log");
            bail!(
                "{message}\nnode 127.0.0.1:{port}'s log ({}): {}",
                log.display(),
                tail(&log, &log)
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// The role of a cluster node that is ready.
enum NodeState {
    Master,
    /// A replica that has synced with its master.
    Replica,
}

/// A node's role if it is ready (`cluster_state:ok` and, for a replica, `master_link_status:up`),
/// else why not.
fn cluster_node_state(port: u16) -> std::result::Result<NodeState, String> {
    let info = redis_bulk(port, "CLUSTER INFO").ok_or("no answer to CLUSTER INFO")?;
    if info_field(&info, "cluster_state") != Some("ok") {
        return Err(format!(
            "cluster_state:{}",
            info_field(&info, "cluster_state").unwrap_or("?")
        ));
    }
    let replication =
        redis_bulk(port, "INFO replication").ok_or("no answer to INFO replication")?;
    match info_field(&replication, "role") {
        Some("master") => Ok(NodeState::Master),
        Some("slave") => match info_field(&replication, "master_link_status") {
            Some("up") => Ok(NodeState::Replica),
            status => Err(format!(
                "replica not yet synced with its master (master_link_status:{})",
                status.unwrap_or("?")
            )),
        },
        role => Err(format!("role:{}", role.unwrap_or("?"))),
    }
}

/// The value of `name` in an `INFO`-style reply (`name:value` lines).
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(':')
            .map(str::trim_end)
    })
}

/// Sends an inline `command` (such as `CLUSTER INFO`) over RESP and returns its bulk-string
/// reply; `None` if the server does not answer within a second or answers anything else.
fn redis_bulk(port: u16, command: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(format!("{command}\r\n").as_bytes()).ok()?;
    let mut reader = BufReader::new(stream);
    let mut header = String::new();
    reader.read_line(&mut header).ok()?;
    let len: usize = header.strip_prefix('$')?.trim_end().parse().ok()?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    String::from_utf8(body).ok()
}

/// Sends `PING` over RESP and expects `+PONG`.
fn redis_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut reply = [0u8; 5];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG"
}

fn start_postgres(instance: &mut Instance) -> Result<()> {
    let (dir, port) = (&instance.dir, instance.ports[0]);
    let data = dir.join("data");
    let as_root = is_root();
    if as_root {
        let mut chown = Command::new("chown");
        chown.arg("postgres:postgres").arg(dir);
        run_quiet(&mut chown, dir, "chown")?;
    }
    let mut initdb = pg_command(as_root, "initdb");
    initdb.arg("-D").arg(&data);
    initdb.args(["-U", "postgres", "-A", "trust", "--no-sync"]);
    initdb.args(["-E", "UTF8", "--locale=C.UTF-8"]);
    run_quiet(&mut initdb, dir, "initdb")?;

    let server_log = dir.join("server.log");
    let mut options = OsString::from(format!("-p {port} -c listen_addresses=127.0.0.1 -k "));
    options.push(dir);
    options.push(" -c fsync=off");
    let mut pg_ctl = pg_command(as_root, "pg_ctl");
    pg_ctl.arg("-D").arg(&data).arg("-l").arg(&server_log);
    pg_ctl
        .args(["-w", "-t", "30", "-o"])
        .arg(options)
        .arg("start");
    run_quiet(&mut pg_ctl, dir, "pg_ctl start")
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", tail(&server_log, &server_log)))?;

    let daemon = &mut instance.daemons[0];
    let pid = read_pid(&daemon.pidfile)
        .context("pg_ctl reported success but postmaster.pid has no pid")?;
    daemon.pid = Some(pid);
    Ok(())
}

/// A PostgreSQL tool, run as the `postgres` user when we are root.
fn pg_command(as_root: bool, tool: &str) -> Command {
    let program = pg_bin(tool);
    if as_root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// Where PostgreSQL's server tools live: `$PG_BIN`, Debian's versioned directories, or `PATH`.
fn pg_bin(tool: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return Path::new(&dir).join(tool);
    }
    let debian = Path::new("/usr/lib/postgresql/15/bin").join(tool);
    if debian.exists() {
        return debian;
    }
    let newest = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .max();
    match newest {
        Some(version) => PathBuf::from(format!("/usr/lib/postgresql/{version}/bin/{tool}")),
        None => PathBuf::from(tool),
    }
}

/// Runs `cmd` with its output written to `DIR/NAME.out`; on failure, the error quotes that file.
fn run_quiet(cmd: &mut Command, dir: &Path, name: &str) -> Result<()> {
    let out_path = dir.join(format!("{}.out", name.replace(' ', "-")));
    let out = File::create(&out_path)?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .with_context(|| format!("could not run {cmd:?}"))?;
    if !status.success() {
        bail!(
            "{name} exited with {status}: {}",
            tail(&out_path, &out_path)
        );
    }
    Ok(())
}

/// Runs `cmd` as [`run_quiet`] does, but kills it and fails if it has not exited within `timeout`.
fn run_quiet_within(cmd: &mut Command, dir: &Path, name: &str, timeout: Duration) -> Result<()> {
    let out_path = dir.join(format!("{}.out", name.replace(' ', "-")));
    let out = File::create(&out_path)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("could not run {cmd:?}"))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("waiting for {name}"))?
        {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{name} did not finish within {timeout:?} and was killed: {}",
                tail(&out_path, &out_path)
            );
        }
        thread::sleep(Duration::from_millis(50));
    };
    if !status.success() {
        bail!(
            "{name} exited with {status}: {}",
            tail(&out_path, &out_path)
        );
    }
    Ok(())
}

/// Sends `signal` to every pid of `pids`, waits up to `grace` for them all to exit, then sends
/// SIGKILL to those still running.
fn stop_pids(pids: &[u32], signal: &str, grace: Duration) -> Result<()> {
    for &pid in pids {
        signal_pid(pid, signal)?;
    }
    let stubborn = still_running(pids, grace);
    if stubborn.is_empty() {
        return Ok(());
    }
    for &pid in &stubborn {
        signal_pid(pid, "KILL")?;
    }
    let survivors = still_running(&stubborn, Duration::from_secs(5));
    if survivors.is_empty() {
        bail!(
            "{} ignored SIG{signal} for {grace:?} and had to be killed",
            pid_list(&stubborn)
        );
    }
    bail!("{}: still running after SIGKILL", pid_list(&survivors));
}

/// Those of `pids` that have not exited within `timeout` (shared by all of them).
fn still_running(pids: &[u32], timeout: Duration) -> Vec<u32> {
    let deadline = Instant::now() + timeout;
    pids.iter()
        .copied()
        .filter(|&pid| !wait_exit(pid, deadline.saturating_duration_since(Instant::now())))
        .collect()
}

/// `pid 12` or `pids 12, 13`, for messages.
fn pid_list(pids: &[u32]) -> String {
    let list = pids
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match pids.len() {
        1 => format!("pid {list}"),
        _ => format!("pids {list}"),
    }
}

/// `kill -SIGNAL PID` through `sh`, whose `kill` builtin exists even where procps does not.
pub(crate) fn signal_pid(pid: u32, signal: &str) -> Result<()> {
    // A failing `kill` means the process is already gone, which is what we want.
    Command::new("sh")
        .args([
            "-c",
            "kill -s \"$1\" \"$2\" 2>/dev/null",
            "sh",
            signal,
            &pid.to_string(),
        ])
        .status()
        .context("could not run sh")?;
    Ok(())
}

/// Waits until `pid` no longer runs; a zombie (exited, unreaped by a container's pid 1) counts as gone.
fn wait_exit(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        match fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat) => {
                let state = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next());
                if matches!(state, Some('Z' | 'X')) {
                    return true;
                }
            }
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// A port that was free a moment ago on 127.0.0.1 (the listener is closed before returning).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).context("could not bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The offset of a Redis Cluster node's cluster bus port from its client port.
const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// `n` distinct ports for Redis Cluster nodes that were free a moment ago on 127.0.0.1, each
/// with its cluster bus port (the port + 10000) free too, and so at most 55535. Every listener is
/// held until all `n` are found, so that no port (or bus port) is handed out twice.
fn free_cluster_ports(n: usize) -> Result<Vec<u16>> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    // Ports above 55535 (a fifth of Linux's default ephemeral range) have no bus port: skip them.
    for _ in 0..n * 50 {
        if ports.len() == n {
            return Ok(ports);
        }
        let listener = TcpListener::bind(("127.0.0.1", 0)).context("could not bind 127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        held.push(listener);
        let Some(bus_port) = port.checked_add(CLUSTER_BUS_OFFSET) else {
            continue;
        };
        if let Ok(bus) = TcpListener::bind(("127.0.0.1", bus_port)) {
            held.push(bus);
            ports.push(port);
        }
    }
    if ports.len() == n {
        return Ok(ports);
    }
    bail!(
        "found only {} of {n} free ports on 127.0.0.1 with their cluster bus port \
         (+{CLUSTER_BUS_OFFSET}) free too",
        ports.len()
    )
}

/// A new, empty directory under the system temp dir, named after the service, pid and time.
fn scratch_dir(service: &str) -> Result<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("xtask-{service}-{}-{nanos}", std::process::id()));
    fs::create_dir(&dir).with_context(|| format!("could not create {}", dir.display()))?;
    Ok(dir)
}

/// The first line of a pid file, if it is a number.
fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

/// The last lines of `first` (or, if it is empty, of `second`), for error messages.
fn tail(first: &Path, second: &Path) -> String {
    let text = [first, second]
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .find(|t| !t.trim().is_empty());
    match text {
        Some(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(15);
            format!("last lines of output:\n{}", lines[start..].join("\n"))
        }
        None => format!("no output (see {})", first.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_missing_packages_are_installed_each_once() {
        let none = |_: &str| false;
        assert_eq!(
            missing_packages(REQUIRED, &none),
            ["redis-server", "redis-tools", "postgresql"]
        );
        let all = |_: &str| true;
        assert!(missing_packages(ALL, &all).is_empty());
        // redis-server installed (with its tools): only PostgreSQL.
        let redis = |binary: &str| binary.starts_with("redis");
        assert_eq!(missing_packages(REQUIRED, &redis), ["postgresql"]);
        // A machine with the server but not the cluster's client.
        let no_cli = |binary: &str| binary != "redis-cli";
        assert_eq!(
            missing_packages(&[Service::Redis], &no_cli),
            Vec::<&str>::new()
        );
        assert_eq!(
            missing_packages(&[Service::RedisCluster], &no_cli),
            ["redis-tools"]
        );
    }

    #[test]
    fn a_binary_is_found_on_path_or_not_at_all() {
        assert!(binary_found("sh"));
        assert!(!binary_found("no-such-binary-admission-xtask"));
    }
}
