//! The provider layer: from [`ModelSpec`]s to the limiters, demands and feedback of LLM calls.
//!
//! - [`LimiterFactory`] builds and keeps the limiters: one [`TokenBucket`] per spec id, one model
//!   gate per spec that caps concurrency, one [`ElasticWindow`] per spec that configures one, and
//!   one shared instance per limiter *type* ([`LimiterFactory::shared`],
//!   [`LimiterFactory::shared_with`]) — which is how every job names the same [`HttpGate`].
//! - [`Registry`] is the facade a service holds: it knows the specs, builds a call's whole
//!   [`Demand`] ([`Registry::demand_for`]), prices it, and closes the loop with the upstream's
//!   answers ([`Registry::on_success`], [`Registry::on_rate_limit_error`],
//!   [`Registry::observe`]).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use admission_llm::model_spec::ModelSpec;
//! use admission_llm::provider::Registry;
//! use admission_llm::RateLimitInfo;
//! use admission_core::{JobContext, Monitor};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let monitor = Monitor::new();
//! monitor.start()?;
//! let registry = Registry::new(monitor.clock().clone()).with_http_connections(16)?;
//! registry.register(
//!     ModelSpec::new("sonnet", "claude-sonnet-4-5", 400_000)
//!         .with_requests_per_minute(50)
//!         .with_max_concurrent(4)
//!         .with_prices(3_000_000, 15_000_000),
//! )?;
//!
//! // One call: an HTTP connection, 1,200 + 800 tokens and one request, a model-gate slot.
//! let call = registry.demand_for("sonnet", 1_200, 800)?;
//! assert_eq!(call.demand.len(), 3);
//! assert_eq!(call.price.micros(), 15_600);
//!
//! let ctx = JobContext::new("summarise");
//! let grant = monitor.admit_blocking(call.demand, &ctx, Some(Duration::from_secs(5)))?;
//! assert_eq!(registry.bucket("sonnet")?.level(), 400_000 - 2_000);
//! // ... send the request; then tell the registry how it went:
//! registry.on_rate_limit_error("sonnet", &RateLimitInfo::rate_limited("sonnet"));
//! assert_eq!(registry.bucket("sonnet")?.throttle(), 0.5);
//! drop(grant); // the connection and the gate slot come back; the tokens stay spent
//! monitor.stop();
//! # Ok(())
//! # }
//! ```

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::num::NonZeroU64;
use std::ops::Deref;
use std::sync::Arc;

use admission_accounts::elastic_window::ElasticWindow;
use admission_accounts::token_bucket::{TokenBucket, TokenBucketConfig};
use admission_accounts::{ConfigError, CountingGate};
use admission_core::{Account, AccountStatus, Amount, Clock, Demand};
use parking_lot::{Mutex, RwLock};

use crate::model_spec::{ModelCatalog, ModelSpec, SpecError};
use crate::rate_limit_info::RateLimitInfo;
use crate::spend::Money;

/// The weight of an explicit overload answer (HTTP 529/503 "overloaded") as backpressure on a
/// model's bucket: three 429s' worth.
pub const OVERLOAD_INCREMENTS: u32 = 3;

/// The HTTP connection gate every call shares: a [`CountingGate`] providing the HTTP capability.
///
/// One instance per [`LimiterFactory`], kept as its shared instance of this type. A [`Registry`]
/// builds it from its own clock with [`HttpGate::DEFAULT_CAPACITY`] connections unless
/// [`Registry::with_http_connections`] says otherwise; there is no default gate, since a gate
/// must stamp on the clock of the monitor it serves. It derefs to the gate, and
/// [`HttpGate::account`] is the handle a [`Demand`] takes.
pub struct HttpGate(Arc<CountingGate>);

impl HttpGate {
    /// The connections of a registry's gate unless configured otherwise.
    pub const DEFAULT_CAPACITY: u64 = 64;

    /// A gate of `capacity` connections stamping activity on `clock`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `capacity` when it is zero.
    pub fn new(capacity: u64, clock: Arc<dyn Clock>) -> Result<HttpGate, ConfigError> {
        Ok(HttpGate(Arc::new(CountingGate::http(capacity, clock)?)))
    }

