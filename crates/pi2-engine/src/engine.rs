//! The dense forward pass. Every FFN matrix is computed row by row (a row of gate/up is one
//! neuron), so the sparse engine can later restrict the same loops to the active neurons.

use crate::offload::{Offload, FIRST_STREAM_TAG, GATE, UPDOWN};
use crate::packed::PackedWeights;
use crate::sparse::{SparseFfn, SparseLayer, SparseStats};
use half::f16;
use pi2_io::Request;
use pi2_kernels::{
    axpy_rows_by, gather_matvec_by, matmul, matmul_many, ActBuf, KernelSet, MatRef, Tier,
};
use pi2_model::{FfnAct, LayerWeights, Model, RopeKind, TensorView, TokenId};
use pi2_sparse::FfnObserver;
use rayon::prelude::*;
use std::sync::atomic::{
    AtomicU32, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Release,
};

/// Engine errors: bad requests rather than bad files (the model was checked at load).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "context full: {needed} tokens needed but the context holds {n_ctx} (raise -c/--ctx-size)"
    )]
    ContextFull { needed: usize, n_ctx: usize },
    #[error("token id {0} is outside the vocabulary ({1} tokens)")]
    BadToken(TokenId, usize),
    #[error("kernel tier `{0}` is not supported by this CPU")]
    TierUnsupported(&'static str),
    #[error("cannot start {threads} worker threads: {msg}")]
    ThreadPool { threads: usize, msg: String },
    #[error("CPU {cpu} is not available to this process (allowed: {allowed})")]
    CpuNotAllowed { cpu: usize, allowed: String },
    #[error("empty input")]
    Empty,
    #[error("sparse weights do not fit the model: {0}")]
    SparseMismatch(String),
    #[error("reading the model's neurons failed: {0}")]
    Io(#[from] pi2_io::IoError),
    #[error("offloaded FFN: {0}")]
    Offload(String),
}

/// One token-layer of sparse decode: the candidate neurons (gate rows computed) and the
/// confirmed ones (up and down rows computed), as file-order indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NeuronStep {
    pub layer: u32,
    pub candidates: Vec<u32>,
    pub confirmed: Vec<u32>,
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Compute threads.
    pub threads: usize,
    /// Context length (tokens held in the KV cache); 0 = the model's training context.
    pub n_ctx: usize,
    /// Force a kernel tier (default: the best this CPU supports).
    pub tier: Option<Tier>,
    /// CPUs to pin the compute threads to, thread `i` on `cpus[i % len]` (empty: let the OS
    /// place them). See [`crate::topology::Topology::select`].
    pub cpus: Vec<usize>,
    /// Neurons per cluster in sparse decode (a multiple of 4): a cluster is computed as soon as
    /// its rows are resident, and is the unit of partial sums (so results do not depend on
    /// residency or thread count).
    pub cluster: usize,
    /// Copy the matrices multiplied whole into the row-interleaved layout (`PackedMat`) at
    /// [`Engine::prepare`]: about twice the matvec speed; `false` keeps every tensor in the
    /// file mapping.
    pub repack: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            n_ctx: 0,
            tier: None,
            cpus: Vec::new(),
            cluster: 64,
            repack: true,
        }
    }
}

/// Which positions of a batch need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token (generation).
    Last,
    /// Every token from index `k` of the batch on (perplexity scores the second half).
    From(usize),
}

/// Per-layer key/value cache in f16 (llama.cpp's default: half the memory of f32, and the
/// rounding the reference outputs were made with), grown as positions are used.
struct KvCache {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    len: usize,
}

/// Reused activation buffers (grown on demand, never shrunk).
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    logits: Vec<f32>,
    acts: ActBuf,
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    // Sparse FFN: neuron lists, their values, predictor scores, per-thread partial outputs.
    cand: Vec<u32>,
    /// Which of the step's units (index into its unit list) each candidate belongs to.
    cand_unit: Vec<u32>,
    vals: Vec<f32>,
    coeff: Vec<f32>,
    pred_h: Vec<f32>,
    pred_s: Vec<f32>,
    partials: Vec<f32>,
    // Cluster pipeline: row addresses per candidate, its cold slot (NO_SLOT if pinned or in
    // the file mapping), outstanding reads per cluster, the up rows' activations.
    gate_at: Vec<usize>,
    up_at: Vec<usize>,
    down_at: Vec<usize>,
    slot: Vec<u32>,
    pend_gate: Vec<AtomicU32>,
    pend_updown: Vec<AtomicU32>,
    reqs: Vec<Request>,
    acts_up: ActBuf,
    // Mixture of experts: per expert, the (token, weight) pairs routed to it.
    routes: Vec<Vec<(usize, f32)>>,
    picked: Vec<(usize, f32)>,
}

const NO_SLOT: u32 = u32::MAX;

fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

thread_local! {
    /// Attention scores of the (token, head) task running on this worker (grows to the context).
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs one model. Holds the KV cache of one sequence.
pub struct Engine<'m> {
    model: &'m Model,
    ks: KernelSet,
    pool: std::sync::Arc<rayon::ThreadPool>,
    n_ctx: usize,
    kv: KvCache,
    s: Scratch,
    inv_freq: Vec<f32>,
    sparse: Option<&'m SparseFfn<'m>>,
    stats: SparseStats,
    /// Sparse decode's neuron sets per token-layer, when recording (planner profiling).
    record: Option<Vec<NeuronStep>>,
    offload: Option<Offload>,
    cluster: usize,
    repack: bool,
    /// Row-interleaved copies of the whole-matrix tensors (see [`Engine::prepare`]).
    packed: Option<PackedWeights>,
}

