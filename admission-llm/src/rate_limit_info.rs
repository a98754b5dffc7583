//! What a provider says about its rate limits: [`RateLimitInfo`], read from the response headers
//! providers send (the OpenAI-style `x-ratelimit-*` family with `retry-after`, and the
//! `anthropic-ratelimit-*` family), or built for a limit that was hit with nothing more known.
//!
//! A successful response's headers are a *capacity* reading: what the limits are and how much is
//! left, nothing hit and nobody asked to wait. A 429's headers are a *rate-limited* reading,
//! which also carries the provider's `retry-after`.
//!
//! Header names are matched without regard to case. Values that cannot be read leave their field
//! `None` (and are logged at debug); reading never panics, whatever bytes arrive.

mod parse;

use std::time::{Duration, SystemTime};

use http::HeaderMap;
use serde::Serialize;

use self::parse::{parse_int, parse_reset, parse_retry_after};

/// How long [`RateLimitInfo::rate_limited`] asks a caller to wait when nothing more is known.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(60);

/// What a reading is about: a capacity reading, or the dimension of a provider's limit that was
/// hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LimitKind {
    /// A capacity reading from a successful response: the limits and what is left, no limit
    /// hit.
    Capacity,
    /// Requests per window.
    Requests,
    /// Tokens per window, input and output together.
    Tokens,
    /// Input (prompt) tokens per window.
    InputTokens,
    /// Output (completion) tokens per window.
    OutputTokens,
    /// Not known; also what a missing or unrecognised kind reads as.
    #[default]
    Unknown,
}

impl LimitKind {
    /// Reads a kind by name (`capacity`, `requests`, `tokens`, `input_tokens` or
    /// `input-tokens`, `output_tokens` or `output-tokens`, any case); a missing or unrecognised
    /// name is [`LimitKind::Unknown`].
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_llm::rate_limit_info::LimitKind;
    ///
    /// assert_eq!(LimitKind::from_name(Some("Input-Tokens")), LimitKind::InputTokens);
    /// assert_eq!(LimitKind::from_name(None), LimitKind::Unknown);
    /// ```
    pub fn from_name(name: Option<&str>) -> Self {
        let Some(name) = name else {
            return Self::Unknown;
        };
        match name.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "capacity" => Self::Capacity,
            "requests" => Self::Requests,
            "tokens" => Self::Tokens,
            "input_tokens" => Self::InputTokens,
            "output_tokens" => Self::OutputTokens,
            _ => Self::Unknown,
        }
    }

    /// The kind's wire name, as it serializes (`capacity`, `requests`, `tokens`,
    /// `input_tokens`, `output_tokens`, `unknown`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Capacity => "capacity",
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::InputTokens => "input_tokens",
            Self::OutputTokens => "output_tokens",
            Self::Unknown => "unknown",
        }
    }
}

