//! Reading a [`ModelCatalog`] from JSON or TOML text, with refusals that say where.
//!
//! Both formats are deserialized through `serde_path_to_error`, which tracks the path of the
//! value being read (`models[1].tokens_per_minute`). A refusal is then placed three ways: the
//! path, the line and column the parser reports, and the model, named by its `id` read again
//! from the text on its own (so an `id` written after the bad value still names it) or, when
//! that `id` cannot be read, by its index. The second reading happens only on the error path.

use serde::de::DeserializeOwned;
use serde_path_to_error::{Path, Segment};

use super::{ModelCatalog, ModelRef, SpecError};

/// Deserializes a JSON catalog, not yet validated.
pub(super) fn from_json(text: &str) -> Result<ModelCatalog, SpecError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let catalog = read(&mut deserializer).map_err(|error| json_error(text, error))?;
    // Trailing characters after the catalog: a syntax error, as `serde_json::from_str` says.
    deserializer
        .end()
        .map_err(|error| json_parse_error(&error))?;
    Ok(catalog)
}

/// Deserializes a TOML catalog, not yet validated.
pub(super) fn from_toml(text: &str) -> Result<ModelCatalog, SpecError> {
    let deserializer = toml::Deserializer::parse(text).map_err(|error| {
        let (line, column) = toml_position(text, &error);
        SpecError::Parse {
            format: "TOML",
            line,
            column,
            message: error.message().to_owned(),
        }
    })?;
    read(deserializer).map_err(|error| toml_error(text, error))
}

/// Deserializes `T`, recording the path of the value that failed.
fn read<'de, D: serde::Deserializer<'de>, T: DeserializeOwned>(
    deserializer: D,
) -> Result<T, serde_path_to_error::Error<D::Error>> {
    serde_path_to_error::deserialize(deserializer)
}

/// A JSON refusal: a syntax error is [`SpecError::Parse`], a value error [`SpecError::Value`].
fn json_error(text: &str, error: serde_path_to_error::Error<serde_json::Error>) -> SpecError {
    let path = error.path().clone();
    let inner = error.into_inner();
    if !inner.is_data() || is_root(&path) {
        return json_parse_error(&inner);
    }
    let (line, column) = json_position(&inner);
    SpecError::Value {
        format: "JSON",
        model: model_of(&path, |index| json_id(text, index)),
        path: path.to_string(),
        line,
        column,
        message: json_message(&inner),
    }
}

/// A JSON syntax error (or an error about the text as a whole) as [`SpecError::Parse`].
fn json_parse_error(error: &serde_json::Error) -> SpecError {
    let (line, column) = json_position(error);
    SpecError::Parse {
        format: "JSON",
        line,
        column,
        message: json_message(error),
    }
}

/// serde_json's line and column, both from 1 (it reports 0 for an error it could not place).
fn json_position(error: &serde_json::Error) -> (Option<usize>, Option<usize>) {
    let placed = |n: usize| (n > 0).then_some(n);
    (placed(error.line()), placed(error.column()))
}

/// serde_json's message without the ` at line L column C` it appends.
fn json_message(error: &serde_json::Error) -> String {
    let full = error.to_string();
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    match full.strip_suffix(&suffix) {
        Some(message) => message.to_owned(),
        None => full,
    }
}

/// The `id` of the `index`th model of a JSON catalog, when the text reads as JSON and that id
/// is a string.
fn json_id(text: &str, index: usize) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    value
        .get("models")?
        .get(index)?
        .get("id")?
        .as_str()
        .map(str::to_owned)
}

/// A TOML refusal found while deserializing (the syntax was checked before): a value error,
/// [`SpecError::Parse`] only when it has no path at all.
fn toml_error(text: &str, error: serde_path_to_error::Error<toml::de::Error>) -> SpecError {
    let path = error.path().clone();
    let inner = error.into_inner();
    let (line, column) = toml_position(text, &inner);
    let message = inner.message().to_owned();
    if is_root(&path) {
        return SpecError::Parse {
            format: "TOML",
            line,
            column,
            message,
        };
    }
    SpecError::Value {
        format: "TOML",
        model: model_of(&path, |index| toml_id(text, index)),
        path: path.to_string(),
        line,
        column,
        message,
    }
}

/// Where a TOML error starts, as a line and a column (in characters), both from 1; neither
/// when toml placed the error nowhere.
fn toml_position(text: &str, error: &toml::de::Error) -> (Option<usize>, Option<usize>) {
    let Some(before) = error.span().and_then(|span| text.get(..span.start)) else {
        return (None, None);
    };
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
    let column = before[line_start..].chars().count() + 1;
    (Some(line), Some(column))
}

/// The `id` of the `index`th model of a TOML catalog, when it is a string.
///
/// Read from toml's document tree, which keeps numbers as written, so a number no integer
/// type holds elsewhere in the model does not stop the id being read.
fn toml_id(text: &str, index: usize) -> Option<String> {
    let root = toml::de::DeTable::parse(text).ok()?;
    let root = toml::de::DeValue::Table(root.into_inner());
    let id = root
        .get("models")?
        .get_ref()
        .get(index)?
        .get_ref()
        .get("id")?;
    id.get_ref().as_str().map(str::to_owned)
}

/// True for the empty path: the error is about the catalog as a whole.
fn is_root(path: &Path) -> bool {
    path.iter().next().is_none()
}

/// The model a path runs through (`models[i]...`): its id if `id_of(i)` reads one, else `i`.
fn model_of(path: &Path, id_of: impl FnOnce(usize) -> Option<String>) -> Option<ModelRef> {
    let mut segments = path.iter();
    match (segments.next(), segments.next()) {
        (Some(Segment::Map { key }), Some(Segment::Seq { index })) if key == "models" => {
            Some(id_of(*index).map_or(ModelRef::Index(*index), ModelRef::Id))
        }
        _ => None,
    }
}
