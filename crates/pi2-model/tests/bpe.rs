//! Byte-level BPE details on a hand-made vocabulary: Llama 3's `ignore_merges` (a piece that is
//! itself a token stays whole, for the llama-bpe family of pre-tokenizers only).

use pi2_model::writer::GgufWriter;
use pi2_model::{GgufFile, Tokenizer, Value};

/// The 256 byte characters, "ab" by one merge, and "abc" which no merge makes.
fn tokenizer(pre: &str) -> Tokenizer {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| {
            // GPT-2's printable map for the ASCII letters is the identity.
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("<b{b}>")
            }
        })
        .collect();
    tokens.push("ab".into());
    tokens.push("abc".into());
    let n = tokens.len();
    let mut w = GgufWriter::new();
    w.meta("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.meta("tokenizer.ggml.pre", Value::String(pre.into()));
    w.meta(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.into_iter().map(Value::String).collect()),
    );
    w.meta(
        "tokenizer.ggml.token_type",
        Value::Array(vec![Value::I32(1); n]),
    );
    w.meta(
        "tokenizer.ggml.merges",
        Value::Array(vec![Value::String("a b".into())]),
    );
    Tokenizer::from_gguf(&GgufFile::from_bytes(&w.to_bytes()).unwrap()).unwrap()
}

#[test]
fn llama3_pieces_that_are_tokens_stay_whole() {
    let abc = 257;
    let llama3 = tokenizer("llama-bpe");
    assert_eq!(llama3.encode("abc", false, false), vec![abc]);
    // "abcd" is no token: merged as usual ("ab", "c", "d").
    assert_eq!(llama3.encode("abcd", false, false).len(), 3);
    // Other pre-tokenizers merge: "ab" + "c".
    let gpt2 = tokenizer("gpt2");
    assert_eq!(gpt2.encode("abc", false, false), vec![256, b'c' as u32]);
}