/// One reading of a model's rate limits at a provider.
///
/// One of three things:
/// - a capacity reading from a successful response's headers
///   ([`from_headers`](Self::from_headers), [`from_pairs`](Self::from_pairs)): kind
///   [`LimitKind::Capacity`], not rate limited, no retry-after, and the limits, remaining counts
///   and resets the headers said;
/// - a 429's reading ([`rate_limited_from_headers`](Self::rate_limited_from_headers),
///   [`rate_limited_from_pairs`](Self::rate_limited_from_pairs)): rate limited, the same
///   numbers, and the provider's retry-after ([`DEFAULT_RETRY_AFTER`] when it sent none);
/// - the record of a limit that was hit with nothing more known
///   ([`rate_limited`](Self::rate_limited)).
///
/// Every limit, remaining count and reset is `None` when the provider did not send it; the
/// per-minute accessors read those absent limits as zero.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use admission_llm::RateLimitInfo;
/// use admission_llm::rate_limit_info::LimitKind;
///
/// let arrived = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
/// let info = RateLimitInfo::from_pairs(
///     "gpt-4o",
///     [
///         ("x-ratelimit-limit-requests", "500"),
///         ("x-ratelimit-remaining-requests", "499"),
///         ("X-RateLimit-Limit-Tokens", "30000"),
///         ("x-ratelimit-reset-tokens", "6m0s"),
///     ],
///     arrived,
/// );
/// assert!(!info.rate_limited);
/// assert_eq!(info.kind, LimitKind::Capacity);
/// assert_eq!(info.requests_per_minute(), 500);
/// assert_eq!(info.request_remaining, Some(499));
/// assert_eq!(info.tokens_per_minute(), 30_000);
/// assert_eq!(info.token_reset, Some(Duration::from_secs(360)));
/// assert_eq!(info.retry_after, None);
///
/// let hit = RateLimitInfo::rate_limited("gpt-4o");
/// assert!(hit.rate_limited);
/// assert_eq!(hit.kind, LimitKind::Unknown);
/// assert_eq!(hit.retry_after, Some(Duration::from_secs(60)));
/// assert_eq!(hit.tokens_per_minute(), 0);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RateLimitInfo {
    /// The model the reading is about.
    pub model: String,
    /// What the reading is about: [`LimitKind::Capacity`] for a successful response's headers;
    /// for a 429's headers, the first dimension found exhausted (remaining zero) in the order
    /// requests, tokens, input tokens, output tokens, else [`LimitKind::Unknown`], which is
    /// also the kind of [`rate_limited`](Self::rate_limited).
    pub kind: LimitKind,
    /// Whether a limit was hit (the provider refused the call).
    pub rate_limited: bool,
    /// Requests allowed per window.
    pub request_limit: Option<u64>,
    /// Requests left in the current window.
    pub request_remaining: Option<u64>,
    /// Time until the request limit resets.
    pub request_reset: Option<Duration>,
    /// Tokens allowed per window.
    pub token_limit: Option<u64>,
    /// Tokens left in the current window.
    pub token_remaining: Option<u64>,
    /// Time until the token limit resets.
    pub token_reset: Option<Duration>,
    /// Input tokens allowed per window.
    pub input_token_limit: Option<u64>,
    /// Input tokens left in the current window.
    pub input_token_remaining: Option<u64>,
    /// Time until the input-token limit resets.
    pub input_token_reset: Option<Duration>,
    /// Output tokens allowed per window.
    pub output_token_limit: Option<u64>,
    /// Output tokens left in the current window.
    pub output_token_remaining: Option<u64>,
    /// Time until the output-token limit resets.
    pub output_token_reset: Option<Duration>,
    /// How long the provider asks the caller to wait before retrying; always `None` in a
    /// capacity reading.
    pub retry_after: Option<Duration>,
}

impl RateLimitInfo {
    /// The record of a limit that was hit when nothing more is known: no limits, nothing
    /// remaining, a retry-after of [`DEFAULT_RETRY_AFTER`] (60 s) and kind
    /// [`LimitKind::Unknown`].
    pub fn rate_limited(model: impl Into<String>) -> Self {
        Self {
            rate_limited: true,
            retry_after: Some(DEFAULT_RETRY_AFTER),
            ..Self::empty(model.into())
        }
    }

    /// A 429's reading from its response headers, with resets and an HTTP-date retry-after
    /// measured from `now`. Header values that are not visible ASCII are skipped. See
    /// [`rate_limited_from_pairs`](Self::rate_limited_from_pairs).
    pub fn rate_limited_from_headers(
        model: impl Into<String>,
        headers: &HeaderMap,
        now: SystemTime,
    ) -> Self {
        Self::rate_limited_from_pairs(model, header_pairs(headers), now)
    }

