//! pi2-convert: writes neuron-bundle model files (`pi2_model::bundle`); `pi2_engine::load_sparse`
//! reads them (and PowerInfer's sparse GGUF files).
//!
//! A converted file is a GGUF file. Dense tensors are copied byte for byte. Each FFN layer is
//! re-laid out as neuron bundles, hot neurons first (by how often they fired on the calibration
//! text): neuron `j` of the file is row `j` of `blk.N.ffn_gate.weight`, row `j` of
//! `blk.N.ffn_up.weight` and row `j` of `blk.N.ffn_down_t.weight` (its down column, stored
//! transposed), each part readable on its own; tensor data starts on the I/O granule
//! (`general.alignment` = `pi2.io.granule`). `blk.N.ffn_perm` (I32) maps each file neuron to the
//! source model's neuron. The predictor is `blk.N.fc1.weight` (`rank x n_embd`),
//! `blk.N.fc2.weight` (`n_ff x rank`) and `blk.N.fc2.bias`. Metadata `pi2.*` holds the format
//! version, the per-layer thresholds and predictor cuts, held-out recall and candidate fractions,
//! and the profile (renumbered to the file's neuron order) as JSON. The source's `ffn_down` is
//! kept as it is (in the source's neuron order, which `ffn_perm` maps to): a layer that runs
//! dense multiplies it whole at the speed of the plain model.

use pi2_engine::{check_thresholds, transposed, EngineError};
use pi2_kernels::QuantType;
use pi2_model::writer::GgufWriter;
use pi2_model::{Model, Value};
use pi2_sparse::{placement, FiringColumns, FitConfig, Predictor, PredictorKind, Profile};
use rayon::prelude::*;
use std::path::Path;

mod atomic;
mod calibrate;
pub mod calibration;
pub mod describe;
pub mod head;
pub mod moe;
pub mod pipeline;
pub mod plan;
pub mod sensitivity;

pub use atomic::write_atomic;
pub use calibrate::{calibrate, collect_samples, Calibrated, Samples};

use pi2_model::bundle::{
    Tensor, FORMAT_VERSION, GGML_I32, HEAD_CENTROIDS, HEAD_COEF, HEAD_DIRECTIONS, HEAD_FREQUENCY,
    HEAD_ORDER, HEAD_SPREAD, KEY_ACTIVATION, KEY_CANDIDATES, KEY_CUTS, KEY_GRANULE,
    KEY_HEAD_CLUSTER, KEY_HEAD_SHARE, KEY_HEAD_UCB, KEY_PREDICTOR_KIND as KEY_KIND, KEY_PROFILE,
    KEY_RECALL, KEY_SOURCE, KEY_SPARSITY, KEY_THRESHOLDS, KEY_VERSION,
};

/// Conversion errors.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Fit(#[from] pi2_sparse::SparseError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Model(#[from] pi2_model::ModelError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Refused(String),
    #[error("the written file does not match what was converted: {0}")]
    Verify(String),
}

/// What `convert` chose per layer, measured on the held-out calibration tokens.
#[derive(Clone, Debug)]
pub struct LayerReport {
    pub threshold: f32,
    pub rank: usize,
    pub recall: f32,
    pub candidates: f32,
    /// Fraction of neurons that fired (held-out).
    pub fired: f32,
}

/// Settings of [`convert`].
#[derive(Clone, Debug)]
pub struct ConvertConfig {
    pub sparsity: f32,
    /// `None`: no predictor (every neuron a candidate).
    pub predictor: Option<PredictorKind>,
    /// Type of the transposed down rows (default: the model's down type if it can be made for
    /// rows of `n_embd`, else the smallest 32-element type at least as precise: Q5_0 for
    /// Q2_K-Q4_K and IQ4_XS, Q5_1 for Q5_K, else Q8_0).
    pub down_type: Option<QuantType>,
    /// I/O granule the tensors are aligned to.
    pub granule: u32,
    /// Fraction of calibration tokens held out for early stopping and cut calibration.
    pub held_out: f32,
    pub fit: FitConfig,
    /// Cluster the output head (`None`: decode computes the whole output matrix).
    pub head: Option<head::HeadConfig>,
    /// Bands of the hot-first order inside which neurons are placed by co-activation (0 or 1:
    /// frequency order alone).
    pub placement_band: usize,
}

