//! [`ConfigError`]: a configuration that cannot work, refused at construction with the field named.

/// A limiter's configuration was refused; nothing was built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {limiter} configuration: `{field}` {reason}")]
pub struct ConfigError {
    /// The limiter family ("counting gate", "token bucket", ...).
    pub limiter: &'static str,
    /// The offending field, as named in the builder.
    pub field: &'static str,
    /// What is wrong with it, with the value seen.
    pub reason: String,
}

impl ConfigError {
    /// A refusal of `field` of a `limiter`.
    pub fn new(
        limiter: &'static str,
        field: &'static str,
        reason: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            limiter,
            field,
            reason: reason.into(),
        }
    }
}