impl<'m> Engine<'m> {
    pub fn new(model: &'m Model, cfg: &EngineConfig) -> Result<Self, EngineError> {
        let ks = match cfg.tier {
            None => *KernelSet::best(),
            Some(t) => KernelSet::for_tier(t).ok_or(EngineError::TierUnsupported(t.name()))?,
        };
        let threads = cfg.threads.max(1);
        if let Some(allowed) = crate::topology::allowed_cpus() {
            if let Some(&cpu) = cfg.cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(EngineError::CpuNotAllowed {
                    cpu,
                    allowed: crate::topology::format_cpu_list(&allowed),
                });
            }
        }
        let cpus = cfg.cpus.clone();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("pi2-compute-{i}"))
            .start_handler(move |i| {
                if !cpus.is_empty() {
                    // Checked against the affinity mask above; a failure here only loses placement.
                    let _ = crate::topology::pin_current_thread(cpus[i % cpus.len()]);
                }
            })
            .build()
            .map_err(|e| EngineError::ThreadPool {
                threads,
                msg: e.to_string(),
            })?;
        let c = &model.config;
        let n_ctx = if cfg.n_ctx == 0 {
            c.n_ctx_train
        } else {
            cfg.n_ctx
        };
        let freq_factors = model
            .weights
            .rope_freqs
            .as_ref()
            .map(|t| t.f32s(&model.file));
        let inv_freq = (0..c.n_rot / 2)
            .map(|i| {
                let f = c.rope_base.powf(-2.0 * i as f32 / c.n_rot as f32) * c.rope_freq_scale;
                f / freq_factors.map_or(1.0, |ff| ff[i])
            })
            .collect();
        Ok(Self {
            model,
            ks,
            pool: std::sync::Arc::new(pool),
            n_ctx,
            kv: KvCache {
                k: vec![Vec::new(); c.n_layer],
                v: vec![Vec::new(); c.n_layer],
                len: 0,
            },
            s: Scratch::default(),
            inv_freq,
            sparse: None,
            stats: SparseStats::default(),
            record: None,
            offload: None,
            cluster: cfg.cluster.max(4).div_ceil(4) * 4,
            repack: cfg.repack,
            packed: None,
        })
    }

    /// Make the row-interleaved copies of the matrices this engine multiplies whole (attention,
    /// output, and a dense FFN), if the configuration asks for them and the model runs from
    /// memory. Called by the first [`Engine::forward`]; call it earlier to keep the copying
    /// out of the first token's time. Offloaded models keep their tensors in the mapping.
    pub fn prepare(&mut self) {
        // Only where the tier has SIMD kernels for the interleaved layout.
        if !self.repack || !self.ks.x8.fast || self.packed.is_some() || self.offload.is_some() {
            return;
        }
        let m = self.model;
        let dense_ffn = self.sparse.is_none()
            && m.weights
                .layers
                .iter()
                .all(|l| l.router.is_none() && !l.down_transposed);
        let pool = self.pool.clone();
        self.packed = Some(pool.install(|| PackedWeights::build(m, dense_ffn)));
    }

    /// Bytes held by the row-interleaved copies (0 before [`Engine::prepare`]).
    pub fn packed_bytes(&self) -> usize {
        self.packed.as_ref().map_or(0, PackedWeights::bytes)
    }

    /// Compute the FFN sparsely from now on (`None`: dense). Decode runs the two-phase sparse
    /// FFN; batches do too when `sparse.batches_too` is set.
    pub fn set_sparse(&mut self, sparse: Option<&'m SparseFfn<'m>>) -> Result<(), EngineError> {
        if let Some(sp) = sparse {
            let c = &self.model.config;
            let experts = c.n_expert.max(1);
            if sp.experts != experts || sp.layers.len() != c.n_layer * experts {
                return Err(EngineError::SparseMismatch(format!(
                    "{} sparse units ({} per layer) for {} model layers of {experts}",
                    sp.layers.len(),
                    sp.experts,
                    c.n_layer
                )));
            }
            for (i, l) in sp.layers.iter().enumerate() {
                let bad = |what: String| EngineError::SparseMismatch(format!("unit {i}: {what}"));
                if (l.down_t.rows, l.down_t.cols) != (c.n_ff, c.n_embd) {
                    return Err(bad(format!(
                        "transposed down is {}x{}, expected {}x{}",
                        l.down_t.rows, l.down_t.cols, c.n_ff, c.n_embd
                    )));
                }
                if let Some(p) = &l.predictor {
                    if p.fc1.cols != c.n_embd || p.fc2.rows != c.n_ff || p.fc2.cols != p.fc1.rows {
                        return Err(bad(format!(
                            "predictor shapes {}x{} and {}x{} do not fit width {} and {} neurons",
                            p.fc1.rows, p.fc1.cols, p.fc2.rows, p.fc2.cols, c.n_embd, c.n_ff
                        )));
                    }
                    if p.bias.as_ref().is_some_and(|b| b.len() != c.n_ff) {
                        return Err(bad("predictor bias length".into()));
                    }
                } else if sp.use_predictor {
                    return Err(bad("predictor use asked for but the layer has none".into()));
                }
            }
            // The FFN is read row by row from now on: repack without it.
            self.packed = None;
            self.stats = SparseStats {
                // Fractions are of the neurons a dense step computes (the chosen experts').
                n_ff: c.n_ff * c.n_expert_used.max(1),
                layer_true_active: vec![0; c.n_layer],
                layer_true_found: vec![0; c.n_layer],
                layer_candidates: vec![0; c.n_layer],
                layer_tokens: vec![0; c.n_layer],
                ..SparseStats::default()
            };
        }
        self.sparse = sparse;
        Ok(())
    }

    /// Read the FFN from flash through `offload` from now on (`None`: from the file mapping).
    /// Needs the sparse weights of a converted model (see [`Engine::set_sparse`]).
    pub fn set_offload(&mut self, offload: Option<Offload>) -> Result<(), EngineError> {
        if offload.is_some() && self.sparse.is_none() {
            return Err(EngineError::Offload(
                "offloading needs the sparse FFN of a converted model".into(),
            ));
        }
        if let Some(o) = &offload {
            let c = &self.model.config;
            if o.layers.len() != c.n_layer * c.n_expert.max(1) || o.n_ff != c.n_ff {
                return Err(EngineError::Offload("built for another model".into()));
            }
            // An offloaded model's budget counts its mapped tensors: no copies.
            self.packed = None;
        }
        self.offload = offload;
        Ok(())
    }

    /// The offloaded FFN, if any (budget, statistics).
    pub fn offload(&self) -> Option<&Offload> {
        self.offload.as_ref()
    }

    pub fn offload_mut(&mut self) -> Option<&mut Offload> {
        self.offload.as_mut()
    }

    /// Stop offloading and hand the offloaded FFN back.
    pub fn take_offload(&mut self) -> Option<Offload> {
        self.offload.take()
    }

    /// Neurons per cluster in sparse decode.
    pub fn cluster(&self) -> usize {
        self.cluster
    }

    /// Set the neurons per cluster (rounded up to a multiple of 4; one huge cluster turns the
    /// pipeline's overlap of reads and compute off).
    pub fn set_cluster(&mut self, n: usize) {
        self.cluster = n.clamp(4, 1 << 30).div_ceil(4) * 4;
    }

    /// Start (or stop and drop) recording every sparse decode step's candidate and confirmed
    /// neurons; [`Engine::take_neuron_record`] returns them.
    pub fn record_neurons(&mut self, on: bool) {
        self.record = on.then(Vec::new);
    }

    /// The steps recorded since the last call (recording continues).
    pub fn take_neuron_record(&mut self) -> Vec<NeuronStep> {
        self.record.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// What the sparse FFN has done since [`Engine::set_sparse`] or [`Engine::reset_stats`].
    pub fn sparse_stats(&self) -> &SparseStats {
        &self.stats
    }

    pub fn reset_stats(&mut self) {
        let s = &mut self.stats;
        *s = SparseStats {
            n_ff: s.n_ff,
            layer_true_active: vec![0; s.layer_true_active.len()],
            layer_true_found: vec![0; s.layer_true_found.len()],
            layer_candidates: vec![0; s.layer_candidates.len()],
            layer_tokens: vec![0; s.layer_tokens.len()],
            ..SparseStats::default()
        };
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// The kernel tier in use.
    pub fn tier(&self) -> Tier {
        self.ks.tier
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Context length.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Tokens currently in the KV cache.
    pub fn n_past(&self) -> usize {
        self.kv.len
    }

    /// Forget everything after the first `n` cached tokens (0 clears the sequence).
    pub fn truncate(&mut self, n: usize) {
        self.kv.len = self.kv.len.min(n);
    }

    /// Bytes the KV cache holds when the context is full.
    pub fn kv_bytes_full(&self) -> usize {
        let c = &self.model.config;
        2 * self.n_ctx * c.kv_dim() * c.n_layer * std::mem::size_of::<f16>()
    }

    /// Working buffers for batches of up to `n_batch` tokens (activations, predictor scores,
    /// cluster partials) with logits for the last one ([`Logits::Last`]; each further row of
    /// logits takes `4 * n_vocab` bytes more), an upper estimate for memory budgets.
    pub fn scratch_bytes(&self, n_batch: usize) -> usize {
        let c = &self.model.config;
        let n = n_batch.max(1);
        let per_token = 8 * c.n_embd + c.q_dim() + 2 * c.kv_dim() + 4 * c.n_ff;
        4 * (n * per_token + c.n_vocab + self.threads() * n * c.n_embd + 2 * c.n_ff * 3)
            + 4 * self.n_ctx * rayon::current_num_threads().max(self.threads())
    }

    /// Bytes held by the KV cache.
    pub fn kv_bytes(&self) -> usize {
        self.kv
            .k
            .iter()
            .chain(&self.kv.v)
            .map(|b| b.capacity() * 2)
            .sum()
    }

    /// Run `tokens` at the next positions; returns logits rows (`n_vocab` each) as asked.
    pub fn forward(&mut self, tokens: &[TokenId], want: Logits) -> Result<&[f32], EngineError> {
        self.forward_observed(tokens, want, None)
    }

    /// [`Engine::forward`], reporting every FFN layer's input and gate pre-activations to
    /// `observer` (activation profiling).
    pub fn forward_observed<'o>(
        &mut self,
        tokens: &[TokenId],
        want: Logits,
        mut observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<&[f32], EngineError> {
        let n = tokens.len();
        if n == 0 {
            return Err(EngineError::Empty);
        }
        let c = &self.model.config;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(EngineError::BadToken(bad, c.n_vocab));
        }
        if self.kv.len + n > self.n_ctx {
            return Err(EngineError::ContextFull {
                needed: self.kv.len + n,
                n_ctx: self.n_ctx,
            });
        }
        let first_logit = match want {
            Logits::Last => n - 1,
            Logits::From(k) => k.min(n - 1),
        };
        self.prepare();
        let pool = self.pool.clone();
        pool.install(|| self.forward_inner(tokens, first_logit, observer.as_deref_mut()))?;
        let rows = n - first_logit;
        Ok(&self.s.logits[..rows * c.n_vocab])
    }

    fn forward_inner<'o>(
        &mut self,
        tokens: &[TokenId],
        first_logit: usize,
        mut observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let c = &m.config;
        let f = &m.file;
        let n = tokens.len();
        let d = c.n_embd;
        let pos0 = self.kv.len;

        // Embedding rows: from the mapping, or (offloaded) from flash where not resident.
        let embd = m.weights.token_embd.mat(f);
        let x = grow(&mut self.s.x, n * d);
        match self.offload.as_mut() {
            Some(o) if o.streams_embedding() => o.embed(&embd, tokens, x)?,
            _ => {
                for (t, &tok) in tokens.iter().enumerate() {
                    embd.dequantize_row(tok as usize, &mut x[t * d..(t + 1) * d]);
                }
            }
        }
        self.rope_tables(pos0, n);
        for (li, layer) in m.weights.layers.iter().enumerate() {
            self.attention_block(li, layer, pos0, n)?;
            self.ffn_block(li, layer, n, observer.as_deref_mut())?;
        }
        self.kv.len = pos0 + n;

        // Final norm and LM head for the rows that need logits.
        let rows = n - first_logit;
        let xs = &self.s.x[first_logit * d..n * d];
        let xn = grow(&mut self.s.xn, rows * d);
        for (xr, or) in xs.chunks_exact(d).zip(xn.chunks_exact_mut(d)) {
            rms_norm(xr, m.weights.output_norm.f32s(f), c.rms_eps, or);
        }
        let out = match &self.packed {
            Some(p) => p.output(&m.weights.output, f),
            None => m.weights.output.mat(f),
        };
        let logits = grow(&mut self.s.logits, rows * c.n_vocab);
        self.s
            .acts
            .quantize(out.ty.act_kind(), &self.s.xn[..rows * d], d);
        match self.offload.as_mut() {
            Some(o) if o.streams_output() => {
                o.lm_head(&self.ks, &out, &self.s.acts, rows, logits)?
            }
            _ => matmul(&self.ks, &out, &self.s.acts, logits),
        }
        Ok(())
    }

    /// cos/sin of every (token, frequency) pair of this batch.
    fn rope_tables(&mut self, pos0: usize, n: usize) {
        let half = self.inv_freq.len();
        let cos = grow(&mut self.s.rope_cos, n * half);
        for t in 0..n {
            for (i, f) in self.inv_freq.iter().enumerate() {
                cos[t * half + i] = ((pos0 + t) as f32 * f).cos();
            }
        }
        let sin = grow(&mut self.s.rope_sin, n * half);
        for t in 0..n {
            for (i, f) in self.inv_freq.iter().enumerate() {
                sin[t * half + i] = ((pos0 + t) as f32 * f).sin();
            }
        }
    }

    /// `out = x W^T (+ bias)` for `n` token rows.
    fn project(
        ks: &KernelSet,
        f: &pi2_model::GgufFile,
        mat: &MatRef<'_>,
        bias: Option<&TensorView>,
        acts: &ActBuf,
        out: &mut [f32],
    ) {
        matmul(ks, mat, acts, out);
        if let Some(b) = bias {
            let b = b.f32s(f);
            for row in out.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(y, bb)| *y += bb);
            }
        }
    }

    /// Several projections of the same input `x` (rows of `d`): consecutive matrices that take
    /// the same activation format share one quantization and one parallel region.
    fn project_many<const J: usize>(
        ks: &KernelSet,
        f: &pi2_model::GgufFile,
        acts: &mut ActBuf,
        x: &[f32],
        d: usize,
        jobs: [(MatRef<'_>, Option<&TensorView>, &mut [f32]); J],
    ) {
        let biases = jobs.each_ref().map(|j| j.1);
        let mut pairs = jobs.map(|(w, _, out)| (w, out));
        let mut start = 0;
        while start < J {
            let kind = pairs[start].0.ty.act_kind();
            let end = (start..J)
                .find(|&j| pairs[j].0.ty.act_kind() != kind)
                .unwrap_or(J);
            acts.quantize(kind, x, d);
            matmul_many(ks, acts, &mut pairs[start..end]);
            start = end;
        }
        for ((_, out), bias) in pairs.iter_mut().zip(biases) {
            if let Some(b) = bias {
                let b = b.f32s(f);
                for row in out.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(y, bb)| *y += bb);
                }
            }
        }
    }

    fn attention_block(
        &mut self,
        li: usize,
        l: &LayerWeights,
        pos0: usize,
        n: usize,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let c = &m.config;
        let f = &m.file;
        // The projections: from the file mapping, or streamed from flash.
        let streamed = match self.offload.as_mut() {
            Some(o) => o.stream_attention(li)?,
            None => false,
        };
        let [wq, wk, wv, wo] = match (&self.offload, streamed, &self.packed) {
            (Some(o), true, _) => o.attention_mats(li),
            (_, _, Some(p)) => p.attn(li, [&l.wq, &l.wk, &l.wv, &l.wo], f),
            _ => [&l.wq, &l.wk, &l.wv, &l.wo].map(|w| w.mat(f)),
        };
        let (d, qd, kvd, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.head_dim);
        let s = &mut self.s;
        let xn = grow(&mut s.xn, n * d);
        for t in 0..n {
            rms_norm(
                &s.x[t * d..(t + 1) * d],
                l.attn_norm.f32s(f),
                c.rms_eps,
                &mut xn[t * d..(t + 1) * d],
            );
        }
        // Q, K and V share the input; quantize it once per activation format.
        let q = grow(&mut s.q, n * qd);
        let k = grow(&mut s.k, n * kvd);
        let v = grow(&mut s.v, n * kvd);
        Self::project_many(
            &self.ks,
            f,
            &mut s.acts,
            &s.xn[..n * d],
            d,
            [
                (wq, l.bq.as_ref(), q),
                (wk, l.bk.as_ref(), k),
                (wv, l.bv.as_ref(), v),
            ],
        );
        let half = self.inv_freq.len();
        let (cos, sin) = (&s.rope_cos[..n * half], &s.rope_sin[..n * half]);
        for t in 0..n {
            let (ct, st) = (
                &cos[t * half..(t + 1) * half],
                &sin[t * half..(t + 1) * half],
            );
            for h in s.q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                rope(h, c.n_rot, c.rope_kind, ct, st);
            }
            for h in s.k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                rope(h, c.n_rot, c.rope_kind, ct, st);
            }
        }
        // Append to the cache (grown in steps so decode does not reallocate each token).
        let (kc, vc) = (&mut self.kv.k[li], &mut self.kv.v[li]);
        let need = (pos0 + n) * kvd;
        if kc.len() < need {
            let cap = need.max(kc.len() * 2).min(self.n_ctx * kvd).max(need);
            kc.resize(cap, f16::ZERO);
            vc.resize(cap, f16::ZERO);
        }
        for (dst, &src) in kc[pos0 * kvd..need].iter_mut().zip(&s.k[..n * kvd]) {
            *dst = f16::from_f32(src);
        }
        for (dst, &src) in vc[pos0 * kvd..need].iter_mut().zip(&s.v[..n * kvd]) {
            *dst = f16::from_f32(src);
        }

        // Causal attention, one task per (token, head).
        let att = grow(&mut s.att, n * qd);
        let group = c.n_head / c.n_head_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        let (kc, vc, qs) = (&kc[..], &vc[..], &s.q[..n * qd]);
        let kc: &[u16] = bytemuck::cast_slice(kc);
        let vc: &[u16] = bytemuck::cast_slice(vc);
        let ks = &self.ks;
        att.par_chunks_mut(hd).enumerate().for_each(|(i, out)| {
            let (t, h) = (i / c.n_head, i % c.n_head);
            let kvh = h / group;
            let qv = &qs[t * qd + h * hd..t * qd + (h + 1) * hd];
            let len = pos0 + t + 1;
            SCORES.with_borrow_mut(|scores| {
                scores.clear();
                let mut max = f32::NEG_INFINITY;
                for p in 0..len {
                    let kv = &kc[p * kvd + kvh * hd..p * kvd + (kvh + 1) * hd];
                    let sc = (ks.f16)(kv, qv) * scale;
                    max = max.max(sc);
                    scores.push(sc);
                }
                let mut sum = 0.0;
                for sc in scores.iter_mut() {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                }
                out.fill(0.0);
                for (p, &w) in scores.iter().enumerate() {
                    let vv = &vc[p * kvd + kvh * hd..p * kvd + (kvh + 1) * hd];
                    (ks.axpy_f16)(w / sum, vv, out);
                }
            });
        });
        s.acts.quantize(wo.ty.act_kind(), &s.att[..n * qd], qd);
        let o = grow(&mut s.o, n * d);
        Self::project(&self.ks, f, &wo, None, &s.acts, o);
        s.x[..n * d]
            .iter_mut()
            .zip(&s.o[..n * d])
            .for_each(|(x, o)| *x += o);
        Ok(())
    }

    fn ffn_block<'o>(
        &mut self,
        li: usize,
        l: &LayerWeights,
        n: usize,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let c = &m.config;
        let f = &m.file;
        let (d, ff) = (c.n_embd, c.n_ff);
        let s = &mut self.s;
        let xn = grow(&mut s.xn, n * d);
        for t in 0..n {
            rms_norm(
                &s.x[t * d..(t + 1) * d],
                l.ffn_norm.f32s(f),
                c.rms_eps,
                &mut xn[t * d..(t + 1) * d],
            );
        }
        if let Some(router) = &l.router {
            return self.ffn_moe(li, l, router, n, observer);
        }
        if let Some(sp) = self.sparse {
            if n == 1 {
                return self.ffn_sparse_token(li, l, &[(li, 1.0)], sp.use_predictor);
            }
        }
        // Whole matrices: from the file mapping, or staged from flash layer by layer.
        let n_layer = c.n_layer;
        let staged = match &mut self.offload {
            Some(o) => Some(o.stage_unit(li, (li + 1 < n_layer).then_some(li + 1))?),
            None => None,
        };
        let (gate, up, down) = match (&self.offload, staged, &self.packed) {
            (Some(o), Some(b), _) => o.stage_mats(b, li, d),
            (_, _, Some(p)) => p.ffn(li, [&l.gate, &l.up, &l.down], f).into(),
            _ => (l.gate.mat(f), l.up.mat(f), l.down.mat(f)),
        };
        let dense_bytes = (gate.bytes().len() + up.bytes().len() + down.bytes().len()) as u64;
        if let Some(sp) = self.sparse.filter(|sp| sp.batches_too) {
            let sl = &sp.layers[li];
            let down_t = if staged.is_some() {
                down
            } else {
                sl.down_t.mat()
            };
            ffn_sparse_batch(
                &self.ks,
                s,
                &mut self.stats,
                li,
                n,
                sl,
                sp.use_predictor,
                [gate, up, down_t],
                dense_bytes,
                c.ffn_act,
            );
            return Ok(());
        }
        let gate_out = grow(&mut s.gate, n * ff);
        let up_out = grow(&mut s.up, n * ff);
        project_pair(
            &self.ks,
            &mut s.acts,
            &s.xn[..n * d],
            d,
            [(gate, gate_out), (up, up_out)],
        );
        if let Some(o) = observer {
            o.observe(li, &s.xn[..n * d], &s.gate[..n * ff]);
        }
        gated(c.ffn_act, &mut s.gate[..n * ff], &s.up[..n * ff]);
        if staged.is_some() || l.down_transposed {
            accumulate_down_t(
                &self.ks,
                &down,
                &s.gate[..n * ff],
                n,
                &mut s.partials,
                &mut s.x,
            );
            return Ok(());
        }
        s.acts.quantize(down.ty.act_kind(), &s.gate[..n * ff], ff);
        let o = grow(&mut s.o, n * d);
        matmul(&self.ks, &down, &s.acts, o);
        s.x[..n * d]
            .iter_mut()
            .zip(&s.o[..n * d])
            .for_each(|(x, o)| *x += o);
        Ok(())
    }
}

