//! The integration tests of `admission-redis`, against real `redis-server`s: the one `cargo xtask
//! ci` starts (`ADMISSION_REDIS_URL`), and private ones for stopping, restarting, TLS and a crash.

mod cluster;
mod config;
mod fair_line;
mod faults;
mod fleet;
mod leases;
mod line;
mod metrics;
mod rates;
mod readme;
mod real_time;
mod recovery;
mod rules;
mod servers;
mod slices;
mod support;
