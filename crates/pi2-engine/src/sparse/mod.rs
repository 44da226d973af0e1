//! Sparse FFN weights: per layer, the confirm threshold, the transposed down matrix and an
//! optional predictor. Built from a converted model file (zero-copy) or from a dense model at load
//! (the down matrix transposed in RAM).
//!
//! The engine's two-phase decode (`pipeline.rs`) reads these: predictor -> candidate
//! neurons -> their gate rows -> confirmed neurons (`|act(gate . x)| >= threshold`) -> their up rows
//! and down columns. `load` reads them from converted and PowerInfer files.

use crate::EngineError;
mod load;

pub use load::{load_sparse, unit_frequencies, verify_checksums};
use pi2_kernels::{MatRef, QuantType};
use pi2_model::Model;

/// The activation a profile of a model with `act` records (scores are `|act(gate . x)|`).
pub fn profile_activation(act: pi2_model::FfnAct) -> pi2_sparse::Activation {
    match act {
        // gpt-oss's clamped SwiGLU scores as SwiGLU does (its sparse FFN is not built).
        pi2_model::FfnAct::Silu | pi2_model::FfnAct::SwigluOai => pi2_sparse::Activation::Silu,
        pi2_model::FfnAct::Gelu => pi2_sparse::Activation::Gelu,
        pi2_model::FfnAct::Relu | pi2_model::FfnAct::DRelu => pi2_sparse::Activation::Relu,
    }
}

/// Bytes either borrowed from the model file or owned (8-byte aligned so every block type can be
/// viewed in place).
#[derive(Debug)]
pub enum Blob<'a> {
    File(&'a [u8]),
    Owned { words: Vec<u64>, len: usize },
}

impl Blob<'_> {
    pub fn owned(bytes: &[u8]) -> Blob<'static> {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Blob::Owned {
            words,
            len: bytes.len(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Blob::File(b) => b,
            Blob::Owned { words, len } => &bytemuck::cast_slice(words)[..*len],
        }
    }
}

/// A weight matrix held by the sparse layer (`rows` x `cols`, row-major, GGML type `ty`).
#[derive(Debug)]
pub struct Weight<'a> {
    pub ty: QuantType,
    pub rows: usize,
    pub cols: usize,
    pub data: Blob<'a>,
}

impl<'a> Weight<'a> {
    /// Check geometry and alignment once.
    pub fn new(
        ty: QuantType,
        rows: usize,
        cols: usize,
        data: Blob<'a>,
    ) -> Result<Self, pi2_kernels::KernelError> {
        MatRef::new(ty, rows, cols, data.bytes())?;
        Ok(Self {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// Quantize a row-major f32 matrix.
    pub fn quantize(
        ty: QuantType,
        rows: usize,
        cols: usize,
        values: &[f32],
    ) -> Result<Weight<'static>, EngineError> {
        let mut bytes = Vec::new();
        for r in values.chunks_exact(cols) {
            bytes.extend(ty.quantize_row(r).ok_or(EngineError::DownType {
                ty,
                cols,
                need: "a format pi2 can quantize to (F32, F16, Q8_0, Q4_0, Q4_1, Q4_K) and whole blocks",
            })?);
        }
        Weight::new(ty, rows, cols, Blob::owned(&bytes)).map_err(|e| EngineError::SparseLayer {
            layer: 0,
            msg: e.to_string(),
        })
    }

    pub fn mat(&self) -> MatRef<'_> {
        MatRef::new(self.ty, self.rows, self.cols, self.data.bytes())
            .expect("checked when the weight was made")
    }

    pub fn bytes(&self) -> usize {
        self.data.bytes().len()
    }
}

/// A low-rank neuron predictor `score = fc2 . h(fc1 . x) + bias`; `kind` says whether `h` is a
/// ReLU and how the score is compared with `cut` (see [`pi2_sparse::PredictorKind`]).
#[derive(Debug)]
pub struct PredictorWeights<'a> {
    pub kind: pi2_sparse::PredictorKind,
    /// `rank x n_embd`.
    pub fc1: Weight<'a>,
    /// `n_ff x rank`.
    pub fc2: Weight<'a>,
    /// Per-neuron bias (`n_ff`), if any.
    pub bias: Option<Vec<f32>>,
    pub cut: f32,
}

