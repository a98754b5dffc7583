//! Reading a [`ModelCatalog`] from JSON or TOML text, with refusals that say where.
//!
//! Both formats are deserialized through `serde_path_to_error`, which tracks the path of the
//! value being read (`models[1].tokens_per_minute`). A refusal is then placed three ways: the
//! path, the line and column the parser reports, and the model, named by its `id` read again
//! from the text on its own (so an `id` written after the bad value still names it) or, when
//! that `id` cannot be read, by its index. The second reading happens only on the error path.
//!
//! serde_json reports a number no `f64` holds (`1e400`) as a syntax error, like a missing
//! bracket. So a JSON refusal that is not about a value is told apart by reading the text again
//! with every value ignored (numbers are then scanned, never converted): text that reads is
//! syntactically JSON, and the refusal was about the value at its path after all.

use std::fmt;

use serde::de::{DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
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

/// A JSON refusal: a syntax error is [`SpecError::Parse`], a value error (a number out of range
/// included) [`SpecError::Value`].
fn json_error(text: &str, error: serde_path_to_error::Error<serde_json::Error>) -> SpecError {
    let path = error.path().clone();
    let inner = error.into_inner();
    if is_root(&path) {
        return json_parse_error(&inner);
    }
    if !inner.is_data() {
        // A syntax error, or a number out of range, which serde_json files as syntax too: the
        // text read with every value ignored tells them apart (and places a real syntax error
        // where the text first stops being JSON).
        if let Err(syntax) = json_syntax(text) {
            return json_parse_error(&syntax);
        }
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

/// Reads `text` as JSON with every value ignored: fails only where the text is not JSON (a
/// number is scanned, never converted, so `1e400` reads).
fn json_syntax(text: &str) -> Result<(), serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    IgnoredAny::deserialize(&mut deserializer)?;
    deserializer.end()
}

/// The `id` of the `index`th model of a JSON catalog, when the text reads as JSON and that id
/// is a string.
///
/// Only that id is converted; every other value is ignored, so a number no type holds
/// (`1e400`), in this model or another, does not stop the id being read.
fn json_id(text: &str, index: usize) -> Option<String> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let id = CatalogId(index).deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    id
}

/// Reads a catalog for the `id` of model `.0` only.
struct CatalogId(usize);

impl<'de> DeserializeSeed<'de> for CatalogId {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for CatalogId {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a model catalog")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut id = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "models" {
                id = map.next_value_seed(ModelsId(self.0))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(id)
    }
}

/// Reads the `models` list for the `id` of model `.0` only.
struct ModelsId(usize);

impl<'de> DeserializeSeed<'de> for ModelsId {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ModelsId {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of models")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut id = None;
        let mut index = 0;
        loop {
            if index == self.0 {
                match seq.next_element_seed(ModelId)? {
                    Some(found) => id = found,
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            index += 1;
        }
        Ok(id)
    }
}

/// Reads one model for its `id`, when that is a string.
struct ModelId;

impl<'de> DeserializeSeed<'de> for ModelId {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ModelId {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a model")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut id = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "id" {
                id = map.next_value::<IdText>()?.0;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(id)
    }
}

/// An `id` value: its text when it is a string, `None` for any other value (read and ignored).
struct IdText(Option<String>);

impl<'de> Deserialize<'de> for IdText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<IdText, D::Error> {
        deserializer.deserialize_any(IdTextVisitor)
    }
}

struct IdTextVisitor;

impl<'de> Visitor<'de> for IdTextVisitor {
    type Value = IdText;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<IdText, E> {
        Ok(IdText(Some(text.to_owned())))
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<IdText, E> {
        Ok(IdText(None))
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<IdText, E> {
        Ok(IdText(None))
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<IdText, E> {
        Ok(IdText(None))
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<IdText, E> {
        Ok(IdText(None))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<IdText, E> {
        Ok(IdText(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<IdText, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| IdText(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<IdText, A::Error> {
        IgnoredAny.visit_map(map).map(|_| IdText(None))
    }
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
