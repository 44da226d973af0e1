//! The one-command flow's conversion cache: a plain GGUF is converted once and reused, and a
//! changed file is never served the conversion of its old contents.

use pi2_engine::EngineConfig;
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::Model;
use pi2_runtime::convert_cache::{converted, file_sha256, is_converted};

fn spec(seed: u64) -> SynthSpec {
    SynthSpec {
        n_embd: 64,
        n_ff: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        weight_type: QuantType::Q8_0,
        embd_type: QuantType::Q8_0,
        seed,
        ..SynthSpec::default()
    }
}

#[test]
fn a_plain_model_is_converted_once_and_a_changed_one_again() {
    let dir = tempfile::tempdir().unwrap();
    // This test binary owns its process: the cache folder is set before anything reads it.
    std::env::set_var("PI2_CACHE_DIR", dir.path().join("cache"));
    let src = dir.path().join("plain.gguf");
    std::fs::write(&src, build(&spec(1)).to_bytes()).unwrap();
    let cfg = EngineConfig {
        threads: 2,
        n_ctx: 512,
        ..EngineConfig::default()
    };
    let (mut notices, mut phases) = (0, Vec::new());
    let first = converted(&src, &cfg, |_| notices += 1, &mut |p, _, _| {
        if phases.last().is_none_or(|l: &String| l != p) {
            phases.push(p.to_string());
        }
    })
    .unwrap();
    assert!(first.made && notices == 1);
    assert!(phases.contains(&"profile".to_string()) && phases.contains(&"write".to_string()));
    assert!(first
        .path
        .starts_with(dir.path().join("cache").join("converted")));
    let conv = Model::load(&first.path).unwrap();
    assert!(is_converted(&conv));
    // Again: found, nothing made, no notice.
    let again = converted(&src, &cfg, |_| panic!("converted twice"), &mut |_, _, _| {}).unwrap();
    assert_eq!(
        (again.path.clone(), again.made),
        (first.path.clone(), false)
    );
    // A converted file is its own conversion.
    let own = converted(&first.path, &cfg, |_| panic!("no"), &mut |_, _, _| {}).unwrap();
    assert_eq!(own.path, first.path);
    // The same size, other weights: another SHA-256, another conversion.
    let before = file_sha256(&src).unwrap();
    std::fs::write(&src, build(&spec(2)).to_bytes()).unwrap();
    let after = file_sha256(&src).unwrap();
    assert_ne!(before, after);
    let changed = converted(&src, &cfg, |_| {}, &mut |_, _, _| {}).unwrap();
    assert!(changed.made);
    assert_ne!(changed.path, first.path);
}
