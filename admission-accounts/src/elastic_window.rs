//! elastic_window (in progress)
