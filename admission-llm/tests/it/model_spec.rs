//! Model specs: loading from JSON and TOML, refusals that name the model, the field's path and
//! the line of a wrong value, validation that names the model and the field, the derived request
//! budget and the price of a call.

use std::time::Duration;

use admission_llm::model_spec::{ModelCatalog, ModelRef, ModelSpec, SpecError, WindowSpec};
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

/// A two-model TOML catalog whose second model (`haiku`, line 7 on) ends with `last`.
fn toml_with(last: &str) -> String {
    format!(
        "[[models]]\n\
         id = \"gpt-4o\"\n\
         wire_model = \"gpt-4o-2024-08-06\"\n\
         tokens_per_minute = 30000\n\
         \n\
         [[models]]\n\
         id = \"haiku\"\n\
         wire_model = \"claude-haiku-4-5\"\n\
         {last}\n"
    )
}

/// A two-model JSON catalog, one model a line, whose second model (`haiku`, line 3) ends with
/// `last`.
fn json_with(last: &str) -> String {
    format!(
        "{{\"models\": [\n\
         {{\"id\": \"gpt-4o\", \"wire_model\": \"gpt-4o-2024-08-06\", \"tokens_per_minute\": 30000}},\n\
         {{\"id\": \"haiku\", \"wire_model\": \"claude-haiku-4-5\", {last}}}\n\
         ]}}"
    )
}

fn value_error(
    format: &'static str,
    model: ModelRef,
    path: &str,
    (line, column): (usize, usize),
    message: &str,
) -> SpecError {
    SpecError::Value {
        format,
        model: Some(model),
        path: path.into(),
        line: Some(line),
        column: Some(column),
        message: message.into(),
    }
}

fn haiku() -> ModelRef {
    ModelRef::Id("haiku".into())
}

/// The five ways a value can be wrong, each refused naming the model, the field's path, the
/// line and column, and the value seen.
#[test]
fn a_wrong_value_in_toml_names_the_model_the_path_and_the_line() {
    let tpm = "models[1].tokens_per_minute";
    let cases = [
        (
            "tokens_per_minute = -1",
            value_error(
                "TOML",
                haiku(),
                tpm,
                (9, 21),
                "invalid value: integer `-1`, expected u64",
            ),
            "model spec `haiku`: `models[1].tokens_per_minute` invalid value: integer `-1`, \
             expected u64 (TOML line 9, column 21)",
        ),
        (
            "tokens_per_minute = 1.5",
            value_error(
                "TOML",
                haiku(),
                tpm,
                (9, 21),
                "invalid type: floating point `1.5`, expected u64",
            ),
            "model spec `haiku`: `models[1].tokens_per_minute` invalid type: floating point \
             `1.5`, expected u64 (TOML line 9, column 21)",
        ),
        (
            "tokens_per_minute = \"1000\"",
            value_error(
                "TOML",
                haiku(),
                tpm,
                (9, 21),
                "invalid type: string \"1000\", expected u64",
            ),
            "model spec `haiku`: `models[1].tokens_per_minute` invalid type: string \"1000\", \
             expected u64 (TOML line 9, column 21)",
        ),
        (
            "tokens_per_minute = 18446744073709551616",
            value_error(
                "TOML",
                haiku(),
                tpm,
                (9, 21),
                "invalid type: integer `18446744073709551616` as i128, expected u64",
            ),
            "model spec `haiku`: `models[1].tokens_per_minute` invalid type: integer \
             `18446744073709551616` as i128, expected u64 (TOML line 9, column 21)",
        ),
        (
            "tokens_per_minute = 1000\nwindow = { max_requests = 5, window = \"soon\" }",
            value_error(
                "TOML",
                haiku(),
                "models[1].window.window",
                (10, 39),
                "`soon` is not a duration: expected number at 0",
            ),
            "model spec `haiku`: `models[1].window.window` `soon` is not a duration: expected \
             number at 0 (TOML line 10, column 39)",
        ),
    ];
    for (last, error, message) in cases {
        let refused = ModelCatalog::from_toml(&toml_with(last));
        assert_eq!(
            refused.as_ref().map_err(ToString::to_string),
            Err(message.to_owned()),
            "{last}"
        );
        assert_eq!(refused, Err(error), "{last}");
    }
}

