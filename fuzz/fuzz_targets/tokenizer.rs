//! Any text through both tokenizer kinds (byte-level BPE and SentencePiece), with and without
//! special-token parsing; decoding what was encoded gives the text back (BPE).
#![no_main]
use libfuzzer_sys::fuzz_target;
use pi2_model::synth::{build, spm_vocabulary, SynthSpec};
use pi2_model::{GgufFile, Model, Tokenizer};
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
        let bytes = spm_vocabulary().to_bytes();
        Tokenizer::from_gguf(&GgufFile::from_bytes(&bytes).unwrap()).unwrap()
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
