//! [`ModelSpec`]: what one model endpoint allows, loaded from JSON or TOML and checked on load.
//!
//! A spec is the unit the [`provider`](crate::provider) layer builds limiters from: one token
//! bucket per spec id, a model gate where the spec caps concurrency, an elastic window where it
//! configures one, and the prices that turn a call's tokens into [`Money`].
//!
//! Specs are checked as they are loaded, and a refusal names the model and the field: a value of
//! the wrong type or out of range with its path, line and column ([`SpecError::Value`], read
//! through `serde_path_to_error`), a value that breaks a rule ([`SpecError::Invalid`]):
//!
//! ```
//! use admission_llm::model_spec::ModelCatalog;
//!
//! let refused = ModelCatalog::from_toml(r#"
//!     [[models]]
//!     id = "gpt-4o"
//!     wire_model = "gpt-4o-2024-08-06"
//!     tokens_per_minute = 0
//! "#).unwrap_err();
//! assert_eq!(
//!     refused.to_string(),
//!     "model spec `gpt-4o`: `tokens_per_minute` must be positive, was 0"
//! );
//! ```

mod load;

use std::collections::BTreeSet;
use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use admission_accounts::elastic_window::ElasticWindowConfig;
use admission_core::FairShares;
use serde::{Deserialize, Serialize};

use crate::spend::Money;

/// What one model endpoint allows and costs.
///
/// The `id` names the limiters; the `wire_model` is what goes in the request. Two endpoint
/// variants of one wire model (a regional deployment, a batch tier) are two specs with two ids,
/// and so two buckets.
///
/// # Examples
///
/// ```
/// use admission_llm::model_spec::ModelSpec;
///
/// let spec: ModelSpec = serde_json::from_str(r#"{
///     "id": "claude-sonnet",
///     "wire_model": "claude-sonnet-4-5",
///     "tokens_per_minute": 400000,
///     "max_concurrent": 8,
///     "input_micros_per_million": 3000000,
///     "output_micros_per_million": 15000000
/// }"#).unwrap();
/// spec.validate().unwrap();
/// // No requests-per-minute published: a thousandth of the token budget.
/// assert_eq!(spec.effective_requests_per_minute(), 400);
/// // 2,000 tokens in and 1,000 out cost 0.006 + 0.015.
/// assert_eq!(spec.price(2_000, 1_000).micros(), 21_000);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The key of this spec's limiters; unique within a catalog.
    pub id: String,
    /// The model name sent on the wire.
    pub wire_model: String,
    /// Tokens per minute the provider allows this endpoint.
    pub tokens_per_minute: u64,
    /// Requests per minute, when the provider publishes one; otherwise
    /// [`effective_requests_per_minute`](ModelSpec::effective_requests_per_minute) derives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// The most calls in flight at once, when the endpoint caps concurrency: a model gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u64>,
    /// The price of a million input tokens, in micro-units of money.
    #[serde(default)]
    pub input_micros_per_million: u64,
    /// The price of a million output tokens, in micro-units of money.
    #[serde(default)]
    pub output_micros_per_million: u64,
    /// A sliding window of calls in front of the endpoint, when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowSpec>,
}

/// A sliding window of at most `max_requests` calls per `window`, which the provider layer builds
/// as an [`ElasticWindow`](admission_accounts::ElasticWindow) for the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowSpec {
    /// The most calls started within one window.
    pub max_requests: u64,
    /// The window's length, written as a duration ("60s", "1m", "500ms").
    #[serde(with = "humantime_serde_shim")]
    pub window: Duration,
}

impl WindowSpec {
    /// The elastic window configuration this spec describes, with the family's defaults for
    /// everything else.
    pub fn config(&self) -> ElasticWindowConfig {
        ElasticWindowConfig::new(self.max_requests, self.window)
    }
}

/// The request budget of a spec that publishes none: a thousandth of its token budget.
pub const REQUESTS_PER_TOKEN_BUDGET: u64 = 1_000;

