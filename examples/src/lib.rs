//! Runnable examples of admission. Nothing here is published; run one with
//! `cargo run --release --example NAME`.
