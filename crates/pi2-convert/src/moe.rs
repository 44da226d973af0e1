//! Mixture-of-experts conversion: every expert of every layer (a *unit*) is re-laid out as
//! hot-first neuron bundles, the way [`crate::convert`] lays out a dense layer.
//!
//! Tensors of layer `N`: `ffn_gate_exps.weight` and `ffn_up_exps.weight` keep their shape (expert
//! `e` owns rows `e*n_ff..(e+1)*n_ff`) with each expert's rows in hot-first order;
//! `ffn_down_t_exps.weight` (`n_embd` x `n_ff` x `n_expert`) holds each expert's down columns as
//! rows in the same order; `ffn_perm_exps` (I32, `n_ff` x `n_expert`) maps file neurons to source
//! neurons and `ffn_freq_exps` (F32, same shape) holds how often each neuron fired per
//! calibration token (routing included), which orders pinning across units. There are no
//! predictors: conversion needs a ReLU-family FFN, whose activity is exact at threshold 0, or
//! explicit thresholds.

use super::{ConvertConfig, ConvertError};
use pi2_engine::{check_thresholds, fires, transposed, Engine, EngineError, Logits};
use pi2_kernels::{MatRef, QuantType};
use pi2_model::bundle::{
    Tensor, FORMAT_VERSION, GGML_I32, KEY_ACTIVATION, KEY_GRANULE, KEY_MOE_CALIBRATION_TOKENS,
    KEY_PREDICTOR_KIND as KEY_KIND, KEY_SOURCE, KEY_SPARSITY, KEY_THRESHOLDS, KEY_VERSION,
};
use pi2_model::writer::TensorLayout;
use pi2_model::{FfnAct, Model, TokenId, Value};
use pi2_sparse::FfnObserver;
use rayon::prelude::*;
use std::io::Write;
use std::path::Path;

fn name(li: usize, s: &str) -> String {
    format!("blk.{li}.{s}")
}

/// How often each neuron of each unit fired on calibration tokens.
#[derive(Clone, Debug)]
pub struct ExpertCounts {
    pub n_ff: usize,
    pub experts: usize,
    /// Calibration tokens (every layer sees each once).
    pub tokens: u64,
    /// Per unit (`layer * experts + e`): tokens routed to it.
    pub routed: Vec<u64>,
    /// Per unit, per neuron: tokens on which it fired.
    pub fired: Vec<Vec<u32>>,
}

impl ExpertCounts {
    /// The counts as `pi2 profile` writes them for a mixture-of-experts model: per unit its
    /// layer, expert, routed tokens, active rate and each neuron's firing frequency when routed.
    pub fn to_json(&self, model: &pi2_model::Model) -> serde_json::Value {
        let c = &model.config;
        let units: Vec<serde_json::Value> = (0..self.fired.len())
            .map(|u| {
                let routed = self.routed[u].max(1) as f32;
                serde_json::json!({
                    "layer": u / self.experts,
                    "expert": u % self.experts,
                    "routed_tokens": self.routed[u],
                    "active_rate": self.active_rate(u),
                    "frequency_when_routed": self.fired[u].iter().map(|&n| n as f32 / routed).collect::<Vec<_>>(),
                })
            })
            .collect();
        serde_json::json!({
            "model": model.name,
            "n_layer": c.n_layer,
            "n_expert": c.n_expert,
            "n_expert_used": c.n_expert_used,
            "n_ff": c.n_ff,
            "activation": c.ffn_act.name(),
            "tokens": self.tokens,
            "units": units,
        })
    }

    /// Fraction of calibration tokens on which each neuron of unit `u` fired.
    pub fn frequency(&self, u: usize) -> Vec<f32> {
        let t = self.tokens.max(1) as f32;
        self.fired[u].iter().map(|&n| n as f32 / t).collect()
    }

    /// Mean fraction of a unit's neurons firing per token routed to it.
    pub fn active_rate(&self, u: usize) -> f64 {
        let fired: u64 = self.fired[u].iter().map(|&n| n as u64).sum();
        fired as f64 / (self.routed[u].max(1) as f64 * self.n_ff as f64)
    }
}

struct CountObserver<'a> {
    counts: ExpertCounts,
    thresholds: &'a [f32],
    act: FfnAct,
}

impl FfnObserver for CountObserver<'_> {
    fn observe(&mut self, _layer: usize, _x: &[f32], _gate: &[f32]) {}

    fn observe_expert(&mut self, layer: usize, expert: usize, _x: &[f32], gate: &[f32]) {
        let u = layer * self.counts.experts + expert;
        let fired = &mut self.counts.fired[u];
        for row in gate.chunks_exact(self.counts.n_ff) {
            self.counts.routed[u] += 1;
            for (n, &g) in fired.iter_mut().zip(row) {
                *n += fires(self.act.gate(g), self.thresholds[layer]) as u32;
            }
        }
    }
}

