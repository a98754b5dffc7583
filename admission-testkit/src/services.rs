//! Where the real servers of the tests are: the Redis and PostgreSQL that `cargo xtask ci` (and
//! `cargo xtask with-services -- ...`) start and announce in `ADMISSION_REDIS_URL` and
//! `ADMISSION_PG_URL`.
//!
//! A test asks with its own name. When the variable is unset the test fails, saying how to run
//! it: a test that passed without its server would prove nothing. A plain `cargo nextest run`
//! does not run these tests at all: the workspace's nextest profile leaves them out by default
//! (`.config/nextest.toml`), and nextest reports them as skipped, with their count;
//! `cargo xtask test` starts the servers and runs them (`--profile services`).
//!
//! # Examples
//!
//! ```
//! use admission_testkit::services;
//!
//! fn a_test_against_redis() {
//!     let (host, port) = services::redis("a_test_against_redis");
//!     // ... connect to host:port ...
//!     # let _ = (host, port);
//! }
//! # let _ = a_test_against_redis;
//! assert_eq!(
//!     services::host_and_port("redis://127.0.0.1:6390/"),
//!     Some(("127.0.0.1".to_owned(), 6390))
//! );
//! ```

/// The shared Redis server's host and port, from `ADMISSION_REDIS_URL` (`redis://host:port/`).
///
/// # Panics
///
/// When the variable is unset (the test fails, saying how to start the server), or is not
/// `redis://host:port`.
pub fn redis(test: &str) -> (String, u16) {
    let url = url_of(test, "ADMISSION_REDIS_URL", "Redis");
    host_and_port(&url)
        .unwrap_or_else(|| panic!("{test}: ADMISSION_REDIS_URL is {url:?}, not redis://host:port"))
}

/// The shared Redis Cluster's nodes, from `ADMISSION_REDIS_CLUSTER` (`host:port`, comma
/// separated).
///
/// # Panics
///
/// When the variable is unset (the test fails, saying how to start the cluster), or a node is
/// not `host:port`.
pub fn redis_cluster(test: &str) -> Vec<(String, u16)> {
    url_of(test, "ADMISSION_REDIS_CLUSTER", "a Redis Cluster")
        .split(',')
        .map(|node| {
            host_and_port(node).unwrap_or_else(|| {
                panic!("{test}: ADMISSION_REDIS_CLUSTER names {node:?}, not host:port")
            })
        })
        .collect()
}

/// The shared PostgreSQL server's connection URL, from `ADMISSION_PG_URL`.
///
/// # Panics
///
/// When the variable is unset (the test fails, saying how to start the server).
pub fn postgres(test: &str) -> String {
    url_of(test, "ADMISSION_PG_URL", "PostgreSQL")
}

/// A program a test runs as its server (`redis-server`, say), from `PATH`.
///
/// # Panics
///
/// When it is not on `PATH` (the test fails, saying how to install it).
pub fn program(test: &str, name: &str, package: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|path| path.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "{test}: needs {name}, which is not on PATH (apt-get install {package};                  `.ci/run` and `cargo xtask ci` install it)"
            )
        })
}

/// `host` and `port` of a `scheme://host:port/` URL.
pub fn host_and_port(url: &str) -> Option<(String, u16)> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (host, port) = rest.trim_end_matches('/').rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

fn url_of(test: &str, variable: &str, server: &str) -> String {
    match std::env::var(variable) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "{test}: needs {server}, and {variable} is unset: run it through `cargo xtask test` \
             (or `cargo xtask with-services -- CMD`), which starts {server} and sets it \
             (xtask/src/services.rs); a plain `cargo nextest run` skips it"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::host_and_port;

    #[test]
    fn a_url_gives_its_host_and_port() {
        assert_eq!(
            host_and_port("redis://127.0.0.1:6390/"),
            Some(("127.0.0.1".to_owned(), 6390))
        );
        assert_eq!(
            host_and_port("redis://[::1]:7000"),
            Some(("[::1]".to_owned(), 7000))
        );
        assert_eq!(
            host_and_port("127.0.0.1:1"),
            Some(("127.0.0.1".to_owned(), 1))
        );
        assert_eq!(host_and_port("redis://127.0.0.1/"), None);
        assert_eq!(host_and_port("redis://h:99999"), None);
    }
}
