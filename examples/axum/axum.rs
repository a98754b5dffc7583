//! An axum service where every request holds its whole demand, admitted at once by the tower
//! layer: an HTTP connection to the model provider, the model's tokens and one request (built by
//! `Registry::demand_for`), and a connection of a SQLite pool (`R2d2SqliteProvider`'s gate). The
//! grant lives in the response body, so nothing is given back before the answer is sent. A
//! refusal is an HTTP status: 503 with `Retry-After` on a timeout (the layer's estimate of how
//! long its line takes to drain) and, at once, for a request the line ahead would keep past the
//! timeout anyway, or for a waiter the line can no longer serve in time (`LineBound::ExpectedWait`
//! of the timeout less half a second; `--no-shed` lets every request wait), 400 for a request no
//! demand can be built from, 422 (never retried, even when the line is long) for one that can
//! never fit the model's budget, its body naming the account, what was asked and the capacity.
//!
//! The write is a `POST` (a `GET` or `HEAD` of it is answered 405 before any admission), its
//! `tokens` parameter read by axum's `Query` extractor (percent-encoded values are decoded), and
//! `GET /status` shows the line's waiters and every account's numbers as JSON. Connections are
//! served by hyper with a header-read timeout, so a client that sends part of a request and
//! stalls is closed instead of holding a connection open.
//!
//! Run it with `cargo run --example axum` and try
//! `curl -i -X POST 'http://127.0.0.1:3000/summarize?tokens=800'` and
//! `curl 'http://127.0.0.1:3000/status'`; `--self-test 24` sends 24 requests of its own at once,
//! prints their statuses and exits (non-zero on an unexpected one).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use admission_core::{Account as _, Amount, Demand, JobContext, Monitor};
use admission_db::DbHandle as _;
use admission_db::DbResourceProvider as _;
use admission_db::r2d2_sqlite::{R2d2SqliteProvider, SqliteManager};
use admission_llm::{ModelCatalog, Registry};
use admission_tower::{AdmissionLayer, DemandError, LineBound, Waited};
use anyhow::Context as _;
use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use clap::Parser;
use r2d2_sqlite::SqliteConnectionManager;
use serde::Deserialize;
use tokio::net::TcpListener;

/// The model every request calls, its budget, and the other limits.
const CATALOG: &str = r#"
    [[models]]
    id = "small"
    wire_model = "small-2026"
    tokens_per_minute = 60000
    requests_per_minute = 600
    max_concurrent = 4
    input_micros_per_million = 150000
    output_micros_per_million = 600000
"#;
const MODEL: &str = "small";
/// The answer's declared most tokens, charged with the prompt at the grant.
const MAX_OUTPUT_TOKENS: u64 = 200;
/// Connections to the model provider.
const HTTP_CONNECTIONS: u64 = 8;
/// Requests holding a database connection at once (the pool has one more, for the host).
const DB_BOUND: u64 = 3;
/// The longest a request waits for its demand.
const ADMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much shorter than the timeout the line ahead of a request may be expected to take.
const SHED_MARGIN: Duration = Duration::from_millis(500);
/// The longest a client may take to send a request's headers before its connection is closed.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The prompt's size when the request does not say.
const DEFAULT_TOKENS: u64 = 800;

/// The query of `POST /summarize`.
#[derive(Debug, Deserialize)]
struct Params {
    /// The prompt's size, in tokens.
    tokens: Option<u64>,
}

#[derive(Parser, Debug)]
#[command(
    name = "axum",
    about = "An axum service admitting each request's whole demand"
)]
struct Args {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    /// Send this many requests of its own at once (on a free port), print the statuses, exit.
    #[arg(long)]
    self_test: Option<usize>,
    /// Let every request wait up to the timeout, however long the line (by default a request
    /// the line ahead would keep past the timeout is refused at once: `LineBound`).
    #[arg(long)]
    no_shed: bool,
}

/// What the handler needs: the registry (feedback after the call) and the notes database.
struct App {
    registry: Arc<Registry>,
    notes: Arc<R2d2SqliteProvider>,
}

