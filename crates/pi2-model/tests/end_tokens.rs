//! Which tokens end generation and which are shown, as llama.cpp decides from the vocabulary:
//! harmony's (gpt-oss) `<|end|>` ends a message but not the answer, its header tokens are
//! shown text, Gemma 4's `<turn|>` ends a turn, and `</s>` is ordinary beside `<|tool_response>`.

use pi2_model::writer::GgufWriter;
use pi2_model::{GgufFile, Tokenizer, Value};

/// The 256 byte characters (normal) and `specials` as control tokens.
fn tokenizer(specials: &[&str]) -> Tokenizer {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| match b.is_ascii_alphanumeric() {
            true => (b as char).to_string(),
            false => format!("<b{b}>"),
        })
        .collect();
    let mut types = vec![Value::I32(1); tokens.len()];
    for s in specials {
        tokens.push(s.to_string());
        types.push(Value::I32(3));
    }
    let mut w = GgufWriter::new();
    w.meta("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.meta(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.into_iter().map(Value::String).collect()),
    );
    w.meta("tokenizer.ggml.token_type", Value::Array(types));
    w.meta("tokenizer.ggml.merges", Value::Array(vec![]));
    Tokenizer::from_gguf(&GgufFile::from_bytes(&w.to_bytes()).unwrap()).unwrap()
}

fn id(t: &Tokenizer, text: &str) -> u32 {
    t.token_id(text).unwrap()
}

#[test]
fn harmony_ends_at_return_and_call_and_shows_its_headers() {
    let t = tokenizer(&[
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|constrain|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
    ]);
    assert!(t.is_eog(id(&t, "<|return|>")) && t.is_eog(id(&t, "<|call|>")));
    assert!(
        !t.is_eog(id(&t, "<|end|>")),
        "<|end|> closes a message only"
    );
    let answer = [
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|start|>",
        "<|constrain|>",
    ];
    let ids: Vec<u32> = answer.iter().map(|s| id(&t, s)).collect();
    assert_eq!(t.decode(&ids, false), answer.concat().into_bytes());
    // Without `<|return|>` and `<|call|>`, `<|end|>` ends the answer (Phi-3's) and stays hidden.
    let phi = tokenizer(&["<|end|>", "<|user|>"]);
    assert!(phi.is_eog(id(&phi, "<|end|>")));
    assert!(phi.decode(&[id(&phi, "<|end|>")], false).is_empty());
}

#[test]
fn gemma4_turns_end_and_a_plain_eos_stays_text() {
    let t = tokenizer(&["<|turn>", "<turn|>", "<|tool_response>", "</s>"]);
    assert!(t.is_eog(id(&t, "<turn|>")));
    assert!(
        !t.is_eog(id(&t, "</s>")),
        "</s> is ordinary where <|tool_response> marks turns"
    );
    assert!(!t.is_eog(id(&t, "<|turn>")));
    let other = tokenizer(&["</s>", "<|eom_id|>"]);
    assert!(other.is_eog(id(&other, "</s>")) && other.is_eog(id(&other, "<|eom_id|>")));
}
