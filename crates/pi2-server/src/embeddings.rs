//! `POST /v1/embeddings`: each input (a text, a list of texts, token ids, or lists of them)
//! pooled into one L2-normalized vector by a slot ([`pi2_runtime::embed`]), as floats or
//! `encoding_format: base64` (little-endian f32, what the `openai` client asks for by default).

use crate::error::ApiError;
use crate::slots::{Event, Job};
use crate::state::{read_body, AppState};
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use base64::Engine as _;
use pi2_model::{TokenId, Tokenizer};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Most inputs in one request.
const MAX_INPUTS: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingRequest {
    input: Value,
    model: Option<String>,
    encoding_format: Option<String>,
    dimensions: Option<u64>,
    user: Option<String>,
}

pub async fn embeddings(
    State(s): State<Arc<AppState>>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    s.metrics.request();
    let answer = embed(&s, body).await;
    match &answer {
        Ok(_) => s.metrics.completed_request(),
        Err(e) => s.metrics.refused(e.status),
    }
    answer
}

async fn embed(s: &Arc<AppState>, body: Body) -> Result<Json<Value>, ApiError> {
    let s = &**s;
    let body = read_body(s, body).await?;
    let req: EmbeddingRequest =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&body))
            .map_err(|e| {
                let path = e.path().to_string();
                ApiError::bad(format!("`{path}`: {}", e.into_inner())).param(path)
            })?;
    // `model` and `user` are labels: one model is served, whatever name a client sends.
    let _ = (&req.user, &req.model);
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(f) => {
            return Err(
                ApiError::bad(format!("`encoding_format` `{f}` is not float or base64"))
                    .param("encoding_format"),
            )
        }
    };
    let d = s.model.config.n_embd;
    if req.dimensions.is_some_and(|n| n != d as u64) {
        return Err(ApiError::bad(format!(
            "`dimensions`: this model's embeddings have {d} (pi2 does not shorten them)"
        ))
        .param("dimensions"));
    }
    let inputs = token_inputs(s, &req.input)?;
    let (mut data, mut used) = (Vec::new(), 0);
    for (i, tokens) in inputs.into_iter().enumerate() {
        used += tokens.len();
        let v = embed_one(s, tokens).await?;
        let embedding = match base64 {
            true => Value::String(
                base64::engine::general_purpose::STANDARD
                    .encode(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
            ),
            false => json!(v),
        };
        data.push(json!({"object": "embedding", "index": i, "embedding": embedding}));
    }
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": s.names[0],
        "usage": {"prompt_tokens": used, "total_tokens": used},
    })))
}

/// The inputs, as OpenAI and llama-server take them: a text, token ids, text and token ids
/// mixed (llama-server's), an object (`{"prompt_string": ..}` or `{"content": [text parts]}`),
/// or a list of any of these but bare ids (a list holding ids is one mixed input).
fn input_items(input: &Value) -> Vec<&Value> {
    match input.as_array() {
        Some(items) if !items.iter().any(Value::is_number) => items.iter().collect(),
        _ => vec![input],
    }
}

/// One input's token ids (BOS as the model adds it before its first text), checked.
fn input_tokens(tok: &Tokenizer, item: &Value) -> Result<Vec<TokenId>, String> {
    // `content` is a list of text parts, as llama-server takes it.
    let text_of = |v: &Value| -> Result<String, String> {
        match v {
            Value::Array(parts) => (parts.iter())
                .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("text"), Some(t)) => Ok(t),
                    _ => Err("a content part that is not text (only text is embedded)".to_string()),
                })
                .collect(),
            _ => Err("`content` is a list of text parts".into()),
        }
    };
    let pieces: Vec<&Value> = match item {
        Value::Array(pieces) => pieces.iter().collect(),
        other => vec![other],
    };
    let mut ids = Vec::new();
    for piece in pieces {
        match piece {
            Value::String(t) => ids.extend(tok.encode(t, ids.is_empty(), false)),
            Value::Number(n) => {
                let id = n.as_i64().and_then(|t| tok.checked_ids([t]).ok());
                ids.extend(id.ok_or(format!("token {n} is outside the vocabulary"))?);
            }
            Value::Object(o) => {
                let text = match (o.get("prompt_string"), o.get("content")) {
                    (Some(Value::String(t)), None) => t.clone(),
                    (None, Some(c)) => text_of(c)?,
                    _ => return Err("an object input is {\"prompt_string\": text} or {\"content\": [text parts]}".into()),
                };
                ids.extend(tok.encode(&text, ids.is_empty(), false));
            }
            _ => return Err("an input is text, token ids, or an object".into()),
        }
    }
    Ok(ids)
}

/// Each input as token ids, checked.
fn token_inputs(s: &AppState, input: &Value) -> Result<Vec<Vec<TokenId>>, ApiError> {
    let tok = &s.model.tokenizer;
    let list = (input_items(input).into_iter().enumerate())
        .map(|(i, item)| {
            input_tokens(tok, item)
                .map_err(|m| ApiError::bad(format!("`input` {i}: {m}")).param("input"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if list.is_empty() || list.len() > MAX_INPUTS {
        return Err(ApiError::bad(format!("`input`: give 1..{MAX_INPUTS} inputs")).param("input"));
    }
    for (i, t) in list.iter().enumerate() {
        if t.is_empty() || t.len() > s.n_ctx {
            return Err(ApiError::bad(format!(
                "`input` {i} is {} tokens: empty or too large; it must be 1..{} (the context size)",
                t.len(),
                s.n_ctx
            ))
            .param("input"));
        }
    }
    Ok(list)
}

async fn embed_one(s: &AppState, prompt: Vec<TokenId>) -> Result<Vec<f32>, ApiError> {
    let (tx, mut rx) = mpsc::channel(2);
    s.queue.submit(Job::embedding(prompt, s.pooling, tx))?;
    match rx.recv().await {
        Some(Event::Embedding(v)) => Ok(v),
        Some(Event::Failed(m)) => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m)),
        Some(Event::Busy(m)) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, m)),
        _ => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the embedding ended without a vector",
        )),
    }
}
