//! A PostgreSQL server that shuts down and restarts under the three PostgreSQL providers
//! (deadpool, sqlx, r2d2) while they are in use: a session the pool cannot open is
//! [`DbError::Connect`], the driver's error its source (`tokio_postgres::Error`, alias
//! `postgres::Error`, or `sqlx::Error`), with PostgreSQL's SQLSTATE where the server sent one;
//! the message repeats no cause; and the providers connect again once the server is back.
//!
//! The server is a private one the test starts and stops itself (`initdb`, `pg_ctl`, as the
//! `postgres` user when run as root, as `xtask/src/services.rs` does), on a free loopback port
//! and in a temporary directory: the shared server of `ADMISSION_PG_URL` is never stopped. The
//! test runs where that variable is set (the services, and so PostgreSQL's tools, are there);
//! without it the test fails, saying how to start the services.
//!
//! Every wait is bounded: `pg_ctl` by `-t 30`, the polls by 30 s, each checkout by its timeout.

use std::error::Error as StdError;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_core::{Clock, SystemClock};
use admission_db::deadpool_postgres::DeadpoolPostgresProvider;
use admission_db::r2d2_postgres::{PgManager, R2d2PostgresProvider};
use admission_db::sqlx_postgres::SqlxPgProvider;
use admission_db::{DbError, DbHandle, DbResourceProvider};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use postgres::NoTls;
use postgres::error::SqlState;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::postgres::pg_url;

/// The longest any poll of the server's state waits.
const POLL: Duration = Duration::from_secs(30);

/// A private PostgreSQL cluster on loopback; stopped (immediately) and removed on drop.
struct Server {
    dir: tempfile::TempDir,
    port: u16,
    as_root: bool,
}