/// What [`convert`] built: per layer, and the clustered head.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    pub layers: Vec<LayerReport>,
    pub head: Option<HeadReport>,
}

/// The clustered head: its shape, and its fidelity on held-out calibration tokens.
#[derive(Clone, Copy, Debug)]
pub struct HeadReport {
    pub clusters: usize,
    pub cluster: usize,
    pub share: f32,
    /// Bytes of the centroids and directions (always resident), and of the output matrix.
    pub centroid_bytes: usize,
    pub output_bytes: usize,
    pub check: head::HeadCheck,
}

impl Default for ConvertConfig {
    fn default() -> Self {
        Self {
            sparsity: 0.5,
            predictor: Some(PredictorKind::Lowrank),
            down_type: None,
            granule: 4096,
            held_out: 0.2,
            fit: FitConfig::default(),
            head: Some(head::HeadConfig::default()),
            placement_band: pi2_sparse::PLACEMENT_BAND,
        }
    }
}

/// Pick the storage type for predictor rows of `cols`.
pub(crate) fn predictor_type(cols: usize) -> QuantType {
    if cols.is_multiple_of(32) {
        QuantType::Q8_0
    } else {
        QuantType::F16
    }
}

/// Build the converted GGUF image of `model` (see the module docs) from calibration `samples`
/// (their fired bits must be at `thresholds`).
pub fn convert<'a>(
    model: &'a Model,
    profile: &Profile,
    thresholds: &[f32],
    samples: Samples,
    cfg: &ConvertConfig,
) -> Result<(GgufWriter<'a>, ConvertReport), ConvertError> {
    let Samples {
        layers: mut samples,
        hidden,
    } = samples;
    let f = &model.file;
    let c = &model.config;
    if c.n_expert > 0 {
        return Err(ConvertError::Refused(
            "mixture-of-experts models convert through `convert::moe::convert`".into(),
        ));
    }
    check_thresholds(thresholds, c.n_layer)?;
    check_granule(cfg.granule)?;
    if model.weights.layers.iter().any(|l| l.down_transposed) {
        return Err(ConvertError::Refused(
            "the model is already converted".into(),
        ));
    }
    for s in samples.iter_mut() {
        s.hold_out(cfg.held_out);
    }
    // Fit every layer (layers in parallel; each fit is single-threaded).
    type Fit = (Vec<u32>, Option<Predictor>, LayerReport);
    let fits: Vec<Result<Fit, ConvertError>> = (0..c.n_layer)
        .into_par_iter()
        .map(|li| {
            let s = &samples[li];
            let l = &model.weights.layers[li];
            // Hot first, co-activated neurons together inside bands (`pi2_sparse::placement`).
            let mut cols = FiringColumns::new(c.n_ff, s.len());
            for t in 0..s.len() {
                for i in 0..c.n_ff {
                    if s.fired(t, i) {
                        cols.set(i, t);
                    }
                }
            }
            let perm = placement(&cols, cfg.placement_band);
            let held = s.len() - s.train;
            let fired_held = (s.train..s.len())
                .map(|t| (0..c.n_ff).filter(|&i| s.fired(t, i)).count())
                .sum::<usize>() as f32
                / (held * c.n_ff).max(1) as f32;
            let mut fit_cfg = cfg.fit.clone();
            fit_cfg.gate_row_bytes = l.gate.mat(f).row_bytes() as f32;
            fit_cfg.predictor_weight_bytes = predictor_type(c.n_embd).block_bytes() as f32
                / predictor_type(c.n_embd).block_len() as f32;
            let fit = match cfg.predictor {
                None => None,
                Some(kind) => {
                    let gate = l.gate.mat(f);
                    let mut w = vec![0.0f32; c.n_ff * c.n_embd];
                    for (r, row) in w.chunks_exact_mut(c.n_embd).enumerate() {
                        gate.dequantize_row(r, row);
                    }
                    let low = pi2_sparse::lowrank(&w, s, &fit_cfg)?;
                    Some(match kind {
                        PredictorKind::Lowrank => low,
                        PredictorKind::Trained => {
                            pi2_sparse::train(s, low.predictor.rank, &fit_cfg)?
                        }
                    })
                }
            };
            let report = LayerReport {
                threshold: thresholds[li],
                rank: fit.as_ref().map_or(0, |x| x.predictor.rank),
                recall: fit.as_ref().map_or(1.0, |x| x.recall),
                candidates: fit.as_ref().map_or(1.0, |x| x.candidates),
                fired: fired_held,
            };
            Ok((perm, fit.map(|x| x.predictor), report))
        })
        .collect();
    let mut layers = Vec::new();
    for r in fits {
        layers.push(r?);
    }
    let mut w = GgufWriter::new();
    write_metadata(&mut w, model, profile, thresholds, &layers, cfg);
    // Gate and up are written in the file's neuron order; the source's down matrix is kept as
    // it is beside its transposed rows, for layers that run dense (`pi2_model::bundle`). The
    // large tensors are produced from the source's mapping as the file is written, so the
    // conversion never holds a second copy of the model.
    let ffn_name = |n: &str| {
        n.starts_with("blk.") && (n.ends_with(".ffn_gate.weight") || n.ends_with(".ffn_up.weight"))
    };
    // A clustered head writes the output matrix itself, in cluster order.
    let head_out = cfg
        .head
        .is_some()
        .then_some(model.weights.output.name.as_str());
    for t in &f.tensors {
        let output = head_out == Some(t.name.as_str()) && !model.weights.tied_output;
        if !ffn_name(&t.name) && t.name != pi2_model::checksum::TENSOR && !output {
            let data = f.tensor_data(t);
            w.tensor_with(&t.name, &t.dims, t.ggml_type, t.size, move |out| {
                out.write_all(data)
            });
        }
    }
    for (li, (perm, pred, _)) in layers.iter().enumerate() {
        write_layer(&mut w, model, li, perm, pred.as_ref(), cfg)?;
    }
    let head = match &cfg.head {
        Some(hc) => Some(write_head(&mut w, model, &hidden, hc, cfg.held_out)?),
        None => None,
    };
    w.with_checksums();
    let layers = layers.into_iter().map(|l| l.2).collect();
    Ok((w, ConvertReport { layers, head }))
}