impl Engine<'_> {
    /// A mixture-of-experts FFN: per token, the router's top `n_expert_used` experts, weighted
    /// by the softmax over their logits. A decoded token with sparse weights runs the chosen
    /// experts' neurons as one sparse step, so the reads of every chosen expert are issued
    /// before any is computed. Batches group tokens by expert, so each chosen expert's matrices
    /// are multiplied once (offloaded: staged from flash expert by expert, the next one read
    /// while this one is computed).
    fn ffn_moe<'o>(
        &mut self,
        li: usize,
        l: &LayerWeights,
        router: &TensorView,
        n: usize,
        mut observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let model = self.model;
        let (c, f) = (&model.config, &model.file);
        let (d, ff, ne) = (c.n_embd, c.n_ff, c.n_expert);
        let s = &mut self.s;
        let router = router.mat(f);
        let logits = grow(&mut s.logits, n * ne);
        s.acts.quantize(router.ty.act_kind(), &s.xn[..n * d], d);
        matmul(&self.ks, &router, &s.acts, logits);
        let mut routes = std::mem::take(&mut s.routes);
        routes.iter_mut().for_each(Vec::clear);
        routes.resize_with(ne, Vec::new);
        let mut picked = std::mem::take(&mut s.picked);
        for t in 0..n {
            route(
                &s.logits[t * ne..(t + 1) * ne],
                c.n_expert_used,
                &mut picked,
            );
            for &(e, w) in &picked {
                routes[e].push((t, w));
            }
        }
        s.routes = routes;
        if let Some(sp) = self.sparse.filter(|_| n == 1) {
            // The chosen experts as units of the sparse FFN.
            picked.iter_mut().for_each(|p| p.0 += li * ne);
            let r = self.ffn_sparse_token(li, l, &picked, sp.use_predictor);
            self.s.picked = picked;
            return r;
        }
        s.picked = picked;

        let Engine { ks, s, offload, .. } = self;
        let routes = std::mem::take(&mut s.routes);
        let mut chosen = routes.iter().enumerate().filter(|(_, t)| !t.is_empty());
        let mut next = chosen.next();
        let mut result = Ok(());
        while let Some((e, toks)) = next {
            next = chosen.next();
            let m = toks.len();
            let xe = grow(&mut s.q, m * d);
            for (j, &(t, _)) in toks.iter().enumerate() {
                xe[j * d..(j + 1) * d].copy_from_slice(&s.xn[t * d..(t + 1) * d]);
            }
            let unit = li * ne + e;
            let staged = match offload.as_mut() {
                Some(o) => match o.stage_unit(unit, next.map(|(e, _)| li * ne + e)) {
                    Ok(b) => Some(b),
                    Err(err) => {
                        result = Err(err.into());
                        break;
                    }
                },
                None => None,
            };
            let (gate, up, down, transposed) = match (offload.as_ref(), staged) {
                (Some(o), Some(b)) => {
                    let (g, u, dn) = o.stage_mats(b, unit, d);
                    (g, u, dn, true)
                }
                _ => {
                    let down = l.down.mat(f);
                    let (rows, t) = match l.down_transposed {
                        true => (e * ff..(e + 1) * ff, true),
                        false => (e * d..(e + 1) * d, false),
                    };
                    let expert = e * ff..(e + 1) * ff;
                    (
                        l.gate.mat(f).rows(expert.clone()),
                        l.up.mat(f).rows(expert),
                        down.rows(rows),
                        t,
                    )
                }
            };
            let (g, u) = (grow(&mut s.gate, m * ff), grow(&mut s.up, m * ff));
            project_pair(ks, &mut s.acts, &s.q[..m * d], d, [(gate, g), (up, u)]);
            if let Some(obs) = observer.as_deref_mut() {
                obs.observe_expert(li, e, &s.q[..m * d], &s.gate[..m * ff]);
            }
            gated(c.ffn_act, &mut s.gate[..m * ff], &s.up[..m * ff]);
            let o = grow(&mut s.o, m * d);
            if transposed {
                o.fill(0.0);
                accumulate_down_t(ks, &down, &s.gate[..m * ff], m, &mut s.partials, &mut s.o);
            } else {
                s.acts.quantize(down.ty.act_kind(), &s.gate[..m * ff], ff);
                matmul(ks, &down, &s.acts, o);
            }
            for (j, &(t, w)) in toks.iter().enumerate() {
                let x = &mut s.x[t * d..(t + 1) * d];
                x.iter_mut()
                    .zip(&s.o[j * d..(j + 1) * d])
                    .for_each(|(x, o)| *x += w * o);
            }
        }
        s.routes = routes;
        result
    }
}