/// Run the dense mixture-of-experts model over `tokens` in chunks of `chunk` (each from an empty
/// cache) and count, per unit and neuron, the tokens on which it fired at `thresholds`.
pub fn count_experts(
    engine: &mut Engine<'_>,
    tokens: &[TokenId],
    chunk: usize,
    thresholds: &[f32],
    mut progress: impl FnMut(usize),
) -> Result<ExpertCounts, EngineError> {
    let c = &engine.model().config;
    let units = c.n_layer * c.n_expert;
    let mut obs = CountObserver {
        counts: ExpertCounts {
            n_ff: c.n_ff,
            experts: c.n_expert,
            tokens: 0,
            routed: vec![0; units],
            fired: vec![vec![0; c.n_ff]; units],
        },
        thresholds,
        act: c.ffn_act,
    };
    let mut done = 0;
    for part in tokens.chunks(chunk.max(1)) {
        engine.truncate(0);
        engine.forward_observed(part, Logits::Last, Some(&mut obs))?;
        done += part.len();
        obs.counts.tokens += part.len() as u64;
        progress(done);
    }
    engine.truncate(0);
    Ok(obs.counts)
}

/// What one tensor of the converted file is made from.
#[derive(Clone, Copy)]
enum Source {
    Copy(usize),
    Rows { layer: usize, up: bool },
    DownT { layer: usize, ty: QuantType },
    Perm(usize),
    Freq(usize),
}

/// Write the converted file of mixture-of-experts `model` to `out` (streamed: files larger than
/// memory convert), units ordered hot-first by `counts` at `thresholds`. Only `cfg.down_type`
/// and `cfg.granule` apply (there are no predictors).
#[allow(clippy::too_many_arguments)]
pub fn convert(
    model: &Model,
    counts: &ExpertCounts,
    thresholds: &[f32],
    cfg: &ConvertConfig,
    out: &Path,
    input: &Path,
    force: bool,
    mut progress: impl FnMut(usize, usize),
) -> Result<(), ConvertError> {
    let c = &model.config;
    let (ff, ne) = (c.n_ff, c.n_expert);
    if ne == 0 {
        return Err(ConvertError::Refused(
            "not a mixture-of-experts model".into(),
        ));
    }
    super::check_mixture_layers(model)?;
    super::check_granule(cfg.granule)?;
    check_thresholds(thresholds, c.n_layer)?;
    if cfg.predictor.is_some() {
        return Err(ConvertError::Refused(
            "predictors for mixture-of-experts models are not supported; convert with no predictor"
                .into(),
        ));
    }
    if model.weights.layers.iter().any(|l| l.down_transposed) {
        return Err(ConvertError::Refused(
            "the model is already converted".into(),
        ));
    }
    if counts.fired.len() != c.n_layer * ne || counts.fired.iter().any(|v| v.len() != ff) {
        return Err(ConvertError::Refused(
            "the calibration counts are for another model".into(),
        ));
    }
    // Hot-first order per unit (stable: ties keep the model's order).
    let perms: Vec<Vec<u32>> = counts
        .fired
        .iter()
        .map(|fired| {
            let mut p: Vec<u32> = (0..ff as u32).collect();
            p.sort_by_key(|&i| std::cmp::Reverse(fired[i as usize]));
            p
        })
        .collect();

    let meta = metadata(model, counts, thresholds, cfg);
    let (tensors, sources) = layout(model, cfg)?;
    let n_tensors = tensors.len();
    let written = |w: &mut std::io::BufWriter<std::fs::File>| {
        pi2_model::writer::write_streamed(
            w,
            *b"GGUF",
            &meta,
            cfg.granule as u64,
            &tensors,
            |i, w| {
                write_tensor(w, model, counts, &perms, sources[i])?;
                progress(i + 1, n_tensors);
                Ok(())
            },
        )
    };
    let check = |p: &Path| super::verify_at(model, p, verify);
    super::write_atomic(out, &[input], force, written, check)
}

