//! gate_and_bucket benches (in progress)
fn main() {}
