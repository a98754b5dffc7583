//! Private Redis servers for tests, benches and examples, a private Redis Cluster of six of them,
//! and what is read from a cluster's nodes (feature `redis-servers`).
//!
//! [`PrivateServer::start`] starts one `redis-server` on a loopback port, as `redis-server --port
//! P --bind 127.0.0.1 --logfile '' --dir DIR ARGS...` in a fresh temporary directory of its own,
//! and waits until it logs that it is ready. A private server never outlives the process that
//! started it, however that process ends (SIGKILL included), and neither does its directory:
//!
//! - the server runs under a watchdog, a `sh` whose child it is (in the foreground: not
//!   daemonized), which reads its own stdin, a pipe whose write end only the caller holds (Rust
//!   opens it close-on-exec, so no other child inherits it, and the server's own stdin is
//!   `/dev/null`). The read ends when the pipe closes: when the caller stops the server
//!   ([`PrivateServer::kill`], a drop) or when the caller dies and the kernel closes the pipe for
//!   it. The watchdog then SIGKILLs the server, reaps it and exits;
//! - the directory has a guard of the same kind, a `sh` in a process group of its own that
//!   removes it once its pipe closes (retrying for up to 5 s while a server killed at the same
//!   moment may still write in it). It lives as long as the [`PrivateServer`], across
//!   [`restart`](PrivateServer::restart)s, so a server killed and started again keeps its files.
//!
//! No `unsafe` (no `prctl`, no `pre_exec`) and no platform call is needed: the pipe does it.
//!
//! [`PrivateCluster::start`] starts six such servers on free loopback ports (each port's cluster
//! bus port, the port plus 10,000, free too), each with `--save '' --appendonly no
//! --cluster-enabled yes --cluster-node-timeout 1000 --repl-diskless-sync-delay 0`, joins them
//! with `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes` (three masters, a
//! replica each), and waits until every node says `cluster_state:ok` and the three replicas say
//! `master_link_status:up` (a replica that never synced cannot take over). A node timeout of 1 s
//! makes a replica take over 2 to 3 s after its master is killed ([`PrivateCluster::kill`]); no
//! diskless-sync delay lets the replicas sync at once. Every node is SIGKILLed when the cluster
//! is dropped (also on a panic), or when the caller dies, and its directory removed.
//!
//! The free functions ask one node on loopback, with a fresh connection bounded by 500 ms, and
//! work on any cluster whose nodes listen there: [`keyslot`], [`cluster_nodes`] (parsed by
//! [`parse_nodes`]), [`master_of`], [`cluster_ok`], [`query`] for any other command.
//!
//! # Example
//!
//! ```no_run
//! use admission_testkit::redis_servers::{self, PrivateCluster};
//!
//! # fn main() -> std::io::Result<()> {
//! let binary = redis_servers::redis_server_on_path().expect("redis-server on PATH");
//! let mut cluster = PrivateCluster::start(&binary)?;
//! let seeds = cluster.seeds(); // for `RedisAdmissionConfig::cluster`, say
//! // ... connect clients to `seeds` and put them under load, then fail a master over:
//! let port = cluster.ports()[0];
//! let master = redis_servers::master_of(port, "admission:{cell}:cfg").expect("a master");
//! assert!(cluster.kill(master));
//! # drop(seeds);
//! # Ok(())
//! # }
//! ```

use std::ffi::OsString;
use std::fmt::Display;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The cluster's nodes: three masters and three replicas.
const NODES: usize = 6;
/// Its replicas, one per master.
const REPLICAS: usize = NODES / 2;
/// What each node is started with besides its port, address, directory and log.
const NODE_ARGS: [&str; 10] = [
    "--save",
    "",
    "--appendonly",
    "no",
    "--cluster-enabled",
    "yes",
    "--cluster-node-timeout",
    "1000",
    // A replica syncs at once (no 5 s wait for more replicas to share a transfer).
    "--repl-diskless-sync-delay",
    "0",
];
/// How long `redis-cli --cluster create` may take.
const CREATE_WITHIN: Duration = Duration::from_secs(30);
/// How long the cluster may take, once created, to be ok with every replica in sync.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How often readiness is polled.
const POLL: Duration = Duration::from_millis(50);
/// The bound on connecting to a node and on its reply to one command.
const QUERY_TIMEOUT: Duration = Duration::from_millis(500);

