//! The dense forward pass. Every FFN matrix is computed row by row (a row of gate/up is one
//! neuron), so the sparse engine can later restrict the same loops to the active neurons.

use crate::sparse::{SparseFfn, SparseLayer, SparseStats};
use half::f16;
use pi2_kernels::{axpy_rows, gather_matvec, matmul, matmul_many, ActBuf, KernelSet, MatRef, Tier};
use pi2_model::{LayerWeights, Model, RopeKind, TensorView, TokenId};
use pi2_sparse::FfnObserver;
use rayon::prelude::*;

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
    conf: Vec<u32>,
    vals: Vec<f32>,
    coeff: Vec<f32>,
    pred_h: Vec<f32>,
    pred_s: Vec<f32>,
    partials: Vec<f32>,
}

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
        })
    }

    /// Compute the FFN sparsely from now on (`None`: dense). Decode runs the two-phase sparse
    /// FFN; batches do too when `sparse.batches_too` is set.
    pub fn set_sparse(&mut self, sparse: Option<&'m SparseFfn<'m>>) -> Result<(), EngineError> {
        if let Some(sp) = sparse {
            let c = &self.model.config;
            if sp.layers.len() != c.n_layer {
                return Err(EngineError::SparseMismatch(format!(
                    "{} sparse layers for {} model layers",
                    sp.layers.len(),
                    c.n_layer
                )));
            }
            for (i, l) in sp.layers.iter().enumerate() {
                let bad = |what: String| EngineError::SparseMismatch(format!("layer {i}: {what}"));
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
            self.stats = SparseStats {
                n_ff: c.n_ff,
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
        let pool = self.pool.clone();
        pool.install(|| self.forward_inner(tokens, first_logit, observer.as_deref_mut()));
        let rows = n - first_logit;
        Ok(&self.s.logits[..rows * c.n_vocab])
    }

    fn forward_inner<'o>(
        &mut self,
        tokens: &[TokenId],
        first_logit: usize,
        mut observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) {
        let m = self.model;
        let c = &m.config;
        let f = &m.file;
        let n = tokens.len();
        let d = c.n_embd;
        let pos0 = self.kv.len;

        // Embedding rows.
        let embd = m.weights.token_embd.mat(f);
        let x = grow(&mut self.s.x, n * d);
        for (t, &tok) in tokens.iter().enumerate() {
            embd.dequantize_row(tok as usize, &mut x[t * d..(t + 1) * d]);
        }
        self.rope_tables(pos0, n);
        for (li, layer) in m.weights.layers.iter().enumerate() {
            self.attention_block(li, layer, pos0, n);
            self.ffn_block(li, layer, n, observer.as_deref_mut());
        }
        self.kv.len = pos0 + n;

        // Final norm and LM head for the rows that need logits.
        let rows = n - first_logit;
        let xs = &self.s.x[first_logit * d..n * d];
        let xn = grow(&mut self.s.xn, rows * d);
        for (xr, or) in xs.chunks_exact(d).zip(xn.chunks_exact_mut(d)) {
            rms_norm(xr, m.weights.output_norm.f32s(f), c.rms_eps, or);
        }
        let out = m.weights.output.mat(f);
        let logits = grow(&mut self.s.logits, rows * c.n_vocab);
        self.s
            .acts
            .quantize(out.ty.act_kind(), &self.s.xn[..rows * d], d);
        matmul(&self.ks, &out, &self.s.acts, logits);
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
        w: &TensorView,
        bias: Option<&TensorView>,
        acts: &ActBuf,
        out: &mut [f32],
    ) {
        let mat: MatRef<'_> = w.mat(f);
        matmul(ks, &mat, acts, out);
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
        jobs: [(&TensorView, Option<&TensorView>, &mut [f32]); J],
    ) {
        let biases = jobs.each_ref().map(|j| j.1);
        let mut pairs = jobs.map(|(w, _, out)| (w.mat(f), out));
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

    fn attention_block(&mut self, li: usize, l: &LayerWeights, pos0: usize, n: usize) {
        let m = self.model;
        let c = &m.config;
        let f = &m.file;
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
                (&l.wq, l.bq.as_ref(), q),
                (&l.wk, l.bk.as_ref(), k),
                (&l.wv, l.bv.as_ref(), v),
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
        s.acts.quantize(l.wo.ty.act_kind(), &s.att[..n * qd], qd);
        let o = grow(&mut s.o, n * d);
        Self::project(&self.ks, f, &l.wo, None, &s.acts, o);
        s.x[..n * d]
            .iter_mut()
            .zip(&s.o[..n * d])
            .for_each(|(x, o)| *x += o);
    }

    fn ffn_block<'o>(
        &mut self,
        li: usize,
        l: &LayerWeights,
        n: usize,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) {
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
        if let Some(sp) = self.sparse {
            if n == 1 {
                return self.ffn_sparse_token(li, l, &sp.layers[li], sp.use_predictor);
            }
            if sp.batches_too {
                return self.ffn_sparse_batch(li, l, n, &sp.layers[li], sp.use_predictor);
            }
        }
        let gate = grow(&mut s.gate, n * ff);
        let up = grow(&mut s.up, n * ff);
        Self::project_many(
            &self.ks,
            f,
            &mut s.acts,
            &s.xn[..n * d],
            d,
            [(&l.gate, None, gate), (&l.up, None, up)],
        );
        if let Some(o) = observer {
            o.observe(li, &s.xn[..n * d], &s.gate[..n * ff]);
        }
        // SwiGLU: neuron i's activation is silu(gate_i . x) * (up_i . x).
        for (g, u) in s.gate[..n * ff].iter_mut().zip(&s.up[..n * ff]) {
            *g = silu(*g) * u;
        }
        if l.down_transposed {
            accumulate_down_t(
                &l.down.mat(f),
                &s.gate[..n * ff],
                n,
                &mut s.partials,
                &mut s.x,
            );
            return;
        }
        s.acts.quantize(l.down.ty.act_kind(), &s.gate[..n * ff], ff);
        let o = grow(&mut s.o, n * d);
        Self::project(&self.ks, f, &l.down, None, &s.acts, o);
        s.x[..n * d]
            .iter_mut()
            .zip(&s.o[..n * d])
            .for_each(|(x, o)| *x += o);
    }
}

impl Engine<'_> {
    /// Candidate scores of the predictor for `n` tokens of `s.xn` into `s.pred_s` (`n * n_ff`).
    fn predict(&mut self, sl: &SparseLayer<'_>, n: usize) {
        let p = sl.predictor.as_ref().expect("checked by the caller");
        let (d, ff, r) = (self.model.config.n_embd, self.model.config.n_ff, p.rank());
        let s = &mut self.s;
        let (fc1, fc2) = (p.fc1.mat(), p.fc2.mat());
        s.acts.quantize(fc1.ty.act_kind(), &s.xn[..n * d], d);
        let h = grow(&mut s.pred_h, n * r);
        matmul(&self.ks, &fc1, &s.acts, h);
        if p.kind.relu() {
            h.iter_mut().for_each(|v| *v = v.max(0.0));
        }
        s.acts.quantize(fc2.ty.act_kind(), &s.pred_h[..n * r], r);
        let sc = grow(&mut s.pred_s, n * ff);
        matmul(&self.ks, &fc2, &s.acts, sc);
        if let Some(b) = &p.bias {
            for row in sc.chunks_exact_mut(ff) {
                row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
            }
        }
    }

    /// Two-phase sparse FFN of one token: predictor -> candidates -> their gate rows -> confirmed
    /// neurons -> their up rows and down columns, each phase split over the worker threads.
    fn ffn_sparse_token(
        &mut self,
        li: usize,
        l: &LayerWeights,
        sl: &SparseLayer<'_>,
        use_predictor: bool,
    ) {
        let m = self.model;
        let f = &m.file;
        let (d, ff) = (m.config.n_embd, m.config.n_ff);
        let predictor = use_predictor.then_some(()).and(sl.predictor.as_ref());
        if predictor.is_some() {
            self.predict(sl, 1);
        }
        let s = &mut self.s;
        s.cand.clear();
        match predictor {
            Some(p) => s
                .cand
                .extend((0..ff as u32).filter(|&i| is_candidate(p, s.pred_s[i as usize]))),
            None => s.cand.extend(0..ff as u32),
        }
        let (gate, up, down_t) = (l.gate.mat(f), l.up.mat(f), sl.down_t.mat());
        let ks = &self.ks;
        let threads = rayon::current_num_threads();

        // Phase 1: gate rows of the candidates, then the threshold test.
        s.acts.quantize(gate.ty.act_kind(), &s.xn[..d], d);
        let nc = s.cand.len();
        let vals = grow(&mut s.vals, nc);
        let chunk = nc.div_ceil(threads).max(1);
        let acts = &s.acts;
        vals.par_chunks_mut(chunk)
            .zip(s.cand.par_chunks(chunk))
            .for_each(|(out, rows)| gather_matvec(ks, &gate, rows, acts, out));
        s.conf.clear();
        s.coeff.clear();
        for (&i, &g) in s.cand.iter().zip(s.vals.iter()) {
            let a = silu(g);
            if a.abs() >= sl.threshold {
                s.conf.push(i);
                s.coeff.push(a);
            }
        }

        // Phase 2: up rows and down columns of the confirmed neurons, one partial sum per task.
        if up.ty.act_kind() != gate.ty.act_kind() {
            s.acts.quantize(up.ty.act_kind(), &s.xn[..d], d);
        }
        let nf = s.conf.len();
        let chunk = nf.div_ceil(threads).max(1);
        let tasks = nf.div_ceil(chunk);
        let partials = grow(&mut s.partials, tasks.max(1) * d);
        partials.fill(0.0);
        let uvals = grow(&mut s.vals, nf);
        let acts = &s.acts;
        partials
            .par_chunks_mut(d)
            .zip(s.conf.par_chunks(chunk))
            .zip(s.coeff.par_chunks_mut(chunk))
            .zip(uvals.par_chunks_mut(chunk))
            .for_each(|(((y, rows), coeff), u)| {
                gather_matvec(ks, &up, rows, acts, u);
                coeff.iter_mut().zip(u.iter()).for_each(|(c, u)| *c *= u);
                axpy_rows(ks, &down_t, rows, coeff, y);
            });
        for part in s.partials[..tasks * d].chunks_exact(d) {
            s.x[..d].iter_mut().zip(part).for_each(|(x, p)| *x += p);
        }

        let st = &mut self.stats;
        st.token_layers += 1;
        st.candidates += nc as u64;
        st.confirmed += nf as u64;
        st.layer_candidates[li] += nc as u64;
        st.layer_tokens[li] += 1;
        if predictor.is_none() {
            st.layer_true_active[li] += nf as u64;
            st.layer_true_found[li] += nf as u64;
        }
        let pred_bytes = predictor.map_or(0, |p| p.bytes());
        st.ffn_bytes += (pred_bytes
            + nc * gate.row_bytes()
            + nf * (up.row_bytes() + down_t.row_bytes())) as u64;
        st.dense_ffn_bytes += (l.gate.bytes(f) + l.up.bytes(f) + l.down.bytes(f)) as u64;
    }

    /// The sparse FFN over a batch with the same result as running [`Self::ffn_sparse_token`]
    /// per token, computed as masked dense work: all gate and up rows (GEMM, so every neuron's
    /// activation is known and the predictor's recall is measured), coefficients zeroed outside
    /// candidates-that-pass, then the transposed down rows accumulated per neuron.
    fn ffn_sparse_batch(
        &mut self,
        li: usize,
        l: &LayerWeights,
        n: usize,
        sl: &SparseLayer<'_>,
        use_predictor: bool,
    ) {
        let m = self.model;
        let f = &m.file;
        let (d, ff) = (m.config.n_embd, m.config.n_ff);
        let predictor = use_predictor.then_some(()).and(sl.predictor.as_ref());
        if predictor.is_some() {
            self.predict(sl, n);
        }
        let s = &mut self.s;
        let gate = grow(&mut s.gate, n * ff);
        let up = grow(&mut s.up, n * ff);
        Self::project_many(
            &self.ks,
            f,
            &mut s.acts,
            &s.xn[..n * d],
            d,
            [(&l.gate, None, gate), (&l.up, None, up)],
        );
        let (mut nc, mut nf, mut active, mut found) = (0u64, 0u64, 0u64, 0u64);
        for t in 0..n {
            for i in 0..ff {
                let k = t * ff + i;
                let a = silu(s.gate[k]);
                let fires = a.abs() >= sl.threshold;
                let cand = predictor.is_none_or(|p| is_candidate(p, s.pred_s[k]));
                nc += cand as u64;
                active += fires as u64;
                found += (fires && cand) as u64;
                nf += (fires && cand) as u64;
                s.gate[k] = if fires && cand { a * s.up[k] } else { 0.0 };
            }
        }
        let down_t = sl.down_t.mat();
        accumulate_down_t(&down_t, &s.gate[..n * ff], n, &mut s.partials, &mut s.x);

        let st = &mut self.stats;
        st.token_layers += n as u64;
        st.candidates += nc;
        st.confirmed += nf;
        st.layer_candidates[li] += nc;
        st.layer_tokens[li] += n as u64;
        st.layer_true_active[li] += active;
        st.layer_true_found[li] += found;
        let (gate, upm) = (l.gate.mat(f), l.up.mat(f));
        let pred_bytes = predictor.map_or(0, |p| p.bytes()) as u64;
        st.ffn_bytes += n as u64 * pred_bytes
            + nc * gate.row_bytes() as u64
            + nf * (upm.row_bytes() + down_t.row_bytes()) as u64;
        st.dense_ffn_bytes += n as u64 * (l.gate.bytes(f) + l.up.bytes(f) + l.down.bytes(f));
    }
}