impl PredictorWeights<'_> {
    pub fn rank(&self) -> usize {
        self.fc1.rows
    }

    pub fn bytes(&self) -> usize {
        self.fc1.bytes() + self.fc2.bytes() + self.bias.as_ref().map_or(0, |b| b.len() * 4)
    }
}

/// One FFN layer's sparse weights.
#[derive(Debug)]
pub struct SparseLayer<'a> {
    /// A neuron is confirmed when `|act(gate . x)| >= threshold` (0 keeps every neuron).
    pub threshold: f32,
    /// The down projection transposed: `n_ff` rows of `n_embd` (neuron i's down column is row i).
    pub down_t: Weight<'a>,
    pub predictor: Option<PredictorWeights<'a>>,
}

/// Sparse FFN weights of every FFN unit, plus how decode should use them. A unit is a layer's
/// FFN, or in a mixture-of-experts model one expert of a layer: unit `layer * experts + e`.
#[derive(Debug)]
pub struct SparseFfn<'a> {
    pub layers: Vec<SparseLayer<'a>>,
    /// Units per layer: the experts of a mixture-of-experts model, else 1.
    pub experts: usize,
    /// Use the predictor (else every neuron is a candidate: gate rows are all computed).
    pub use_predictor: bool,
    /// Also run batches (prefill, perplexity) through the sparse FFN, token by token in effect;
    /// by default batches run dense (prefill) and only single-token decode is sparse.
    pub batches_too: bool,
}

impl SparseFfn<'_> {
    /// Build from a model as loaded: transpose every down matrix (each expert's, in a
    /// mixture-of-experts model) into `down_type` rows (the model's own down type when `None`
    /// and it fits `n_embd`, else Q8_0). No predictor. `thresholds` are per layer.
    pub fn from_dense(
        model: &Model,
        thresholds: &[f32],
        down_type: Option<QuantType>,
    ) -> Result<SparseFfn<'static>, EngineError> {
        let c = &model.config;
        check_thresholds(thresholds, c.n_layer)?;
        let experts = c.n_expert.max(1);
        let mut layers = Vec::with_capacity(c.n_layer * experts);
        for (li, l) in model.weights.layers.iter().enumerate() {
            let down = l.down.mat(&model.file);
            let ty = down_type.unwrap_or(if down.ty.quantize_row(&vec![0.0; c.n_embd]).is_some() {
                down.ty
            } else {
                QuantType::Q8_0
            });
            for e in 0..experts {
                let t = if l.down_transposed {
                    let mut t = vec![0.0; c.n_ff * c.n_embd];
                    let m = down.rows(e * c.n_ff..(e + 1) * c.n_ff);
                    for (r, row) in t.chunks_exact_mut(c.n_embd).enumerate() {
                        m.dequantize_row(r, row);
                    }
                    t
                } else {
                    transposed(&down.rows(e * c.n_embd..(e + 1) * c.n_embd))
                };
                let down_t =
                    Weight::quantize(ty, c.n_ff, c.n_embd, &t).map_err(|e| layer_err(li, e))?;
                layers.push(SparseLayer {
                    threshold: thresholds[li],
                    down_t,
                    predictor: None,
                });
            }
        }
        Ok(SparseFfn {
            layers,
            experts,
            use_predictor: false,
            batches_too: false,
        })
    }
}