/// The watchdog a private server runs under, `sh -c WATCHDOG sh BINARY ARGS...`: the server in
/// the background of the shell (its child, stdin `/dev/null`), its pid said on stdout, then the
/// shell hands its stdout back (so that the pipe closes when the server exits) and reads its own
/// stdin to the end: the caller closed the pipe, or died. Then it SIGKILLs the server and reaps
/// it.
const WATCHDOG: &str = "\"$@\" </dev/null & pid=$!
echo \"watchdog: server pid $pid\"
exec >/dev/null
read -r _
kill -9 \"$pid\" 2>/dev/null
wait \"$pid\"
";

/// What the watchdog says on stdout before the server's pid.
const PID_LINE: &str = "watchdog: server pid ";

/// The guard of a private directory, `sh -c DIR_GUARD sh DIR`: it reads its stdin to the end
/// (the caller closed the pipe, or died), then removes the directory, trying again every 0.1 s
/// for up to 5 s while a server killed at the same moment may still be writing in it.
const DIR_GUARD: &str = "read -r _
i=0
while [ -e \"$1\" ] && [ \"$i\" -lt 50 ]; do
  rm -rf \"$1\" 2>/dev/null || sleep 0.1
  i=$((i + 1))
done
";

/// `redis-server` on PATH, if any.
pub fn redis_server_on_path() -> Option<PathBuf> {
    on_path("redis-server")
}

/// A six-node Redis Cluster of the caller's own on loopback: three masters with a replica each,
/// every node a [`PrivateServer`], SIGKILLed when the cluster is dropped or the caller dies (see
/// the module docs).
pub struct PrivateCluster {
    nodes: Vec<PrivateServer>,
}

impl PrivateCluster {
    /// Starts six nodes of `binary` (`redis-server`), joins them with the `redis-cli` beside it
    /// (or on PATH) and waits until the cluster is ready (see the module docs). The nodes are in
    /// the caller's process group, so a Ctrl-C at the terminal stops them too.
    ///
    /// # Errors
    ///
    /// When `redis-cli` is not found, a node cannot be started, or the cluster cannot be created
    /// or is not ready within 30 s; the nodes already started are stopped.
    pub fn start(binary: &Path) -> io::Result<PrivateCluster> {
        PrivateCluster::start_with(binary, false)
    }

    /// As [`start`](PrivateCluster::start), but every node runs in a process group of its own:
    /// a Ctrl-C at the terminal reaches the caller and not the nodes, which stay up until the
    /// cluster is dropped or the caller exits (for a program that forwards signals and stops in
    /// order).
    ///
    /// # Errors
    ///
    /// As for [`start`](PrivateCluster::start).
    pub fn start_in_own_process_group(binary: &Path) -> io::Result<PrivateCluster> {
        PrivateCluster::start_with(binary, true)
    }

    fn start_with(binary: &Path, own_group: bool) -> io::Result<PrivateCluster> {
        let cli = find_cli(binary).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "a private Redis Cluster is created with redis-cli, which is not beside \
                 redis-server or on PATH (`apt-get install redis-tools`)",
            )
        })?;
        let mut cluster = PrivateCluster { nodes: Vec::new() };
        for port in free_ports(NODES)? {
            let node = PrivateServer::start_with(binary, port, &NODE_ARGS, own_group)
                .map_err(|e| context(e, format!("cluster node 127.0.0.1:{port}")))?;
            cluster.nodes.push(node);
        }
        cluster.create(&cli)?;
        cluster.wait_ready()?;
        Ok(cluster)
    }

    /// Every node's port, killed or not, in the order they were started.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(PrivateServer::port).collect()
    }

    /// Every node, killed or not, as `("127.0.0.1", port)`: the seed nodes a client is given
    /// (`admission_redis::RedisAdmissionConfig::cluster`).
    pub fn seeds(&self) -> Vec<(String, u16)> {
        self.nodes
            .iter()
            .map(|n| ("127.0.0.1".to_owned(), n.port()))
            .collect()
    }

    /// The process id of the node (its `redis-server`) on `port`, if it runs.
    pub fn pid(&self, port: u16) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .and_then(PrivateServer::pid)
    }

    /// SIGKILLs the node on `port`, as a crash would, and waits for it to be gone; false if no
    /// running node of the cluster listens there.
    pub fn kill(&mut self, port: u16) -> bool {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .is_some_and(PrivateServer::kill)
    }

    /// The slot of `key` ([`keyslot`], asked of the first running node that answers).
    pub fn keyslot(&self, key: &str) -> Option<u16> {
        self.alive().find_map(|p| keyslot(p, key))
    }

    /// The cluster's nodes as the first running node that answers sees them
    /// ([`cluster_nodes`]).
    pub fn view(&self) -> Option<Vec<ClusterNode>> {
        self.alive().find_map(cluster_nodes)
    }

    /// Whether every running node says `cluster_state:ok`.
    pub fn all_ok(&self) -> bool {
        self.alive().all(cluster_ok)
    }

    /// The ports of the nodes still running.
    fn alive(&self) -> impl Iterator<Item = u16> + '_ {
        self.nodes
            .iter()
            .filter(|n| n.pid().is_some())
            .map(PrivateServer::port)
    }

    /// `redis-cli --cluster create` over the six nodes, bounded by [`CREATE_WITHIN`], its output
    /// in the first node's directory, `create.log`.
    fn create(&self, cli: &Path) -> io::Result<()> {
        let Some(first) = self.nodes.first() else {
            return Err(io::Error::other("a cluster of no node"));
        };
        let log = first.dir().join("create.log");
        let out =
            File::create(&log).map_err(|e| context(e, format!("creating {}", log.display())))?;
        let err = out.try_clone().map_err(|e| context(e, "the create log"))?;
        let mut command = Command::new(cli);
        command.args(["--cluster", "create"]);
        for node in &self.nodes {
            command.arg(format!("127.0.0.1:{}", node.port()));
        }
        let mut child = command
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| context(e, format!("starting {}", cli.display())))?;
        let deadline = Instant::now() + CREATE_WITHIN;
        let status = loop {
            if let Some(status) = child
                .try_wait()
                .map_err(|e| context(e, "waiting for redis-cli"))?
            {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-cli --cluster create did not finish within {} s (see {})",
                        CREATE_WITHIN.as_secs(),
                        log.display()
                    ),
                ));
            }
            std::thread::sleep(POLL);
        };
        if !status.success() {
            let said = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = said.lines().rev().take(5).collect();
            return Err(io::Error::other(format!(
                "redis-cli --cluster create exited with {status}: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            )));
        }
        Ok(())
    }

    /// Waits until every node says `cluster_state:ok` and [`REPLICAS`] nodes say
    /// `master_link_status:up`, at most [`READY_WITHIN`].
    fn wait_ready(&self) -> io::Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let ok = self.alive().filter(|&p| cluster_ok(p)).count();
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
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the private Redis Cluster was not ready within {} s: {ok} of {NODES} \
                         nodes say cluster_state:ok, {synced} of {REPLICAS} replicas in sync",
                        READY_WITHIN.as_secs()
                    ),
                ));
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Spawns `command`, a `redis-server` on `port` whose log goes to its stdout (`--logfile ""`,
/// stdout piped), and waits until it says it is ready to accept connections; a thread then
/// drains its log so that it never blocks on a full pipe. The server is the returned child
/// itself, with no watchdog: it outlives a caller that dies without killing it (a
/// [`PrivateServer`] does not).
///
/// # Errors
///
/// When it cannot be spawned, or exits before it is ready (its port taken, say).
pub fn spawn_until_ready(command: &mut Command, port: u16) -> io::Result<Child> {
    let mut child = command.spawn()?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::other("redis-server's output could not be read"));
    };
    if read_until_ready(stdout, false).is_none() {
        let status = child.wait().ok();
        return Err(io::Error::other(format!(
            "redis-server exited before it was ready ({}); is port {port} free?",
            status.map_or_else(|| "status unknown".to_owned(), |s| s.to_string())
        )));
    }
    Ok(child)
}