/// `x[t] += sum_i coeff[t][i] * down_t.row(i)` for `n` tokens: the down projection from its
/// transposed rows. Neuron ranges go to the worker threads, each with its own partial sums; a
/// neuron whose coefficients are all zero is never read.
fn accumulate_down_t(
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
            let mut row = vec![0.0f32; d];
            for i in task * chunk..((task + 1) * chunk).min(ff) {
                if (0..n).all(|t| coeff[t * ff + i] == 0.0) {
                    continue;
                }
                down_t.dequantize_row(i, &mut row);
                for (t, yt) in y.chunks_exact_mut(d).enumerate() {
                    let a = coeff[t * ff + i];
                    if a != 0.0 {
                        yt.iter_mut().zip(&row).for_each(|(o, v)| *o += a * v);
                    }
                }
            }
        });
    for part in partials.chunks_exact(n * d) {
        x[..n * d].iter_mut().zip(part).for_each(|(x, p)| *x += p);
    }
}

#[inline]
fn is_candidate(p: &crate::sparse::PredictorWeights<'_>, score: f32) -> bool {
    match p.kind {
        pi2_sparse::PredictorKind::Trained => score > p.cut,
        pi2_sparse::PredictorKind::Lowrank => silu(score).abs() >= p.cut,
    }
}

#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
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
    fn silu_values() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
    }
}