/// The `k` experts with the largest router logits (ties: the lower index), weighted by the
/// softmax over the chosen logits (Mixtral's rule; equal to renormalising the full softmax).
fn route(logits: &[f32], k: usize, out: &mut Vec<(usize, f32)>) {
    out.clear();
    for _ in 0..k {
        let best = (0..logits.len())
            .filter(|e| !out.iter().any(|p| p.0 == *e))
            .fold(None, |b: Option<usize>, e| match b {
                Some(b) if !(logits[e] > logits[b]) => Some(b),
                _ => Some(e),
            });
        let Some(e) = best else { break };
        out.push((e, logits[e]));
    }
    let max = out.iter().map(|p| p.1).fold(f32::NEG_INFINITY, f32::max);
    out.iter_mut().for_each(|p| p.1 = (p.1 - max).exp());
    let sum: f32 = out.iter().map(|p| p.1).sum();
    out.iter_mut().for_each(|p| p.1 /= sum);
}

/// Neuron i's coefficient: `gate[i] = act(gate[i]) * up_act(up[i])`.
fn gated(act: FfnAct, gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = act.gate(*g) * act.up(u);
    }
}

/// `outs[j] = x W_j^T` for two matrices sharing the input (one quantization when their
/// activation formats agree).
fn project_pair(
    ks: &KernelSet,
    acts: &mut ActBuf,
    x: &[f32],
    d: usize,
    mut jobs: [(MatRef<'_>, &mut [f32]); 2],
) {
    let (k0, k1) = (jobs[0].0.ty.act_kind(), jobs[1].0.ty.act_kind());
    if k0 == k1 {
        acts.quantize(k0, x, d);
        matmul_many(ks, acts, &mut jobs);
    } else {
        for (w, out) in jobs {
            acts.quantize(w.ty.act_kind(), x, d);
            matmul(ks, &w, acts, out);
        }
    }
}

/// Candidate scores of the predictor for `n` tokens of `s.xn` into `s.pred_s` (`n * n_ff`).
fn predict(ks: &KernelSet, s: &mut Scratch, sl: &SparseLayer<'_>, d: usize, ff: usize, n: usize) {
    let p = sl.predictor.as_ref().expect("checked by the caller");
    let r = p.rank();
    let (fc1, fc2) = (p.fc1.mat(), p.fc2.mat());
    s.acts.quantize(fc1.ty.act_kind(), &s.xn[..n * d], d);
    let h = grow(&mut s.pred_h, n * r);
    matmul(ks, &fc1, &s.acts, h);
    if p.kind.relu() {
        h.iter_mut().for_each(|v| *v = v.max(0.0));
    }
    s.acts.quantize(fc2.ty.act_kind(), &s.pred_h[..n * r], r);
    let sc = grow(&mut s.pred_s, n * ff);
    matmul(ks, &fc2, &s.acts, sc);
    if let Some(b) = &p.bias {
        for row in sc.chunks_exact_mut(ff) {
            row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
        }
    }
}

/// A pointer that tasks of one layer step share; each task touches only its own cluster's range.
#[derive(Clone, Copy)]
struct Disjoint<T>(*mut T);
// SAFETY: used only for per-cluster disjoint ranges, ordered by the pipeline's atomics.
unsafe impl<T> Send for Disjoint<T> {}
unsafe impl<T> Sync for Disjoint<T> {}

impl<T> Disjoint<T> {
    /// # Safety
    /// No other live reference may overlap `r`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, r: std::ops::Range<usize>) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(r.start), r.len())
    }
}

/// The rows of one step, by address (file mapping, pinned block or cache slot).
///
/// # Safety
/// `at` must be the address of `len` readable bytes that nothing writes meanwhile.
unsafe fn row_at<'a>(at: usize, len: usize) -> &'a [u8] {
    std::slice::from_raw_parts(at as *const u8, len)
}

thread_local! {
    /// Confirmed positions of the cluster a task is computing, and their up values.
    static CONFIRMED: std::cell::RefCell<(Vec<u32>, Vec<f32>, Vec<f32>, Vec<Request>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
}

impl Engine<'_> {
    /// Two-phase sparse FFN of one token, as a cluster pipeline: predictor -> candidates (in
    /// clusters of `self.cluster`) -> gate rows -> confirmed neurons -> their up rows and down
    /// columns. `units` are the FFN units of layer `li` to compute with their output weights:
    /// the layer itself (weight 1), or the experts the router chose; their candidates form one
    /// list, so every unit's reads are issued before any is computed. With an [`Offload`], rows
    /// come from pinned blocks, cache slots or flash: a cluster's gate phase starts once its
    /// gate rows are resident (missing ones are read by the I/O thread meanwhile), and its
    /// up/down phase once its confirmed neurons' rows are. Each cluster sums into its own
    /// partial; partials are added in cluster order, so the result does not depend on
    /// residency, timing or threads.
    fn ffn_sparse_token(
        &mut self,
        li: usize,
        l: &LayerWeights,
        units: &[(usize, f32)],
        use_predictor: bool,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let f = &m.file;
        let (d, ff) = (m.config.n_embd, m.config.n_ff);
        let sp = self.sparse.expect("sparse weights are set");
        let experts = sp.experts;
        let Engine {
            ks,
            s,
            stats,
            offload,
            cluster,
            record,
            ..
        } = self;
        let (ks, cl) = (&*ks, *cluster);
        let act = m.config.ffn_act;
        let unit_layer = |u: usize| &sp.layers[u];
        let predictors = || {
            units
                .iter()
                .filter_map(|&(u, _)| unit_layer(u).predictor.as_ref())
                .filter(|_| use_predictor)
        };
        s.cand.clear();
        s.cand_unit.clear();
        for (j, &(u, _)) in units.iter().enumerate() {
            let sl = unit_layer(u);
            match sl.predictor.as_ref().filter(|_| use_predictor) {
                Some(p) => {
                    predict(ks, s, sl, d, ff, 1);
                    s.cand.extend(
                        (0..ff as u32).filter(|&i| is_candidate(p, act, s.pred_s[i as usize])),
                    );
                }
                None => s.cand.extend(0..ff as u32),
            }
            s.cand_unit.resize(s.cand.len(), j as u32);
        }
        let nc = s.cand.len();
        let nclust = nc.div_ceil(cl);
        // Per unit: its rows in the file mapping (experts are row ranges of stacked tensors).
        let expert_rows = |u: usize| (u % experts) * ff..(u % experts + 1) * ff;
        let mats = |u: usize| {
            (
                l.gate.mat(f).rows(expert_rows(u)),
                l.up.mat(f).rows(expert_rows(u)),
                unit_layer(u).down_t.mat(),
            )
        };
        let (gate_m, up_m, down_m) = mats(units[0].0);
        let (gty, uty, dty) = (gate_m.ty, up_m.ty, down_m.ty);
        let (grb, urb, drb) = (gate_m.row_bytes(), up_m.row_bytes(), down_m.row_bytes());

        // Where every candidate's rows are, and which must be read.
        for v in [&mut s.gate_at, &mut s.up_at, &mut s.down_at] {
            v.clear();
        }
        s.slot.clear();
        s.reqs.clear();
        if s.pend_gate.len() < nclust {
            s.pend_gate.resize_with(nclust, || AtomicU32::new(0));
            s.pend_updown.resize_with(nclust, || AtomicU32::new(0));
        }
        s.pend_gate[..nclust]
            .iter()
            .for_each(|p| p.store(0, Release));
        match offload.as_mut() {
            None => {
                for (j, &(u, _)) in units.iter().enumerate() {
                    let (gate_m, up_m, down_m) = mats(u);
                    let from = s.cand_unit.partition_point(|&x| (x as usize) < j);
                    let to = s.cand_unit.partition_point(|&x| (x as usize) <= j);
                    for &i in &s.cand[from..to] {
                        s.gate_at.push(gate_m.row(i as usize).as_ptr() as usize);
                        s.up_at.push(up_m.row(i as usize).as_ptr() as usize);
                        s.down_at.push(down_m.row(i as usize).as_ptr() as usize);
                        s.slot.push(NO_SLOT);
                    }
                }
            }
            Some(o) => {
                o.cache.begin_step();
                for (k, (&i, &j)) in s.cand.iter().zip(&s.cand_unit).enumerate() {
                    let (i, u) = (i as usize, units[j as usize].0);
                    let (lay, hot) = (&o.layers[u], &o.hot[u]);
                    if i < hot.n {
                        let base = hot.buf.as_ptr() as usize;
                        s.gate_at.push(base + i * grb);
                        s.up_at.push(base + hot.up_at + i * urb);
                        s.down_at.push(base + hot.down_at + i * drb);
                        s.slot.push(NO_SLOT);
                        o.stats.gate_hot += 1;
                        continue;
                    }
                    let key = (u * ff + i) as u32;
                    let slot = match o.cache.lookup(key) {
                        Some(slot) => slot,
                        None => o.cache.insert(key).ok_or_else(|| {
                            EngineError::Offload("the neuron cache has no free slot".into())
                        })?,
                    };
                    let base = o.cache.slot_ptr(slot) as usize;
                    s.gate_at.push(base + lay.gate.slot_at);
                    s.up_at.push(base + lay.up.slot_at);
                    s.down_at.push(base + lay.down.slot_at);
                    s.slot.push(slot.0);
                    if o.cache.parts(slot) & GATE == 0 {
                        s.pend_gate[k / cl].fetch_add(1, AcqRel);
                        s.reqs.push(Request {
                            offset: lay.gate.row_offset(i),
                            len: grb,
                            dst: (base + lay.gate.slot_at) as *mut u8,
                            tag: (k as u64) << 1,
                        });
                        o.stats.gate_reads += 1;
                        o.stats.decode_bytes += grb as u64;
                    } else {
                        o.stats.gate_hits += 1;
                    }
                }
                // SAFETY: the slots were claimed for this step (not evictable until the next)
                // and nothing reads their gate part before its completion arrives.
                unsafe { o.reader.submit(&s.reqs)? };
            }
        }

        // Activations for the gate and up rows.
        s.acts.quantize(gty.act_kind(), &s.xn[..d], d);
        s.acts_up.quantize(uty.act_kind(), &s.xn[..d], d);
        grow(&mut s.vals, nc);
        grow(&mut s.coeff, nc);
        grow(&mut s.partials, nclust.max(1) * d);
        let (vals, coeff, partials) = (
            Disjoint(s.vals.as_mut_ptr()),
            Disjoint(s.coeff.as_mut_ptr()),
            Disjoint(s.partials.as_mut_ptr()),
        );
        let confirmed = AtomicUsize::new(0);
        let updown_reads = AtomicUsize::new(0);
        let updown_cached = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let failed: std::sync::Mutex<Option<pi2_io::IoError>> = std::sync::Mutex::new(None);
        let o = offload.as_ref();
        let (acts, acts_up, cand) = (&s.acts, &s.acts_up, &s.cand);
        let (gate_at, up_at, down_at, slots) = (&s.gate_at, &s.up_at, &s.down_at, &s.slot);
        let (pend_gate, pend_updown) = (&s.pend_gate, &s.pend_updown);
        let cand_unit = &s.cand_unit;
        // A candidate's unit and that unit's output weight.
        let unit_of = |k: usize| units[cand_unit[k] as usize];
        let ffn_act = act;
        let range = |c: usize| c * cl..((c + 1) * cl).min(nc);

        // Phase 2 of cluster `c`: up rows and down columns of its confirmed neurons.
        let updown = |c: usize| {
            let r = range(c);
            CONFIRMED.with_borrow_mut(|(pos, coef, u, _)| {
                pos.clear();
                coef.clear();
                // SAFETY: this cluster's range, owned by this task.
                let cf = unsafe { coeff.range(r.clone()) };
                for (j, &a) in cf.iter().enumerate() {
                    if !a.is_nan() {
                        pos.push((r.start + j) as u32);
                        coef.push(a);
                    }
                }
                u.clear();
                u.resize(pos.len(), 0.0);
                // SAFETY (rows): pinned, mapped, or their reads have completed.
                let up_row = |j: usize| unsafe { row_at(up_at[pos[j] as usize], urb) };
                gather_matvec_by(ks, uty, d, up_row, acts_up, u);
                coef.iter_mut()
                    .zip(u.iter())
                    .for_each(|(a, &u)| *a *= ffn_act.up(u));
                // SAFETY: this cluster's partial.
                let y = unsafe { partials.range(c * d..(c + 1) * d) };
                y.fill(0.0);
                let down_row = |j: usize| unsafe { row_at(down_at[pos[j] as usize], drb) };
                axpy_rows_by(ks, dty, down_row, coef, y);
                if let Some(o) = o {
                    for &k in pos.iter().filter(|&&k| slots[k as usize] != NO_SLOT) {
                        o.cache
                            .add_parts(pi2_cache::Slot(slots[k as usize]), UPDOWN);
                    }
                }
                confirmed.fetch_add(pos.len(), AcqRel);
            });
            done.fetch_add(1, AcqRel);
        };
        // Phase 1 of cluster `c`: gate rows, the threshold, then reads of the confirmed
        // neurons' missing up/down rows (phase 2 runs here at once if none are missing).
        let gate = |c: usize| {
            let r = range(c);
            // SAFETY: this cluster's ranges, owned by this task.
            let (v, cf) = unsafe { (vals.range(r.clone()), coeff.range(r.clone())) };
            // SAFETY (rows): pinned, mapped, or their reads have completed.
            let gate_row = |j: usize| unsafe { row_at(gate_at[r.start + j], grb) };
            gather_matvec_by(ks, gty, d, gate_row, acts, v);
            // Not confirmed: NaN (an exact 0 coefficient still belongs to a confirmed neuron).
            // The unit's output weight is folded into the coefficient.
            for (j, (a, &g)) in cf.iter_mut().zip(v.iter()).enumerate() {
                let (u, w) = unit_of(r.start + j);
                let act = ffn_act.gate(g);
                *a = if fires(act, unit_layer(u).threshold) {
                    act * w
                } else {
                    f32::NAN
                };
            }
            let Some(o) = o else { return updown(c) };
            CONFIRMED.with_borrow_mut(|(_, _, _, reqs)| {
                reqs.clear();
                for (j, &a) in cf.iter().enumerate() {
                    let k = r.start + j;
                    let lay = &o.layers[unit_of(k).0];
                    if slots[k] == NO_SLOT {
                        continue;
                    }
                    let slot = pi2_cache::Slot(slots[k]);
                    o.cache.add_parts(slot, GATE);
                    if a.is_nan() {
                        continue;
                    }
                    if o.cache.parts(slot) & UPDOWN != 0 {
                        updown_cached.fetch_add(1, AcqRel);
                        continue;
                    }
                    let (i, tag) = (cand[k] as usize, (k as u64) << 1 | 1);
                    reqs.push(Request {
                        offset: lay.up.row_offset(i),
                        len: urb,
                        dst: up_at[k] as *mut u8,
                        tag,
                    });
                    reqs.push(Request {
                        offset: lay.down.row_offset(i),
                        len: drb,
                        dst: down_at[k] as *mut u8,
                        tag,
                    });
                }
                updown_reads.fetch_add(reqs.len() / 2, AcqRel);
                // One extra count held by this task, so the driver cannot start phase 2 first.
                pend_updown[c].store(reqs.len() as u32 + 1, Release);
                // SAFETY: the slots were claimed for this step; their up/down parts are not
                // read before their completions arrive.
                if let Err(e) = unsafe { o.reader.submit(reqs) } {
                    failed.lock().unwrap().get_or_insert(e);
                }
            });
            if pend_updown[c].fetch_sub(1, AcqRel) == 1 {
                updown(c);
            }
        };

        // The driver: start resident clusters, then route completions to their clusters while
        // helping with compute; block only when nothing but I/O is left to wait for.
        let mut io_wait = std::time::Duration::ZERO;
        rayon::scope(|sc| {
            let (gate, updown) = (&gate, &updown);
            for c in 0..nclust {
                if pend_gate[c].load(Acquire) == 0 {
                    sc.spawn(move |_| gate(c));
                }
            }
            let handle = |comp: pi2_io::Completion| match comp.result {
                Err(e) => {
                    failed.lock().unwrap().get_or_insert(e);
                }
                Ok(()) if comp.tag >= FIRST_STREAM_TAG => {
                    // A streamed read (attention, output or embedding rows) read ahead.
                    o.expect("reads come from the offload").received(comp.tag);
                }
                Ok(()) => {
                    let c = (comp.tag >> 1) as usize / cl;
                    if comp.tag & 1 == 0 {
                        if pend_gate[c].fetch_sub(1, AcqRel) == 1 {
                            sc.spawn(move |_| gate(c));
                        }
                    } else if pend_updown[c].fetch_sub(1, AcqRel) == 1 {
                        sc.spawn(move |_| updown(c));
                    }
                }
            };
            while done.load(Acquire) < nclust && failed.lock().unwrap().is_none() {
                if let Some(o) = o {
                    match o.reader.try_recv() {
                        Ok(Some(comp)) => {
                            handle(comp);
                            continue;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            failed.lock().unwrap().get_or_insert(e);
                            break;
                        }
                    }
                }
                if rayon::yield_now() == Some(rayon::Yield::Executed) {
                    continue;
                }
                match o.filter(|o| o.reader.outstanding() > 0) {
                    Some(o) => {
                        let t0 = std::time::Instant::now();
                        let comp = o.reader.recv();
                        io_wait += t0.elapsed();
                        match comp {
                            Ok(comp) => handle(comp),
                            Err(e) => {
                                failed.lock().unwrap().get_or_insert(e);
                            }
                        }
                    }
                    None => std::thread::yield_now(),
                }
            }
        });
        if let Some(e) = failed.into_inner().unwrap() {
            // Wait out reads still in flight into the cache, then report.
            if let Some(o) = offload.as_mut() {
                o.fail();
            }
            return Err(e.into());
        }
        let nf = confirmed.into_inner();
        if let Some(rec) = record.as_mut() {
            // Experts' neurons numbered expert-major within the layer.
            let id =
                |k: usize| ((units[s.cand_unit[k] as usize].0 % experts) * ff) as u32 + s.cand[k];
            rec.push(NeuronStep {
                layer: li as u32,
                candidates: (0..nc).map(id).collect(),
                confirmed: (0..nc).filter(|&k| !s.coeff[k].is_nan()).map(id).collect(),
            });
        }
        for part in s.partials[..nclust * d].chunks_exact(d) {
            s.x[..d].iter_mut().zip(part).for_each(|(x, p)| *x += p);
        }
        if let Some(o) = offload.as_mut() {
            let st = &mut o.stats;
            st.token_layers += 1;
            st.io_wait_ns += io_wait.as_nanos() as u64;
            let (reads, cached) = (updown_reads.into_inner(), updown_cached.into_inner());
            st.updown_reads += reads as u64;
            st.decode_bytes += (reads * (urb + drb)) as u64;
            st.updown_hits += cached as u64;
            st.updown_hot += (nf - reads - cached) as u64;
        }

        stats.token_layers += 1;
        stats.candidates += nc as u64;
        stats.confirmed += nf as u64;
        stats.layer_candidates[li] += nc as u64;
        stats.layer_tokens[li] += 1;
        if predictors().next().is_none() {
            stats.layer_true_active[li] += nf as u64;
            stats.layer_true_found[li] += nf as u64;
        }
        let pred_bytes: usize = predictors().map(|p| p.bytes()).sum();
        stats.ffn_bytes += (pred_bytes + nc * grb + nf * (urb + drb)) as u64;
        let layer_bytes = l.gate.bytes(f) + l.up.bytes(f) + l.down.bytes(f);
        stats.dense_ffn_bytes += layer_bytes * units.len() as u64 / experts as u64;
        Ok(())
    }
}

/// The sparse FFN over a batch with the same result as running the token path per token,
/// computed as masked dense work: all gate and up rows (GEMM, so every neuron's activation is
/// known and the predictor's recall is measured), coefficients zeroed outside
/// candidates-that-pass, then the transposed down rows accumulated per neuron.
#[allow(clippy::too_many_arguments)]
fn ffn_sparse_batch(
    ks: &KernelSet,
    s: &mut Scratch,
    st: &mut SparseStats,
    li: usize,
    n: usize,
    sl: &SparseLayer<'_>,
    use_predictor: bool,
    [gate, up, down_t]: [MatRef<'_>; 3],
    dense_bytes: u64,
    act: FfnAct,
) {
    let (d, ff) = (gate.cols, gate.rows);
    let predictor = use_predictor.then_some(()).and(sl.predictor.as_ref());
    if predictor.is_some() {
        predict(ks, s, sl, d, ff, n);
    }
    let gate_out = grow(&mut s.gate, n * ff);
    let up_out = grow(&mut s.up, n * ff);
    project_pair(
        ks,
        &mut s.acts,
        &s.xn[..n * d],
        d,
        [(gate, gate_out), (up, up_out)],
    );
    let (mut nc, mut nf, mut active, mut found) = (0u64, 0u64, 0u64, 0u64);
    for t in 0..n {
        for i in 0..ff {
            let k = t * ff + i;
            let a = act.gate(s.gate[k]);
            let fires = fires(a, sl.threshold);
            let cand = predictor.is_none_or(|p| is_candidate(p, act, s.pred_s[k]));
            nc += cand as u64;
            active += fires as u64;
            found += (fires && cand) as u64;
            nf += (fires && cand) as u64;
            s.gate[k] = if fires && cand {
                a * act.up(s.up[k])
            } else {
                0.0
            };
        }
    }
    accumulate_down_t(ks, &down_t, &s.gate[..n * ff], n, &mut s.partials, &mut s.x);

    st.token_layers += n as u64;
    st.candidates += nc;
    st.confirmed += nf;
    st.layer_candidates[li] += nc;
    st.layer_tokens[li] += n as u64;
    st.layer_true_active[li] += active;
    st.layer_true_found[li] += found;
    let pred_bytes = predictor.map_or(0, |p| p.bytes()) as u64;
    st.ffn_bytes += n as u64 * pred_bytes
        + nc * gate.row_bytes() as u64
        + nf * (up.row_bytes() + down_t.row_bytes()) as u64;
    st.dense_ffn_bytes += n as u64 * dense_bytes;
}

/// `x[t] += sum_i coeff[t][i] * down_t.row(i)` for `n` tokens: the down projection from its
/// transposed rows. Neuron ranges go to the worker threads, each with its own partial sums; a
/// neuron whose coefficients are all zero is never read.
fn accumulate_down_t(
    ks: &KernelSet,
    down_t: &MatRef<'_>,
    coeff: &[f32],
    n: usize,
    partials: &mut Vec<f32>,
    x: &mut [f32],
) {
    let (ff, d) = (down_t.rows, down_t.cols);
    let threads = rayon::current_num_threads();
    let chunk = ff.div_ceil(threads);
    let tasks = ff.div_ceil(chunk);
    let partials = grow(partials, tasks * n * d);
    partials.fill(0.0);
    partials
        .par_chunks_mut(n * d)
        .enumerate()
        .for_each(|(task, y)| {
            let rows = task * chunk..((task + 1) * chunk).min(ff);
            for (t, yt) in y.chunks_exact_mut(d).enumerate() {
                let c = &coeff[t * ff + rows.start..t * ff + rows.end];
                axpy_rows_by(ks, down_t.ty, |j| down_t.row(rows.start + j), c, yt);
            }
        });
    for part in partials.chunks_exact(n * d) {
        x[..n * d].iter_mut().zip(part).for_each(|(x, p)| *x += p);
    }
}

#[inline]
fn is_candidate(p: &crate::sparse::PredictorWeights<'_>, act: FfnAct, score: f32) -> bool {
    match p.kind {
        pi2_sparse::PredictorKind::Trained => score > p.cut,
        // As pi2-sparse measured the cut (`PredictorKind::value`).
        pi2_sparse::PredictorKind::Lowrank => act.gate(score).abs() >= p.cut,
    }
}

/// A neuron fires when its gate activation is not zero and reaches the threshold: with a
/// ReLU-family FFN and threshold 0 that is exact (`> 0`), with SiLU `|act| >= threshold`.
#[inline]
pub(crate) fn fires(act: f32, threshold: f32) -> bool {
    act != 0.0 && act.abs() >= threshold
}

/// `out = x / rms(x) * w`.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = xi * r * wi;
    }
}

