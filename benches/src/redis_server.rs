//! A private `redis-server` for the Redis benches: started on a free loopback port without
//! persistence, ready once it says so, killed when dropped; and [`ServerWork`], what a server
//! says it did (`INFO commandstats` and `INFO cpu`).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

/// A running server of the bench's own.
pub struct RedisServer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl RedisServer {
    /// Starts one.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not on PATH or exits before it is ready: a bench cannot run
    /// without it.
    pub fn start() -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--logfile", ""])
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-server on PATH (apt-get install redis-server)");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("Ready to accept connections") => break,
                Some(Ok(_)) => {}
                _ => panic!("redis-server exited before it was ready"),
            }
        }
        std::thread::spawn(move || for _ in lines {});
        RedisServer { child, port }
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a server did so far, from its reply to `INFO commandstats` (and `INFO cpu` when asked
/// too): calls and microseconds per command, and CPU seconds (user plus system).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServerWork {
    /// `(calls, usec)` by lowercase command name (`fcall`, `evalsha`, ...).
    pub commands: std::collections::BTreeMap<String, (u64, u64)>,
    /// `used_cpu_user` plus `used_cpu_sys`.
    pub cpu_s: f64,
}

impl ServerWork {
    /// Reads an `INFO` reply: `cmdstat_<name>:calls=N,usec=M,...` lines and the CPU lines.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_benches::redis_server::ServerWork;
    ///
    /// let info = "# Commandstats\r\ncmdstat_fcall:calls=12,usec=340,usec_per_call=28.33\r\n\
    ///             # CPU\r\nused_cpu_sys:0.5\r\nused_cpu_user:1.25\r\n";
    /// let work = ServerWork::parse(info);
    /// assert_eq!(work.commands["fcall"], (12, 340));
    /// assert_eq!(work.calls(&ServerWork::default(), "fcall"), 12);
    /// assert_eq!(work.cpu_s, 1.75);
    /// ```
    pub fn parse(info: &str) -> ServerWork {
        let mut work = ServerWork::default();
        for line in info.lines() {
            if let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            {
                let field = |key: &str| {
                    rest.split(',')
                        .find_map(|kv| kv.strip_prefix(key))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .unwrap_or(0)
                };
                work.commands
                    .insert(name.to_owned(), (field("calls="), field("usec=")));
            } else if let Some(v) = line
                .strip_prefix("used_cpu_user:")
                .or_else(|| line.strip_prefix("used_cpu_sys:"))
            {
                work.cpu_s += v.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
        work
    }

    /// Calls of `command` since `before`.
    pub fn calls(&self, before: &ServerWork, command: &str) -> u64 {
        let of = |w: &ServerWork| w.commands.get(command).map_or(0, |c| c.0);
        of(self).saturating_sub(of(before))
    }

    /// Calls and microseconds of every command but `INFO` (the harness's own) since `before`.
    pub fn total(&self, before: &ServerWork) -> (u64, u64) {
        self.commands
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .fold((0, 0), |(calls, usec), (name, (c, u))| {
                let (c0, u0) = before.commands.get(name).copied().unwrap_or((0, 0));
                (calls + c.saturating_sub(c0), usec + u.saturating_sub(u0))
            })
    }
}
