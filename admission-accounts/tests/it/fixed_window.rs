//! fixed_window tests (in progress)