#[test]
fn a_wrong_value_in_json_names_the_model_the_path_and_the_line() {
    let tpm = "models[1].tokens_per_minute";
    let cases = [
        (
            "\"tokens_per_minute\": -1",
            value_error(
                "JSON",
                haiku(),
                tpm,
                (3, 73),
                "invalid value: integer `-1`, expected u64",
            ),
            "model spec `haiku`: `models[1].tokens_per_minute` invalid value: integer `-1`, \
             expected u64 (JSON line 3, column 73)",
        ),
        (
            "\"tokens_per_minute\": 1.5",
            value_error(
                "JSON",
                haiku(),
                tpm,
                (3, 74),
                "invalid type: floating point `1.5`, expected u64",
            ),
            "model spec `haiku`: `models[1].tokens_per_minute` invalid type: floating point \
             `1.5`, expected u64 (JSON line 3, column 74)",
        ),
        (
            "\"tokens_per_minute\": \"1000\"",
            value_error(
                "JSON",
                haiku(),
                tpm,
                (3, 77),
                "invalid type: string \"1000\", expected u64",
            ),
            "model spec `haiku`: `models[1].tokens_per_minute` invalid type: string \"1000\", \
             expected u64 (JSON line 3, column 77)",
        ),
        (
            // serde_json reads an integer past u64::MAX as a float, and says so.
            "\"tokens_per_minute\": 18446744073709551616",
            value_error(
                "JSON",
                haiku(),
                tpm,
                (3, 91),
                "invalid type: floating point `1.8446744073709552e+19`, expected u64",
            ),
            "model spec `haiku`: `models[1].tokens_per_minute` invalid type: floating point \
             `1.8446744073709552e+19`, expected u64 (JSON line 3, column 91)",
        ),
        (
            "\"tokens_per_minute\": 1000, \"window\": {\"max_requests\": 5, \"window\": \"soon\"}",
            value_error(
                "JSON",
                haiku(),
                "models[1].window.window",
                (3, 124),
                "`soon` is not a duration: expected number at 0",
            ),
            "model spec `haiku`: `models[1].window.window` `soon` is not a duration: expected \
             number at 0 (JSON line 3, column 124)",
        ),
    ];
    for (last, error, message) in cases {
        let refused = ModelCatalog::from_json(&json_with(last));
        assert_eq!(
            refused.as_ref().map_err(ToString::to_string),
            Err(message.to_owned()),
            "{last}"
        );
        assert_eq!(refused, Err(error), "{last}");
    }
}

/// One wrong value written in each format: a number no integer (or float) type holds, a
/// negative count, a string for a count, a missing field. JSON and TOML both refuse it as a
/// [`SpecError::Value`] naming the model (`haiku`) and the field's path, in these exact words.
#[test]
fn json_and_toml_name_the_model_and_the_field_for_the_same_wrong_value() {
    let tpm = "models[1].tokens_per_minute";
    // (JSON, TOML, path, JSON's message, TOML's message)
    let cases = [
        (
            "\"tokens_per_minute\": 1e400",
            "tokens_per_minute = 1e400",
            tpm,
            "model spec `haiku`: `models[1].tokens_per_minute` number out of range (JSON line 3, \
             column 76)",
            "model spec `haiku`: `models[1].tokens_per_minute` floating-point number overflowed \
             (TOML line 9, column 21)",
        ),
        (
            "\"tokens_per_minute\": -1e400",
            "tokens_per_minute = -1e400",
            tpm,
            "model spec `haiku`: `models[1].tokens_per_minute` number out of range (JSON line 3, \
             column 77)",
            "model spec `haiku`: `models[1].tokens_per_minute` floating-point number overflowed \
             (TOML line 9, column 21)",
        ),
        (
            "\"tokens_per_minute\": 1000, \"requests_per_minute\": 1e400",
            "tokens_per_minute = 1000\nrequests_per_minute = 1e400",
            "models[1].requests_per_minute",
            "model spec `haiku`: `models[1].requests_per_minute` number out of range (JSON line 3, \
             column 105)",
            "model spec `haiku`: `models[1].requests_per_minute` floating-point number overflowed \
             (TOML line 10, column 23)",
        ),
        (
            "\"tokens_per_minute\": -5",
            "tokens_per_minute = -5",
            tpm,
            "model spec `haiku`: `models[1].tokens_per_minute` invalid value: integer `-5`, \
             expected u64 (JSON line 3, column 73)",
            "model spec `haiku`: `models[1].tokens_per_minute` invalid value: integer `-5`, \
             expected u64 (TOML line 9, column 21)",
        ),
        (
            "\"tokens_per_minute\": \"many\"",
            "tokens_per_minute = \"many\"",
            tpm,
            "model spec `haiku`: `models[1].tokens_per_minute` invalid type: string \"many\", \
             expected u64 (JSON line 3, column 77)",
            "model spec `haiku`: `models[1].tokens_per_minute` invalid type: string \"many\", \
             expected u64 (TOML line 9, column 21)",
        ),
        (
            "\"max_concurrent\": 2",
            "max_concurrent = 2",
            "models[1]",
            "model spec `haiku`: `models[1]` missing field `tokens_per_minute` (JSON line 3, \
             column 70)",
            "model spec `haiku`: `models[1]` missing field `tokens_per_minute` (TOML line 6, \
             column 1)",
        ),
        (
            "\"tokens_per_minute\": 1000, \"window\": {\"max_requests\": 1e400, \"window\": \"1s\"}",
            "tokens_per_minute = 1000\nwindow = { max_requests = 1e400, window = \"1s\" }",
            "models[1].window.max_requests",
            "model spec `haiku`: `models[1].window.max_requests` number out of range (JSON line 3, \
             column 109)",
            "model spec `haiku`: `models[1].window.max_requests` floating-point number overflowed \
             (TOML line 10, column 27)",
        ),
        (
            "\"tokens_per_minute\": 1000, \"window\": {\"max_requests\": 5}",
            "tokens_per_minute = 1000\nwindow = { max_requests = 5 }",
            "models[1].window",
            "model spec `haiku`: `models[1].window` missing field `window` (JSON line 3, column \
             106)",
            "model spec `haiku`: `models[1].window` missing field `window` (TOML line 10, column \
             10)",
        ),
    ];
    for (json, toml, path, json_message, toml_message) in cases {
        for (format, refused, message) in [
            (
                "JSON",
                ModelCatalog::from_json(&json_with(json)),
                json_message,
            ),
            (
                "TOML",
                ModelCatalog::from_toml(&toml_with(toml)),
                toml_message,
            ),
        ] {
            let refused = refused.unwrap_err();
            assert_eq!(refused.to_string(), message, "{format}: {json}");
            assert!(
                matches!(
                    &refused,
                    SpecError::Value { format: f, model: Some(ModelRef::Id(id)), path: p, .. }
                        if *f == format && id == "haiku" && p == path
                ),
                "{format}: {refused:?}"
            );
        }
    }
}