impl ModelSpec {
    /// A spec of `id` sending `wire_model`, allowing `tokens_per_minute`, with nothing else set.
    pub fn new(
        id: impl Into<String>,
        wire_model: impl Into<String>,
        tokens_per_minute: u64,
    ) -> ModelSpec {
        ModelSpec {
            id: id.into(),
            wire_model: wire_model.into(),
            tokens_per_minute,
            requests_per_minute: None,
            max_concurrent: None,
            input_micros_per_million: 0,
            output_micros_per_million: 0,
            window: None,
        }
    }

    /// The same spec publishing `requests_per_minute`.
    pub fn with_requests_per_minute(mut self, requests_per_minute: u64) -> ModelSpec {
        self.requests_per_minute = Some(requests_per_minute);
        self
    }

    /// The same spec capping calls in flight at `max_concurrent`.
    pub fn with_max_concurrent(mut self, max_concurrent: u64) -> ModelSpec {
        self.max_concurrent = Some(max_concurrent);
        self
    }

    /// The same spec priced per million input and output tokens, in micro-units.
    pub fn with_prices(mut self, input_per_million: u64, output_per_million: u64) -> ModelSpec {
        self.input_micros_per_million = input_per_million;
        self.output_micros_per_million = output_per_million;
        self
    }

    /// The same spec with a sliding window of `max_requests` calls per `window`.
    pub fn with_window(mut self, max_requests: u64, window: Duration) -> ModelSpec {
        self.window = Some(WindowSpec {
            max_requests,
            window,
        });
        self
    }

    /// The request budget the bucket is seeded with: the published one, or
    /// `tokens_per_minute / 1000` (at least one) when none is published.
    pub fn effective_requests_per_minute(&self) -> u64 {
        self.requests_per_minute
            .unwrap_or((self.tokens_per_minute / REQUESTS_PER_TOKEN_BUDGET).max(1))
    }

    /// What a call of `input_tokens` in and `output_tokens` out costs, each side rounded up to a
    /// whole micro-unit, saturating.
    pub fn price(&self, input_tokens: u64, output_tokens: u64) -> Money {
        Money::per_million(input_tokens, self.input_micros_per_million).saturating_add(
            Money::per_million(output_tokens, self.output_micros_per_million),
        )
    }

    /// Checks every field; the first problem found is refused with the field named.
    ///
    /// # Errors
    ///
    /// [`SpecError::Invalid`] for an empty `id` or `wire_model`, a zero `tokens_per_minute`,
    /// `requests_per_minute` or `max_concurrent`, or a window the elastic window family refuses.
    pub fn validate(&self) -> Result<(), SpecError> {
        let invalid = |field: &'static str, reason: String| SpecError::Invalid {
            model: self.id.clone(),
            field,
            reason,
        };
        if self.id.trim().is_empty() {
            return Err(invalid("id", "must not be empty".into()));
        }
        if self.wire_model.trim().is_empty() {
            return Err(invalid("wire_model", "must not be empty".into()));
        }
        if self.tokens_per_minute == 0 {
            return Err(invalid(
                "tokens_per_minute",
                "must be positive, was 0".into(),
            ));
        }
        if self.requests_per_minute == Some(0) {
            return Err(invalid(
                "requests_per_minute",
                "must be positive when given, was 0 (leave it out to derive it from tokens_per_minute)"
                    .into(),
            ));
        }
        if self.max_concurrent == Some(0) {
            return Err(invalid(
                "max_concurrent",
                "must be positive when given, was 0 (leave it out for no model gate)".into(),
            ));
        }
        if let Some(window) = &self.window {
            window.config().validate().map_err(|error| {
                invalid(
                    match error.field {
                        "max_requests" => "window.max_requests",
                        "base_window" => "window.window",
                        _ => "window",
                    },
                    error.reason,
                )
            })?;
        }
        Ok(())
    }
}

/// A list of specs as written in a file: `{"models": [...]}` in JSON, `[[models]]` tables in TOML.
///
/// # Examples
///
/// ```
/// use admission_llm::model_spec::ModelCatalog;
///
/// let catalog = ModelCatalog::from_toml(r#"
///     [[models]]
///     id = "gpt-4o"
///     wire_model = "gpt-4o"
///     tokens_per_minute = 30000
///     requests_per_minute = 500
///     input_micros_per_million = 2500000
///     output_micros_per_million = 10000000
///
///     [[models]]
///     id = "gpt-4o-eu"
///     wire_model = "gpt-4o"
///     tokens_per_minute = 10000
///     window = { max_requests = 20, window = "10s" }
/// "#).unwrap();
/// assert_eq!(catalog.models.len(), 2);
/// assert_eq!(catalog.models[1].effective_requests_per_minute(), 10);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCatalog {
    /// The specs, in file order.
    #[serde(default)]
    pub models: Vec<ModelSpec>,
}

