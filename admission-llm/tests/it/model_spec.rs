//! Model specs: loading from JSON and TOML, validation that names the model and the field, the
//! derived request budget and the price of a call.

use std::time::Duration;

use admission_llm::model_spec::{ModelCatalog, ModelSpec, SpecError, WindowSpec};
use admission_llm::spend::Money;
use proptest::prelude::*;

const TOML: &str = r#"
[[models]]
id = "gpt-4o"
wire_model = "gpt-4o-2024-08-06"
tokens_per_minute = 30000
requests_per_minute = 500
input_micros_per_million = 2500000
output_micros_per_million = 10000000

[[models]]
id = "gpt-4o-eu"
wire_model = "gpt-4o-2024-08-06"
tokens_per_minute = 12000
max_concurrent = 4
window = { max_requests = 20, window = "10s" }
"#;

const JSON: &str = r#"{"models": [
  {"id": "gpt-4o", "wire_model": "gpt-4o-2024-08-06", "tokens_per_minute": 30000,
   "requests_per_minute": 500, "input_micros_per_million": 2500000,
   "output_micros_per_million": 10000000},
  {"id": "gpt-4o-eu", "wire_model": "gpt-4o-2024-08-06", "tokens_per_minute": 12000,
   "max_concurrent": 4, "window": {"max_requests": 20, "window": "10s"}}
]}"#;

fn expected() -> Vec<ModelSpec> {
    vec![
        ModelSpec::new("gpt-4o", "gpt-4o-2024-08-06", 30_000)
            .with_requests_per_minute(500)
            .with_prices(2_500_000, 10_000_000),
        ModelSpec::new("gpt-4o-eu", "gpt-4o-2024-08-06", 12_000)
            .with_max_concurrent(4)
            .with_window(20, Duration::from_secs(10)),
    ]
}

fn invalid(model: &str, field: &'static str, reason: &str) -> SpecError {
    SpecError::Invalid {
        model: model.into(),
        field,
        reason: reason.into(),
    }
}

#[test]
fn toml_and_json_load_the_same_catalog() {
    let from_toml = ModelCatalog::from_toml(TOML).unwrap();
    let from_json = ModelCatalog::from_json(JSON).unwrap();
    assert_eq!(from_toml.models, expected());
    assert_eq!(from_json, from_toml);
    assert_eq!(
        from_toml.models[1].window,
        Some(WindowSpec {
            max_requests: 20,
            window: Duration::from_secs(10)
        })
    );
}

#[test]
fn a_catalog_round_trips_through_json_and_toml() {
    let catalog = ModelCatalog { models: expected() };
    let json = serde_json::to_string(&catalog).unwrap();
    assert_eq!(ModelCatalog::from_json(&json).unwrap(), catalog);
    let toml = toml::to_string(&catalog).unwrap();
    assert_eq!(ModelCatalog::from_toml(&toml).unwrap(), catalog);
}

#[test]
fn every_field_is_validated_with_the_model_and_field_named() {
    let base = || ModelSpec::new("m", "wire", 1_000);
    let cases = [
        (
            ModelSpec::new(" ", "wire", 1_000),
            invalid(" ", "id", "must not be empty"),
        ),
        (
            ModelSpec::new("m", "", 1_000),
            invalid("m", "wire_model", "must not be empty"),
        ),
        (
            ModelSpec::new("m", "wire", 0),
            invalid("m", "tokens_per_minute", "must be positive, was 0"),
        ),
        (
            base().with_requests_per_minute(0),
            invalid(
                "m",
                "requests_per_minute",
                "must be positive when given, was 0 (leave it out to derive it from tokens_per_minute)",
            ),
        ),
        (
            base().with_max_concurrent(0),
            invalid(
                "m",
                "max_concurrent",
                "must be positive when given, was 0 (leave it out for no model gate)",
            ),
        ),
    ];
    for (spec, error) in cases {
        assert_eq!(spec.validate(), Err(error));
    }
    let window = base().with_window(0, Duration::from_secs(1)).validate();
    assert!(
        matches!(&window, Err(SpecError::Invalid { model, field: "window.max_requests", .. }) if model == "m"),
        "{window:?}"
    );
    let window = base().with_window(5, Duration::ZERO).validate();
    assert!(
        matches!(
            &window,
            Err(SpecError::Invalid {
                field: "window.window",
                ..
            })
        ),
        "{window:?}"
    );
    assert_eq!(base().validate(), Ok(()));
}

#[test]
fn a_refusal_reads_as_one_line_naming_model_and_field() {
    let error = ModelCatalog::from_json(
        r#"{"models": [{"id": "haiku", "wire_model": "claude-haiku", "tokens_per_minute": 1000,
            "max_concurrent": 0}]}"#,
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "model spec `haiku`: `max_concurrent` must be positive when given, was 0 (leave it out for no model gate)"
    );
}

