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

/// llama-server's default batch, which sizes its fill-in-the-middle window (at most the
/// context).
const FIM_BATCH: usize = 2048;

/// `/infill`'s prompt, as llama-server builds it: the other files (`input_extra`, each after
/// the file separator and its name, the repository's name first; or after a plain separator
/// where the model has no such tokens), then the prefix marker, the end of `input_prefix` (up to
/// three quarters of the window) and `prompt`, the suffix marker and the start of
/// `input_suffix`, and the middle marker, where the model's answer goes.
pub fn infill_prompt(
    tok: &Tokenizer,
    req: &crate::api::CompletionRequest,
    n_ctx: usize,
) -> Result<Vec<u32>, crate::api::ApiError> {
    use crate::api::ApiError;
    let Some((pre, suf, mid)) = tok.fim.markers() else {
        return Err(ApiError::bad(
            "this model has no fill-in-the-middle tokens (prefix, suffix and middle): /infill needs a code model that has them",
        ));
    };
    let need = |v: &Option<String>, name: &'static str| {
        v.clone()
            .ok_or_else(|| ApiError::bad(format!("`{name}` is required")).param(name))
    };
    let (prefix, suffix) = (
        need(&req.input_prefix, "input_prefix")?,
        need(&req.input_suffix, "input_suffix")?,
    );
    let prompt = match &req.prompt {
        None => Vec::new(),
        Some(crate::api::Prompt::Text(t)) => tok.encode(t, false, true),
        Some(_) => return Err(ApiError::bad("`prompt` must be a string").param("prompt")),
    };
    let plain = |t: &str| tok.encode(t, false, false);
    let mut extra = Vec::new();
    if let Some(rep) = tok.fim.rep {
        extra.push(rep);
        extra.extend(plain("myproject\n"));
    }
    for chunk in req.input_extra.iter().flatten() {
        match tok.fim.sep {
            Some(sep) => {
                extra.push(sep);
                extra.extend(plain(&format!(
                    "{}\n",
                    chunk.filename.as_deref().unwrap_or("tmp")
                )));
            }
            None => extra.extend(plain("\n\n--- snippet ---\n\n")),
        }
        extra.extend(plain(&chunk.text));
    }
    if let Some(sep) = tok.fim.sep {
        extra.push(sep);
        extra.extend(plain("filename\n"));
    }
    let batch = FIM_BATCH.min(n_ctx) as i64;
    let (mut head, mut tail) = (plain(&prefix), plain(&suffix));
    let prefix_take = head.len().min((3 * (batch / 4)) as usize);
    let suffix_take = tail
        .len()
        .min((batch / 4 - (2 + prompt.len() as i64)).max(0) as usize);
    // The server's n_predict is unlimited (-1): the extra files fill what a batch leaves.
    let extra_take = extra.len().min((n_ctx as i64 - batch + 2).max(0) as usize);
    head.drain(..head.len() - prefix_take);
    tail.truncate(suffix_take);
    let mut out = extra[extra.len() - extra_take..].to_vec();
    if tok.add_bos {
        out.extend(tok.bos);
    }
    out.push(pre);
    out.extend(head);
    out.extend(prompt);
    out.push(suf);
    out.extend(tail);
    out.push(mid);
    Ok(out)
}