/// The clustered output head (see [`head`]): the output matrix in cluster order, the order,
/// the centroids and their calibration frequencies. The last `held_out` share of the
/// calibration hidden states is kept out of the clustering and checks it.
fn write_head<'a>(
    w: &mut GgufWriter<'a>,
    model: &'a Model,
    hidden: &[f32],
    cfg: &head::HeadConfig,
    held_out: f32,
) -> Result<HeadReport, ConvertError> {
    let out = model.weights.output.mat(&model.file);
    let (vocab, d) = (out.rows, out.cols);
    let n = hidden.len() / d.max(1);
    let keep = ((n as f32 * (1.0 - held_out.clamp(0.0, 0.9))) as usize).clamp(1, n.max(1));
    let (fit, check) = hidden.split_at((keep * d).min(hidden.len()));
    let (h, report) = head::build_checked(&out, fit, check, cfg)?;
    // Rows in stored order: a row-quantized matrix's rows move whole, or are stored again in
    // the type asked for.
    let ty = cfg.row_type.unwrap_or(out.ty);
    if !storable(ty, d) {
        return Err(refuse_unstorable("head", ty, d));
    }
    // A tied embedding stays in vocabulary order for lookups; the head gets its own matrix.
    let name = match model.weights.tied_output {
        true => "output.weight",
        false => model.weights.output.name.as_str(),
    };
    let output_bytes = vocab * ty.row_bytes(d).expect("checked storable");
    let order = h.order.clone();
    w.tensor_with(
        name,
        &[d as u64, vocab as u64],
        ty.ggml_id(),
        output_bytes as u64,
        move |sink| {
            let mut values = vec![0f32; d];
            for &r in &order {
                match ty == out.ty {
                    true => sink.write_all(out.row(r as usize))?,
                    false => {
                        out.dequantize_row(r as usize, &mut values);
                        sink.write_all(&ty.quantize_row(&values).expect("checked storable"))?;
                    }
                }
            }
            Ok(())
        },
    );
    let order: Vec<u8> = h
        .order
        .iter()
        .flat_map(|&i| (i as i32).to_le_bytes())
        .collect();
    w.tensor(HEAD_ORDER, &[vocab as u64], GGML_I32, order);
    let k = h.clusters();
    let cty = head::centroid_type(d);
    let rows_of = |v: &[f32]| -> Vec<u8> {
        v.chunks_exact(d)
            .flat_map(|c| cty.quantize_row(c).expect("a type for this width"))
            .collect()
    };
    let (centroids, directions) = (rows_of(&h.centroids), rows_of(&h.directions));
    let centroid_bytes = centroids.len() + directions.len();
    w.tensor(
        HEAD_CENTROIDS,
        &[d as u64, k as u64],
        cty.ggml_id(),
        centroids,
    );
    w.tensor(
        HEAD_DIRECTIONS,
        &[d as u64, k as u64],
        cty.ggml_id(),
        directions,
    );
    let f32s = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let f32_id = QuantType::F32.ggml_id();
    w.tensor(HEAD_SPREAD, &[k as u64], f32_id, f32s(&h.spread));
    w.tensor(HEAD_COEF, &[vocab as u64], f32_id, f32s(&h.coef));
    w.tensor(HEAD_FREQUENCY, &[k as u64], f32_id, f32s(&h.frequency));
    w.meta(KEY_HEAD_CLUSTER, Value::U32(h.cluster as u32));
    w.meta(KEY_HEAD_SHARE, Value::F32(cfg.share));
    w.meta(KEY_HEAD_UCB, Value::F32(cfg.ucb));
    Ok(HeadReport {
        clusters: k,
        cluster: h.cluster,
        share: cfg.share,
        centroid_bytes,
        output_bytes,
        check: report,
    })
}