impl ModelCatalog {
    /// Reads and validates a JSON catalog.
    ///
    /// # Errors
    ///
    /// [`SpecError::Parse`] when the text is not JSON; [`SpecError::Value`] naming the model,
    /// the field's path and the line when a value has the wrong type or is out of range (a
    /// number no float holds, `1e400`, included: serde_json calls that a syntax error, this
    /// does not), or a field is unknown or missing; else as [`ModelCatalog::validate`].
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_llm::model_spec::{ModelCatalog, ModelRef, SpecError};
    ///
    /// let refused = ModelCatalog::from_json(r#"{"models": [
    ///     {"id": "gpt-4o", "wire_model": "gpt-4o", "tokens_per_minute": 1.5}
    /// ]}"#).unwrap_err();
    /// assert!(matches!(
    ///     &refused,
    ///     SpecError::Value { model: Some(ModelRef::Id(id)), path, line: Some(2), .. }
    ///         if id == "gpt-4o" && path == "models[0].tokens_per_minute"
    /// ));
    /// assert_eq!(
    ///     refused.to_string(),
    ///     "model spec `gpt-4o`: `models[0].tokens_per_minute` invalid type: floating point \
    ///      `1.5`, expected u64 (JSON line 2, column 69)"
    /// );
    /// ```
    pub fn from_json(text: &str) -> Result<ModelCatalog, SpecError> {
        let catalog = load::from_json(text)?;
        catalog.validate()?;
        Ok(catalog)
    }

    /// Reads and validates a TOML catalog.
    ///
    /// # Errors
    ///
    /// [`SpecError::Parse`] when the text is not TOML; [`SpecError::Value`] naming the model,
    /// the field's path, the line and the column when a value has the wrong type or is out of
    /// range, or a field is unknown or missing; else as [`ModelCatalog::validate`].
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_llm::model_spec::ModelCatalog;
    ///
    /// let refused = ModelCatalog::from_toml(r#"
    /// [[models]]
    /// id = "gpt-4o"
    /// wire_model = "gpt-4o"
    /// tokens_per_minute = -1
    /// "#).unwrap_err();
    /// assert_eq!(
    ///     refused.to_string(),
    ///     "model spec `gpt-4o`: `models[0].tokens_per_minute` invalid value: integer `-1`, \
    ///      expected u64 (TOML line 5, column 21)"
    /// );
    /// ```
    pub fn from_toml(text: &str) -> Result<ModelCatalog, SpecError> {
        let catalog = load::from_toml(text)?;
        catalog.validate()?;
        Ok(catalog)
    }

    /// `shares` with every model's tokens named scarce at its capacity, its tokens per minute
    /// ([`FairShares::capacity`]; the provider layer names a model's token bucket by its id):
    /// tenants then share each model in its own tokens, and a call's cost is its dominant share,
    /// the largest fraction of a model's minute it asks. Add other accounts' capacities to the
    /// result the same way (a database pool's connections, say); an account without one counts
    /// nothing in a job's cost.
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use admission_core::{FairShares, Monitor};
    /// use admission_llm::model_spec::ModelCatalog;
    ///
    /// let catalog = ModelCatalog::from_json(r#"{"models": [
    ///     {"id": "gpt-4o", "wire_model": "gpt-4o", "tokens_per_minute": 400000},
    ///     {"id": "mini", "wire_model": "gpt-4o-mini", "tokens_per_minute": 2000000}
    /// ]}"#)?;
    /// let shares = catalog.fair_shares(FairShares::new().weight("acme", 3)?);
    /// assert_eq!(shares.capacity_of("gpt-4o"), NonZeroU64::new(400_000));
    /// assert_eq!(shares.capacity_of("mini"), NonZeroU64::new(2_000_000));
    /// let monitor = Monitor::builder().fair_shares(shares).build();
    /// # drop(monitor);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fair_shares(&self, shares: FairShares) -> FairShares {
        self.models.iter().fold(shares, |shares, spec| {
            match NonZeroU64::new(spec.tokens_per_minute) {
                Some(capacity) => shares.capacity(spec.id.as_str(), capacity),
                // Refused by `validate`: a catalog read from a file never has one.
                None => shares,
            }
        })
    }

    /// Validates every spec, then checks that no id repeats.
    ///
    /// # Errors
    ///
    /// The first spec's [`SpecError::Invalid`], or one naming the field `id` of a repeated id.
    pub fn validate(&self) -> Result<(), SpecError> {
        let mut seen = BTreeSet::new();
        for spec in &self.models {
            spec.validate()?;
            if !seen.insert(spec.id.as_str()) {
                return Err(SpecError::Invalid {
                    model: spec.id.clone(),
                    field: "id",
                    reason:
                        "appears twice in the catalog (ids key the limiters and must be unique)"
                            .into(),
                });
            }
        }
        Ok(())
    }
}