/// The service: `POST /summarize?tokens=N` behind the admission layer and `GET /status`, on
/// `monitor`, its database in `dir`.
fn app(monitor: &Monitor, dir: &Path, shed: bool) -> anyhow::Result<(Router, Arc<App>)> {
    let clock = monitor.clock().clone();
    let registry = Registry::new(clock.clone()).with_http_connections(HTTP_CONNECTIONS)?;
    registry.register_catalog(&ModelCatalog::from_toml(CATALOG)?)?;
    let manager = SqliteConnectionManager::file(dir.join("notes.sqlite"))
        .with_init(|c| c.execute_batch("PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 5000;"));
    let pool = r2d2::Pool::builder()
        .max_size(u32::try_from(DB_BOUND)? + 1)
        .min_idle(Some(0))
        .build(SqliteManager::new(manager))
        .context("opening the notes database")?;
    pool.get()?
        .execute_batch("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, tokens INTEGER)")
        .context("creating the notes table")?;
    let notes = Arc::new(R2d2SqliteProvider::new("notes", DB_BOUND, pool, clock)?);
    let app = Arc::new(App {
        registry: Arc::new(registry),
        notes,
    });

    // One request's whole demand: the model call's (an HTTP connection, the tokens and one
    // request, a slot of the model's concurrency) and one database connection.
    let demand = {
        let app = app.clone();
        move |request: &Request| -> Result<(Demand, JobContext), DemandError> {
            let tokens = prompt_tokens(request)?;
            let call = app
                .registry
                .demand_for(MODEL, tokens, MAX_OUTPUT_TOKENS)
                .map_err(|e| DemandError::invalid(e.to_string()))?;
            let demand = call.demand.with(app.notes.admission().clone(), Amount::ONE);
            Ok((demand, JobContext::new("summarize")))
        }
    };
    let mut layer = AdmissionLayer::new(monitor.clone(), demand).timeout(ADMIT_TIMEOUT);
    if shed {
        // What the line ahead would keep past the timeout is refused now, not after it (and a
        // waiter the line can no longer serve in time, as soon as the layer sees it); the
        // half second keeps a grant due at the end of the wait clear of the timeout.
        layer = layer.shed(LineBound::ExpectedWait(ADMIT_TIMEOUT - SHED_MARGIN));
    }
    let layer = layer.http_responses();
    // `route_layer`: only a request that matches the route and its method is admitted; a `GET`
    // or `HEAD` of `/summarize` is answered 405 without taking anything.
    let status = {
        let (monitor, app) = (monitor.clone(), app.clone());
        move || {
            let (monitor, app) = (monitor.clone(), app.clone());
            async move { status(&monitor, &app) }
        }
    };
    let router = Router::new()
        .route("/summarize", post(summarize).route_layer(layer))
        .route("/status", get(status))
        .with_state(app.clone());
    Ok((router, app))
}

/// The `tokens` query parameter (the prompt's size), [`DEFAULT_TOKENS`] when absent, read by
/// axum's `Query` extractor.
fn prompt_tokens(request: &Request) -> Result<u64, DemandError> {
    let Query(params) = Query::<Params>::try_from_uri(request.uri())
        .map_err(|rejection| DemandError::invalid(rejection.body_text()))?;
    Ok(params.tokens.unwrap_or(DEFAULT_TOKENS))
}

/// `GET /status`: the line's waiters and every account's status record, as JSON.
fn status(monitor: &Monitor, app: &App) -> (StatusCode, String) {
    let mut accounts = app.registry.status();
    accounts.push(app.notes.admission().status());
    let body = serde_json::json!({
        "waiters": monitor.queue_size(),
        "accounts": accounts,
    });
    (StatusCode::OK, format!("{body}\n"))
}