impl Server {
    /// `initdb` and `pg_ctl start` on a free port.
    fn start() -> Server {
        let dir = tempfile::Builder::new()
            .prefix("admission-pg-outage")
            .tempdir()
            .unwrap();
        let as_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
        if as_root {
            run(Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir.path()));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = Server { dir, port, as_root };
        run(server
            .tool("initdb")
            .arg("-D")
            .arg(server.data())
            .args(["-U", "postgres", "-A", "trust", "--no-sync"])
            .args(["-E", "UTF8", "--locale=C.UTF-8"]));
        server.up();
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A PostgreSQL tool, as the `postgres` user when we are root.
    fn tool(&self, tool: &str) -> Command {
        let program = pg_bin(tool);
        if self.as_root {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }

    fn pg_ctl(&self) -> Command {
        let mut cmd = self.tool("pg_ctl");
        cmd.arg("-D").arg(self.data());
        cmd
    }

    /// Starts the server and waits until it accepts sessions.
    fn up(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        run(self
            .pg_ctl()
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-w", "-t", "30", "-o", &options, "start"]));
    }

    /// A smart shutdown, not waited for: the server refuses new sessions (`57P03`) until the
    /// sessions it has end, then stops.
    fn begin_smart_shutdown(&self) {
        run(self.pg_ctl().args(["-m", "smart", "-W", "stop"]));
    }

    /// Waits until the server has stopped.
    fn wait_down(&self) {
        let deadline = Instant::now() + POLL;
        loop {
            // `pg_ctl status` exits with 3 when no server runs.
            let status = self.pg_ctl().arg("status").output().unwrap();
            if status.status.code() == Some(3) {
                return;
            }
            assert!(Instant::now() < deadline, "the server did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn config(&self) -> postgres::Config {
        let mut config = postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(5));
        config
    }

    /// Waits until a new session is refused with `state`.
    fn wait_refusing_with(&self, state: &SqlState) {
        let deadline = Instant::now() + POLL;
        loop {
            match self.config().connect(NoTls) {
                Err(e) if e.code() == Some(state) => return,
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "new sessions never got {state:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self
            .pg_ctl()
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .stdin(Stdio::null())
            .output();
    }
}

/// Where PostgreSQL's server tools live: `$PG_BIN`, Debian's versioned directories, or `PATH`
/// (as `xtask/src/services.rs` looks).
fn pg_bin(tool: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return Path::new(&dir).join(tool);
    }
    let debian = Path::new("/usr/lib/postgresql/15/bin").join(tool);
    if debian.exists() {
        return debian;
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
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

/// Runs `cmd`, failing the test with its output unless it succeeds.
fn run(cmd: &mut Command) -> Output {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The three providers over the server, two sessions each, every wait at most 2 s.
struct Providers {
    runtime: tokio::runtime::Runtime,
    deadpool: DeadpoolPostgresProvider,
    sqlx: SqlxPgProvider,
    r2d2: R2d2PostgresProvider,
}

impl Providers {
    fn new(server: &Server) -> Providers {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let timeout = Duration::from_secs(2);
        // Verified recycling: a pooled session the server ended is found dead on checkout.
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(server.port)
            .user("postgres")
            .dbname("postgres");
        let manager = Manager::from_config(
            config,
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Verified,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(2)
            .runtime(Runtime::Tokio1)
            .build()
            .unwrap();
        let deadpool = DeadpoolPostgresProvider::new(
            "deadpool",
            2,
            pool,
            clock.clone(),
            runtime.handle().clone(),
        )
        .unwrap()
        .with_checkout_timeout(timeout);
        let options = PgConnectOptions::new()
            .host("127.0.0.1")
            .port(server.port)
            .username("postgres")
            .database("postgres");
        let pool = {
            let _entered = runtime.enter();
            PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(1))
                .connect_lazy_with(options)
        };
        let sqlx = SqlxPgProvider::new("sqlx", 2, pool, clock.clone(), runtime.handle().clone())
            .unwrap()
            .with_checkout_timeout(timeout);
        let pool = r2d2::Pool::builder()
            .max_size(2)
            .min_idle(Some(0))
            .connection_timeout(timeout)
            .build_unchecked(PgManager::new(server.config()));
        let r2d2 = R2d2PostgresProvider::new("r2d2", 2, pool, clock)
            .unwrap()
            .with_checkout_timeout(timeout);
        Providers {
            runtime,
            deadpool,
            sqlx,
            r2d2,
        }
    }

    fn all(&self) -> [&dyn DbResourceProvider; 3] {
        [&self.deadpool, &self.sqlx, &self.r2d2]
    }
}

/// A transaction committed and the handle closed.
fn commit_one(provider: &dyn DbResourceProvider) {
    let mut handle = provider.acquire(false).unwrap();
    handle.begin().unwrap();
    handle.commit().unwrap();
    handle.close().unwrap();
}

/// `error` as [`DbError::Connect`] of `provider` over `backend`, its message repeating no
/// cause; its source downcast to the driver's error `E`.
fn driver_error<'e, E: StdError + 'static>(
    error: &'e DbError,
    provider: &str,
    backend: &str,
) -> &'e E {
    assert!(
        matches!(error, DbError::Connect { provider: p, backend: b, .. } if p == provider && *b == backend),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        format!("db provider `{provider}`: {backend} could not connect to the database")
    );
    let mut source = error.source();
    while let Some(cause) = source {
        assert!(
            !error.to_string().contains(&cause.to_string()),
            "`{error}` repeats its cause `{cause}`"
        );
        source = cause.source();
    }
    error
        .source()
        .and_then(|s| s.downcast_ref::<E>())
        .unwrap_or_else(|| panic!("the source of {error:?} is not the driver's error"))
}

/// A refused TCP connection under a driver error.
fn refused(mut error: &(dyn StdError + 'static)) -> bool {
    loop {
        if let Some(io) = error.downcast_ref::<io::Error>() {
            return io.kind() == io::ErrorKind::ConnectionRefused;
        }
        match error.source() {
            Some(cause) => error = cause,
            None => return false,
        }
    }
}

#[test]
fn a_server_shutting_down_and_restarting_is_a_connection_failure_with_the_drivers_error() {
    let test =
        "a_server_shutting_down_and_restarting_is_a_connection_failure_with_the_drivers_error";
    // PostgreSQL's programs must be there: the test starts its own server (ADMISSION_PG_URL
    // says the shared one runs, so the machine has them).
    let _ = pg_url(test);
    let server = Server::start();
    let providers = Providers::new(&server);

    // In use: a transaction through each, and one left open on each.
    for provider in providers.all() {
        commit_one(provider);
    }
    let mut open: Vec<Box<dyn DbHandle>> = providers
        .all()
        .iter()
        .map(|provider| {
            let mut handle = provider.acquire(false).unwrap();
            handle.begin().unwrap();
            handle
        })
        .collect();

    // A smart shutdown, held open by one session: new sessions are refused with 57P03. That
    // session then ends every other one, as a fast shutdown would (57P01).
    let mut admin = server.config().connect(NoTls).unwrap();
    server.begin_smart_shutdown();
    server.wait_refusing_with(&SqlState::CANNOT_CONNECT_NOW);
    admin
        .batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .unwrap();

    // The open transactions fail as statements, the driver's error their source.
    for (handle, name) in open.iter_mut().zip(["deadpool", "sqlx", "r2d2"]) {
        let error = handle.commit().unwrap_err();
        assert!(
            matches!(
                &error,
                DbError::Database {
                    operation: "commit",
                    ..
                }
            ),
            "{name}: {error:?}"
        );
        let source = error.source().expect("the driver's error");
        assert!(
            source.is::<tokio_postgres::Error>() || source.is::<sqlx::Error>(),
            "{name}: {source:?}"
        );
        let _ = handle.close();
    }
    drop(open);

    // A new session is refused: the connection variant, SQLSTATE 57P03 on the driver's error.
    let error = providers
        .runtime
        .block_on(providers.deadpool.checkout(false))
        .unwrap_err();
    let driver: &tokio_postgres::Error = driver_error(&error, "deadpool", "deadpool-postgres");
    assert_eq!(
        driver.code(),
        Some(&SqlState::CANNOT_CONNECT_NOW),
        "{driver:?}"
    );

    let error = providers
        .runtime
        .block_on(providers.sqlx.checkout(false))
        .unwrap_err();
    let driver: &sqlx::Error = driver_error(&error, "sqlx", "sqlx-postgres");
    let code = driver.as_database_error().and_then(|db| db.code());
    assert_eq!(code.as_deref(), Some("57P03"), "{driver:?}");

    let error = providers.r2d2.checkout(false).unwrap_err();
    let driver: &postgres::Error = driver_error(&error, "r2d2", "r2d2-postgres");
    assert_eq!(
        driver.code(),
        Some(&SqlState::CANNOT_CONNECT_NOW),
        "{driver:?}"
    );

    // The last session ends, the server stops: a refused connection, under the driver's error.
    drop(admin);
    server.wait_down();
    let error = providers
        .runtime
        .block_on(providers.deadpool.checkout(false))
        .unwrap_err();
    let driver: &tokio_postgres::Error = driver_error(&error, "deadpool", "deadpool-postgres");
    assert!(refused(driver), "{driver:?}");

    let error = providers
        .runtime
        .block_on(providers.sqlx.checkout(false))
        .unwrap_err();
    let driver: &sqlx::Error = driver_error(&error, "sqlx", "sqlx-postgres");
    assert!(refused(driver), "{driver:?}");

    let error = providers.r2d2.checkout(false).unwrap_err();
    let driver: &postgres::Error = driver_error(&error, "r2d2", "r2d2-postgres");
    assert!(refused(driver), "{driver:?}");

    // Back up: every provider connects again.
    server.up();
    for provider in providers.all() {
        commit_one(provider);
    }
    assert_eq!(
        (
            providers.deadpool.checked_out(),
            providers.sqlx.checked_out(),
            providers.r2d2.checked_out()
        ),
        (0, 0, 0)
    );
}
