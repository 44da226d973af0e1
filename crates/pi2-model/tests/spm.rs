//! The SentencePiece-style (`llama`) tokenizer on a hand-made vocabulary: merges by score,
//! `▁` for spaces, byte fallback, BOS, and decoding.

use pi2_model::writer::GgufWriter;
use pi2_model::{GgufFile, Tokenizer, Value};

fn tokenizer() -> Tokenizer {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for t in [
        "▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁he", "▁hel", "▁hell", "▁hello", "▁w",
        "▁wo", "▁wor", "▁worl", "▁world", "ll",
    ] {
        tokens.push(t.into());
        types.push(1);
    }
    // Longer pieces score higher, so merges build whole words.
    let scores: Vec<Value> = tokens
        .iter()
        .map(|t| Value::F32(t.chars().count() as f32))
        .collect();
    let mut w = GgufWriter::new();
    w.meta("tokenizer.ggml.model", Value::String("llama".into()));
    w.meta(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.into_iter().map(Value::String).collect()),
    );
    w.meta(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    w.meta("tokenizer.ggml.scores", Value::Array(scores));
    w.meta("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.meta("tokenizer.ggml.eos_token_id", Value::U32(2));
    Tokenizer::from_gguf(&GgufFile::from_bytes(&w.to_bytes()).unwrap()).unwrap()
}

fn id(t: &Tokenizer, s: &str) -> u32 {
    t.token_id(s).unwrap()
}

#[test]
fn words_merge_by_score() {
    let t = tokenizer();
    assert_eq!(
        t.encode("hello world", false, false),
        vec![id(&t, "▁hello"), id(&t, "▁world")]
    );
    assert!(t.add_bos, "llama vocabularies add BOS by default");
    assert_eq!(t.encode("hello", true, false), vec![1, id(&t, "▁hello")]);
}

#[test]
fn unknown_characters_fall_back_to_bytes() {
    let t = tokenizer();
    // "i" is not a token: its byte; "é" is two bytes.
    assert_eq!(
        t.encode("hi", false, false),
        vec![id(&t, "▁h"), id(&t, "<0x69>")]
    );
    assert_eq!(
        t.encode("é", false, false),
        vec![id(&t, "▁"), id(&t, "<0xC3>"), id(&t, "<0xA9>")]
    );
}

#[test]
fn decode_round_trips() {
    let t = tokenizer();
    for text in ["hello world", "hi", "é hello", "hello  world"] {
        let ids = t.encode(text, true, true);
        assert_eq!(
            String::from_utf8(t.decode(&ids, false)).unwrap(),
            text,
            "{ids:?}"
        );
    }
}

#[test]
fn control_tokens_parse_only_when_asked() {
    let t = tokenizer();
    assert_eq!(t.encode("</s>", false, true), vec![2]);
    assert_ne!(t.encode("</s>", false, false), vec![2]);
}

#[test]
fn empty_text_is_no_tokens() {
    // llama.cpp: no fragment, so no space-prefix token either.
    let t = tokenizer();
    assert_eq!(t.encode("", false, true), Vec::<u32>::new());
    assert_eq!(t.encode("", false, false), Vec::<u32>::new());
    // Between two control tokens too.
    assert_eq!(t.encode("</s></s>", false, true), vec![2, 2]);
}