/// Runs under the grant: "calls" the model, stores a note on a pooled connection, answers.
async fn summarize(
    State(app): State<Arc<App>>,
    Query(params): Query<Params>,
    request: Request,
) -> (StatusCode, String) {
    let waited = request
        .extensions()
        .get::<Waited>()
        .map_or(Duration::ZERO, |w| w.0);
    let tokens = params.tokens.unwrap_or(DEFAULT_TOKENS);
    // The model call would go here; the grant holds its connection, tokens and slot.
    tokio::task::yield_now().await;
    app.registry.on_success(MODEL);
    let notes = app.notes.clone();
    let stored = tokio::task::spawn_blocking(move || -> anyhow::Result<i64> {
        let mut handle = notes.checkout(false)?;
        let id = (|| -> anyhow::Result<i64> {
            handle.begin()?;
            let conn = handle.connection()?;
            conn.execute(
                "INSERT INTO notes (tokens) VALUES (?1)",
                [i64::try_from(tokens)?],
            )?;
            let id = conn.last_insert_rowid();
            handle.commit()?;
            Ok(id)
        })();
        notes.close(&mut handle)?;
        id
    })
    .await;
    match stored {
        Ok(Ok(id)) => (
            StatusCode::OK,
            format!("note {id}: {tokens} tokens summarized after waiting {waited:?}\n"),
        ),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}\n")),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

/// `method path` on a new connection to `addr`: the status and the body.
async fn send_once(addr: SocketAddr, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use http_body_util::{BodyExt as _, Empty};

    let stream = tokio::net::TcpStream::connect(addr).await?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
    let conn = tokio::spawn(conn);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .body(Empty::<bytes::Bytes>::new())?;
    let response = send.send_request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    drop(send);
    conn.await??;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Serves `router` on `listener` until the task is aborted: each connection by hyper's HTTP/1
/// server, closed when its request's headers take longer than `header_read_timeout` to arrive.
async fn serve(listener: TcpListener, router: Router, header_read_timeout: Duration) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(io, service)
                .await;
        });
    }
}

/// Serves `router` on a free loopback port; the address and the server's task.
async fn serve_on_free_port(
    router: Router,
    header_read_timeout: Duration,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    Ok((
        addr,
        tokio::spawn(serve(listener, router, header_read_timeout)),
    ))
}