    /// A gate of `capacity` connections stamping activity on `clock`; cannot fail.
    fn with_capacity(capacity: NonZeroU64, clock: Arc<dyn Clock>) -> HttpGate {
        HttpGate(Arc::new(
            CountingGate::with_capacity("http", capacity, clock)
                .with_capability(admission_core::Capability::HTTP_CONNECTION),
        ))
    }

    /// The gate as a demand's account.
    pub fn account(&self) -> Arc<CountingGate> {
        self.0.clone()
    }
}

impl Deref for HttpGate {
    type Target = CountingGate;

    fn deref(&self) -> &CountingGate {
        &self.0
    }
}

impl fmt::Debug for HttpGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HttpGate").field(&*self.0).finish()
    }
}

/// [`HttpGate::DEFAULT_CAPACITY`], checked positive when compiled.
const DEFAULT_HTTP_CAPACITY: NonZeroU64 = NonZeroU64::new(HttpGate::DEFAULT_CAPACITY).unwrap();

/// What [`LimiterFactory::update_limits`] did with a reported pair of ceilings.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LimitsUpdate {
    /// The model's bucket now has the reported budgets; its levels were clamped and its
    /// throttle kept.
    Applied,
    /// The model had no bucket: one was created with the reported budgets.
    Created,
    /// Either number was zero (not a ceiling): nothing changed.
    Ignored,
}

/// A call that needs a registered model, a model gate or a limiter could not be served.
///
/// Two errors are equal when their variants and fields are; an [`Unbuildable`]'s source is
/// compared by identity (the same builder's error), since errors in general have no equality.
///
/// [`Unbuildable`]: ProviderError::Unbuildable
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// No spec of that id is registered.
    #[error("no model spec `{model}` is registered (registered: {})", known_list(.known))]
    UnknownModel {
        /// The id asked for.
        model: String,
        /// The ids that are registered, sorted.
        known: Vec<String>,
    },
    /// A spec of that id is registered already; the registry keeps it and the limiters built
    /// from it.
    #[error(
        "model spec `{model}` is already registered (its limiters are built from that spec: register a changed spec under a new id, or apply a provider's ceilings with update_limits)"
    )]
    Duplicate {
        /// The id registered twice.
        model: String,
    },
    /// The spec declares no `max_concurrent`, so it has no model gate: its account is its bucket.
    #[error(
        "model spec `{model}` declares no max_concurrent, so it has no model gate (its account is its token bucket)"
    )]
    NoModelGate {
        /// The spec's id.
        model: String,
    },
    /// A shared limiter could not be built: a deployment fault (its configuration), not
    /// something a caller's demand can correct.
    #[error("cannot build the shared limiter `{limiter}`: {reason}")]
    Unbuildable {
        /// The limiter's type, as `std::any::type_name` spells it.
        limiter: &'static str,
        /// Why, from the builder's error.
        reason: String,
        /// The builder's error itself (downcast it to the builder's own error type).
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The spec is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A limiter refused the configuration derived from the spec.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl PartialEq for ProviderError {
    fn eq(&self, other: &ProviderError) -> bool {
        use ProviderError::{Config, Duplicate, NoModelGate, Spec, Unbuildable, UnknownModel};
        match (self, other) {
            (
                UnknownModel { model, known },
                UnknownModel {
                    model: other_model,
                    known: other_known,
                },
            ) => model == other_model && known == other_known,
            (Duplicate { model }, Duplicate { model: other }) => model == other,
            (NoModelGate { model }, NoModelGate { model: other }) => model == other,
            (
                Unbuildable {
                    limiter,
                    reason,
                    source,
                },
                Unbuildable {
                    limiter: other_limiter,
                    reason: other_reason,
                    source: other_source,
                },
            ) => {
                limiter == other_limiter
                    && reason == other_reason
                    && Arc::ptr_eq(source, other_source)
            }
            (Spec(error), Spec(other)) => error == other,
            (Config(error), Config(other)) => error == other,
            _ => false,
        }
    }
}

impl Eq for ProviderError {}

fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        "none".to_owned()
    } else {
        known.join(", ")
    }
}

/// Everything a factory has built, under one lock.
#[derive(Default)]
struct Limiters {
    buckets: BTreeMap<String, Arc<TokenBucket>>,
    gates: BTreeMap<String, Arc<CountingGate>>,
    windows: BTreeMap<String, Arc<ElasticWindow>>,
    /// One slot per shared type, created on the first ask for the type.
    shared: HashMap<TypeId, Slot>,
}

