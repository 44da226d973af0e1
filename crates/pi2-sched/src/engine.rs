//! The dense forward pass. Every FFN matrix is computed row by row (a row of gate/up is one
//! neuron), so the sparse engine can later restrict the same loops to the active neurons.

use half::f16;
use pi2_kernels::{matmul, matmul_many, ActBuf, KernelSet, MatRef, Tier};
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
        })
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
        s.acts.quantize(l.down.ty.act_kind(), &s.gate[..n * ff], ff);
        let o = grow(&mut s.o, n * d);
        Self::project(&self.ks, f, &l.down, None, &s.acts, o);
        s.x[..n * d]
            .iter_mut()
            .zip(&s.o[..n * d])
            .for_each(|(x, o)| *x += o);
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