#[test]
fn a_repeated_id_is_refused() {
    let text = r#"
        [[models]]
        id = "a"
        wire_model = "x"
        tokens_per_minute = 10
        [[models]]
        id = "a"
        wire_model = "y"
        tokens_per_minute = 20
    "#;
    assert_eq!(
        ModelCatalog::from_toml(text),
        Err(invalid(
            "a",
            "id",
            "appears twice in the catalog (ids key the limiters and must be unique)"
        ))
    );
}

#[test]
fn unknown_fields_and_bad_syntax_are_parse_errors() {
    let unknown = ModelCatalog::from_json(
        r#"{"models": [{"id": "a", "wire_model": "x", "tokens_per_minute": 10, "tpm": 5}]}"#,
    )
    .unwrap_err();
    assert!(
        matches!(&unknown, SpecError::Parse { format: "JSON", message } if message.contains("unknown field `tpm`")),
        "{unknown}"
    );
    let negative = ModelCatalog::from_toml(
        "[[models]]\nid = \"a\"\nwire_model = \"x\"\ntokens_per_minute = -5\n",
    )
    .unwrap_err();
    assert!(
        matches!(&negative, SpecError::Parse { format: "TOML", .. }),
        "{negative}"
    );
    let duration = ModelCatalog::from_toml(
        "[[models]]\nid = \"a\"\nwire_model = \"x\"\ntokens_per_minute = 5\nwindow = { max_requests = 1, window = \"soon\" }\n",
    )
    .unwrap_err();
    assert!(
        duration.to_string().contains("`soon` is not a duration"),
        "{duration}"
    );
    assert_eq!(
        ModelCatalog::from_json("{}").unwrap(),
        ModelCatalog::default()
    );
}

#[test]
fn a_spec_without_rpm_gets_a_thousandth_of_its_tpm() {
    assert_eq!(
        ModelSpec::new("a", "x", 90_000).effective_requests_per_minute(),
        90
    );
    assert_eq!(
        ModelSpec::new("a", "x", 90_999).effective_requests_per_minute(),
        90
    );
    // Never zero: a tiny budget still allows one request a minute.
    assert_eq!(
        ModelSpec::new("a", "x", 999).effective_requests_per_minute(),
        1
    );
    assert_eq!(
        ModelSpec::new("a", "x", 90_000)
            .with_requests_per_minute(7)
            .effective_requests_per_minute(),
        7
    );
}

#[test]
fn a_price_is_input_plus_output_each_rounded_up() {
    let spec = ModelSpec::new("a", "x", 1_000).with_prices(3_000_000, 15_000_000);
    assert_eq!(spec.price(1_000, 500), Money::from_micros(3_000 + 7_500));
    // One token at 3 micros a thousand... 3,000,000 / 1,000,000 = 3 micros exactly.
    assert_eq!(spec.price(1, 0), Money::from_micros(3));
    // 0.25 micros rounds up to 1 on each side.
    let cheap = ModelSpec::new("a", "x", 1_000).with_prices(250_000, 250_000);
    assert_eq!(cheap.price(1, 1), Money::from_micros(2));
    assert_eq!(cheap.price(0, 0), Money::ZERO);
    // Saturates instead of overflowing.
    let dear = ModelSpec::new("a", "x", 1_000).with_prices(u64::MAX, u64::MAX);
    assert_eq!(dear.price(u64::MAX, u64::MAX), Money::from_micros(u64::MAX));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the text, loading answers a catalog or an error; it never panics.
    #[test]
    fn loading_never_panics(text in any::<String>()) {
        let _ = ModelCatalog::from_json(&text);
        let _ = ModelCatalog::from_toml(&text);
    }

    /// Any spec with positive numbers validates and round-trips through JSON.
    #[test]
    fn positive_specs_validate_and_round_trip(
        tpm in 1u64..,
        rpm in proptest::option::of(1u64..),
        concurrent in proptest::option::of(1u64..),
        prices in (any::<u64>(), any::<u64>()),
    ) {
        let mut spec = ModelSpec::new("m", "wire", tpm).with_prices(prices.0, prices.1);
        spec.requests_per_minute = rpm;
        spec.max_concurrent = concurrent;
        prop_assert_eq!(spec.validate(), Ok(()));
        prop_assert!(spec.effective_requests_per_minute() >= 1);
        let json = serde_json::to_string(&spec).unwrap();
        prop_assert_eq!(serde_json::from_str::<ModelSpec>(&json).unwrap(), spec);
    }
}
