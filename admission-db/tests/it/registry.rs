//! The registry: a name once, typed lookup, same-instance unregister, the default provider.

use std::sync::Arc;

use admission_core::{Clock, SystemClock};
use admission_db::{
    CountingDbResourceProvider, DbResourceProvider, DbResourceProviders, RegistryError,
};

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

fn counting(name: &str) -> Arc<CountingDbResourceProvider> {
    Arc::new(CountingDbResourceProvider::new(name, 2, clock()).unwrap())
}

/// Another provider type, to look up under the wrong type.
struct Other(Arc<CountingDbResourceProvider>);

impl DbResourceProvider for Other {
    fn id(&self) -> &admission_db::ProviderId {
        self.0.id()
    }
    fn admission(&self) -> &Arc<admission_accounts::CountingGate> {
        self.0.admission()
    }
    fn acquire(
        &self,
        read_only: bool,
    ) -> Result<Box<dyn admission_db::DbHandle>, admission_db::DbError> {
        self.0.acquire(read_only)
    }
}

#[test]
fn a_name_is_registered_once_and_the_same_instance_again_is_a_no_op() {
    let providers = DbResourceProviders::new(clock());
    let orders = counting("orders");
    providers.register(orders.clone()).unwrap();
    providers.register(orders.clone()).unwrap();
    let err = providers.register(counting("orders")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "a different db provider is already registered as `orders`"
    );
    assert!(Arc::ptr_eq(
        &providers
            .get::<CountingDbResourceProvider>("orders")
            .unwrap(),
        &orders
    ));
}

#[test]
fn a_lookup_of_the_wrong_type_names_both_types() {
    let providers = DbResourceProviders::new(clock());
    providers
        .register(Arc::new(Other(counting("orders"))))
        .unwrap();
    let err = providers
        .get::<CountingDbResourceProvider>("orders")
        .unwrap_err();
    assert!(
        matches!(
            &err,
            RegistryError::WrongType { name, registered, asked }
                if name == "orders"
                    && registered.ends_with("registry::Other")
                    && *asked == "admission_db::counting::CountingDbResourceProvider"
        ),
        "{err}"
    );
}

#[test]
fn a_miss_names_what_is_registered_in_order() {
    let providers = DbResourceProviders::new(clock());
    providers.register(counting("b")).unwrap();
    providers.register(counting("a")).unwrap();
    assert_eq!(providers.names(), ["a", "b"]);
    let err = providers.get_dyn("c").err().unwrap();
    assert_eq!(
        err.to_string(),
        r#"no db provider is registered as `c` (registered: ["a", "b"])"#
    );
}

#[test]
fn only_the_registered_instance_unregisters() {
    let providers = DbResourceProviders::new(clock());
    let orders = counting("orders");
    providers.register(orders.clone()).unwrap();
    let err = providers.unregister(&counting("orders")).unwrap_err();
    assert!(matches!(err, RegistryError::NotSameInstance { ref name } if name == "orders"));
    assert_eq!(providers.names(), ["orders"]);
    providers.unregister(&orders).unwrap();
    assert_eq!(providers.names(), Vec::<String>::new());
}

#[test]
fn the_default_provider_is_a_counting_bound_and_nothing_without_one() {
    let providers = DbResourceProviders::new(clock());
    assert!(providers.register_default(None, None).unwrap().is_none());
    assert_eq!(providers.names(), Vec::<String>::new());
    let default = providers.register_default(Some(3), None).unwrap().unwrap();
    assert_eq!(
        (
            default.name(),
            default.admission().name(),
            default.admission().capacity()
        ),
        ("default", "db:default", 3)
    );
    let named = providers
        .register_default(Some(1), Some("audit"))
        .unwrap()
        .unwrap();
    assert_eq!(named.admission().name(), "db:audit");
    assert_eq!(providers.names(), ["audit", "default"]);
    let zero = providers
        .register_default(Some(0), Some("none"))
        .unwrap_err();
    assert!(
        matches!(zero, RegistryError::Provider(ref e) if e.provider() == "none"),
        "{zero}"
    );
}
