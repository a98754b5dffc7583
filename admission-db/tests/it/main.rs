//! The integration tests of `admission-db`: one binary, one module per part.

mod registry;
mod session;