/// A model spec or catalog that cannot be used; nothing was loaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// A field of one spec is wrong.
    #[error("model spec `{model}`: `{field}` {reason}")]
    Invalid {
        /// The spec's id (empty when the id itself is missing).
        model: String,
        /// The field, as written in the file (`window.max_requests` for a nested one).
        field: &'static str,
        /// What is wrong, with the value seen.
        reason: String,
    },
    /// A value in the catalog's text has the wrong type or is out of range (`-1`, `1.5` or
    /// `"1000"` for a count, a number past `u64::MAX` or past what a float holds, `1e400`,
    /// `"soon"` for a duration), or a field is unknown or missing (the path is then the table
    /// the field is missing from, and the message names the field).
    #[error(
        "{}: `{path}` {message} ({format}{})",
        subject(.model),
        position(*.line, *.column)
    )]
    Value {
        /// `JSON` or `TOML`.
        format: &'static str,
        /// The model the value belongs to; `None` for a value outside every model (`models`
        /// itself, or an unknown top-level field).
        model: Option<ModelRef>,
        /// Where the value sits, from the catalog's root: `models[1].tokens_per_minute`,
        /// `models[0].window.window`.
        path: String,
        /// The line the parser placed the error on, from 1; `None` only when it placed it
        /// nowhere.
        line: Option<usize>,
        /// The column on that line, from 1: where the value starts in TOML; in JSON, where
        /// serde_json stopped reading (the value's last character, or just past it).
        column: Option<usize>,
        /// What is wrong, with the value seen (the deserializer's words).
        message: String,
    },
    /// The text is not a catalog at all: not JSON or TOML, or not a table at its root.
    #[error("model catalog is not valid {format}{}: {message}", position(*.line, *.column))]
    Parse {
        /// `JSON` or `TOML`.
        format: &'static str,
        /// The line of the error, from 1, when the parser placed it.
        line: Option<usize>,
        /// The column of the error on that line, from 1, when the parser placed it.
        column: Option<usize>,
        /// The parser's message, without the position.
        message: String,
    },
}

/// Which model of a catalog a [`SpecError::Value`] is about.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelRef {
    /// The model's `id`, as written.
    Id(String),
    /// The model's position in `models`, from 0, when its `id` cannot be read (missing, not a
    /// string, or the text too broken to read it).
    Index(usize),
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelRef::Id(id) => write!(f, "`{id}`"),
            ModelRef::Index(index) => write!(f, "at index {index}"),
        }
    }
}

/// Who a [`SpecError::Value`] is about, as its message opens.
fn subject(model: &Option<ModelRef>) -> String {
    match model {
        Some(model) => format!("model spec {model}"),
        None => "model catalog".to_owned(),
    }
}

/// ` line 4, column 21`, or nothing when the parser placed the error nowhere.
fn position(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(line), Some(column)) => format!(" line {line}, column {column}"),
        (Some(line), None) => format!(" line {line}"),
        _ => String::new(),
    }
}

/// Durations written as "60s", "1m30s", "250ms" in catalogs, through `humantime`.
mod humantime_serde_shim {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(
        value: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(*value).to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text)
            .map_err(|error| D::Error::custom(format!("`{text}` is not a duration: {error}")))
    }
}
