//! `lb config-schema`: the JSON Schema of `lb.toml`, derived from the serde types in `config`
//! (names, nesting, enumerations, defaults and doc comments), so it cannot drift from what `lb`
//! parses. Draft-07, the draft taplo (Even Better TOML) reads. The committed
//! `docs/lb.schema.json` is this output; tests/tests/config_reference.rs fails when it is stale.
//!
//! The schema checks the file's shape only: the rules across fields (primes, overlaps, which
//! field needs which other) stay with `lb validate`.

use crate::config::raw::Config;
use schemars::generate::SchemaSettings;
use serde_json::Value;

/// The schema's title, shown by editors.
pub const SCHEMA_TITLE: &str = "lb.toml: configuration of the lb load balancer";

/// The schema as a JSON value.
pub fn schema() -> Value {
    let mut schema = SchemaSettings::draft07().for_deserialize().into_generator().into_root_schema_for::<Config>();
    schema.insert("title".into(), SCHEMA_TITLE.into());
    let mut value = schema.to_value();
    drop_nulls(&mut value);
    value
}

/// TOML has no null: an absent key is what an `Option` field's `None` reads from, so the
/// `null` alternatives and `null` defaults serde's view adds would only mislead an editor.
fn drop_nulls(value: &mut Value) {
    let Value::Object(map) = value else {
        if let Value::Array(items) = value {
            items.iter_mut().for_each(drop_nulls);
        }
        return;
    };
    // `"default": null`, and the absent members of a default table.
    map.retain(|_, v| !v.is_null());
    if let Some(Value::Array(types)) = map.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types.remove(0);
            map.insert("type".into(), only);
        }
    }
    if let Some(Value::Array(alternatives)) = map.get_mut("anyOf") {
        alternatives.retain(|a| a.get("type").is_none_or(|t| t != "null"));
        if alternatives.len() == 1 {
            let Some(Value::Object(only)) = map.remove("anyOf").and_then(|mut a| a.as_array_mut()?.pop()) else {
                unreachable!("one alternative left, an object")
            };
            for (k, v) in only {
                map.entry(k).or_insert(v);
            }
        }
    }
    map.values_mut().for_each(drop_nulls);
}

/// The schema as the file `docs/lb.schema.json` holds it: pretty-printed, one final newline.
pub fn schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&schema()).expect("a JSON value serializes");
    text.push('\n');
    text
}
