//! The account families' integration tests: one binary, one module per family, plus a monitor
//! scenario that mixes the families in one demand.

mod counting_gate;
mod elastic_window;
mod fair_shares;
mod fixed_window;
mod levels;
mod memory_gate;
mod mixed;
mod status;
mod token_bucket;
