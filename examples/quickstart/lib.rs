//! The package of the `quickstart` example (`quickstart.rs`): eight jobs share three HTTP
//! connections and a model's tokens and requests per minute, each asking for all of it at once,
//! every event printed. Run it with `cargo run --example quickstart`.
//!
//! Each example is a package of its own, depending only on what it uses, so that its first run
//! builds no other example's dependencies. Nothing here is published.