/// Where the one shared instance of a type lives: empty until it is built (or installed).
///
/// Its lock is held while the instance is built, so callers racing for a type wait for the one
/// construction instead of making their own. The slot's lock is taken only after the factory's
/// lock is released, never the other way round, so a builder may ask the factory for other
/// limiters.
type Slot = Arc<Mutex<Option<Arc<dyn Any + Send + Sync>>>>;

/// Builds limiters from specs and keeps one of each, so every job that names a model or a
/// limiter type gets the same instance.
///
/// Every limiter it builds reads the factory's clock, which should be the monitor's.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_llm::model_spec::ModelSpec;
/// use admission_llm::provider::{LimiterFactory, LimitsUpdate};
/// use admission_testkit::FakeClock;
///
/// let factory = LimiterFactory::new(FakeClock::new().shared());
/// let spec = ModelSpec::new("haiku", "claude-haiku-4-5", 50_000);
/// let bucket = factory.bucket(&spec).unwrap();
/// assert!(Arc::ptr_eq(&bucket, &factory.bucket(&spec).unwrap()));
/// assert_eq!(bucket.config().requests_per_minute, 50); // no rpm published: tpm / 1000
///
/// // A provider reports other ceilings: applied in place.
/// assert_eq!(factory.update_limits("haiku", 80_000, 100), LimitsUpdate::Applied);
/// assert_eq!(bucket.config().tokens_per_minute, 80_000);
/// assert_eq!(factory.update_limits("haiku", 0, 100), LimitsUpdate::Ignored);
/// ```
pub struct LimiterFactory {
    clock: Arc<dyn Clock>,
    limiters: Mutex<Limiters>,
}

