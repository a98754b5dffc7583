//! counting_gate tests (in progress)
