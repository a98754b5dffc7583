//! fixed_window (in progress)
