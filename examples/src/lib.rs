//! Runnable examples of admission. Nothing here is published; run one with
//! `cargo run --release --example NAME`:
//!
//! - `quickstart` (`quickstart.rs`): eight jobs over a connection gate and a model's token
//!   bucket, every event printed.
//! - `agents` (`agents/`): a fleet of LLM agents against a simulated provider.
