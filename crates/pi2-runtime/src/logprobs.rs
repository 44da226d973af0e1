//! Log probabilities in the OpenAI API's shapes, from a generation's [`TokenLogprob`]s: the
//! server's answers and the Python package's build them here alike.

use pi2_engine::TokenLogprob;
use pi2_model::Tokenizer;
use serde_json::{json, Value};

/// A token's text for the wire (invalid UTF-8 pieces of a character as U+FFFD; `bytes` has
/// the exact bytes).
fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let b = tok.token_bytes(id, true);
    (String::from_utf8_lossy(&b).into_owned(), b)
}

/// Chat's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs: [...]}]}`.
pub fn chat(tok: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let entry = |id: u32, lp: f32| {
        let (text, bytes) = token_text(tok, id);
        json!({"token": text, "logprob": lp, "bytes": bytes})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut e = entry(l.token, l.logprob);
            e["top_logprobs"] = l.top.iter().map(|&(t, lp)| entry(t, lp)).collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// Legacy completions' `logprobs`: parallel lists of tokens, their log probabilities, each
/// token's alternatives (text to log probability) and each token's offset in the answer's
/// text (from `offset`).
pub fn completion(tok: &Tokenizer, lps: &[TokenLogprob], offset: usize) -> Value {
    let mut at = offset;
    let (mut tokens, mut lp, mut top, mut offsets) = (vec![], vec![], vec![], vec![]);
    for l in lps {
        let (text, bytes) = token_text(tok, l.token);
        offsets.push(at);
        at += bytes.len();
        tokens.push(text);
        lp.push(l.logprob);
        let alts: serde_json::Map<String, Value> = l
            .top
            .iter()
            .map(|&(t, p)| (token_text(tok, t).0, json!(p)))
            .collect();
        top.push(Value::Object(alts));
    }
    json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": offsets})
}