/// `requests` concurrent requests against a server of its own; the statuses, in order.
async fn self_test(monitor: &Monitor, dir: &Path, requests: usize) -> anyhow::Result<Vec<u16>> {
    let (router, _) = app(monitor, dir, true)?;
    let (addr, server) = serve_on_free_port(router, HEADER_READ_TIMEOUT).await?;
    let calls: Vec<_> = (0..requests)
        .map(|i| {
            tokio::spawn(send_once(
                addr,
                "POST",
                if i % 2 == 0 {
                    "/summarize?tokens=400"
                } else {
                    "/summarize"
                },
            ))
        })
        .collect();
    let mut statuses = Vec::with_capacity(requests);
    for call in calls {
        let (status, body) = call.await??;
        print!("{status} {body}");
        statuses.push(status);
    }
    server.abort();
    Ok(statuses)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let monitor = Monitor::new();
    let dir = tempfile::tempdir().context("a directory for the notes database")?;
    if let Some(requests) = args.self_test {
        let statuses = self_test(&monitor, dir.path(), requests).await?;
        let admitted = statuses.iter().filter(|s| **s == 200).count();
        println!("{admitted} of {requests} admitted and answered");
        monitor.stop();
        anyhow::ensure!(
            admitted == requests,
            "every request should have been admitted"
        );
        return Ok(());
    }
    let (router, _) = app(&monitor, dir.path(), !args.no_shed)?;
    let listener = TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("listening on {}", args.addr))?;
    println!(
        "listening on http://{}; try: curl -i -X POST 'http://{}/summarize?tokens=800'",
        args.addr, args.addr
    );
    tokio::select! {
        () = serve(listener, router, HEADER_READ_TIMEOUT) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    monitor.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_are_all_admitted_and_stored_once_each() {
        let monitor = Monitor::new();
        let dir = tempfile::tempdir().unwrap();
        let statuses = self_test(&monitor, dir.path(), 12).await.unwrap();
        assert_eq!(statuses, vec![200; 12]);
        let (_, app) = app(&monitor, dir.path(), true).unwrap();
        let rows: i64 = app
            .notes
            .pool()
            .get()
            .unwrap()
            .query_row("SELECT COUNT(*) FROM notes", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 12);
        assert_eq!(app.notes.admission().in_use(), 0);
        monitor.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bad_or_impossible_request_is_refused_with_its_status() {
        let monitor = Monitor::new();
        let dir = tempfile::tempdir().unwrap();
        let (router, app) = app(&monitor, dir.path(), true).unwrap();
        let (addr, server) = serve_on_free_port(router, HEADER_READ_TIMEOUT)
            .await
            .unwrap();

        let (status, body) = send_once(addr, "POST", "/summarize?tokens=many")
            .await
            .unwrap();
        assert_eq!(
            (status, body.as_str()),
            (400, "admission refused: invalid\n")
        );
        // More tokens than the model's whole minute: it can never fit, and says by how much.
        let (status, body) = send_once(addr, "POST", "/summarize?tokens=100000")
            .await
            .unwrap();
        let expected = "admission refused: too_large: account `small` asked 100200+1, capacity \
                        60000+600: `small` allows 60000 tokens and 600 requests per minute; a \
                        demand of 100200 tokens and 1 requests can never fit: split it into \
                        smaller calls or use a model with a larger budget\n";
        assert_eq!((status, body.as_str()), (422, expected));
        let (status, body) = send_once(addr, "POST", "/summarize?tokens=100")
            .await
            .unwrap();
        assert_eq!(status, 200);
        assert!(body.starts_with("note 1: 100 tokens summarized"), "{body}");
        assert_eq!(app.notes.admission().in_use(), 0);
        server.abort();
        monitor.stop();
    }

    fn rows(app: &App) -> i64 {
        app.notes
            .pool()
            .get()
            .unwrap()
            .query_row("SELECT COUNT(*) FROM notes", [], |r| r.get(0))
            .unwrap()
    }

    /// A `GET` or `HEAD` of the write is 405 and writes nothing; a percent-encoded parameter is
    /// decoded (`%32%35%30` is 250); `/status` shows no waiter and every account, the database
    /// gate with its one permit back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_write_is_a_post_with_decoded_parameters_and_a_status_route() {
        let monitor = Monitor::new();
        let dir = tempfile::tempdir().unwrap();
        let (router, app) = app(&monitor, dir.path(), true).unwrap();
        let (addr, server) = serve_on_free_port(router, HEADER_READ_TIMEOUT)
            .await
            .unwrap();
        for method in ["GET", "HEAD"] {
            let (status, _) = send_once(addr, method, "/summarize?tokens=100")
                .await
                .unwrap();
            assert_eq!(status, 405, "{method}");
        }
        assert_eq!(rows(&app), 0, "nothing written by a GET or a HEAD");
        let (status, body) = send_once(addr, "POST", "/summarize?tokens=%32%35%30")
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.starts_with("note 1: 250 tokens summarized"), "{body}");
        assert_eq!(rows(&app), 1);

        let (status, body) = send_once(addr, "GET", "/status").await.unwrap();
        assert_eq!(status, 200);
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["waiters"], 0);
        let names: Vec<&str> = status["accounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a["name"].as_str())
            .collect();
        assert!(names.contains(&"http"), "{body}");
        let db = status["accounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "db:notes")
            .unwrap_or_else(|| panic!("no db:notes account in {body}"));
        assert_eq!(
            (&db["max_concurrent"], &db["available_permits"]),
            (&serde_json::json!(3), &serde_json::json!(3)),
            "{body}"
        );
        server.abort();
        monitor.stop();
    }

    /// A client that sends half a request's headers and stalls has its connection closed after
    /// the header-read timeout (0.3 s here), well before a second passes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_partial_request_is_closed_after_the_header_read_timeout() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let monitor = Monitor::new();
        let dir = tempfile::tempdir().unwrap();
        let (router, _app) = app(&monitor, dir.path(), true).unwrap();
        let (addr, server) = serve_on_free_port(router, Duration::from_millis(300))
            .await
            .unwrap();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"POST /summarize?tokens=10 HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buf))
            .await
            .expect("the server closed the connection");
        let elapsed = started.elapsed();
        let answered = String::from_utf8_lossy(&buf);
        assert!(
            read.is_err() || !answered.contains("200 OK"),
            "a half request is never served: {answered:?}"
        );
        assert!(
            elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(3),
            "closed after {elapsed:?}"
        );
        server.abort();
        monitor.stop();
    }
}