impl LimiterFactory {
    /// An empty factory whose limiters read `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> LimiterFactory {
        LimiterFactory {
            clock,
            limiters: Mutex::new(Limiters::default()),
        }
    }

    /// The clock every limiter built here reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The bucket of `spec.id`, created full from its tokens and requests per minute on first
    /// use (a spec without requests per minute gets `tokens_per_minute / 1000`).
    ///
    /// A bucket that already exists under the id is returned as it is, whatever the spec says:
    /// its limits change through [`update_limits`](LimiterFactory::update_limits).
    ///
    /// # Errors
    ///
    /// [`ProviderError::Spec`] when the spec is invalid.
    pub fn bucket(&self, spec: &ModelSpec) -> Result<Arc<TokenBucket>, ProviderError> {
        if let Some(bucket) = self.limiters.lock().buckets.get(&spec.id) {
            return Ok(bucket.clone());
        }
        spec.validate()?;
        let config =
            TokenBucketConfig::new(spec.tokens_per_minute, spec.effective_requests_per_minute());
        let fresh = Arc::new(TokenBucket::new(&spec.id, config, self.clock.clone())?);
        Ok(self
            .limiters
            .lock()
            .buckets
            .entry(spec.id.clone())
            .or_insert(fresh)
            .clone())
    }

    /// The bucket of model `id` when one exists.
    pub fn existing_bucket(&self, id: &str) -> Option<Arc<TokenBucket>> {
        self.limiters.lock().buckets.get(id).cloned()
    }

    /// The model gate of `spec`: a counting gate of `max_concurrent` permits named
    /// `"{id}:concurrency"`, created on first use.
    ///
    /// # Errors
    ///
    /// [`ProviderError::NoModelGate`] when the spec declares no `max_concurrent`;
    /// [`ProviderError::Spec`] when it is invalid.
    pub fn gate(&self, spec: &ModelSpec) -> Result<Arc<CountingGate>, ProviderError> {
        let Some(capacity) = spec.max_concurrent else {
            return Err(ProviderError::NoModelGate {
                model: spec.id.clone(),
            });
        };
        if let Some(gate) = self.limiters.lock().gates.get(&spec.id) {
            return Ok(gate.clone());
        }
        spec.validate()?;
        let fresh = Arc::new(CountingGate::new(
            format!("{}:concurrency", spec.id),
            capacity,
            self.clock.clone(),
        )?);
        Ok(self
            .limiters
            .lock()
            .gates
            .entry(spec.id.clone())
            .or_insert(fresh)
            .clone())
    }

    /// The elastic window of `spec`, named `"{id}:window"`, when the spec configures one;
    /// created on first use.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Spec`] when the spec is invalid.
    pub fn window(&self, spec: &ModelSpec) -> Result<Option<Arc<ElasticWindow>>, ProviderError> {
        let Some(window) = &spec.window else {
            return Ok(None);
        };
        if let Some(existing) = self.limiters.lock().windows.get(&spec.id) {
            return Ok(Some(existing.clone()));
        }
        spec.validate()?;
        let fresh = Arc::new(ElasticWindow::new(
            format!("{}:window", spec.id),
            window.config(),
            self.clock.clone(),
        )?);
        Ok(Some(
            self.limiters
                .lock()
                .windows
                .entry(spec.id.clone())
                .or_insert(fresh)
                .clone(),
        ))
    }

    /// The window of model `id` when one exists.
    pub fn existing_window(&self, id: &str) -> Option<Arc<ElasticWindow>> {
        self.limiters.lock().windows.get(id).cloned()
    }

    /// The one shared instance of limiter type `T`, built with `T::default()` on first use.
    ///
    /// `T::default()` runs exactly once per factory (and again only after `clear`, a test hook
    /// of feature `test-util`): callers racing for a type that is not built yet wait
    /// for the one construction and all get its instance. Building holds no lock but the type's
    /// own, so other limiters stay available meanwhile.
    ///
    /// # Panics
    ///
    /// When `T::default()` panics; nothing is kept, and the next call builds again. A
    /// `T::default()` that asks this factory for a shared `T` never returns (the type's lock is
    /// held by its own construction).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::AtomicU64;
    /// use admission_llm::provider::LimiterFactory;
    /// use admission_testkit::FakeClock;
    ///
    /// #[derive(Default)]
    /// struct CallsToday(AtomicU64);
    ///
    /// let factory = LimiterFactory::new(FakeClock::new().shared());
    /// let a = factory.shared::<CallsToday>();
    /// let b = factory.shared::<CallsToday>();
    /// assert!(Arc::ptr_eq(&a, &b));
    /// ```
    pub fn shared<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.shared_or_build(T::default)
    }

    /// The one shared instance of `T`, built by `build` on first use.
    fn shared_or_build<T: Send + Sync + 'static>(&self, build: impl FnOnce() -> T) -> Arc<T> {
        match self.try_shared_or_build(|| Ok::<T, std::convert::Infallible>(build())) {
            Ok(shared) => shared,
            Err(never) => match never {},
        }
    }

    /// The one shared instance of `T`, built by `build` on first use, under the type's slot
    /// lock so that it is built once; an error keeps nothing.
    fn try_shared_or_build<T: Send + Sync + 'static, E>(
        &self,
        build: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        let slot = self.slot::<T>();
        let mut held = slot.lock();
        if let Some(existing) = &*held {
            return Ok(downcast(existing.clone()));
        }
        let fresh = Arc::new(build()?);
        *held = Some(fresh.clone());
        Ok(fresh)
    }

    /// The slot of type `T`, created empty on first use.
    fn slot<T: 'static>(&self) -> Slot {
        self.limiters
            .lock()
            .shared
            .entry(TypeId::of::<T>())
            .or_default()
            .clone()
    }

    /// The one shared instance of limiter type `T`, built by `build` on first use; `build` is
    /// not called when the instance exists.
    ///
    /// For limiters whose construction can fail (a configuration read at start-up). A
    /// successful `build` runs exactly once per factory, as for [`shared`](LimiterFactory::shared):
    /// racing callers wait for it; after a failure the next caller builds.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Unbuildable`] naming the type and the reason, with `build`'s error as
    /// its source; nothing is kept, so a later call tries again.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_llm::provider::{HttpGate, LimiterFactory};
    /// use admission_testkit::FakeClock;
    ///
    /// let factory = LimiterFactory::new(FakeClock::new().shared());
    /// let refused = factory
    ///     .shared_with(|| HttpGate::new(0, factory.clock().clone()))
    ///     .unwrap_err();
    /// assert_eq!(
    ///     refused.to_string(),
    ///     "cannot build the shared limiter `admission_llm::provider::HttpGate`: invalid \
    ///      counting gate configuration: `capacity` must be positive, was 0 (a gate without \
    ///      permits would refuse everyone)"
    /// );
    /// let gate = factory.shared_with(|| HttpGate::new(8, factory.clock().clone())).unwrap();
    /// assert_eq!(gate.capacity(), 8);
    /// ```
    pub fn shared_with<T, E>(
        &self,
        build: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, ProviderError>
    where
        T: Send + Sync + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        self.try_shared_or_build(|| {
            build().map_err(|error| ProviderError::Unbuildable {
                limiter: std::any::type_name::<T>(),
                reason: error.to_string(),
                source: Arc::new(error),
            })
        })
    }

    /// Installs `value` as the shared instance of `T`, or answers the instance already there.
    ///
    /// # Errors
    ///
    /// The existing instance, when `T` already has one; `value` is then dropped.
    pub fn insert_shared<T: Send + Sync + 'static>(&self, value: Arc<T>) -> Result<(), Arc<T>> {
        let slot = self.slot::<T>();
        let mut held = slot.lock();
        if let Some(existing) = &*held {
            return Err(downcast(existing.clone()));
        }
        *held = Some(value);
        Ok(())
    }

    /// Installs `value` as the shared instance of `T`, replacing any (holders of the old one
    /// keep it).
    fn replace_shared<T: Send + Sync + 'static>(&self, value: Arc<T>) {
        *self.slot::<T>().lock() = Some(value);
    }

    /// Applies a provider's reported ceilings to model `id`'s bucket, keeping its throttle;
    /// creates the bucket when none exists; ignores the pair when either number is zero.
    pub fn update_limits(
        &self,
        id: &str,
        tokens_per_minute: u64,
        requests_per_minute: u64,
    ) -> LimitsUpdate {
        if tokens_per_minute == 0 || requests_per_minute == 0 {
            tracing::debug!(
                model = id,
                tokens_per_minute,
                requests_per_minute,
                "ignored reported limits: a ceiling of zero is not a ceiling"
            );
            return LimitsUpdate::Ignored;
        }
        let config = TokenBucketConfig::new(tokens_per_minute, requests_per_minute);
        if let Some(bucket) = self.existing_bucket(id) {
            return match bucket.set_config(config) {
                Ok(()) => LimitsUpdate::Applied,
                Err(_) => LimitsUpdate::Ignored, // unreachable: both budgets are positive
            };
        }
        let fresh = match TokenBucket::new(id, config, self.clock.clone()) {
            Ok(bucket) => Arc::new(bucket),
            Err(_) => return LimitsUpdate::Ignored, // unreachable: both budgets are positive
        };
        let mut limiters = self.limiters.lock();
        if let Some(raced) = limiters.buckets.get(id) {
            let raced = raced.clone();
            drop(limiters);
            let _ = raced.set_config(config);
            return LimitsUpdate::Applied;
        }
        limiters.buckets.insert(id.to_owned(), fresh);
        LimitsUpdate::Created
    }

    /// The status of every limiter built by model (buckets, gates, windows), in id order.
    pub fn status(&self) -> Vec<Box<dyn AccountStatus>> {
        let limiters = self.limiters.lock();
        let mut all: Vec<(&String, u8, Box<dyn AccountStatus>)> = Vec::new();
        all.extend(limiters.buckets.iter().map(|(id, b)| (id, 0, b.status())));
        all.extend(limiters.gates.iter().map(|(id, g)| (id, 1, g.status())));
        all.extend(limiters.windows.iter().map(|(id, w)| (id, 2, w.status())));
        all.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        all.into_iter().map(|(_, _, status)| status).collect()
    }

    /// Forgets every limiter, shared instances included. A test hook (feature `test-util`): jobs
    /// holding a limiter keep theirs, but the next lookup builds a new one.
    #[cfg(feature = "test-util")]
    pub fn clear(&self) {
        *self.limiters.lock() = Limiters::default();
    }
}

