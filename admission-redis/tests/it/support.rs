//! What every test here shares: the server `cargo xtask ci` started (`ADMISSION_REDIS_URL`), a
//! fresh cell per test, private servers for the tests that stop, restart or reconfigure one, and
//! a blocking read of the events stream (tests wait for records, never for time to pass).
//!
//! Without its server a test fails, saying how to start it (`admission_testkit::services`); a
//! plain `cargo nextest run` skips these tests, `cargo xtask test` runs them.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use admission_redis::{Ceilings, FleetEvent, RedisAdmission, RedisAdmissionConfig, read_events};
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamReadOptions, StreamReadReply};

/// The shared server's host and port, or `None` (after saying why) when unset outside CI.
///
/// # Panics
///
/// When unset under `CI=true`.
pub(crate) fn server(test: &str) -> (String, u16) {
    admission_testkit::services::redis(test)
}

/// A cell no other test (or earlier run) uses.
pub(crate) fn cell(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name: String = test
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(32)
        .collect();
    format!(
        "{name}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn ceilings(
    service_bytes: u64,
    service_transfers: u64,
    tenant_bytes: u64,
    tenant_transfers: u64,
    backend_transfers: u64,
) -> Ceilings {
    Ceilings {
        service_bytes,
        service_transfers,
        tenant_bytes,
        tenant_transfers,
        backend_transfers,
    }
}

/// A config for `cell` on `host:port` with a 3 s TTL renewed every second, a 300 ms connect
/// timeout and a 700 ms response timeout (together, one renewal interval).
pub(crate) fn config(
    host: &str,
    port: u16,
    cell: &str,
    ceilings: Ceilings,
) -> RedisAdmissionConfig {
    let mut config = RedisAdmissionConfig::new(host, port, cell, ceilings);
    config.key_prefix = "it".into();
    config.lease_ttl = Duration::from_secs(3);
    config.renew_every = Duration::from_secs(1);
    // A renewal that meets a dead connection ends before the next is due.
    config.connect_timeout = Duration::from_millis(300);
    config.response_timeout = Duration::from_millis(700);
    // Every test's cell is new (its name is unique): nothing can hold a lease of it from before.
    config.recover_created_cells = false;
    config
}

pub(crate) async fn connect(config: RedisAdmissionConfig) -> RedisAdmission {
    RedisAdmission::connect(config)
        .await
        .expect("connects to the test server")
}

/// The kinds of the cell's events, oldest first.
pub(crate) async fn kinds(admission: &RedisAdmission) -> Vec<String> {
    read_events(admission)
        .await
        .expect("reads events")
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

/// The lease ids of the cell's events of `kind`, oldest first.
pub(crate) async fn leases_of(admission: &RedisAdmission, kind: &str) -> Vec<String> {
    read_events(admission)
        .await
        .expect("reads events")
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.lease)
        .collect()
}

/// Blocks (on the server, `XREAD BLOCK`) until a record of `kind` for `lease` appears, and
/// returns it; fails after 10 s.
pub(crate) async fn wait_for_event(
    admission: &RedisAdmission,
    host: &str,
    port: u16,
    kind: &str,
    lease: &str,
) -> FleetEvent {
    let mut conn = blocking_connection(host, port).await;
    wait_for_event_on(&mut conn, admission, kind, lease).await
}

/// A connection without a response timeout, for `XREAD BLOCK`.
pub(crate) async fn blocking_connection(host: &str, port: u16) -> MultiplexedConnection {
    let client = redis::Client::open(format!("redis://{host}:{port}/")).expect("client");
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connects")
}

/// [`wait_for_event`] on a connection the caller keeps (from [`blocking_connection`]).
pub(crate) async fn wait_for_event_on(
    conn: &mut MultiplexedConnection,
    admission: &RedisAdmission,
    kind: &str,
    lease: &str,
) -> FleetEvent {
    let mut last = "0-0".to_string();
    loop {
        let options = StreamReadOptions::default().block(10_000).count(100);
        let reply: Option<StreamReadReply> = redis::AsyncCommands::xread_options(
            conn,
            &[admission.events_key()],
            &[&last],
            &options,
        )
        .await
        .expect("xread");
        let Some(reply) = reply else {
            panic!("no {kind} event for {lease} within 10 s")
        };
        for stream in reply.keys {
            for record in stream.ids {
                last = record.id.clone();
                let k: Option<String> = record.get("kind");
                let l: Option<String> = record.get("lease");
                if k.as_deref() == Some(kind) && l.as_deref() == Some(lease) {
                    let events = read_events(admission).await.expect("reads events");
                    return events
                        .into_iter()
                        .find(|e| e.id == record.id)
                        .expect("the record");
                }
            }
        }
    }
}

/// A `redis-server` of a test's own, for tests that stop, restart or reconfigure one. Started
/// in the foreground as a child process on a free loopback port, ready once it logs so.
pub(crate) struct PrivateRedis {
    child: Option<Child>,
    pub(crate) port: u16,
    args: Vec<String>,
    _dir: tempfile::TempDir,
}

pub(crate) fn redis_server_binary(test: &str) -> PathBuf {
    admission_testkit::services::program(test, "redis-server", "redis-server")
}

impl PrivateRedis {
    /// Starts a server with `extra` arguments (`--port` is chosen here unless `extra` sets
    /// `--tls-port`, in which case the chosen port is the TLS port and plain TCP is off).
    pub(crate) fn start(binary: &PathBuf, extra: &[String]) -> PrivateRedis {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let tls = extra.iter().any(|a| a == "--tls-cert-file");
        let mut args: Vec<String> = if tls {
            vec![
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string(),
            ]
        } else {
            vec!["--port".into(), port.to_string()]
        };
        args.extend(
            [
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                "",
                "--dir",
            ]
            .map(String::from),
        );
        args.push(dir.path().display().to_string());
        args.extend(extra.iter().cloned());
        let mut server = PrivateRedis {
            child: None,
            port,
            args,
            _dir: dir,
        };
        server.spawn(binary);
        server
    }

    fn spawn(&mut self, binary: &PathBuf) {
        let mut child = Command::new(binary)
            .args(&self.args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts redis-server");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("Ready to accept connections") => break,
                Some(Ok(_)) => continue,
                _ => panic!(
                    "redis-server exited before it was ready: {:?}",
                    child.wait()
                ),
            }
        }
        // Keep draining its log so that it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        self.child = Some(child);
    }

    /// Kills the server (its data is gone: it keeps none).
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub(crate) fn restart(&mut self, binary: &PathBuf) {
        self.stop();
        self.spawn(binary);
    }

    /// Starts it again on the same port, empty, after a [`stop`](PrivateRedis::stop).
    pub(crate) fn start_again(&mut self, binary: &PathBuf) {
        assert!(self.child.is_none(), "start_again after stop");
        self.spawn(binary);
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the server process, as `kill -<signal>` does.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("runs kill");
        assert!(status.success(), "kill -{signal} {pid}: {status}");
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A lease of `bytes` for `id` that must fit now.
pub(crate) async fn lease(
    fleet: &RedisAdmission,
    id: &str,
    tenant: &str,
    backend: &str,
    bytes: u64,
) -> admission_redis::Lease {
    let request = admission_redis::LeaseRequest::new(id, tenant, backend, bytes, "upload");
    fleet.try_acquire(&request).await.expect("fits now")
}

/// The `(dimension, held, asked, ceiling)` of a request that must not fit now.
pub(crate) async fn full(
    fleet: &RedisAdmission,
    id: &str,
    tenant: &str,
    backend: &str,
    bytes: u64,
) -> (admission_redis::Dimension, u64, u64, u64) {
    let request = admission_redis::LeaseRequest::new(id, tenant, backend, bytes, "upload");
    match fleet.try_acquire(&request).await {
        Err(admission_redis::AcquireError::Full {
            dimension,
            held,
            asked,
            ceiling,
            ..
        }) => (dimension, held, asked, ceiling),
        other => panic!("{id}: expected no room now, got {other:?}"),
    }
}

/// `acquire` of `bytes` for `id` on a task, waiting at most `wait`.
pub(crate) fn spawn_acquire(
    fleet: &RedisAdmission,
    id: &str,
    tenant: &str,
    backend: &str,
    bytes: u64,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<admission_redis::Lease, admission_redis::AcquireError>> {
    let fleet = fleet.clone();
    let request = admission_redis::LeaseRequest::new(id, tenant, backend, bytes, "upload");
    tokio::spawn(async move { fleet.acquire(&request, wait).await })
}

/// `acquire` of `request` on a task, waiting at most `wait`.
pub(crate) fn spawn_request(
    fleet: &RedisAdmission,
    request: admission_redis::LeaseRequest,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<admission_redis::Lease, admission_redis::AcquireError>> {
    let fleet = fleet.clone();
    tokio::spawn(async move { fleet.acquire(&request, wait).await })
}

/// Runs the ignored test `test` of this binary as a second OS process with `var` set to
/// `value`, and returns it once it printed a line starting with `marker` (and that line).
pub(crate) fn child_process(test: &str, var: &str, value: &str, marker: &str) -> (Child, String) {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", test, "--ignored", "--nocapture"])
        .env(var, value)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starts the child");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = loop {
        match lines.next() {
            Some(Ok(line)) if line.starts_with(marker) => break line,
            Some(Ok(_)) => {}
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{test} ended before it printed {marker:?}");
            }
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, line)
}

/// Script calls (`EVALSHA`) the server at `port` has counted since its last `CONFIG RESETSTAT`.
pub(crate) async fn script_calls(port: u16) -> u64 {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("info");
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Waits until none of `keys` exists any more (the server expires them); fails after 10 s.
pub(crate) async fn wait_until_gone(conn: &mut MultiplexedConnection, keys: &[String]) {
    let started = std::time::Instant::now();
    loop {
        let existing: u64 = redis::cmd("EXISTS")
            .arg(keys)
            .query_async(conn)
            .await
            .expect("exists");
        if existing == 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{existing} of the keys still exist after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `lease:outcome` of every admission in the cell's stream, in order.
pub(crate) async fn admissions(fleet: &RedisAdmission) -> Vec<String> {
    read_events(fleet)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.kind == "admitted")
        .map(|e| format!("{}:{}", e.lease, e.outcome))
        .collect()
}
