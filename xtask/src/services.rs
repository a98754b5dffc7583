//! The integration services (Redis, PostgreSQL) that the test steps may need, started and stopped
//! by the xtask itself: nothing runs before a session or a CI job, and nothing is left behind.
//!
//! Each service gets a fresh temporary directory and a free loopback port (bind port 0, read it
//! back), so two runs on one machine never collide. Its URL reaches the tests through an
//! environment variable:
//!
//! | service      | variable              | value                                          |
//! |--------------|-----------------------|------------------------------------------------|
//! | Redis        | `ADMISSION_REDIS_URL` | `redis://127.0.0.1:PORT/`                      |
//! | PostgreSQL   | `ADMISSION_PG_URL`    | `postgres://postgres@127.0.0.1:PORT/postgres`  |
//!
//! A started service is stopped by its pid (SIGTERM for Redis, SIGINT, "fast shutdown", for
//! PostgreSQL; SIGKILL if it has not exited after a grace period) and its directory removed, when
//! [`Running::stop`] is called or, on any early return or panic, when the [`Running`] value is
//! dropped. A run killed by a signal (Ctrl-C) cannot clean up: the log line printed at start
//! names the pid and the directory.
//!
//! # Enabling a service
//!
//! [`REQUIRED`] lists what `cargo xtask ci` and `cargo xtask test` start around the test steps:
//! Redis, for `admission-redis`, and PostgreSQL, for `admission-db`'s providers over it
//! (features `r2d2-postgres`, `deadpool-postgres`, `sqlx-postgres`). A test that needs a service reads its variable;
//! when it is unset (plain `cargo test`) it prints that it was skipped and why, except under
//! `CI=true`, where it fails. `.ci/run` installs `redis-server` and `postgresql` when they are
//! missing, and fails when either is still missing after that. `cargo xtask with-services -- CMD ...`
//! starts both, whatever [`REQUIRED`] says, to run one command against them by hand.
//!
//! # How each service is started
//!
//! - Redis: `redis-server --port PORT --bind 127.0.0.1 --save '' --appendonly no --daemonize yes
//!   --pidfile DIR/redis.pid --logfile DIR/redis.log`, ready once it answers `PING`.
//! - PostgreSQL: `initdb -D DIR/data -U postgres -A trust --no-sync -E UTF8 --locale=C.UTF-8`, then
//!   `pg_ctl -D DIR/data -l DIR/server.log -w -t 30 -o "-p PORT -c listen_addresses=127.0.0.1 -k
//!   DIR -c fsync=off" start`. `initdb` refuses to run as root, so as root both run through
//!   `runuser -u postgres --` and DIR is handed to that user. The binaries are looked up in
//!   `$PG_BIN`, then `/usr/lib/postgresql/15/bin` (Debian's place), then the newest
//!   `/usr/lib/postgresql/*/bin`, then `PATH`.

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

/// The services started around the test steps of `ci` and `test`: Redis, for `admission-redis`,
/// and PostgreSQL, for `admission-db`'s providers over it. See the module docs.
pub(crate) const REQUIRED: &[Service] = &[Service::Redis, Service::Postgres];

/// Every service this module knows how to run.
pub(crate) const ALL: &[Service] = &[Service::Redis, Service::Postgres];

/// One kind of integration service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Service {
    /// A throwaway `redis-server` on loopback, no persistence.
    Redis,
    /// A throwaway PostgreSQL cluster on loopback, user `postgres`, trust authentication.
    Postgres,
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Service::Redis => "redis",
            Service::Postgres => "postgres",
        })
    }
}

/// Services that are up; they are stopped by [`Running::stop`] or, failing that, on drop.
#[derive(Default)]
pub(crate) struct Running {
    /// Stopped in reverse order of start.
    instances: Vec<Instance>,
}