/// The shared map is keyed by `TypeId::of::<T>()`, so the value under a key is always a `T`.
fn downcast<T: Send + Sync + 'static>(any: Arc<dyn Any + Send + Sync>) -> Arc<T> {
    match any.downcast::<T>() {
        Ok(value) => value,
        Err(_) => unreachable!("the shared map holds a T under TypeId::of::<T>()"),
    }
}

impl fmt::Debug for LimiterFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limiters = self.limiters.lock();
        // `try_lock`: a slot being built is not counted, and formatting never waits on a build.
        let shared = limiters
            .shared
            .values()
            .filter(|slot| slot.try_lock().is_some_and(|held| held.is_some()))
            .count();
        f.debug_struct("LimiterFactory")
            .field("buckets", &limiters.buckets.keys().collect::<Vec<_>>())
            .field("gates", &limiters.gates.keys().collect::<Vec<_>>())
            .field("windows", &limiters.windows.keys().collect::<Vec<_>>())
            .field("shared", &shared)
            .finish()
    }
}

/// One call's whole demand, as [`Registry::demand_for`] builds it.
#[derive(Clone, Debug)]
pub struct ModelCall {
    /// The registered spec the call is for (shared, not copied, per call).
    pub spec: Arc<ModelSpec>,
    /// The HTTP connection, the bucket's tokens and one request, the model gate's slot where
    /// declared, the window's call where configured.
    pub demand: Demand,
    /// Tokens charged to the bucket: the input plus the declared most output.
    pub tokens: u64,
    /// The reservation's price: the same tokens at the spec's prices.
    pub price: Money,
}

