//! counting_gate (in progress)