/// The source's metadata (but its `pi2.*` keys) and the format's.
fn metadata(
    model: &Model,
    counts: &ExpertCounts,
    thresholds: &[f32],
    cfg: &ConvertConfig,
) -> Vec<(String, Value)> {
    let mut meta: Vec<(String, Value)> = model
        .file
        .metadata
        .iter()
        .filter(|(k, _)| {
            k != "general.alignment"
                && !(k.starts_with("pi2.") && k != pi2_model::KEY_FFN_ACTIVATION)
        })
        .cloned()
        .collect();
    let floats = |v: &[f32]| Value::Array(v.iter().map(|&x| Value::F32(x)).collect());
    meta.extend([
        ("general.alignment".into(), Value::U32(cfg.granule)),
        (KEY_VERSION.into(), Value::U32(FORMAT_VERSION)),
        (KEY_SPARSITY.into(), Value::F32(cfg.sparsity)),
        (
            KEY_ACTIVATION.into(),
            Value::String(model.config.ffn_act.name().into()),
        ),
        (KEY_GRANULE.into(), Value::U32(cfg.granule)),
        (KEY_THRESHOLDS.into(), floats(thresholds)),
        (KEY_KIND.into(), Value::String("none".into())),
        (KEY_MOE_CALIBRATION_TOKENS.into(), Value::U64(counts.tokens)),
        (
            KEY_SOURCE.into(),
            Value::String(model.name.clone().unwrap_or_else(|| "unnamed model".into())),
        ),
    ]);
    meta
}

/// Every tensor of the converted file and where its bytes come from: dense tensors copied,
/// then per layer the permuted expert gate and up rows, transposed down rows, the
/// permutations and the frequencies.
fn layout(
    model: &Model,
    cfg: &ConvertConfig,
) -> Result<(Vec<TensorLayout>, Vec<Source>), ConvertError> {
    let (f, c) = (&model.file, &model.config);
    let (ff, d, ne) = (c.n_ff, c.n_embd, c.n_expert);
    let is_expert_ffn = |n: &str| {
        n.starts_with("blk.")
            && [
                ".ffn_gate_exps.weight",
                ".ffn_up_exps.weight",
                ".ffn_down_exps.weight",
            ]
            .iter()
            .any(|s| n.ends_with(s))
    };
    let mut tensors = Vec::new();
    let mut sources = Vec::new();
    let mut add = |name: String, dims: Vec<u64>, ggml_type: u32, bytes: u64, src: Source| {
        tensors.push(TensorLayout {
            name,
            dims,
            ggml_type,
            bytes,
        });
        sources.push(src);
    };
    for (i, t) in f.tensors.iter().enumerate() {
        if !is_expert_ffn(&t.name) && t.name != pi2_model::checksum::TENSOR {
            add(
                t.name.clone(),
                t.dims.clone(),
                t.ggml_type,
                t.size,
                Source::Copy(i),
            );
        }
    }
    let stacked = [d as u64, ff as u64, ne as u64];
    for (li, l) in model.weights.layers.iter().enumerate() {
        for (tv, t, up) in [
            (&l.gate, Tensor::GateExps, false),
            (&l.up, Tensor::UpExps, true),
        ] {
            let bytes = tv.mat(f).bytes().len() as u64;
            let src = Source::Rows { layer: li, up };
            add(t.name(li), stacked.to_vec(), tv.ty.ggml_id(), bytes, src);
        }
        let dt = super::down_type(cfg.down_type, l.down.ty, d)?;
        let bytes = (ne * ff * dt.row_bytes(d).expect("checked by down_type")) as u64;
        let src = Source::DownT { layer: li, ty: dt };
        add(
            Tensor::DownTExps.name(li),
            stacked.to_vec(),
            dt.ggml_id(),
            bytes,
            src,
        );
        for (t, ty, src) in [
            (Tensor::PermExps, GGML_I32, Source::Perm(li)),
            (Tensor::FreqExps, 0, Source::Freq(li)),
        ] {
            add(
                t.name(li),
                vec![ff as u64, ne as u64],
                ty,
                (ff * ne * 4) as u64,
                src,
            );
        }
    }
    // Filled by the writer with the checksums of what it wrote (no source of its own).
    let sums = pi2_model::writer::checksum_layout(tensors.iter().map(|t| (&t.dims[..], t.bytes)));
    tensors.push(sums);
    Ok((tensors, sources))
}