/// `1e400` was refused as "not valid JSON" without the model or the field: now the exact
/// [`SpecError::Value`], with the model named by an id written after it, or by its index when
/// it has none; a number out of range outside every model names the field alone.
#[test]
fn a_json_number_out_of_range_is_a_value_error_not_a_parse_error() {
    let refused = ModelCatalog::from_json(&json_with("\"tokens_per_minute\": 1e400"));
    assert_eq!(
        refused,
        Err(value_error(
            "JSON",
            haiku(),
            "models[1].tokens_per_minute",
            (3, 76),
            "number out of range"
        ))
    );
    let late = r#"{"models": [{"tokens_per_minute": 1e400, "wire_model": "x", "id": "late"}]}"#;
    assert_eq!(
        ModelCatalog::from_json(late).map_err(|e| e.to_string()),
        Err(
            "model spec `late`: `models[0].tokens_per_minute` number out of range (JSON line 1, \
             column 39)"
                .to_owned()
        )
    );
    // Another model's number out of range does not stop this model's id being read.
    let other = r#"{"models": [{"id": "a", "tokens_per_minute": 1e400}, {"id": "b", "x": 1e999}]}"#;
    assert!(
        matches!(
            ModelCatalog::from_json(other),
            Err(SpecError::Value { model: Some(ModelRef::Id(id)), .. }) if id == "a"
        ),
        "{other}"
    );
    for nameless in [
        r#"{"models": [{"tokens_per_minute": 1e400, "wire_model": "x"}]}"#,
        r#"{"models": [{"tokens_per_minute": 1e400, "wire_model": "x", "id": 1e400}]}"#,
    ] {
        assert_eq!(
            ModelCatalog::from_json(nameless),
            Err(value_error(
                "JSON",
                ModelRef::Index(0),
                "models[0].tokens_per_minute",
                (1, 39),
                "number out of range"
            )),
            "{nameless}"
        );
    }
    assert_eq!(
        ModelCatalog::from_json(r#"{"models": 1e400}"#),
        Err(SpecError::Value {
            format: "JSON",
            model: None,
            path: "models".into(),
            line: Some(1),
            column: Some(16),
            message: "number out of range".into(),
        })
    );
}

/// A number out of range in text that is not JSON further on: the refusal is the syntax error,
/// placed where the text stops being JSON.
#[test]
fn a_syntax_error_after_a_number_out_of_range_is_still_a_parse_error() {
    let text =
        "{\"models\": [\n  {\"id\": \"a\", \"tokens_per_minute\": 1e400,\n   \"wire_model\": }\n]}";
    assert_eq!(
        ModelCatalog::from_json(text),
        Err(SpecError::Parse {
            format: "JSON",
            line: Some(3),
            column: Some(18),
            message: "expected value".into(),
        })
    );
}

#[test]
fn the_catalogs_around_the_bad_values_load_when_the_values_are_right() {
    let toml = ModelCatalog::from_toml(&toml_with(
        "tokens_per_minute = 1000\nwindow = { max_requests = 5, window = \"10s\" }",
    ))
    .unwrap();
    let json = ModelCatalog::from_json(&json_with(
        "\"tokens_per_minute\": 1000, \"window\": {\"max_requests\": 5, \"window\": \"10s\"}",
    ))
    .unwrap();
    assert_eq!(toml, json);
    assert_eq!(
        toml.models,
        [
            ModelSpec::new("gpt-4o", "gpt-4o-2024-08-06", 30_000),
            ModelSpec::new("haiku", "claude-haiku-4-5", 1_000)
                .with_window(5, Duration::from_secs(10)),
        ]
    );
}

#[test]
fn a_model_whose_id_cannot_be_read_is_named_by_its_index() {
    let toml = "[[models]]\nid = \"a\"\nwire_model = \"x\"\ntokens_per_minute = 1\n\
                [[models]]\nid = 7\nwire_model = \"x\"\ntokens_per_minute = 1\n";
    assert_eq!(
        ModelCatalog::from_toml(toml),
        Err(value_error(
            "TOML",
            ModelRef::Index(1),
            "models[1].id",
            (6, 6),
            "invalid type: integer `7`, expected a string"
        ))
    );
    let json = r#"{"models": [{"wire_model": "x", "tokens_per_minute": -1}]}"#;
    let refused = ModelCatalog::from_json(json).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "model spec at index 0: `models[0].tokens_per_minute` invalid value: integer `-1`, \
         expected u64 (JSON line 1, column 55)"
    );
}

