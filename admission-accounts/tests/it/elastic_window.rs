//! elastic_window tests (in progress)
