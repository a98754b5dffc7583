//! The Redis a `--fleet` run shares: `--redis HOST:PORT`, or a private `redis-server` the parent
//! starts on a free loopback port (no persistence, its log on stdout) and stops at the end; and
//! the server's count of script calls (`INFO commandstats`), from which the round trips per
//! admitted lease are read.

use std::fmt;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;

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

/// What to say when the fleet needs a Redis and none is there.
pub const INSTALL_HINT: &str = "--fleet needs Redis (7 or later): install redis-server \
     (`apt-get install redis-server`, or your platform's package) so that it is on PATH, \
     or pass --redis HOST:PORT to use a server that is already running";

/// A `redis-server` of this run's own, stopped (killed, it keeps nothing) when dropped.
pub struct PrivateRedis {
    child: Child,
    /// Where it listens.
    pub endpoint: Endpoint,
    _dir: tempfile::TempDir,
}

/// `redis-server` on PATH, if any.
pub fn find_binary() -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|p| p.join("redis-server"))
        .find(|p| p.is_file())
}

impl PrivateRedis {
    /// Starts `binary` on a free loopback port and waits until it says it is ready.
    ///
    /// # Errors
    ///
    /// When it cannot be started or exits before it is ready.
    pub fn start(binary: &PathBuf) -> anyhow::Result<PrivateRedis> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for redis-server")?
            .port();
        let dir = tempfile::tempdir().context("creating redis-server's directory")?;
        let mut child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--logfile", ""])
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("redis-server's output could not be read");
        };
        let mut lines = BufReader::new(stdout).lines();
        let ready = loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("Ready to accept connections") => break true,
                Some(Ok(_)) => {}
                _ => break false,
            }
        };
        if !ready {
            let status = child.wait().ok();
            bail!(
                "redis-server exited before it was ready ({}); is port {port} free?",
                status.map_or_else(|| "status unknown".to_owned(), |s| s.to_string())
            );
        }
        // Keep draining its log so that it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(PrivateRedis {
            child,
            endpoint: Endpoint {
                host: "127.0.0.1".to_owned(),
                port,
            },
            _dir: dir,
        })
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Script calls the server has run (`EVALSHA` and `EVAL`), from `INFO commandstats`.
///
/// # Errors
///
/// When the server cannot be reached.
pub async fn script_calls(endpoint: &Endpoint) -> anyhow::Result<u64> {
    let client = redis::Client::open(format!("redis://{endpoint}/"))
        .with_context(|| format!("a client of {endpoint}"))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("connecting to {endpoint}"))?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .with_context(|| format!("INFO commandstats on {endpoint}"))?;
    Ok(script_calls_in(&info))
}

/// The `calls` of `cmdstat_evalsha` and `cmdstat_eval` in an `INFO commandstats` reply, summed
/// (a command never run has no line: 0).
pub fn script_calls_in(info: &str) -> u64 {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.trim().split_once(':')?;
            if name != "cmdstat_evalsha" && name != "cmdstat_eval" {
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
    fn script_calls_sum_evalsha_and_eval() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=1234,usec=5678,usec_per_call=4.60,rejected_calls=0,failed_calls=2\r\n\
            cmdstat_eval:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_xread:calls=99,usec=1,usec_per_call=0.01,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_evalsha_ro:calls=7,usec=1,usec_per_call=0.14,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(script_calls_in(info), 1_237);
        assert_eq!(script_calls_in("# Commandstats\r\n"), 0);
    }
}