impl SparseFfn<'_> {
    /// Replace every layer's confirm threshold (one per layer, shared by its experts).
    pub fn set_thresholds(&mut self, thresholds: &[f32]) -> Result<(), EngineError> {
        let experts = self.experts.max(1);
        check_thresholds(thresholds, self.layers.len() / experts)?;
        for (u, l) in self.layers.iter_mut().enumerate() {
            l.threshold = thresholds[u / experts];
        }
        Ok(())
    }

    /// Model layers covered.
    pub fn n_layer(&self) -> usize {
        self.layers.len() / self.experts.max(1)
    }

    /// Whether every layer has a predictor.
    pub fn has_predictors(&self) -> bool {
        self.layers.iter().all(|l| l.predictor.is_some())
    }
}

fn layer_err(layer: usize, e: EngineError) -> EngineError {
    match e {
        EngineError::SparseLayer { msg, .. } => EngineError::SparseLayer { layer, msg },
        e => e,
    }
}

pub fn check_thresholds(t: &[f32], n_layer: usize) -> Result<(), EngineError> {
    if t.len() != n_layer {
        return Err(EngineError::ThresholdCount(t.len(), n_layer));
    }
    if let Some((i, &v)) = t
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
    {
        return Err(EngineError::BadThreshold(v, i));
    }
    Ok(())
}

/// A matrix's transpose as f32, row-major (`cols` rows of `rows`).
pub fn transposed(m: &MatRef<'_>) -> Vec<f32> {
    let mut row = vec![0.0; m.cols];
    let mut out = vec![0.0; m.rows * m.cols];
    for r in 0..m.rows {
        m.dequantize_row(r, &mut row);
        for (c, &v) in row.iter().enumerate() {
            out[c * m.rows + r] = v;
        }
    }
    out
}

/// What the sparse FFN did, summed over tokens (decode and sparse batches).
#[derive(Clone, Debug, Default)]
pub struct SparseStats {
    /// Token-layer pairs computed sparsely.
    pub token_layers: u64,
    /// Neurons per token-layer (for fractions).
    pub n_ff: usize,
    pub candidates: u64,
    pub confirmed: u64,
    /// FFN weight bytes read (predictor + candidate gate rows + confirmed up rows and down
    /// columns) and what the dense FFN would have read for the same token-layers.
    pub ffn_bytes: u64,
    pub dense_ffn_bytes: u64,
    /// Per layer: neurons passing the threshold among all (known when every gate row was
    /// computed: batches), and how many of them the predictor had named.
    pub layer_true_active: Vec<u64>,
    pub layer_true_found: Vec<u64>,
    pub layer_candidates: Vec<u64>,
    pub layer_tokens: Vec<u64>,
    /// Decoded token-layers of a sparse model run dense instead, their whole FFN in memory
    /// (`EngineConfig::dense_resident`).
    pub dense_token_layers: u64,
}

impl SparseStats {
    fn per(&self, v: u64) -> f64 {
        v as f64 / (self.token_layers.max(1) as f64 * self.n_ff.max(1) as f64)
    }
    /// Mean fraction of neurons that were candidates.
    pub fn candidate_fraction(&self) -> f64 {
        self.per(self.candidates)
    }
    /// Mean fraction of neurons confirmed (1 - FFN sparsity).
    pub fn confirmed_fraction(&self) -> f64 {
        self.per(self.confirmed)
    }
    /// FFN bytes per token-layer relative to dense.
    pub fn byte_fraction(&self) -> f64 {
        self.ffn_bytes as f64 / self.dense_ffn_bytes.max(1) as f64
    }
    /// Predictor recall per layer (None where it was not measured).
    pub fn recall(&self) -> Vec<Option<f64>> {
        self.layer_true_active
            .iter()
            .zip(&self.layer_true_found)
            .map(|(&a, &f)| (a > 0).then(|| f as f64 / a as f64))
            .collect()
    }
    /// Recall over all layers.
    pub fn total_recall(&self) -> Option<f64> {
        let a: u64 = self.layer_true_active.iter().sum();
        (a > 0).then(|| self.layer_true_found.iter().sum::<u64>() as f64 / a as f64)
    }
}