/// The bytes of one tensor of the converted file.
fn write_tensor(
    w: &mut dyn Write,
    model: &Model,
    counts: &ExpertCounts,
    perms: &[Vec<u32>],
    src: Source,
) -> std::io::Result<()> {
    let (f, c) = (&model.file, &model.config);
    let (ff, d, ne) = (c.n_ff, c.n_embd, c.n_expert);
    match src {
        Source::Copy(t) => w.write_all(f.tensor_data(&f.tensors[t]))?,
        Source::Rows { layer, up } => {
            let l = &model.weights.layers[layer];
            let m = if up { l.up.mat(f) } else { l.gate.mat(f) };
            for e in 0..ne {
                let rows: Vec<u8> = perms[layer * ne + e]
                    .iter()
                    .flat_map(|&i| m.row(e * ff + i as usize).iter().copied())
                    .collect();
                w.write_all(&rows)?;
            }
        }
        Source::DownT { layer, ty } => {
            let down = model.weights.layers[layer].down.mat(f);
            for e in 0..ne {
                let rows =
                    transposed_rows(&down.rows(e * d..(e + 1) * d), &perms[layer * ne + e], ty);
                w.write_all(&rows)?;
            }
        }
        Source::Perm(layer) => {
            for p in &perms[layer * ne..(layer + 1) * ne] {
                for &i in p {
                    w.write_all(&(i as i32).to_le_bytes())?;
                }
            }
        }
        Source::Freq(layer) => {
            for (e, p) in perms[layer * ne..(layer + 1) * ne].iter().enumerate() {
                let freq = counts.frequency(layer * ne + e);
                for &i in p {
                    w.write_all(&freq[i as usize].to_le_bytes())?;
                }
            }
        }
    }
    Ok(())
}

/// Columns `perm` of `m` (`n_embd` rows of `n_ff`) as rows of type `ty`, quantized in parallel.
fn transposed_rows(m: &MatRef<'_>, perm: &[u32], ty: QuantType) -> Vec<u8> {
    let (rows, cols) = (m.rows, m.cols);
    let mut src = vec![0.0f32; rows * cols];
    src.par_chunks_mut(cols)
        .enumerate()
        .for_each(|(r, out)| m.dequantize_row(r, out));
    perm.par_iter()
        .map(|&i| {
            let col: Vec<f32> = (0..rows).map(|r| src[r * cols + i as usize]).collect();
            ty.quantize_row(&col).expect("type checked by down_type")
        })
        .collect::<Vec<_>>()
        .concat()
}

/// Re-read a converted mixture-of-experts file and compare it with its source: dense tensors
/// byte for byte, every expert's gate and up rows against the source rows its permutation
/// names, transposed down rows against the source columns (within the storage type's
/// rounding); the sparse weights and frequencies must load.
pub fn verify(source: &Model, converted: &Model) -> Result<(), ConvertError> {
    let bad = |m: String| ConvertError::Verify(m);
    let (fs, fc) = (&source.file, &converted.file);
    let c = &source.config;
    let (ff, d, ne) = (c.n_ff, c.n_embd, c.n_expert);
    super::same_dense_tensors(source, converted, |n| n.contains("_exps."))?;
    for (li, (ls, lc)) in source
        .weights
        .layers
        .iter()
        .zip(&converted.weights.layers)
        .enumerate()
    {
        let n = name(li, "ffn_perm_exps");
        let pt = fc
            .tensor(&n)
            .ok_or_else(|| bad(format!("{n} is missing")))?;
        let perm: Vec<i32> = fc
            .tensor_data(pt)
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        if perm.len() != ff * ne {
            return Err(bad(format!("{n} has {} entries", perm.len())));
        }
        if !lc.down_transposed {
            return Err(bad(format!("layer {li} has no transposed down matrix")));
        }
        let (down, dt) = (ls.down.mat(fs), lc.down.mat(fc));
        for e in 0..ne {
            let p = &perm[e * ff..(e + 1) * ff];
            let mut seen = vec![false; ff];
            for &i in p {
                if i < 0 || i as usize >= ff || std::mem::replace(&mut seen[i as usize], true) {
                    return Err(bad(format!("{n}: expert {e} is not a permutation")));
                }
            }
            for (a, b) in [(&ls.gate, &lc.gate), (&ls.up, &lc.up)] {
                let (ma, mb) = (a.mat(fs), b.mat(fc));
                if let Some(j) =
                    (0..ff).find(|&j| mb.row(e * ff + j) != ma.row(e * ff + p[j] as usize))
                {
                    return Err(bad(format!(
                        "{} expert {e} row {j} is not source row {}",
                        b.name, p[j]
                    )));
                }
            }
            let t = transposed(&down.rows(e * d..(e + 1) * d));
            let mine = dt.rows(e * ff..(e + 1) * ff);
            let bad_row = (0..ff).into_par_iter().find_first(|&j| {
                let mut row = vec![0.0; d];
                mine.dequantize_row(j, &mut row);
                let i = p[j] as usize;
                !super::requantized_row_matches(&row, &t[i * d..(i + 1) * d], mine.ty)
            });
            if let Some(j) = bad_row {
                return Err(bad(format!(
                    "layer {li} expert {e}: transposed down row {j} is not source down column {}",
                    p[j]
                )));
            }
        }
    }
    pi2_engine::load_sparse(converted)?.ok_or_else(|| bad("no pi2 metadata".into()))?;
    pi2_engine::verify_checksums(converted)?;
    pi2_engine::unit_frequencies(converted)?;
    Ok(())
}
