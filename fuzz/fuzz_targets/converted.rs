//! Any bytes as a converted (pi2 bundle) file: the sparse weights, the clustered head and the
//! checksum table load (and check) or fail cleanly, and a small model that loads decodes a
//! token through its head.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pi2_engine::{ClusteredHead, Engine, EngineConfig, EngineParts, Logits};
use pi2_model::{GgufFile, Model};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data) else {
        return;
    };
    let Ok(m) = Model::from_file(f) else {
        return;
    };
    let _ = pi2_engine::load_sparse(&m);
    let _ = pi2_engine::verify_checksums(&m);
    let Ok(Some(head)) = ClusteredHead::load(&m, true) else {
        return;
    };
    // Small enough to run quickly.
    let c = &m.config;
    if c.n_vocab > 4096 || c.n_layer > 4 || c.n_embd > 256 || c.n_ff > 1024 {
        return;
    }
    let cfg = EngineConfig {
        threads: 1,
        n_ctx: 8,
        ..EngineConfig::default()
    };
    let parts = EngineParts {
        head: Some(&head),
        ..Default::default()
    };
    let engine = Engine::with_parts(&m, &cfg, parts);
    if let Ok(mut e) = engine {
        let _ = e.forward(&[0], Logits::Last);
    };
});