/// The source's metadata (but its `pi2.*` keys) and the format's: version, thresholds,
/// predictor kind and cuts, measured recall and candidates, the renumbered profile.
fn write_metadata(
    w: &mut GgufWriter<'_>,
    model: &Model,
    profile: &Profile,
    thresholds: &[f32],
    layers: &[(Vec<u32>, Option<Predictor>, LayerReport)],
    cfg: &ConvertConfig,
) {
    for (k, v) in &model.file.metadata {
        let ours = k.starts_with("pi2.") && k != pi2_model::KEY_FFN_ACTIVATION;
        if k != "general.alignment" && !ours {
            w.meta(k, v.clone());
        }
    }
    w.meta("general.alignment", Value::U32(cfg.granule));
    w.meta(KEY_VERSION, Value::U32(FORMAT_VERSION));
    w.meta(KEY_SPARSITY, Value::F32(cfg.sparsity));
    w.meta(
        KEY_ACTIVATION,
        Value::String(model.config.ffn_act.name().into()),
    );
    w.meta(KEY_GRANULE, Value::U32(cfg.granule));
    let floats = |v: Vec<f32>| Value::Array(v.into_iter().map(Value::F32).collect());
    w.meta(KEY_THRESHOLDS, floats(thresholds.to_vec()));
    w.meta(
        KEY_KIND,
        Value::String(cfg.predictor.map_or("none", |k| k.name()).into()),
    );
    if cfg.predictor.is_some() {
        w.meta(
            KEY_CUTS,
            floats(layers.iter().map(|l| l.1.as_ref().unwrap().cut).collect()),
        );
    }
    w.meta(
        KEY_RECALL,
        floats(layers.iter().map(|l| l.2.recall).collect()),
    );
    w.meta(
        KEY_CANDIDATES,
        floats(layers.iter().map(|l| l.2.candidates).collect()),
    );
    let perms: Vec<Vec<u32>> = layers.iter().map(|l| l.0.clone()).collect();
    w.meta(
        KEY_PROFILE,
        Value::String(profile.permuted(&perms).to_json()),
    );
    w.meta(
        KEY_SOURCE,
        Value::String(model.name.clone().unwrap_or_else(|| "unnamed model".into())),
    );
}