impl Running {
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

/// Starts `services` in order. If one fails, those already started are stopped again.
pub(crate) fn start(services: &[Service]) -> Result<Running> {
    let mut running = Running::default();
    for &service in services {
        // Dropped, and so cleaned up, if starting fails.
        let mut instance = Instance::new(service)?;
        match service {
            Service::Redis => start_redis(&mut instance),
            Service::Postgres => start_postgres(&mut instance),
        }
        .with_context(|| format!("could not start {service}"))?;
        println!(
            "==> services: {service} at {} (pid {}, dir {})",
            instance.url,
            instance.pid.unwrap_or(0),
            instance.dir.display()
        );
        running.instances.push(instance);
    }
    Ok(running)
}

/// One service's directory, port and process; stopped and removed on [`Instance::stop`] or drop.
struct Instance {
    service: Service,
    /// A scratch directory that holds the service's data, sockets and logs.
    dir: PathBuf,
    port: u16,
    /// Where the daemon (Redis server, PostgreSQL postmaster) writes its pid.
    pidfile: PathBuf,
    /// The daemon's pid once it is up. A daemon that failed half-way is found through `pidfile`.
    pid: Option<u32>,
    /// The signal that asks the daemon to shut down cleanly.
    stop_signal: &'static str,
    env_var: &'static str,
    url: String,
    /// Set by the first `stop`, which makes later ones (and drop) do nothing.
    stopped: bool,
}

impl Instance {
    /// A fresh directory and a free port for `service`; nothing runs yet.
    fn new(service: Service) -> Result<Self> {
        let dir = scratch_dir(&service.to_string())?;
        let port = match free_port() {
            Ok(port) => port,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let (pidfile, stop_signal, env_var, url) = match service {
            Service::Redis => (
                dir.join("redis.pid"),
                "TERM",
                "ADMISSION_REDIS_URL",
                format!("redis://127.0.0.1:{port}/"),
            ),
            Service::Postgres => (
                dir.join("data").join("postmaster.pid"),
                // SIGINT is PostgreSQL's "fast shutdown": disconnect clients, then exit.
                "INT",
                "ADMISSION_PG_URL",
                format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            ),
        };
        Ok(Self {
            service,
            dir,
            port,
            pidfile,
            pid: None,
            stop_signal,
            env_var,
            url,
            stopped: false,
        })
    }

    /// Signals the daemon (if it ever started), waits for it to exit, then removes the
    /// directory. Idempotent.
    fn stop(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.stopped, true) {
            return Ok(());
        }
        if let Some(pid) = self.pid.or_else(|| read_pid(&self.pidfile)) {
            stop_pid(pid, self.stop_signal, Duration::from_secs(20)).with_context(|| {
                format!(
                    "could not stop {} (pid {pid}, dir {})",
                    self.service,
                    self.dir.display()
                )
            })?;
        }
        // Only now: the directory (and its logs) stays if the process might still be running.
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
    let (dir, port) = (&instance.dir, instance.port);
    let log = dir.join("redis.log");
    let status = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "yes"])
        .arg("--pidfile")
        .arg(&instance.pidfile)
        .arg("--logfile")
        .arg(&log)
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
            tail(&dir.join("redis-server.err"), &log)
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = read_pid(&instance.pidfile)
            && redis_ping(port)
        {
            instance.pid = Some(pid);
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "redis-server did not answer PING on port {port} within 10s; {}",
                tail(&log, &log)
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
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
    let (dir, port) = (&instance.dir, instance.port);
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

    let pid = read_pid(&instance.pidfile)
        .context("pg_ctl reported success but postmaster.pid has no pid")?;
    instance.pid = Some(pid);
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

/// Sends `signal` to `pid`, waits up to `grace` for it to exit, then sends SIGKILL.
fn stop_pid(pid: u32, signal: &str, grace: Duration) -> Result<()> {
    signal_pid(pid, signal)?;
    if wait_exit(pid, grace) {
        return Ok(());
    }
    signal_pid(pid, "KILL")?;
    if wait_exit(pid, Duration::from_secs(5)) {
        bail!("pid {pid} ignored SIG{signal} for {grace:?} and was killed");
    }
    bail!("pid {pid} is still running after SIGKILL");
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
