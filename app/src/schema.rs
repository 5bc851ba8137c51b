//! Checking edited arguments against a tool's input schema in the browser, before anything is sent.
//!
//! A small checker for the part of JSON Schema that tool input schemas use (`type`, `properties`, `required`,
//! `additionalProperties`, `items`, `minItems`/`maxItems`, `minLength`/`maxLength`, `minimum`/`maximum`, `enum`,
//! `const`), rather than the `jsonschema` crate the server uses: that crate brings regular expressions, formats and
//! remote references into the WASM (several hundred KiB before compression, more than the whole page today) for
//! keywords these schemas do not use. Keywords it does not know are not checked here; the server checks the whole
//! schema again in any case, so this check only spares a round trip, it never decides alone.

use serde_json::{Map, Value};

/// Every way `value` fails `schema`, each as "where: what", `/` for the whole value. Empty when it satisfies it.
pub fn check(schema: &Value, value: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    check_at(schema, value, "", &mut problems);
    problems
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn has_type(value: &Value, name: &str) -> bool {
    match name {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|n| n.fract() == 0.0)
        }
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        // A type this checker does not know: the server decides.
        _ => true,
    }
}

fn limit(schema: &Map<String, Value>, key: &str) -> Option<u64> {
    schema.get(key).and_then(Value::as_u64)
}

fn check_at(schema: &Value, value: &Value, at: &str, problems: &mut Vec<String>) {
    let Some(schema) = schema.as_object() else {
        // `true` or `{}`-like: anything goes; `false`: nothing does.
        if schema == &Value::Bool(false) {
            problems.push(format!("{}: is not allowed", place(at)));
        }
        return;
    };
    match schema.get("type") {
        Some(Value::String(name)) if !has_type(value, name) => {
            push(
                problems,
                at,
                format!("must be {}, not {}", article(name), kind(value)),
            );
            return;
        }
        Some(Value::Array(names))
            if !names
                .iter()
                .filter_map(Value::as_str)
                .any(|name| has_type(value, name)) =>
        {
            push(
                problems,
                at,
                format!("is {}, which this field does not take", kind(value)),
            );
            return;
        }
        _ => {}
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        let shown: Vec<String> = options.iter().map(Value::to_string).collect();
        push(problems, at, format!("must be one of {}", shown.join(", ")));
    }
    if let Some(expected) = schema.get("const")
        && expected != value
    {
        push(problems, at, format!("must be {expected}"));
    }
    match value {
        Value::String(text) => {
            let length = text.chars().count() as u64;
            if let Some(min) = limit(schema, "minLength")
                && length < min
            {
                push(
                    problems,
                    at,
                    if min == 1 {
                        "must not be empty".to_owned()
                    } else {
                        format!("must be at least {min} characters long")
                    },
                );
            }
            if let Some(max) = limit(schema, "maxLength")
                && length > max
            {
                push(
                    problems,
                    at,
                    format!("must be at most {max} characters long (it has {length})"),
                );
            }
        }
        Value::Number(number) => {
            let n = number.as_f64().unwrap_or_default();
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                && n < min
            {
                push(problems, at, format!("must be at least {min}"));
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                && n > max
            {
                push(problems, at, format!("must be at most {max}"));
            }
        }
        Value::Array(items) => {
            if let Some(min) = limit(schema, "minItems")
                && (items.len() as u64) < min
            {
                push(problems, at, format!("must have at least {min} items"));
            }
            if let Some(max) = limit(schema, "maxItems")
                && (items.len() as u64) > max
            {
                push(
                    problems,
                    at,
                    format!("must have at most {max} items (it has {})", items.len()),
                );
            }
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    check_at(item_schema, item, &format!("{at}/{index}"), problems);
                }
            }
        }
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for name in required.iter().filter_map(Value::as_str) {
                    if !fields.contains_key(name) {
                        problems.push(format!("{}: is required", place(&format!("{at}/{name}"))));
                    }
                }
            }
            for (name, field) in fields {
                let field_at = format!("{at}/{name}");
                match properties.and_then(|properties| properties.get(name)) {
                    Some(field_schema) => check_at(field_schema, field, &field_at, problems),
                    None => match schema.get("additionalProperties") {
                        Some(Value::Bool(false)) => {
                            problems
                                .push(format!("{}: is not a field of this tool", place(&field_at)));
                        }
                        Some(extra) => check_at(extra, field, &field_at, problems),
                        None => {}
                    },
                }
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
}

fn push(problems: &mut Vec<String>, at: &str, what: String) {
    problems.push(format!("{}: {what}", place(at)));
}

fn place(at: &str) -> &str {
    if at.is_empty() { "/" } else { at }
}

fn article(name: &str) -> String {
    match name {
        "null" => "null".to_owned(),
        "array" | "object" | "integer" => format!("an {name}"),
        other => format!("a {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write_file() -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1, "maxLength": 10},
                "content": {"type": "string", "maxLength": 5}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        })
    }

    #[test]
    fn valid_input_passes() {
        assert!(check(&write_file(), &json!({"path": "a.txt", "content": "hi"})).is_empty());
        let command = json!({
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "args": {"type": "array", "items": {"type": "string"}, "maxItems": 2}
            },
            "required": ["command"]
        });
        assert!(check(&command, &json!({"command": "ls", "args": ["-l"]})).is_empty());
        assert_eq!(
            check(&command, &json!({"command": "ls", "args": ["-l", 3, "x"]})),
            [
                "/args: must have at most 2 items (it has 3)",
                "/args/1: must be a string, not a number"
            ]
        );
    }

    #[test]
    fn every_violation_is_named_with_where_it_is() {
        assert_eq!(
            check(&write_file(), &json!({"path": "", "extra": 1})),
            [
                "/content: is required",
                "/extra: is not a field of this tool",
                "/path: must not be empty",
            ]
        );
        assert_eq!(
            check(&write_file(), &json!({"path": "a", "content": "toolong"})),
            ["/content: must be at most 5 characters long (it has 7)"]
        );
        assert_eq!(
            check(&write_file(), &json!(["a"])),
            ["/: must be an object, not an array"]
        );
        // Characters, not bytes, as JSON Schema counts them.
        assert!(check(&write_file(), &json!({"path": "a", "content": "ééééé"})).is_empty());
    }

    #[test]
    fn enums_numbers_and_unknown_keywords() {
        let schema = json!({"type": "object", "properties": {
            "mode": {"enum": ["a", "b"]},
            "n": {"type": "integer", "minimum": 1, "maximum": 3},
            "p": {"type": "string", "pattern": "^x"}
        }});
        assert_eq!(
            check(&schema, &json!({"mode": "c", "n": 5, "p": "y"})),
            [r#"/mode: must be one of "a", "b""#, "/n: must be at most 3"]
        );
        assert_eq!(
            check(&schema, &json!({"n": 1.5})),
            ["/n: must be an integer, not a number"]
        );
    }
}
