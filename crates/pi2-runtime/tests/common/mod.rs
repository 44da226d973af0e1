//! What the session tests share: a synthetic model file and its conversion.

use pi2_convert::{calibrate, convert, write_file, ConvertConfig};
use pi2_engine::Engine;
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::Model;
use pi2_runtime::{EngineOptions, SessionOptions};
use pi2_sparse::{Activation, ModelInfo};
use std::path::{Path, PathBuf};

pub const TOKENS: [u32; 10] = [5, 17, 42, 3, 99, 7, 64, 12, 8, 150];

pub fn spec() -> SynthSpec {
    SynthSpec {
        n_embd: 64,
        n_ff: 1024,
        n_layer: 8,
        n_head: 4,
        n_head_kv: 2,
        weight_type: QuantType::Q8_0,
        embd_type: QuantType::F32,
        ..SynthSpec::default()
    }
}

pub fn options() -> SessionOptions {
    SessionOptions {
        engine: EngineOptions {
            threads: Some(2),
            n_ctx: 32,
            // Offloaded engines read the mapping's row layout: compare like with like.
            repack: false,
            ..EngineOptions::default()
        },
        ..SessionOptions::default()
    }
}

/// A synthetic model file, and its conversion (50% sparsity, low-rank predictors, a
/// clustered head scoring a quarter of the rows).
pub fn model_files(dir: &Path) -> (PathBuf, PathBuf) {
    model_files_with(dir, true)
}

/// [`model_files`], with or without the clustered head.
pub fn model_files_with(dir: &Path, head: bool) -> (PathBuf, PathBuf) {
    let src = dir.join("src.gguf");
    std::fs::write(&src, build(&spec()).to_bytes()).unwrap();
    let m = Model::load(&src).unwrap();
    let c = &m.config;
    let info = ModelInfo {
        architecture: "llama".into(),
        n_layer: c.n_layer,
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        activation: Activation::Silu,
        file_name: "src.gguf".into(),
        file_bytes: 0,
    };
    let toks: Vec<u32> = (0..200u32)
        .map(|i| (i * 37 + 11) % c.n_vocab as u32)
        .collect();
    let mut e = Engine::new(&m, &options().engine.config().unwrap()).unwrap();
    let cal = calibrate(&mut e, &toks, 25, 0.5, info).unwrap();
    let cfg = ConvertConfig {
        granule: 512,
        head: head.then(|| pi2_convert::head::HeadConfig {
            cluster: 8,
            share: 0.25,
            ..Default::default()
        }),
        ..ConvertConfig::default()
    };
    let (w, _) = convert(&m, &cal.profile, &cal.thresholds, cal.samples, &cfg).unwrap();
    let out = dir.join(if head {
        "conv.gguf"
    } else {
        "conv-nohead.gguf"
    });
    write_file(&w, &out, &src, false).unwrap();
    (src, out)
}
