//! token_bucket tests (in progress)