impl ModelCall {
    /// The spec's id.
    pub fn model(&self) -> &str {
        &self.spec.id
    }

    /// The model name to send.
    pub fn wire_model(&self) -> &str {
        &self.spec.wire_model
    }
}

/// The provider layer's facade: registered specs and the factory's limiters, a call's demand and
/// the upstream's feedback, in one handle a service shares (`Send + Sync`; wrap it in an `Arc`).
pub struct Registry {
    factory: LimiterFactory,
    specs: RwLock<BTreeMap<String, Arc<ModelSpec>>>,
    /// The HTTP gate's connections: [`HttpGate::DEFAULT_CAPACITY`] unless configured. Kept here,
    /// not only in the gate, so that a gate built after `Registry::clear` (`test-util`) has them
    /// too.
    http_capacity: NonZeroU64,
}

impl Registry {
    /// A registry with no specs whose limiters, the HTTP gate among them, read `clock` (the
    /// monitor's). Its HTTP gate has [`HttpGate::DEFAULT_CAPACITY`] connections.
    pub fn new(clock: Arc<dyn Clock>) -> Registry {
        Registry {
            factory: LimiterFactory::new(clock),
            specs: RwLock::new(BTreeMap::new()),
            http_capacity: DEFAULT_HTTP_CAPACITY,
        }
    }

    /// The same registry with an HTTP gate of `capacity` connections (instead of
    /// [`HttpGate::DEFAULT_CAPACITY`]) as its shared [`HttpGate`], a new gate on the registry's
    /// clock replacing any built before. The capacity is the registry's from then on, across
    /// the `test-util` hook `clear` too.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `capacity` when it is zero.
    pub fn with_http_connections(mut self, capacity: u64) -> Result<Registry, ConfigError> {
        let gate = HttpGate::new(capacity, self.factory.clock.clone())?;
        // `new` refused zero, so this always replaces the capacity.
        self.http_capacity = NonZeroU64::new(capacity).unwrap_or(self.http_capacity);
        self.factory.replace_shared(Arc::new(gate));
        Ok(self)
    }

    /// The factory behind the facade.
    pub fn factory(&self) -> &LimiterFactory {
        &self.factory
    }

    /// Validates and registers `spec` under its id.
    ///
    /// An id is registered once: a second spec under it, even an identical one, is refused, so
    /// a spec never sits over limiters built from another (a model's bucket, gate and window are
    /// built from the spec registered first, on first use). To change a model's ceilings keep
    /// its id and use [`update_limits`](Registry::update_limits); to change anything else,
    /// register the new spec under a new id (in tests, `clear` of feature `test-util` forgets
    /// everything). A bucket that [`update_limits`](Registry::update_limits) created for an id no
    /// spec had yet is kept when the spec arrives: its ceilings are the provider's.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Spec`] naming the invalid field, or [`ProviderError::Duplicate`] naming
    /// an id already registered; either way nothing changes.
    pub fn register(&self, spec: ModelSpec) -> Result<(), ProviderError> {
        spec.validate()?;
        let mut specs = self.specs.write();
        if specs.contains_key(&spec.id) {
            return Err(ProviderError::Duplicate { model: spec.id });
        }
        specs.insert(spec.id.clone(), Arc::new(spec));
        Ok(())
    }

