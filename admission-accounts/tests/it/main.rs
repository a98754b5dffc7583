//! The account families' integration tests: one binary, one module per family, plus a monitor
//! scenario that mixes all four in one demand.

mod counting_gate;
mod elastic_window;
mod fixed_window;
mod memory_gate;
mod mixed;
mod model_spec;
mod provider;
mod rate_limit_info;
mod spend;
mod status;
mod token_bucket;
