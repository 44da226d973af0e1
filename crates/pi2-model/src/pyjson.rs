//! Python's `json.dumps` layout for chat templates' `tojson` (transformers renders templates
//! with it): `", "` and `": "` between items, or with `indent` a newline and that many spaces
//! per level; non-ASCII text kept as it is; no HTML escaping (minijinja's own `tojson` escapes
//! `<`, `>`, `&` and `'`, which changes what a model trained on transformers' output sees).

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};

/// The `tojson` filter: `value | tojson` or `value | tojson(indent=2)`.
pub fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent =
        match kwargs.get::<Option<Value>>("indent")?.or(indent) {
            None => None,
            Some(v) if v.is_none() || v.is_undefined() => None,
            Some(v) => Some(usize::try_from(v).map_err(|_| {
                Error::new(ErrorKind::InvalidOperation, "tojson: indent is a number")
            })?),
        };
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let open = |out: &mut String, d: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * d));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                open(out, depth + 1);
                write(x, indent, depth + 1, out);
            }
            open(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, x)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                open(out, depth + 1);
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                write(x, indent, depth + 1, out);
            }
            open(out, depth);
            out.push('}');
        }
        other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(v: serde_json::Value, indent: Option<usize>) -> String {
        let mut s = String::new();
        write(&v, indent, 0, &mut s);
        s
    }

    #[test]
    fn matches_python_json_dumps() {
        let v = serde_json::json!({"name": "f", "args": [1, 2.5, true, null], "d": "<é & 'x'>", "e": {}});
        assert_eq!(
            dump(v.clone(), None),
            r#"{"name": "f", "args": [1, 2.5, true, null], "d": "<é & 'x'>", "e": {}}"#
        );
        assert_eq!(
            dump(serde_json::json!({"a": [1, {"b": 2}]}), Some(2)),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ]\n}"
        );
    }
}