/// Layer `li`'s bundles in `perm` order: gate and up rows, transposed down rows, the
/// permutation, and the predictor (its output rows permuted the same way).
fn write_layer<'a>(
    w: &mut GgufWriter<'a>,
    model: &'a Model,
    li: usize,
    perm: &[u32],
    pred: Option<&Predictor>,
    cfg: &ConvertConfig,
) -> Result<(), ConvertError> {
    let (f, c) = (&model.file, &model.config);
    let l = &model.weights.layers[li];
    let shape = [c.n_embd as u64, c.n_ff as u64];
    // Rows are produced in file order while the file is written (see `convert`).
    for (tv, t) in [(&l.gate, Tensor::Gate), (&l.up, Tensor::Up)] {
        let m = tv.mat(f);
        let order = perm.to_vec();
        let bytes = m.bytes().len() as u64;
        w.tensor_with(&t.name(li), &shape, tv.ty.ggml_id(), bytes, move |out| {
            order
                .iter()
                .try_for_each(|&i| out.write_all(m.row(i as usize)))
        });
    }
    let down = l.down.mat(f);
    let dt = down_type(cfg.down_type, down.ty, c.n_embd)?;
    let n_embd = c.n_embd;
    let order = perm.to_vec();
    let bytes = (perm.len() * dt.row_bytes(n_embd).expect("type checked by down_type")) as u64;
    w.tensor_with(
        &Tensor::DownT.name(li),
        &shape,
        dt.ggml_id(),
        bytes,
        move |out| {
            let t = transposed(&down);
            order.iter().try_for_each(|&i| {
                let row = &t[i as usize * n_embd..(i as usize + 1) * n_embd];
                out.write_all(&dt.quantize_row(row).expect("type checked by down_type"))
            })
        },
    );
    let perm_bytes: Vec<u8> = perm
        .iter()
        .flat_map(|&i| (i as i32).to_le_bytes())
        .collect();
    w.tensor(
        &Tensor::Perm.name(li),
        &[c.n_ff as u64],
        GGML_I32,
        perm_bytes,
    );
    let Some(p) = pred else {
        return Ok(());
    };
    let t1 = predictor_type(c.n_embd);
    let fc1: Vec<u8> = p
        .fc1
        .chunks_exact(c.n_embd)
        .flat_map(|r| t1.quantize_row(r).expect("predictor type fits"))
        .collect();
    w.tensor(
        &Tensor::Fc1.name(li),
        &[c.n_embd as u64, p.rank as u64],
        t1.ggml_id(),
        fc1,
    );
    let t2 = predictor_type(p.rank);
    let fc2: Vec<u8> = perm
        .iter()
        .flat_map(|&i| {
            let r = &p.fc2[i as usize * p.rank..(i as usize + 1) * p.rank];
            t2.quantize_row(r).expect("predictor type fits")
        })
        .collect();
    w.tensor(
        &Tensor::Fc2.name(li),
        &[p.rank as u64, c.n_ff as u64],
        t2.ggml_id(),
        fc2,
    );
    let bias: Vec<u8> = perm
        .iter()
        .flat_map(|&i| p.bias[i as usize].to_le_bytes())
        .collect();
    w.tensor(&Tensor::Fc2Bias.name(li), &[c.n_ff as u64], 0, bias);
    Ok(())
}

/// Every tensor of `source` except those `skip` names is in `converted`, byte for byte.
fn same_dense_tensors(
    source: &Model,
    converted: &Model,
    skip: impl Fn(&str) -> bool,
) -> Result<(), ConvertError> {
    let bad = |m: String| ConvertError::Verify(m);
    let (fs, fc) = (&source.file, &converted.file);
    let copied = |n: &str| !skip(n) && n != pi2_model::checksum::TENSOR;
    for t in fs.tensors.iter().filter(|t| copied(&t.name)) {
        let o = fc
            .tensor(&t.name)
            .ok_or_else(|| bad(format!("{} is missing", t.name)))?;
        if o.dims != t.dims || o.ggml_type != t.ggml_type || fc.tensor_data(o) != fs.tensor_data(t)
        {
            return Err(bad(format!("{} differs from the source", t.name)));
        }
    }
    Ok(())
}

/// A clustered head's output matrix holds the source's output rows in its stored order.
fn verify_head(source: &Model, converted: &Model) -> Result<(), ConvertError> {
    let bad = |m: String| ConvertError::Verify(m);
    let fc = &converted.file;
    let t = fc
        .tensor(HEAD_ORDER)
        .ok_or_else(|| bad(format!("{HEAD_ORDER} is missing")))?;
    let order: Vec<i32> = fc
        .tensor_data(t)
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (src, out) = (
        source.weights.output.mat(&source.file),
        converted.weights.output.mat(fc),
    );
    if order.len() != src.rows || (out.rows, out.cols) != (src.rows, src.cols) {
        return Err(bad("the clustered output matrix has another shape".into()));
    }
    let mut seen = vec![false; src.rows];
    let (mut want, mut got) = (vec![0f32; src.cols], vec![0f32; src.cols]);
    for (j, &i) in order.iter().enumerate() {
        let ok =
            i >= 0 && (i as usize) < src.rows && !std::mem::replace(&mut seen[i as usize], true);
        let same = ok
            && match out.ty == src.ty {
                true => out.row(j) == src.row(i as usize),
                // Stored again in another type: the same values within its rounding.
                false => {
                    src.dequantize_row(i as usize, &mut want);
                    out.dequantize_row(j, &mut got);
                    requantized_row_matches(&got, &want, out.ty)
                }
            };
        if !same {
            return Err(bad(format!("output row {j} is not source row {i}")));
        }
    }
    Ok(())
}

