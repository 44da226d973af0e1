//! Any text through both tokenizer kinds (byte-level BPE and SentencePiece), with and without
//! special-token parsing; decoding what was encoded gives the text back (BPE).
#![no_main]
use libfuzzer_sys::fuzz_target;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::writer::GgufWriter;
use pi2_model::{GgufFile, Model, Tokenizer, Value};
use std::sync::OnceLock;

fn bpe() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let bytes = build(&SynthSpec::default()).to_bytes();
        Model::from_file(GgufFile::from_bytes(&bytes).unwrap())
            .unwrap()
            .tokenizer
    })
}

fn spm() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        for b in 0..256 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        for t in ["▁", "h", "e", "l", "o", "▁h", "▁he", "▁hel", "▁hell", "▁hello", "ll"] {
            tokens.push(t.into());
            types.push(1);
        }
        let scores = tokens.iter().map(|t| Value::F32(t.chars().count() as f32)).collect();
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
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for parse_special in [false, true] {
        let ids = bpe().encode(&text, false, parse_special);
        if !parse_special {
            assert_eq!(bpe().decode(&ids, false), text.as_bytes(), "BPE round trip");
        }
        let ids = spm().encode(&text, true, parse_special);
        let _ = spm().decode(&ids, true);
    }
});
