//! A private `redis-server` for the Redis benches: started on a free loopback port without
//! persistence, ready once it says so, killed when dropped.

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
