//! The package of the `axum` example (`axum.rs`): a service where every request holds its whole
//! demand (a connection to the model provider, the model's tokens and one request, a SQLite
//! connection), admitted at once by `admission-tower`'s layer. Run it with
//! `cargo run --example axum`.
//!
//! Each example is a package of its own, depending only on what it uses, so that its first run
//! builds no other example's dependencies. Nothing here is published.
