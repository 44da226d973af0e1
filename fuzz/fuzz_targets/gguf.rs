//! Any bytes as a GGUF file: a clean error or a model, never a panic, hang or huge allocation.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pi2_model::{GgufFile, Model};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = GgufFile::from_bytes(data) {
        if let Ok(m) = Model::from_file(f) {
            let _ = m.chat_template();
            let _ = m.tokenizer.encode("Hello, world! <|im_start|>", true, true);
        }
    }
});