    /// Registers every spec of `catalog`, after validating all of them, all or nothing.
    ///
    /// Ids are held to the same rule as [`register`](Registry::register): an id repeated inside
    /// the catalog, or one already registered, refuses the whole catalog.
    ///
    /// # Errors
    ///
    /// The catalog's first [`SpecError`] as [`ProviderError::Spec`] (an invalid field, or an id
    /// the catalog repeats), or [`ProviderError::Duplicate`] naming its first id that is already
    /// registered; nothing is registered.
    pub fn register_catalog(&self, catalog: &ModelCatalog) -> Result<(), ProviderError> {
        catalog.validate()?;
        let mut specs = self.specs.write();
        if let Some(taken) = catalog.models.iter().find(|s| specs.contains_key(&s.id)) {
            return Err(ProviderError::Duplicate {
                model: taken.id.clone(),
            });
        }
        for spec in &catalog.models {
            specs.insert(spec.id.clone(), Arc::new(spec.clone()));
        }
        Ok(())
    }

    /// The registered ids, sorted.
    pub fn models(&self) -> Vec<String> {
        self.specs.read().keys().cloned().collect()
    }

    /// The spec registered as `model`.
    ///
    /// # Errors
    ///
    /// [`ProviderError::UnknownModel`] naming what is registered.
    pub fn spec(&self, model: &str) -> Result<Arc<ModelSpec>, ProviderError> {
        let specs = self.specs.read();
        specs
            .get(model)
            .cloned()
            .ok_or_else(|| ProviderError::UnknownModel {
                model: model.to_owned(),
                known: specs.keys().cloned().collect(),
            })
    }

    /// The shared HTTP gate: the factory's shared [`HttpGate`], built on first use with the
    /// registry's capacity and clock.
    pub fn http(&self) -> Arc<HttpGate> {
        self.factory.shared_or_build(|| {
            HttpGate::with_capacity(self.http_capacity, self.factory.clock.clone())
        })
    }

    /// The bucket of `model`: the registered spec's, or one created by
    /// [`update_limits`](Registry::update_limits) for a model without a spec.
    ///
    /// # Errors
    ///
    /// [`ProviderError::UnknownModel`] when neither exists.
    pub fn bucket(&self, model: &str) -> Result<Arc<TokenBucket>, ProviderError> {
        match self.spec(model) {
            Ok(spec) => self.factory.bucket(&spec),
            Err(unknown) => self.factory.existing_bucket(model).ok_or(unknown),
        }
    }

    /// The model gate of `model`.
    ///
    /// # Errors
    ///
    /// [`ProviderError::UnknownModel`], or [`ProviderError::NoModelGate`] when the spec declares
    /// no `max_concurrent`.
    pub fn gate(&self, model: &str) -> Result<Arc<CountingGate>, ProviderError> {
        self.factory.gate(&*self.spec(model)?)
    }

    /// The elastic window of `model`, when its spec configures one.
    ///
    /// # Errors
    ///
    /// [`ProviderError::UnknownModel`].
    pub fn window(&self, model: &str) -> Result<Option<Arc<ElasticWindow>>, ProviderError> {
        self.factory.window(&*self.spec(model)?)
    }

    /// What `input_tokens` in and `output_tokens` out cost on `model`.
    ///
    /// # Errors
    ///
    /// [`ProviderError::UnknownModel`].
    pub fn price(
        &self,
        model: &str,
        input_tokens: u64,
        output_tokens: u64,
    ) -> Result<Money, ProviderError> {
        Ok(self.spec(model)?.price(input_tokens, output_tokens))
    }