/// Reads a server's log from `stdout` until it says it is ready to accept connections (and, with
/// `pid`, until its watchdog said the server's pid too), then hands the rest to a thread that
/// drains it. The pid (0 without `pid`), or `None` if the output ended first.
fn read_until_ready(stdout: impl io::Read + Send + 'static, pid: bool) -> Option<u32> {
    let mut lines = BufReader::new(stdout).lines();
    let (mut ready, mut said) = (false, (!pid).then_some(0));
    while !(ready && said.is_some()) {
        let line = lines.next()?.ok()?;
        if line.contains("Ready to accept connections") {
            ready = true;
        } else if let Some(n) = line.strip_prefix(PID_LINE) {
            said = n.trim().parse().ok();
        }
    }
    std::thread::spawn(move || for _ in lines {});
    said
}

/// One `redis-server` of the caller's own on loopback, in a fresh temporary directory of its own;
/// SIGKILLed when dropped or when the caller dies, however it dies, and its directory removed
/// (see the module docs).
pub struct PrivateServer {
    port: u16,
    /// `redis-server` and every argument it is started with.
    command: Vec<OsString>,
    /// Whether it runs in a process group of its own.
    own_group: bool,
    /// The server under its watchdog, while it runs.
    running: Option<Watched>,
    /// Its directory, removed after the server stopped (a field dropped after `Drop::drop` ran).
    dir: GuardedDir,
}

