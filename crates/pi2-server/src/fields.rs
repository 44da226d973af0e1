//! Which request fields pi2 honours. Nothing a client sends is silently ignored: a field pi2
//! serves is read; a field it does not serve yet is accepted only with the value that asks for
//! nothing (`null`, or OpenAI's default, such as `presence_penalty: 0` or `logprobs: false`),
//! and refused with a 400 naming it otherwise; fields that never change an answer (labels such
//! as `user` and `model`, llama-server's delivery options such as `cache_prompt`) are accepted as
//! notes; any other field is refused by name.

use crate::error::ApiError;
use serde_json::{Map, Value};

/// Fields read by [`crate::api::CompletionRequest`].
const SERVED: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "n_predict",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
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
    "n_probs",
    "chat_template_kwargs",
    "reasoning_format",
    "reasoning_effort",
    "add_generation_prompt",
    "continue_final_message",
    "input_prefix",
    "input_suffix",
    "input_extra",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];

/// Fields that never change what is generated: bookkeeping for the client's own side, and
/// llama-server's options for how an answer is delivered or cached (pi2 reuses a slot's cache
/// by itself; the answer is the same either way).
const NOTES: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "cache_prompt",
    "id_slot",
    "timings_per_token",
    "return_progress",
];

/// llama-server's default sampler chain: sent by some clients as is.
const DEFAULT_SAMPLERS: &[&str] = &[
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
];

/// Whether `v` asks for nothing for the not-yet-served field `name` of `body`; `None` if pi2
/// does not know the field at all. A sampler's settings ask for nothing while the sampler is
/// off (llama-server's `dry_multiplier`, `xtc_probability`, `mirostat`, `dynatemp_range` at 0).
fn asks_nothing(name: &str, v: &Value, body: &Map<String, Value>) -> Option<bool> {
    let zero = || v.as_f64() == Some(0.0);
    let empty =
        || v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(Map::is_empty);
    let off = |switch: &str| {
        body.get(switch)
            .is_none_or(|s| s.is_null() || s.as_f64() == Some(0.0))
    };
    Some(match name {
        "typical_p" => v.as_f64() == Some(1.0),
        "top_n_sigma" => v.as_f64().is_some_and(|x| x <= 0.0),
        "dry_multiplier" | "xtc_probability" | "mirostat" | "dynatemp_range" => zero(),
        "dry_base" | "dry_allowed_length" | "dry_penalty_last_n" | "dry_sequence_breakers" => {
            off("dry_multiplier")
        }
        "xtc_threshold" => off("xtc_probability"),
        "mirostat_tau" | "mirostat_eta" => off("mirostat"),
        "dynatemp_exponent" => off("dynatemp_range"),
        "samplers" => v.as_array().is_some_and(|a| {
            a.iter()
                .map(Value::as_str)
                .eq(DEFAULT_SAMPLERS.iter().map(|s| Some(*s)))
        }),
        "min_keep" => zero(),
        "functions" => empty(),
        "function_call" => v.as_str() == Some("none"),
        "suffix" => v.as_str() == Some("") || empty(),
        "best_of" => v.as_f64() == Some(1.0),
        "modalities" => v.as_array().is_some_and(|a| a.iter().all(|m| m == "text")),
        "audio" | "prediction" | "web_search_options" => false,
        _ => return None,
    })
}

/// Checks the fields of a request body (see the module's rule).
pub fn check(body: &Map<String, Value>) -> Result<(), ApiError> {
    for (name, v) in body {
        if v.is_null() || SERVED.contains(&name.as_str()) || NOTES.contains(&name.as_str()) {
            continue;
        }
        match asks_nothing(name, v, body) {
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
            ("typical_p", json!(0.5)),
            ("functions", json!([{"name": "f"}])),
            ("function_call", json!("auto")),
            ("suffix", json!("}")),
            ("best_of", json!(2)),
            ("audio", json!({"voice": "x"})),
        ] {
            let e = checked(json!({ field: value })).unwrap_err();
            assert!(e.starts_with(&format!("`{field}` is not supported")), "{e}");
        }
        for (field, value) in [
            ("mirostat", json!(2)),
            ("typical_p", json!(0.9)),
            ("dry_multiplier", json!(0.8)),
            ("xtc_probability", json!(0.5)),
            ("top_n_sigma", json!(1.5)),
            ("samplers", json!(["top_k", "temperature"])),
        ] {
            let e = checked(json!({ field: value })).unwrap_err();
            assert!(e.starts_with(&format!("`{field}` is not supported")), "{e}");
        }
        // A sampler's settings count once the sampler is on.
        let e = checked(json!({"dry_multiplier": 0.8, "dry_base": 1.75})).unwrap_err();
        assert!(e.contains("dry_"), "{e}");
        let e = checked(json!({"frobnicate": 1})).unwrap_err();
        assert!(e.contains("`frobnicate` is not a field pi2 knows"), "{e}");
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
        // What llama-server's own clients send by default.
        checked(json!({
            "n_predict": 16, "cache_prompt": true, "id_slot": -1, "timings_per_token": false,
            "typical_p": 1.0, "repeat_last_n": 64, "dry_multiplier": 0.0, "dry_base": 1.75,
            "dry_allowed_length": 2, "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n"],
            "xtc_probability": 0.0, "xtc_threshold": 0.1, "mirostat": 0, "mirostat_tau": 5.0,
            "mirostat_eta": 0.1, "top_n_sigma": -1.0, "dynatemp_range": 0.0,
            "dynatemp_exponent": 1.0, "samplers": DEFAULT_SAMPLERS, "n_probs": 0, "min_keep": 0,
            "chat_template_kwargs": {}, "continue_final_message": false,
        }))
        .unwrap();
    }
}
