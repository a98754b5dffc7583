//! token_bucket (in progress)
