//! llama-server's native `/completion` answers: `content` and `stop`, the counts under its own
//! names (`tokens_predicted`, `tokens_evaluated`, `tokens_cached`), why it stopped (`stop_type`
//! `eos`, `word` with `stopping_word`, or `limit`), the settings, and with `n_probs` each token's
//! `completion_probabilities`.

use crate::api::{Envelope, Finish, Summary};
use pi2_engine::TokenLogprob;
use pi2_model::tokenizer::Tokenizer;
use serde_json::{json, Value};

/// The whole answer.
pub fn answer(env: &Envelope, text: &str, s: &Summary, probs: Option<Value>) -> Value {
    let mut v = end_fields(env, s);
    v["content"] = text.into();
    v["has_new_line"] = text.contains('\n').into();
    if let Some(p) = probs {
        v["completion_probabilities"] = p;
    }
    v
}

/// A stream chunk: a piece of text (with its tokens' probabilities when asked for), or the
/// end (`stop: true` and the answer's fields, no text).
pub fn chunk(text: Option<&str>, end: Option<&Summary>, probs: Option<Value>) -> Value {
    let mut v = json!({
        "index": 0,
        "content": text.unwrap_or(""),
        "tokens": [],
        "stop": end.is_some(),
        "id_slot": 0,
    });
    if let Some(p) = probs {
        v["completion_probabilities"] = p;
    }
    v
}

/// A stream's last chunk.
pub fn last(env: &Envelope, s: &Summary) -> Value {
    let mut v = end_fields(env, s);
    v["content"] = "".into();
    v
}

fn end_fields(env: &Envelope, s: &Summary) -> Value {
    let stop_type = match (s.finish, &s.stop_word) {
        (Finish::Length, _) => "limit",
        (_, Some(_)) => "word",
        _ => "eos",
    };
    json!({
        "index": 0,
        "tokens": [],
        "id_slot": 0,
        "stop": true,
        "model": env.model,
        "tokens_predicted": s.completion_tokens,
        "tokens_evaluated": s.prompt_tokens,
        "generation_settings": env.settings,
        "prompt": env.prompt,
        "has_new_line": false,
        "truncated": false,
        "stop_type": stop_type,
        "stopping_word": s.stop_word.as_deref().unwrap_or(""),
        "tokens_cached": s.prompt_tokens + s.completion_tokens,
        "timings": s.timings(),
    })
}

/// `completion_probabilities`: per token its id, text, bytes and log probability, and the
/// `n_probs` most likely tokens the same way.
pub fn probabilities(tok: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let entry = |id: u32, lp: f32| {
        let b = tok.token_bytes(id, true);
        json!({"id": id, "token": String::from_utf8_lossy(&b), "bytes": b, "logprob": lp})
    };
    lps.iter()
        .map(|l| {
            let mut e = entry(l.token, l.logprob);
            e["top_logprobs"] = l.top.iter().map(|&(t, lp)| entry(t, lp)).collect();
            e
        })
        .collect()
}

/// `generation_settings`: what the answer was made with, under llama-server's names.
pub fn settings(
    sampler: &pi2_engine::SamplerConfig,
    max_tokens: Option<usize>,
    n_ctx: usize,
    req: &crate::api::CompletionRequest,
) -> Value {
    json!({
        "n_ctx": n_ctx,
        "n_predict": max_tokens.map_or(-1, |n| n as i64),
        "temperature": sampler.temperature,
        "top_k": sampler.top_k,
        "top_p": sampler.top_p,
        "min_p": sampler.min_p,
        "repeat_penalty": sampler.repeat_penalty,
        "repeat_last_n": sampler.repeat_last_n,
        "presence_penalty": sampler.presence_penalty,
        "frequency_penalty": sampler.frequency_penalty,
        "seed": sampler.seed,
        "stream": req.streams(),
        "ignore_eos": req.ignore_eos.unwrap_or(false),
        "n_probs": req.n_probs.unwrap_or(0),
    })
}