    /// A 429's reading from plain name/value pairs: rate limited, the limits, remaining counts
    /// and resets read as by [`from_pairs`](Self::from_pairs), the kind of the first
    /// dimension found exhausted ([`LimitKind::Unknown`] if none), and the `retry-after` the
    /// provider sent (whole seconds, or an HTTP-date measured from `now`), or
    /// [`DEFAULT_RETRY_AFTER`] (60 s) when it sent none that could be read.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use admission_llm::RateLimitInfo;
    /// use admission_llm::rate_limit_info::LimitKind;
    ///
    /// let now = SystemTime::UNIX_EPOCH;
    /// let hit = RateLimitInfo::rate_limited_from_pairs("gpt-4o", [
    ///     ("x-ratelimit-limit-tokens", "30000"),
    ///     ("x-ratelimit-remaining-tokens", "0"),
    ///     ("retry-after", "7"),
    /// ], now);
    /// assert!(hit.rate_limited);
    /// assert_eq!(hit.kind, LimitKind::Tokens);
    /// assert_eq!(hit.tokens_per_minute(), 30_000);
    /// assert_eq!(hit.retry_after, Some(Duration::from_secs(7)));
    ///
    /// let bare = RateLimitInfo::rate_limited_from_pairs("gpt-4o", [], now);
    /// assert_eq!(bare, RateLimitInfo::rate_limited("gpt-4o"));
    /// ```
    pub fn rate_limited_from_pairs<'a>(
        model: impl Into<String>,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        now: SystemTime,
    ) -> Self {
        let mut info = Self::read_all(model.into(), pairs, now);
        info.rate_limited = true;
        info.kind = info.exhausted_kind();
        info.retry_after.get_or_insert(DEFAULT_RETRY_AFTER);
        info
    }

    /// A capacity reading from a successful response's headers, with resets given as instants
    /// measured from `now`, the wall-clock time the response arrived. Header values that are not
    /// visible ASCII are skipped. See [`from_pairs`](Self::from_pairs).
    pub fn from_headers(model: impl Into<String>, headers: &HeaderMap, now: SystemTime) -> Self {
        Self::from_pairs(model, header_pairs(headers), now)
    }

    /// A capacity reading from plain name/value pairs, for a successful response: kind
    /// [`LimitKind::Capacity`], not rate limited, no retry-after (a `retry-after` header is
    /// ignored: nobody was asked to wait), and every other field `None` unless its header is
    /// present and readable.
    ///
    /// Names are matched case-insensitively; when a name repeats, the last readable value wins.
    /// Read headers: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` and
    /// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`.
    ///
    /// Limits and remaining counts are non-negative integers (surrounding whitespace trimmed).
    /// A reset is a Go-style duration (`6m0s`, `20ms`, `1h2m3.5s`; units `h`, `m`, `s`, `ms`,
    /// `us` or `µs`, `ns`), a number of seconds (`30`, `0.5`), or an RFC 3339 instant in UTC or
    /// with an offset (`2026-01-01T00:01:00Z`, `2026-01-01T01:01:00+01:00`) counted from `now`,
    /// zero once passed: `now` is the wall-clock time the answer arrived, which the caller reads
    /// (nothing here reads a clock).
    pub fn from_pairs<'a>(
        model: impl Into<String>,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        now: SystemTime,
    ) -> Self {
        let mut info = Self::read_all(model.into(), pairs, now);
        info.kind = LimitKind::Capacity;
        info.retry_after = None;
        info
    }

    /// Every header of `pairs` read into a reading of `model` that is otherwise empty.
    fn read_all<'a>(
        model: String,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        now: SystemTime,
    ) -> Self {
        let mut info = Self::empty(model);
        for (name, value) in pairs {
            info.read(&name.to_ascii_lowercase(), value, now);
        }
        info
    }

    /// Requests per minute: the request limit, zero when absent.
    pub fn requests_per_minute(&self) -> u64 {
        self.request_limit.unwrap_or(0)
    }

    /// Tokens per minute: the token limit, zero when absent.
    pub fn tokens_per_minute(&self) -> u64 {
        self.token_limit.unwrap_or(0)
    }

    /// Input tokens per minute: the input-token limit, zero when absent.
    pub fn input_tokens_per_minute(&self) -> u64 {
        self.input_token_limit.unwrap_or(0)
    }

    /// Output tokens per minute: the output-token limit, zero when absent.
    pub fn output_tokens_per_minute(&self) -> u64 {
        self.output_token_limit.unwrap_or(0)
    }

    /// One line naming what the reading knows, for logs: the model, whether it was rate
    /// limited, the kind, each limit as `remaining/limit` (`?` where unknown) with its reset, and
    /// the retry-after. Dimensions with nothing known are left out.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use admission_llm::RateLimitInfo;
    ///
    /// let info = RateLimitInfo::from_pairs("gpt-4o", [
    ///     ("x-ratelimit-limit-tokens", "30000"),
    ///     ("x-ratelimit-remaining-tokens", "0"),
    ///     ("x-ratelimit-reset-tokens", "6m0s"),
    /// ], SystemTime::UNIX_EPOCH);
    /// assert_eq!(info.summary(), "gpt-4o capacity kind=capacity tokens=0/30000 reset 360s");
    /// assert_eq!(
    ///     RateLimitInfo::rate_limited("gpt-4o").summary(),
    ///     "gpt-4o rate limited kind=unknown retry-after 60s"
    /// );
    /// ```
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut line = format!(
            "{} {} kind={}",
            self.model,
            if self.rate_limited {
                "rate limited"
            } else {
                "capacity"
            },
            self.kind.as_str()
        );
        let known = |value: Option<u64>| value.map_or_else(|| "?".to_owned(), |v| v.to_string());
        for (name, limit, remaining, reset) in [
            (
                "requests",
                self.request_limit,
                self.request_remaining,
                self.request_reset,
            ),
            (
                "tokens",
                self.token_limit,
                self.token_remaining,
                self.token_reset,
            ),
            (
                "input_tokens",
                self.input_token_limit,
                self.input_token_remaining,
                self.input_token_reset,
            ),
            (
                "output_tokens",
                self.output_token_limit,
                self.output_token_remaining,
                self.output_token_reset,
            ),
        ] {
            if limit.is_none() && remaining.is_none() && reset.is_none() {
                continue;
            }
            let _ = write!(line, " {name}={}/{}", known(remaining), known(limit));
            if let Some(reset) = reset {
                let _ = write!(line, " reset {}s", reset.as_secs_f64());
            }
        }
        if let Some(retry) = self.retry_after {
            let _ = write!(line, " retry-after {}s", retry.as_secs_f64());
        }
        line
    }

    /// A reading of `model` that knows nothing.
    fn empty(model: String) -> Self {
        Self {
            model,
            kind: LimitKind::Unknown,
            rate_limited: false,
            request_limit: None,
            request_remaining: None,
            request_reset: None,
            token_limit: None,
            token_remaining: None,
            token_reset: None,
            input_token_limit: None,
            input_token_remaining: None,
            input_token_reset: None,
            output_token_limit: None,
            output_token_remaining: None,
            output_token_reset: None,
            retry_after: None,
        }
    }

    /// Applies one header, `name` already lowercase; unknown names are ignored.
    fn read(&mut self, name: &str, value: &str, now: SystemTime) {
        if name == "retry-after" {
            set(&mut self.retry_after, parse_retry_after(Some(value), now));
            return;
        }
        let Some((kind, field)) = split_name(name) else {
            return;
        };
        let (limit, remaining, reset) = match kind {
            LimitKind::Requests => (
                &mut self.request_limit,
                &mut self.request_remaining,
                &mut self.request_reset,
            ),
            LimitKind::Tokens => (
                &mut self.token_limit,
                &mut self.token_remaining,
                &mut self.token_reset,
            ),
            LimitKind::InputTokens => (
                &mut self.input_token_limit,
                &mut self.input_token_remaining,
                &mut self.input_token_reset,
            ),
            LimitKind::OutputTokens => (
                &mut self.output_token_limit,
                &mut self.output_token_remaining,
                &mut self.output_token_reset,
            ),
            LimitKind::Capacity | LimitKind::Unknown => return,
        };
        match field {
            Field::Limit => set(limit, parse_int(Some(value))),
            Field::Remaining => set(remaining, parse_int(Some(value))),
            Field::Reset => match parse_reset(value, now) {
                Ok(duration) => *reset = Some(duration),
                Err(error) => {
                    tracing::debug!(model = %self.model, header = name, %error, "unreadable rate-limit reset")
                }
            },
        }
    }

    /// The first dimension with nothing remaining, or unknown.
    fn exhausted_kind(&self) -> LimitKind {
        [
            (self.request_remaining, LimitKind::Requests),
            (self.token_remaining, LimitKind::Tokens),
            (self.input_token_remaining, LimitKind::InputTokens),
            (self.output_token_remaining, LimitKind::OutputTokens),
        ]
        .into_iter()
        .find(|&(remaining, _)| remaining == Some(0))
        .map_or(LimitKind::Unknown, |(_, kind)| kind)
    }
}

