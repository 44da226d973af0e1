//! llama-server's token routes and properties: `POST /tokenize`, `POST /detokenize`,
//! `GET /props`.

use crate::error::ApiError;
use crate::state::{read_body, AppState};
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    content: String,
    /// Add the model's BOS (llama-server: `add_special`, default false).
    #[serde(default)]
    add_special: bool,
    /// Control-token text becomes control tokens (llama-server's default: true).
    #[serde(default = "yes")]
    parse_special: bool,
    /// Each token with its text.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    tokens: Vec<i64>,
}

/// Parses a JSON body into `T`; the error names the field that is wrong or unknown.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        ApiError::bad(format!("`{path}`: {}", e.into_inner())).param(path)
    })
}

pub async fn tokenize(State(s): State<Arc<AppState>>, body: Body) -> Response {
    let run = async {
        let r: TokenizeRequest = parse(&read_body(&s, body).await?)?;
        let tok = &s.model.tokenizer;
        let ids = tok.encode(&r.content, r.add_special, r.parse_special);
        let tokens: Vec<Value> = if r.with_pieces {
            ids.iter()
                .map(|&id| {
                    let bytes = tok.token_bytes(id, true);
                    let piece = match std::str::from_utf8(&bytes) {
                        Ok(t) => json!(t),
                        // Part of a character: its bytes, as llama-server sends them.
                        Err(_) => json!(bytes),
                    };
                    json!({"id": id, "piece": piece})
                })
                .collect()
        } else {
            ids.iter().map(|&id| json!(id)).collect()
        };
        Ok::<_, ApiError>(Json(json!({ "tokens": tokens })))
    };
    run.await.into_response()
}

pub async fn detokenize(State(s): State<Arc<AppState>>, body: Body) -> Response {
    let run = async {
        let r: DetokenizeRequest = parse(&read_body(&s, body).await?)?;
        let tok = &s.model.tokenizer;
        let vocab = tok.vocab_size();
        let ids = tok
            .checked_ids(r.tokens.iter().copied())
            .map_err(|(i, t)| {
                ApiError::bad(format!("{t} is outside the vocabulary of {vocab}"))
                    .param(format!("tokens[{i}]"))
            })?;
        let content = String::from_utf8_lossy(&tok.decode(&ids, false)).into_owned();
        Ok::<_, ApiError>(Json(json!({ "content": content })))
    };
    run.await.into_response()
}

/// llama-server's `GET /slots`: each slot's id, context, whether it is answering a request,
/// the tokens its KV cache holds from its last one, and the default settings.
pub async fn slots(State(s): State<Arc<AppState>>) -> Json<Value> {
    let d = pi2_engine::SamplerConfig::default();
    let list: Vec<Value> = (s.queue.slots().iter().enumerate())
        .map(|(id, v)| {
            json!({
                "id": id,
                "id_task": -1,
                "n_ctx": s.n_ctx,
                "speculative": s.draft_model,
                "is_processing": v.busy,
                "cached_tokens": v.cached_tokens,
                "params": {
                    "temperature": d.temperature,
                    "top_k": d.top_k,
                    "top_p": d.top_p,
                    "min_p": d.min_p,
                    "repeat_penalty": d.repeat_penalty,
                    "repeat_last_n": d.repeat_last_n,
                },
                "next_token": {"has_next_token": v.busy, "n_remain": -1, "n_decoded": 0},
            })
        })
        .collect();
    Json(Value::Array(list))
}

/// llama-server's slot actions (`POST /slots/ID?action=save|restore|erase`): not served yet,
/// refused by name (llama-server itself refuses them without `--slot-save-path`).
pub async fn props(State(s): State<Arc<AppState>>) -> Json<Value> {
    let d = pi2_engine::SamplerConfig::default();
    Json(json!({
        "model_alias": s.names[0],
        "model_name": s.model.name,
        "model_path": s.labels.path,
        "total_slots": s.slots,
        "chat_template": s.model.chat_template,
        "build_info": concat!("pi2 ", env!("CARGO_PKG_VERSION")),
        "default_generation_settings": {
            "n_ctx": s.n_ctx,
            "params": {
                "temperature": d.temperature,
                "top_k": d.top_k,
                "top_p": d.top_p,
                "min_p": d.min_p,
                "repeat_penalty": d.repeat_penalty,
                "repeat_last_n": d.repeat_last_n,
                "draft": s.draft.as_str(),
                "draft_model": s.draft_model,
                "draft_max": s.draft_max,
            },
        },
    }))
}