/// Whether `row`, read back from type `ty`, is `want` within that type's rounding.
fn requantized_row_matches(row: &[f32], want: &[f32], ty: QuantType) -> bool {
    let amax = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let tol = amax * requant_tolerance(ty) + 1e-6;
    row.iter().zip(want).all(|(a, b)| (a - b).abs() <= tol)
}

/// Largest error, relative to a row's largest magnitude, of storing the row as `ty`: Q4_0 can
/// clamp a value of the other sign than its block's extreme by a whole step (1/8); Q4_1 rounds
/// by half of (max - min) / 15.
fn requant_tolerance(ty: QuantType) -> f32 {
    match ty {
        QuantType::Q4_0 => 0.13,
        _ => 0.07,
    }
}

/// A mixture whose leading layers are dense (LFM2-MoE) is not converted: it runs from the
/// plain file, its experts streamed.
fn check_mixture_layers(model: &Model) -> Result<(), ConvertError> {
    if model
        .weights
        .layers
        .iter()
        .any(|l| l.expert_norms.is_some())
    {
        return Err(ConvertError::Refused(
            "a mixture with a dense FFN beside its experts (Gemma 4) is not converted yet: run it from the plain file (under --mem-budget its experts stream from flash)".into(),
        ));
    }
    match model.config.dense_lead {
        0 => Ok(()),
        n => Err(ConvertError::Refused(format!(
            "a mixture whose first {n} layers are dense is not converted yet: run it from the plain file (under --mem-budget its experts stream from flash)"
        ))),
    }
}

fn check_granule(granule: u32) -> Result<(), ConvertError> {
    if !granule.is_power_of_two() || granule < 32 || granule as u64 > pi2_model::gguf::MAX_ALIGNMENT
    {
        return Err(ConvertError::Refused(format!(
            "I/O granule {granule} must be a power of two in 32..={}",
            pi2_model::gguf::MAX_ALIGNMENT
        )));
    }
    Ok(())
}

/// Whether pi2 can store rows of `width` values as `ty` (a type it quantizes to, whole blocks).
pub(crate) fn storable(ty: QuantType, width: usize) -> bool {
    ty.quantize_row(&vec![0.0; width]).is_some()
}

/// `--what` rows of `width` stored as `ty`, or why not.
pub(crate) fn refuse_unstorable(what: &str, ty: QuantType, width: usize) -> ConvertError {
    ConvertError::Refused(format!(
        "cannot store {what} rows of {width} as {ty} (pi2 makes F32, F16, Q8_0, Q5_0, Q5_1, Q4_0, Q4_1, Q4_K in whole blocks): choose another --{what}-type"
    ))
}

/// The types `cfg` asks for, checked against a model of width `n_embd` before any work.
pub(crate) fn check_types(cfg: &ConvertConfig, n_embd: usize) -> Result<(), ConvertError> {
    if let Some(t) = cfg.down_type.filter(|&t| !storable(t, n_embd)) {
        return Err(refuse_unstorable("down", t, n_embd));
    }
    let head = cfg.head.as_ref().and_then(|h| h.row_type);
    if let Some(t) = head.filter(|&t| !storable(t, n_embd)) {
        return Err(refuse_unstorable("head", t, n_embd));
    }
    Ok(())
}

pub(crate) fn down_type(
    want: Option<QuantType>,
    model: QuantType,
    n_embd: usize,
) -> Result<QuantType, ConvertError> {
    let ok = |t: QuantType| storable(t, n_embd);
    match want {
        Some(t) if ok(t) => Ok(t),
        Some(t) => Err(refuse_unstorable("down", t, n_embd)),
        None if ok(model) => Ok(model),
        // The smallest type of 32-element blocks at least as precise as the source's.
        None => Ok(match model {
            QuantType::Q2_K | QuantType::Q3_K | QuantType::Q4_K | QuantType::IQ4_XS
                if ok(QuantType::Q5_0) =>
            {
                QuantType::Q5_0
            }
            QuantType::Q5_K if ok(QuantType::Q5_1) => QuantType::Q5_1,
            _ => QuantType::Q8_0,
        }),
    }
}