impl PrivateServer {
    /// Starts `binary` (`redis-server`) on loopback `port` with `args` after its own (`--port`,
    /// `--bind 127.0.0.1`, `--logfile ""`: its log on a pipe, and `--dir`, a fresh temporary
    /// directory), under its watchdog, in a process group of its own (a Ctrl-C at the terminal
    /// reaches the caller, not the server), and waits until it says it is ready. A thread drains
    /// its log.
    ///
    /// # Errors
    ///
    /// When `sh` or the server cannot be started, or the server exits before it is ready (its
    /// port taken, say); nothing is left running and the directory is removed.
    pub fn start(binary: &Path, port: u16, args: &[&str]) -> io::Result<PrivateServer> {
        PrivateServer::start_with(binary, port, args, true)
    }

    fn start_with(
        binary: &Path,
        port: u16,
        args: &[&str],
        own_group: bool,
    ) -> io::Result<PrivateServer> {
        let dir = GuardedDir::new()?;
        let mut command: Vec<OsString> = vec![binary.into()];
        for arg in ["--port", &port.to_string(), "--bind", "127.0.0.1"] {
            command.push(arg.into());
        }
        command.extend(["--logfile".into(), "".into(), "--dir".into()]);
        command.push(dir.path.clone().into());
        command.extend(args.iter().map(OsString::from));
        let running = Watched::spawn(&command, own_group)
            .map_err(|e| context(e, format!("starting {} on port {port}", binary.display())))?;
        Ok(PrivateServer {
            port,
            command,
            own_group,
            running: Some(running),
            dir,
        })
    }

    /// The port it listens on (loopback).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id of the `redis-server`, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.running.as_ref().map(|r| r.pid)
    }

    /// Its directory (`--dir`): removed when this is dropped or the caller dies.
    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    /// SIGKILLs the server, as a crash would, and waits until it is gone (its port free again);
    /// its directory stays. False if it was not running.
    pub fn kill(&mut self) -> bool {
        self.running.take().is_some_and(|mut running| {
            running.stop();
            true
        })
    }

    /// Starts the server again on its port, with its directory and arguments (so that it loads
    /// what it persisted there), and waits until it is ready; a running server is killed first.
    ///
    /// # Errors
    ///
    /// As for [`start`](PrivateServer::start); the server is then not running.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let running = Watched::spawn(&self.command, self.own_group)
            .map_err(|e| context(e, format!("starting redis-server again on {}", self.port)))?;
        self.running = Some(running);
        Ok(())
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A server running under its watchdog (see [`WATCHDOG`]).
struct Watched {
    /// The watchdog shell: the server's parent.
    shell: Child,
    /// The write end of the watchdog's stdin; closing it stops the server.
    pipe: Option<ChildStdin>,
    /// The server's process id.
    pid: u32,
}

