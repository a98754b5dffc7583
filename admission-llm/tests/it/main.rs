//! The provider layer's integration tests: one binary, one module per part (model specs and
//! catalogs, the limiter factory and registry, rate-limit headers, the spend cap, and the spend
//! cap in the call path).

mod budgeted;
mod model_spec;
mod provider;
mod rate_limit_info;
mod spend;
