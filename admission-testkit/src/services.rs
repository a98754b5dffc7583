//! Where the real servers of the tests are: the Redis and PostgreSQL that `cargo xtask ci` (and
//! `cargo xtask with-services -- ...`) start and announce in `ADMISSION_REDIS_URL` and
//! `ADMISSION_PG_URL`.
//!
//! A test asks with its own name. When the variable is unset it is skipped (it says so on
//! stderr and the caller returns), except under `CI=true`, where a missing server is a failure:
//! a CI run that silently skipped its real-server tests would prove nothing.
//!
//! # Examples
//!
//! ```
//! use admission_testkit::services;
//!
//! fn a_test_against_redis() {
//!     let Some((host, port)) = services::redis("a_test_against_redis") else {
//!         return;
//!     };
//!     // ... connect to host:port ...
//!     # let _ = (host, port);
//! }
//! # let _ = a_test_against_redis;
//! assert_eq!(
//!     services::host_and_port("redis://127.0.0.1:6390/"),
//!     Some(("127.0.0.1".to_owned(), 6390))
//! );
//! ```

/// The shared Redis server's host and port, from `ADMISSION_REDIS_URL` (`redis://host:port/`),
/// or `None` after saying on stderr that `test` is skipped.
///
/// # Panics
///
/// When the variable is unset under `CI=true`, or is not `redis://host:port`.
pub fn redis(test: &str) -> Option<(String, u16)> {
    let url = url_of(test, "ADMISSION_REDIS_URL", "Redis")?;
    Some(
        host_and_port(&url).unwrap_or_else(|| {
            panic!("{test}: ADMISSION_REDIS_URL is {url:?}, not redis://host:port")
        }),
    )
}

/// The shared PostgreSQL server's connection URL, from `ADMISSION_PG_URL`, or `None` after
/// saying on stderr that `test` is skipped.
///
/// # Panics
///
/// When the variable is unset under `CI=true`.
pub fn postgres(test: &str) -> Option<String> {
    url_of(test, "ADMISSION_PG_URL", "PostgreSQL")
}

/// `host` and `port` of a `scheme://host:port/` URL.
pub fn host_and_port(url: &str) -> Option<(String, u16)> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (host, port) = rest.trim_end_matches('/').rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

fn url_of(test: &str, variable: &str, server: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").as_deref() == Ok("true") => panic!(
            "{test}: {variable} is unset under CI=true; `cargo xtask ci` starts {server} and sets \
             it (xtask/src/services.rs)"
        ),
        _ => {
            eprintln!(
                "{test}: skipped: {variable} is unset (run `cargo xtask test`, or `cargo xtask \
                 with-services -- cargo nextest run ...`, to start {server})"
            );
            None
        }
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