/// Rotate the first `n_rot` dims of one head.
fn rope(h: &mut [f32], n_rot: usize, kind: RopeKind, cos: &[f32], sin: &[f32]) {
    let half = n_rot / 2;
    for i in 0..half {
        let (a, b) = match kind {
            RopeKind::Norm => (2 * i, 2 * i + 1),
            RopeKind::Neox => (i, i + half),
        };
        let (x0, x1) = (h[a], h[b]);
        h[a] = x0 * cos[i] - x1 * sin[i];
        h[b] = x0 * sin[i] + x1 * cos[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_weights() {
        let mut out = [0.0; 4];
        rms_norm(&[1.0, -1.0, 1.0, -1.0], &[1.0; 4], 0.0, &mut out);
        assert_eq!(out, [1.0, -1.0, 1.0, -1.0]);
        rms_norm(&[2.0, 0.0, 0.0, 0.0], &[1.0, 1.0, 1.0, 3.0], 0.0, &mut out);
        assert_eq!(out, [2.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn rope_pairs_by_kind() {
        let (cos, sin) = ([0.0, 1.0], [1.0, 0.0]); // rotate pair 0 by 90 degrees, pair 1 by 0
        let mut h = [1.0, 2.0, 3.0, 4.0];
        rope(&mut h, 4, RopeKind::Norm, &cos, &sin);
        assert_eq!(h, [-2.0, 1.0, 3.0, 4.0]);
        let mut h = [1.0, 2.0, 3.0, 4.0];
        rope(&mut h, 4, RopeKind::Neox, &cos, &sin);
        assert_eq!(h, [-3.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn routing_picks_the_top_experts_and_normalises_their_weights() {
        let mut r = Vec::new();
        route(&[0.0, 2.0, 1.0, 2.0], 2, &mut r);
        // Ties go to the lower index; weights are the softmax over the chosen logits.
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 3]);
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
        route(&[3.0, 1.0, f32::NEG_INFINITY], 2, &mut r);
        let e = (-2.0f32).exp();
        assert_eq!(r[0].0, 0);
        assert!((r[0].1 - 1.0 / (1.0 + e)).abs() < 1e-6);
        assert!((r[1].1 - e / (1.0 + e)).abs() < 1e-6);
    }

    #[test]
    fn fires_is_exact_for_relu_and_a_threshold_for_silu() {
        let relu = FfnAct::Relu;
        assert!(!fires(relu.gate(-1.0), 0.0));
        assert!(!fires(relu.gate(0.0), 0.0));
        assert!(fires(relu.gate(1e-30), 0.0));
        assert!(fires(FfnAct::Silu.gate(-1.0), 0.2));
        assert!(!fires(FfnAct::Silu.gate(-0.1), 0.2));
    }
}
