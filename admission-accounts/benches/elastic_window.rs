//! elastic_window benches (in progress)
fn main() {}
