//! Any bytes as a converted (pi2 bundle) file: the sparse weights, the sparse head and the
//! checksum table load (and check) or fail cleanly.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pi2_model::{GgufFile, Model};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data) else {
        return;
    };
    let Ok(m) = Model::from_file(f) else {
        return;
    };
    let _ = pi2_engine::load_sparse(&m);
    let _ = pi2_engine::SparseHead::load(&m, true);
    let _ = pi2_engine::verify_checksums(&m);
});
