//! [`DbResourceProviders`]: the process's providers by name.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use admission_core::Clock;
use parking_lot::RwLock;

use crate::{CountingDbResourceProvider, DbResourceProvider, RegistryError};

/// One registered provider and its type's name.
struct Registered {
    provider: Arc<dyn DbResourceProvider>,
    type_name: &'static str,
}

/// Providers by name: each name registered once, looked up by type.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use admission_core::Monitor;
/// use admission_db::{CountingDbResourceProvider, DbResourceProvider, DbResourceProviders};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let monitor = Monitor::new();
/// let providers = DbResourceProviders::new(monitor.clock().clone());
/// providers.register_default(Some(8), None)?;
/// let db = providers.get::<CountingDbResourceProvider>("default")?;
/// assert_eq!(db.admission().capacity(), 8);
/// assert_eq!(providers.names(), ["default"]);
/// # Ok(())
/// # }
/// ```
pub struct DbResourceProviders {
    clock: Arc<dyn Clock>,
    /// By name; sorted, so `names` is too.
    providers: RwLock<BTreeMap<String, Registered>>,
}

/// The address of a provider, for "the same instance".
fn address<P: ?Sized>(provider: &Arc<P>) -> *const () {
    Arc::as_ptr(provider) as *const ()
}

impl DbResourceProviders {
    /// An empty registry; the default provider's gate stamps on `clock` (the monitor's).
    pub fn new(clock: Arc<dyn Clock>) -> DbResourceProviders {
        DbResourceProviders {
            clock,
            providers: RwLock::new(BTreeMap::new()),
        }
    }

    /// Registers `provider` under its name. The same instance again is a no-op.
    ///
    /// # Errors
    ///
    /// [`RegistryError::AlreadyRegistered`] when another instance holds the name.
    pub fn register<P: DbResourceProvider>(&self, provider: Arc<P>) -> Result<(), RegistryError> {
        let mut providers = self.providers.write();
        let name = provider.name().to_owned();
        if let Some(there) = providers.get(&name) {
            return if address(&there.provider) == address(&provider) {
                Ok(())
            } else {
                Err(RegistryError::AlreadyRegistered { name })
            };
        }
        providers.insert(
            name,
            Registered {
                provider,
                type_name: std::any::type_name::<P>(),
            },
        );
        Ok(())
    }

    /// Registers a [`CountingDbResourceProvider`] bounding jobs to `max_concurrent`, under
    /// `name` or `"default"`; without a bound, registers nothing and answers `None`.
    ///
    /// # Errors
    ///
    /// As [`register`](DbResourceProviders::register), or a bound of zero.
    pub fn register_default(
        &self,
        max_concurrent: Option<u64>,
        name: Option<&str>,
    ) -> Result<Option<Arc<CountingDbResourceProvider>>, RegistryError> {
        let Some(bound) = max_concurrent else {
            return Ok(None);
        };
        let provider = Arc::new(CountingDbResourceProvider::new(
            name.unwrap_or("default"),
            bound,
            self.clock.clone(),
        )?);
        self.register(provider.clone())?;
        Ok(Some(provider))
    }

    /// The provider registered as `name`, of type `P`.
    ///
    /// # Errors
    ///
    /// [`RegistryError::NotRegistered`] naming what is registered, or
    /// [`RegistryError::WrongType`] naming both types.
    pub fn get<P: DbResourceProvider>(&self, name: &str) -> Result<Arc<P>, RegistryError> {
        let providers = self.providers.read();
        let registered = self.find(&providers, name)?;
        let any: Arc<dyn Any + Send + Sync> = registered.provider.clone();
        any.downcast::<P>().map_err(|_| RegistryError::WrongType {
            name: name.to_owned(),
            registered: registered.type_name,
            asked: std::any::type_name::<P>(),
        })
    }

    /// The provider registered as `name`, whatever its type.
    ///
    /// # Errors
    ///
    /// [`RegistryError::NotRegistered`] naming what is registered.
    pub fn get_dyn(&self, name: &str) -> Result<Arc<dyn DbResourceProvider>, RegistryError> {
        let providers = self.providers.read();
        Ok(self.find(&providers, name)?.provider.clone())
    }

    fn find<'a>(
        &self,
        providers: &'a BTreeMap<String, Registered>,
        name: &str,
    ) -> Result<&'a Registered, RegistryError> {
        providers
            .get(name)
            .ok_or_else(|| RegistryError::NotRegistered {
                name: name.to_owned(),
                registered: providers.keys().cloned().collect(),
            })
    }

    /// Removes `provider` if it is the instance registered under its name.
    ///
    /// # Errors
    ///
    /// [`RegistryError::NotRegistered`], or [`RegistryError::NotSameInstance`] when another
    /// instance holds the name (it stays).
    pub fn unregister<P: DbResourceProvider>(
        &self,
        provider: &Arc<P>,
    ) -> Result<(), RegistryError> {
        let mut providers = self.providers.write();
        let name = provider.name();
        let there = self.find(&providers, name)?;
        if address(&there.provider) != address(provider) {
            return Err(RegistryError::NotSameInstance {
                name: name.to_owned(),
            });
        }
        providers.remove(name);
        Ok(())
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.providers.read().keys().cloned().collect()
    }
}

impl std::fmt::Debug for DbResourceProviders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbResourceProviders")
            .field("names", &self.names())
            .finish()
    }
}