impl Watched {
    /// Starts `command` (the server and its arguments, its log on stdout) under a watchdog and
    /// waits until the server says it is ready; on any error the watchdog is stopped.
    fn spawn(command: &[OsString], own_group: bool) -> io::Result<Watched> {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .args(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        #[cfg(unix)]
        if own_group {
            std::os::unix::process::CommandExt::process_group(&mut sh, 0);
        }
        #[cfg(not(unix))]
        let _ = own_group;
        let mut shell = sh.spawn().map_err(|e| context(e, "starting sh"))?;
        let pipe = shell.stdin.take();
        let stdout = shell.stdout.take();
        let mut watched = Watched {
            shell,
            pipe,
            pid: 0,
        };
        match stdout.and_then(|out| read_until_ready(out, true)) {
            Some(pid) => {
                watched.pid = pid;
                Ok(watched)
            }
            None => {
                watched.stop();
                Err(io::Error::other(
                    "redis-server exited before it was ready (is its port free?)",
                ))
            }
        }
    }

    /// Closes the watchdog's pipe and waits for it: the server is SIGKILLed and reaped by then.
    fn stop(&mut self) {
        drop(self.pipe.take());
        let _ = self.shell.wait();
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A fresh temporary directory and its guard (see [`DIR_GUARD`]): removed when this is dropped,
/// or by the guard when the caller dies.
struct GuardedDir {
    path: PathBuf,
    /// The guard and the write end of its stdin.
    guard: Option<(Child, ChildStdin)>,
}

impl GuardedDir {
    fn new() -> io::Result<GuardedDir> {
        let path = tempfile::Builder::new()
            .prefix("admission-redis-")
            .tempdir()
            .map_err(|e| context(e, "creating a directory for redis-server"))?
            .keep();
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(DIR_GUARD)
            .arg("sh")
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // A Ctrl-C at the terminal must not end the guard before the caller.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut guarded = GuardedDir { path, guard: None };
        let mut child = command
            .spawn()
            .map_err(|e| context(e, "starting sh to guard redis-server's directory"))?;
        match child.stdin.take() {
            Some(pipe) => guarded.guard = Some((child, pipe)),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::other("the directory guard's stdin"));
            }
        }
        Ok(guarded)
    }
}

impl Drop for GuardedDir {
    fn drop(&mut self) {
        if let Some((mut child, pipe)) = self.guard.take() {
            drop(pipe);
            let _ = child.wait();
        }
        // Without a guard (it could not be started), or if it gave up: remove it here.
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// `error` with `what` said before it.
fn context(error: io::Error, what: impl Display) -> io::Error {
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

/// `name` on PATH, if any.
fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|p| p.join(name))
        .find(|p| p.is_file())
}

/// `redis-cli` beside `binary`, else on PATH.
fn find_cli(binary: &Path) -> Option<PathBuf> {
    let beside = binary.with_file_name("redis-cli");
    if beside.is_file() {
        return Some(beside);
    }
    on_path("redis-cli")
}

/// The cluster bus port of a node listening on `port`: 10,000 above it, if that is a port.
fn bus_port(port: u16) -> Option<u16> {
    port.checked_add(10_000)
}

/// `n` free loopback ports whose bus ports are free too (each bound meanwhile, so that none is
/// picked twice nor is another's bus port).
fn free_ports(n: usize) -> io::Result<Vec<u16>> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..n * 50 {
        if ports.len() == n {
            break;
        }
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| context(e, "finding a free port"))?;
        let port = listener
            .local_addr()
            .map_err(|e| context(e, "finding a free port"))?
            .port();
        held.push(listener);
        if let Some(bus) = bus_port(port)
            && let Ok(bus_listener) = TcpListener::bind(("127.0.0.1", bus))
        {
            held.push(bus_listener);
            ports.push(port);
        }
    }
    if ports.len() < n {
        return Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!(
                "found {} of {n} free ports with a free cluster bus port",
                ports.len()
            ),
        ));
    }
    Ok(ports)
}

/// `command`'s reply from the node on loopback `port`, on a fresh connection bounded by 500 ms
/// (connecting, and each of the write and the read); `None` when it cannot be had.
pub fn query<T: redis::FromRedisValue>(port: u16, command: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut conn = client.get_connection_with_timeout(QUERY_TIMEOUT).ok()?;
    conn.set_read_timeout(Some(QUERY_TIMEOUT)).ok()?;
    conn.set_write_timeout(Some(QUERY_TIMEOUT)).ok()?;
    command.query(&mut conn).ok()
}

