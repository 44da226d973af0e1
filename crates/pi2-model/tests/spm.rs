//! The SentencePiece-style (`llama`) tokenizer on a hand-made vocabulary: merges by score,
//! `▁` for spaces, byte fallback, BOS, and decoding.

use pi2_model::synth::spm_vocabulary;
use pi2_model::{GgufFile, Tokenizer};

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::from_bytes(&spm_vocabulary().to_bytes()).unwrap()).unwrap()
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
