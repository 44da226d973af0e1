//! Which request fields pi2 honours. Nothing a client sends is silently ignored: a field pi2
//! serves is read; a field it does not serve yet is accepted only with the value that asks for
//! nothing (`null`, or OpenAI's default, such as `presence_penalty: 0` or `logprobs: false`),
//! and refused with a 400 naming it otherwise; a few fields that never change an answer
//! (`user`, `metadata`, ...) are accepted as notes; any other field is refused by name.

use crate::error::ApiError;
use serde_json::{Map, Value};

/// Fields read by [`crate::api::CompletionRequest`].
const SERVED: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "ignore_eos",
    "echo",
    "draft",
    "response_format",
    "grammar",
    "json_schema",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];

/// Fields that never change what is generated: bookkeeping for the client's own side.
const NOTES: &[&str] = &["user", "metadata", "store", "service_tier"];

/// Whether `v` asks for nothing for the not-yet-served field `name`; `None` if pi2 does not
/// know the field at all.
fn asks_nothing(name: &str, v: &Value) -> Option<bool> {
    let zero = || v.as_f64() == Some(0.0);
    let empty =
        || v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(Map::is_empty);
    Some(match name {
        "n_probs" => zero(),
        "functions" => empty(),
        "function_call" => v.as_str() == Some("none"),
        "suffix" => v.as_str() == Some("") || empty(),
        "best_of" => v.as_f64() == Some(1.0),
        "modalities" => v.as_array().is_some_and(|a| a.iter().all(|m| m == "text")),
        "audio" | "prediction" | "reasoning_effort" | "web_search_options" => false,
        _ => return None,
    })
}

/// Checks the fields of a request body (see the module's rule).
pub fn check(body: &Map<String, Value>) -> Result<(), ApiError> {
    for (name, v) in body {
        if v.is_null() || SERVED.contains(&name.as_str()) || NOTES.contains(&name.as_str()) {
            continue;
        }
        match asks_nothing(name, v) {
            Some(true) => {}
            Some(false) => {
                return Err(ApiError::bad(format!(
                    "`{name}` is not supported by pi2 yet: remove it (or send its default)"
                ))
                .param(name.clone()))
            }
            None => {
                return Err(ApiError::bad(format!(
                    "`{name}` is not a field pi2 knows: remove it (the server's README lists the fields)"
                ))
                .param(name.clone()))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn checked(v: Value) -> Result<(), String> {
        check(v.as_object().unwrap()).map_err(|e| e.message)
    }

    #[test]
    fn fields_that_ask_for_something_pi2_lacks_are_refused_by_name() {
        for (field, value) in [
            ("n_probs", json!(3)),
            ("functions", json!([{"name": "f"}])),
            ("function_call", json!("auto")),
            ("suffix", json!("}")),
            ("best_of", json!(2)),
            ("audio", json!({"voice": "x"})),
        ] {
            let e = checked(json!({ field: value })).unwrap_err();
            assert!(e.starts_with(&format!("`{field}` is not supported")), "{e}");
        }
        let e = checked(json!({"mirostat": 2})).unwrap_err();
        assert!(e.contains("`mirostat` is not a field pi2 knows"), "{e}");
    }

    #[test]
    fn defaults_nulls_notes_and_served_fields_pass() {
        checked(json!({
            "model": "x", "messages": [], "temperature": 0, "logprobs": false, "top_logprobs": 0,
            "presence_penalty": 0.5, "frequency_penalty": 0.0, "logit_bias": {"5": 1}, "echo": false,
            "tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "n": 1,
            "best_of": 1, "user": "u1", "metadata": {"a": "b"}, "store": false, "seed": null,
            "grammar": null, "suffix": "", "modalities": ["text"],
        }))
        .unwrap();
    }
}