/// The slot of `key` (`CLUSTER KEYSLOT`, asked of the node on loopback `port`).
pub fn keyslot(port: u16, key: &str) -> Option<u16> {
    query(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
}

/// The cluster's nodes as the node on loopback `port` sees them (`CLUSTER NODES`, parsed by
/// [`parse_nodes`]).
pub fn cluster_nodes(port: u16) -> Option<Vec<ClusterNode>> {
    query::<String>(port, redis::cmd("CLUSTER").arg("NODES")).map(|text| parse_nodes(&text))
}

/// The port of the master that serves `key`, as the node on loopback `port` sees the cluster;
/// `None` while none does (its master failed and no replica took over yet) or the node does not
/// answer.
pub fn master_of(port: u16, key: &str) -> Option<u16> {
    let slot = keyslot(port, key)?;
    let nodes = cluster_nodes(port)?;
    master_of_slot(&nodes, slot).map(|n| n.port)
}

/// Whether the node on loopback `port` says `cluster_state:ok` (`CLUSTER INFO`).
pub fn cluster_ok(port: u16) -> bool {
    query::<String>(port, redis::cmd("CLUSTER").arg("INFO"))
        .is_some_and(|info| info_field(&info, "cluster_state") == Some("ok"))
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
    /// The host it takes clients on.
    pub host: String,
    /// The port it takes clients on.
    pub port: u16,
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

    /// Where it takes clients: `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
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
            let (host, port) = address.rsplit_once(':')?;
            if host.is_empty() || host.contains(['/', '@']) {
                return None;
            }
            let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
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
                host: host.to_owned(),
                port,
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
                host: "127.0.0.1".into(),
                port: 40_003,
                master: true,
                failing: false,
                slots: vec![(10_923, 16_383)],
            }
        );
        assert_eq!(nodes[2].address(), "127.0.0.1:40003");
        assert!(!nodes[3].master && nodes[3].slots.is_empty());
        // Single slots, importing and migrating entries, a node without an address, junk.
        let odd = parse_nodes(
            "x 127.0.0.1:7000@17000 master - 0 0 1 connected 5 7-9 [10->-y] [11-<-z]\n\
             y :0@0 master,noaddr - 0 0 0 disconnected\n\
             z 127.0.0.1:0@0 master - 0 0 0 disconnected\n\
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
        let port = |slot| master_of_slot(&before, slot).map(|n| n.port);
        assert_eq!(port(0), Some(40_001));
        assert_eq!(port(5_461), Some(40_002));
        assert_eq!(port(10_922), Some(40_002));
        assert_eq!(port(16_383), Some(40_003));
        let serving: Vec<u16> = serving_masters(&before).iter().map(|n| n.port).collect();
        assert_eq!(serving, [40_001, 40_002, 40_003]);

        // After the failover the slot is the promoted replica's; the dead master serves none.
        let after = parse_nodes(NODES_AFTER);
        assert_eq!(master_of_slot(&after, 7_000).map(|n| n.port), Some(40_006));
        let serving: Vec<u16> = serving_masters(&after).iter().map(|n| n.port).collect();
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

    /// `redis-server` on PATH; `None` (the test skips) without one, but under `CI=true`.
    fn binary(test: &str) -> Option<PathBuf> {
        let found = redis_server_on_path();
        if found.is_none() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: redis-server is not on PATH under CI=true"
            );
            eprintln!("{test}: skipped: redis-server is not on PATH");
        }
        found
    }

    /// Polls `done` every 10 ms for up to 5 s; whether it came true.
    fn within_5_s(mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    #[test]
    fn a_private_server_restarts_on_its_port_and_directory_and_dies_when_its_pipe_closes() {
        let Some(binary) = binary("private_server") else {
            return;
        };
        let port = free_ports(1).unwrap()[0];
        let args = [
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ];
        let mut server = PrivateServer::start(&binary, port, &args).unwrap();
        let get = || query::<Option<String>>(port, redis::cmd("GET").arg("k"));
        let pid = server.pid().unwrap();
        let runs = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
        // The pid is the server's, not its watchdog's.
        if cfg!(target_os = "linux") {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap();
            assert!(String::from_utf8_lossy(&cmdline).contains("redis-server"));
        }
        let set: Option<String> = query(port, redis::cmd("SET").arg("k").arg("v"));
        assert_eq!(set.as_deref(), Some("OK"));

        // Killed: gone (reaped by its watchdog), its port free, its directory kept.
        let dir = server.dir().to_owned();
        assert!(server.kill());
        assert!(!server.kill());
        assert_eq!(server.pid(), None);
        assert_eq!(get(), None);
        if cfg!(target_os = "linux") {
            assert!(!runs(pid));
        }
        assert!(dir.is_dir());
        // Started again on the same port, from the same directory.
        server.restart().unwrap();
        assert_eq!(get(), Some(Some("v".to_owned())));

        // The caller's ends of the pipes closed, as when the caller dies: the watchdog kills the
        // server and the guard removes the directory, with nothing else done here.
        let pid = server.pid().unwrap();
        let running = server.running.as_mut().unwrap();
        drop(running.pipe.take());
        if cfg!(target_os = "linux") {
            assert!(within_5_s(|| !runs(pid)), "the server outlived its pipe");
        }
        assert!(within_5_s(|| get().is_none()));
        let (mut guard, pipe) = server.dir.guard.take().unwrap();
        drop(pipe);
        assert!(
            within_5_s(|| !dir.exists()),
            "the directory outlived its pipe"
        );
        let _ = guard.wait();
        drop(server);
        assert!(!dir.exists());
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