#[test]
fn a_model_is_named_by_an_id_written_after_the_bad_value() {
    let json = r#"{"models": [{"tokens_per_minute": "lots", "wire_model": "x", "id": "late"}]}"#;
    let refused = ModelCatalog::from_json(json).unwrap_err();
    assert!(
        matches!(&refused, SpecError::Value { model: Some(ModelRef::Id(id)), .. } if id == "late"),
        "{refused}"
    );
}

#[test]
fn unknown_and_missing_fields_name_the_model_and_the_path() {
    let unknown = ModelCatalog::from_json(&json_with("\"tokens_per_minute\": 10, \"tpm\": 5"));
    assert_eq!(
        unknown.map_err(|e| e.to_string()),
        Err(
            "model spec `haiku`: `models[1].tpm` unknown field `tpm`, expected one of `id`, \
             `wire_model`, `tokens_per_minute`, `requests_per_minute`, `max_concurrent`, \
             `input_micros_per_million`, `output_micros_per_million`, `window` (JSON line 3, \
             column 80)"
                .to_owned()
        )
    );
    let missing = ModelCatalog::from_toml(&toml_with("max_concurrent = 2")).unwrap_err();
    assert!(
        matches!(
            &missing,
            SpecError::Value { format: "TOML", model: Some(ModelRef::Id(id)), path, message, .. }
                if id == "haiku" && path == "models[1]" && message == "missing field `tokens_per_minute`"
        ),
        "{missing}"
    );
    let top = ModelCatalog::from_toml("models = 3\n").unwrap_err();
    assert_eq!(
        top,
        SpecError::Value {
            format: "TOML",
            model: None,
            path: "models".into(),
            line: Some(1),
            column: Some(10),
            message: "invalid type: integer `3`, expected a sequence".into(),
        }
    );
}

#[test]
fn text_that_is_not_json_or_toml_is_a_parse_error_with_its_line() {
    let toml =
        ModelCatalog::from_toml("[[models]]\nid = \"a\"\ntokens_per_minute = \n").unwrap_err();
    assert!(
        matches!(
            &toml,
            SpecError::Parse {
                format: "TOML",
                line: Some(3),
                ..
            }
        ),
        "{toml:?}"
    );
    let json = ModelCatalog::from_json("{\"models\": [\n  {\"id\": }\n]}").unwrap_err();
    assert_eq!(
        json,
        SpecError::Parse {
            format: "JSON",
            line: Some(2),
            column: Some(10),
            message: "expected value".into(),
        }
    );
    assert_eq!(
        json.to_string(),
        "model catalog is not valid JSON line 2, column 10: expected value"
    );
    let trailing = ModelCatalog::from_json("{} {}").unwrap_err();
    assert!(
        matches!(&trailing, SpecError::Parse { format: "JSON", message, .. } if message == "trailing characters"),
        "{trailing:?}"
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
