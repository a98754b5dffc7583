//! The provider layer's integration tests: one binary, one module per part (model specs and
//! catalogs, the limiter factory and registry, rate-limit headers, the spend cap).

mod model_spec;
mod provider;
mod rate_limit_info;
mod spend;