    /// One call's whole demand on `model`: one HTTP connection; `input_tokens +
    /// max_output_tokens` tokens and one request from the model's bucket; one slot of the model
    /// gate where the spec declares `max_concurrent`; one call of the elastic window where it
    /// configures one. The price is the same tokens at the spec's prices, the reservation a
    /// spend cap judges: [`demand_within`](Registry::demand_within) judges it against a
    /// workflow's cap and reserves it before the call can wait.
    ///
    /// Charging the declared most output at the grant is how providers count a request against
    /// the quota when it starts, so the local bucket spends what the provider's does, at the same
    /// minute.
    ///
    /// # Errors
    ///
    /// [`ProviderError::UnknownModel`]. A call larger than the bucket's budget is not refused
    /// here: the monitor refuses it at once when it is admitted.
    pub fn demand_for(
        &self,
        model: &str,
        input_tokens: u64,
        max_output_tokens: u64,
    ) -> Result<ModelCall, ProviderError> {
        let spec = self.spec(model)?;
        let tokens = input_tokens.saturating_add(max_output_tokens);
        let mut demand = Demand::new();
        demand
            .add(self.http().account(), Amount::ONE)
            .add(self.factory.bucket(&spec)?, Amount::pair(tokens, 1));
        if spec.max_concurrent.is_some() {
            demand.add(self.factory.gate(&spec)?, Amount::ONE);
        }
        if let Some(window) = self.factory.window(&spec)? {
            demand.add(window, Amount::ONE);
        }
        Ok(ModelCall {
            price: spec.price(input_tokens, max_output_tokens),
            spec,
            demand,
            tokens,
        })
    }

    /// A call on `model` succeeded: relieves the bucket's throttle and the window's, and closes
    /// the window's circuit if this was its probe. A model with no limiters is ignored.
    pub fn on_success(&self, model: &str) {
        if let Some(bucket) = self.factory.existing_bucket(model) {
            bucket.record_success();
        }
        if let Some(window) = self.factory.existing_window(model) {
            window.record_success();
        }
    }

    /// The upstream answered 429 on `model`: one backpressure increment on the bucket, pressure
    /// on the window, the upstream's reading logged at `warn`; ceilings the reading carries are
    /// applied as by [`observe`](Registry::observe).
    pub fn on_rate_limit_error(&self, model: &str, info: &RateLimitInfo) {
        tracing::warn!(model, reading = %info.summary(), "upstream rate limited a call");
        if let Some(bucket) = self.factory.existing_bucket(model) {
            bucket.record_429();
        }
        if let Some(window) = self.factory.existing_window(model) {
            window.record_pressure();
        }
        self.apply_ceilings(model, info);
    }

    /// The upstream said it is overloaded (HTTP 529, or 503 with an overload message) on
    /// `model`: [`OVERLOAD_INCREMENTS`] of backpressure on the bucket and a failure described
    /// by `description` on the window.
    pub fn on_overload(&self, model: &str, description: &str) {
        tracing::warn!(model, description, "upstream overloaded");
        if let Some(bucket) = self.factory.existing_bucket(model) {
            bucket.record_backpressure(OVERLOAD_INCREMENTS);
        }
        if let Some(window) = self.factory.existing_window(model) {
            window.record_failure(description);
        }
    }

    /// A capacity reading from a response's headers: the ceilings it reports are applied to
    /// its model's bucket ([`update_limits`](Registry::update_limits)). A reading without both
    /// ceilings changes nothing.
    pub fn observe(&self, info: &RateLimitInfo) -> LimitsUpdate {
        self.apply_ceilings(&info.model, info)
    }

    fn apply_ceilings(&self, model: &str, info: &RateLimitInfo) -> LimitsUpdate {
        self.update_limits(model, info.tokens_per_minute(), info.requests_per_minute())
    }

    /// As [`LimiterFactory::update_limits`].
    pub fn update_limits(
        &self,
        model: &str,
        tokens_per_minute: u64,
        requests_per_minute: u64,
    ) -> LimitsUpdate {
        self.factory
            .update_limits(model, tokens_per_minute, requests_per_minute)
    }

    /// The status of everything: the HTTP gate first, then every model's limiters in id order.
    pub fn status(&self) -> Vec<Box<dyn AccountStatus>> {
        let mut all = vec![self.http().status()];
        all.extend(self.factory.status());
        all
    }

    /// Forgets every spec and every limiter. A test hook (feature `test-util`). The HTTP gate is
    /// forgotten too, but not its configuration: the next one is built with the registry's
    /// capacity (the one [`with_http_connections`](Registry::with_http_connections) set, if it
    /// did) and clock.
    #[cfg(feature = "test-util")]
    pub fn clear(&self) {
        self.specs.write().clear();
        self.factory.clear();
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("models", &self.models())
            .field("factory", &self.factory)
            .finish()
    }
}
