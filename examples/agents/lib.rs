//! The package of the `agents` example (`main.rs` and its modules): a fleet of LLM agents
//! against a simulated provider, in one process or as a fleet of processes sharing Redis. Run it
//! with `cargo run --release --example agents`.
//!
//! Each example is a package of its own, depending only on what it uses, so that its first run
//! builds no other example's dependencies. Nothing here is published.