/// Write `w` to `out` (see [`write_atomic`]: complete or not at all). Refuses to write over
/// `input`, and over an existing file unless `force`.
pub fn write_file(
    w: &GgufWriter<'_>,
    out: &Path,
    input: &Path,
    force: bool,
) -> Result<(), ConvertError> {
    write_atomic(out, &[input], force, |file| w.write(file), |_| Ok(()))
}

/// [`write_file`], with the written file re-read and [`verify`]d against `source` before it
/// gets its name: a file that fails leaves nothing (and an older `out` untouched).
pub fn write_verified(
    w: &GgufWriter<'_>,
    source: &Model,
    out: &Path,
    input: &Path,
    force: bool,
) -> Result<(), ConvertError> {
    write_atomic(
        out,
        &[input],
        force,
        |file| w.write(file),
        |p| verify_at(source, p, verify),
    )
}

/// Load the file at `path` and run `check` on it against `source`.
pub(crate) fn verify_at(
    source: &Model,
    path: &Path,
    check: fn(&Model, &Model) -> Result<(), ConvertError>,
) -> Result<(), ConvertError> {
    let written = Model::load(path)
        .map_err(|e| ConvertError::Verify(format!("cannot re-read the written file: {e}")))?;
    check(source, &written)
}

/// Re-read a converted file and compare it with its source: dense tensors byte for byte, gate
/// and up rows against the source rows named by `ffn_perm`, transposed down rows against the
/// source down columns (within the storage type's rounding), and the sparse weights must load.
pub fn verify(source: &Model, converted: &Model) -> Result<(), ConvertError> {
    let bad = |m: String| ConvertError::Verify(m);
    let (fs, fc) = (&source.file, &converted.file);
    let c = &source.config;
    let head = fc.get(pi2_model::bundle::KEY_HEAD_CLUSTER).is_some();
    let out_name = source.weights.output.name.as_str();
    same_dense_tensors(source, converted, |n| {
        n.contains(".ffn_gate.")
            || n.contains(".ffn_up.")
            || n.contains(".ffn_down.")
            || (head && n == out_name && !source.weights.tied_output)
    })?;
    if head {
        verify_head(source, converted)?;
    }
    for (li, (ls, lc)) in source
        .weights
        .layers
        .iter()
        .zip(&converted.weights.layers)
        .enumerate()
    {
        let pt = fc
            .tensor(&format!("blk.{li}.ffn_perm"))
            .ok_or_else(|| bad(format!("blk.{li}.ffn_perm is missing")))?;
        let perm: Vec<i32> = fc
            .tensor_data(pt)
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let mut seen = vec![false; c.n_ff];
        for &p in &perm {
            if p < 0 || p as usize >= c.n_ff || std::mem::replace(&mut seen[p as usize], true) {
                return Err(bad(format!("blk.{li}.ffn_perm is not a permutation")));
            }
        }
        if perm.len() != c.n_ff {
            return Err(bad(format!("blk.{li}.ffn_perm has {} entries", perm.len())));
        }
        for (a, b) in [(&ls.gate, &lc.gate), (&ls.up, &lc.up)] {
            let (ma, mb) = (a.mat(fs), b.mat(fc));
            for (j, &i) in perm.iter().enumerate() {
                if mb.row(j) != ma.row(i as usize) {
                    return Err(bad(format!("{} row {j} is not source row {i}", b.name)));
                }
            }
        }
        if !lc.down_transposed {
            return Err(bad(format!("layer {li} has no transposed down matrix")));
        }
        let (down, dt) = (ls.down.mat(fs), lc.down.mat(fc));
        let t = transposed(&down);
        let mut row = vec![0.0; c.n_embd];
        for (j, &i) in perm.iter().enumerate() {
            dt.dequantize_row(j, &mut row);
            let want = &t[i as usize * c.n_embd..(i as usize + 1) * c.n_embd];
            if !requantized_row_matches(&row, want, dt.ty) {
                return Err(bad(format!(
                    "blk.{li}.ffn_down_t row {j} is not source down column {i}"
                )));
            }
        }
    }
    pi2_engine::load_sparse(converted)?.ok_or_else(|| bad("no pi2 metadata".into()))?;
    pi2_engine::verify_checksums(converted)?;
    Ok(())
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