/// The headers of `headers` whose values are visible ASCII, as name/value pairs.
fn header_pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
}

/// Which of a dimension's three numbers a header carries.
#[derive(Clone, Copy)]
enum Field {
    Limit,
    Remaining,
    Reset,
}

/// Splits a lowercase header name of either family into its dimension and field.
fn split_name(name: &str) -> Option<(LimitKind, Field)> {
    if let Some(rest) = name.strip_prefix("x-ratelimit-") {
        let (field, dimension) = rest.split_once('-')?;
        let kind = match dimension {
            "requests" => LimitKind::Requests,
            "tokens" => LimitKind::Tokens,
            _ => return None,
        };
        return Some((kind, field_named(field)?));
    }
    let rest = name.strip_prefix("anthropic-ratelimit-")?;
    let (dimension, field) = rest.rsplit_once('-')?;
    let kind = match dimension {
        "requests" => LimitKind::Requests,
        "tokens" => LimitKind::Tokens,
        "input-tokens" => LimitKind::InputTokens,
        "output-tokens" => LimitKind::OutputTokens,
        _ => return None,
    };
    Some((kind, field_named(field)?))
}

/// The field a header name's `limit`, `remaining` or `reset` part names.
fn field_named(field: &str) -> Option<Field> {
    match field {
        "limit" => Some(Field::Limit),
        "remaining" => Some(Field::Remaining),
        "reset" => Some(Field::Reset),
        _ => None,
    }
}

/// Stores a readable value, keeping the previous one when the new value is unreadable.
fn set<T>(slot: &mut Option<T>, value: Option<T>) {
    if value.is_some() {
        *slot = value;
    }
}
