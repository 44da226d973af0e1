//! The engine: one model, one sequence's KV cache, a worker pool. A forward pass is embed ->
//! layers (attention, FFN) -> head; each stage lives in the file named after it
//! (`attention.rs`, `ffn.rs`, `moe.rs`, `pipeline.rs`), working in `scratch.rs`'s buffers.

use crate::error::EngineError;
use crate::head::{HeadNeed, HeadState, HeadStats, SparseHead};
use crate::kv::KvCache;
use crate::moe::Routes;
use crate::offload::Offload;
use crate::packed::PackedWeights;
use crate::pipeline::StepBuffers;
use crate::residency::Mapped;
use crate::scratch::{grow, rms_norm_in_place, rms_norm_rows, Scratch};
use crate::sparse::{SparseFfn, SparseStats};
use crate::{attention, ffn, moe, pipeline};
use pi2_kernels::{matmul, KernelSet, MatRef, Tier};
use pi2_model::{LayerWeights, Model, TokenId};
use pi2_sparse::FfnObserver;

mod memory;

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

/// Most tokens a context may hold: far beyond any model's training context, small enough that
/// every size computed from it fits in 64 bits.
pub const MAX_CTX: usize = 1 << 24;

/// Which positions of a batch need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token (generation).
    Last,
    /// Every token from index `k` of the batch on (perplexity scores the second half).
    From(usize),
}

/// What a pass starts from: tokens to embed, or the residual stream entering a layer.
#[derive(Clone, Copy)]
enum Input<'a> {
    Tokens(&'a [TokenId]),
    Stream { layer: usize, x: &'a [f32] },
}

impl Input<'_> {
    fn len(&self, n_embd: usize) -> usize {
        match self {
            Input::Tokens(t) => t.len(),
            Input::Stream { x, .. } => x.len() / n_embd,
        }
    }
}

/// Runs one model. Holds the KV cache of one sequence.
pub struct Engine<'m> {
    model: &'m Model,
    ks: KernelSet,
    pool: std::sync::Arc<rayon::ThreadPool>,
    n_ctx: usize,
    kv: KvCache,
    s: Scratch,
    /// The sparse pipeline's buffers and the experts' routes, reused across passes.
    step: StepBuffers,
    routes: Routes,
    inv_freq: Vec<f32>,
    /// Sliding-window layers' RoPE frequencies, when their base differs.
    inv_freq_local: Option<Vec<f32>>,
    sparse: Option<&'m SparseFfn<'m>>,
    stats: SparseStats,
    /// Sparse decode's neuron sets per token-layer, when recording (planner profiling).
    record: Option<Vec<NeuronStep>>,
    offload: Option<Offload>,
    cluster: usize,
    repack: bool,
    /// Row-interleaved copies of the whole-matrix tensors (see [`Engine::prepare`]).
    packed: Option<PackedWeights>,
    head: HeadState<'m>,
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
        if n_ctx == 0 || n_ctx > MAX_CTX {
            return Err(EngineError::ContextSize {
                n_ctx,
                max: MAX_CTX,
            });
        }
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
        // Sliding layers: their own base, unscaled (llama.cpp's `rope_freq_*_swa`).
        let inv_freq_local = c.sliding_window.map(|w| {
            (0..c.n_rot / 2)
                .map(|i| w.rope_base.powf(-2.0 * i as f32 / c.n_rot as f32))
                .collect()
        });
        Ok(Self {
            model,
            ks,
            pool: std::sync::Arc::new(pool),
            n_ctx,
            kv: KvCache::new((0..c.n_layer).map(|li| c.window(li)), n_ctx),
            s: Scratch::default(),
            step: StepBuffers::default(),
            routes: Routes::default(),
            inv_freq,
            inv_freq_local,
            sparse: None,
            stats: SparseStats::default(),
            record: None,
            offload: None,
            cluster: cfg.cluster.max(4).div_ceil(4) * 4,
            repack: cfg.repack,
            packed: None,
            head: HeadState::default(),
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
            if o.units() != c.n_layer * c.n_expert.max(1) || o.n_ff() != c.n_ff {
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

    /// Compute one token's logits (decode) through the sparse head `head` (`None`: dense), for
    /// what [`Engine::set_head_need`] says the sampler needs.
    pub fn set_head(&mut self, head: Option<&'m SparseHead<'m>>) -> Result<(), EngineError> {
        if let Some(h) = head {
            h.check(&self.model.weights.output.mat(&self.model.file))?;
        }
        self.head.head = head;
        Ok(())
    }

    /// What the sampler needs of the head (`None`: the dense product). Batches with several
    /// rows of logits (perplexity) always take the dense product.
    pub fn set_head_need(&mut self, need: Option<HeadNeed>) {
        self.head.need = need;
    }

    /// What the sparse head has done since [`Engine::set_head`] or [`Engine::reset_stats`].
    pub fn head_stats(&self) -> HeadStats {
        self.head.stats
    }

    /// What the sparse FFN has done since [`Engine::set_sparse`] or [`Engine::reset_stats`].
    pub fn sparse_stats(&self) -> &SparseStats {
        &self.stats
    }

    pub fn reset_stats(&mut self) {
        self.head.stats = HeadStats::default();
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

    /// The kernels, and the final normalized hidden states and logits of the last `rows` rows
    /// the last forward computed logits for (checks that repeat the head's work).
    pub fn head_inputs(&self, rows: usize) -> (&KernelSet, &[f32], &[f32]) {
        let c = &self.model.config;
        let s = &self.s;
        (
            &self.ks,
            &s.xn[..rows * c.n_embd],
            &s.logits[..rows * c.n_vocab],
        )
    }

    /// Context length.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Tokens currently in the KV cache.
    pub fn n_past(&self) -> usize {
        self.kv.len
    }

    /// Forget everything after the first `n` cached tokens (0 clears the sequence). Returns
    /// the tokens kept: `n` (at most those held), or 0 when sliding-window layers no longer
    /// hold the window position `n` needs (the caller evaluates those tokens again).
    pub fn truncate(&mut self, n: usize) -> usize {
        self.kv.truncate(n)
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
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<&[f32], EngineError> {
        let c = &self.model.config;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(EngineError::BadToken(bad, c.n_vocab));
        }
        self.pass(Input::Tokens(tokens), want, observer)
    }

    /// Layers `first_layer..` and the head over `stream`, the residual stream entering
    /// `first_layer` at the next positions (`n * n_embd`, as
    /// [`FfnObserver::observe_stream`] saw it), without extending the context: the layers
    /// below hold nothing for these positions, so nothing else may attend to them (and where
    /// the pass wrote over a sliding window the next positions need, the context is lost, as
    /// [`Engine::truncate`] loses it: [`Engine::n_past`] says). What a change to one layer
    /// costs is measured this way without running the layers below it again (they are the
    /// same as in the dense pass that saw the stream).
    pub fn resume_observed<'o>(
        &mut self,
        first_layer: usize,
        stream: &[f32],
        want: Logits,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<&[f32], EngineError> {
        let c = &self.model.config;
        if first_layer >= c.n_layer || !stream.len().is_multiple_of(c.n_embd) {
            return Err(EngineError::Resume {
                layer: first_layer,
                n_layer: c.n_layer,
                len: stream.len(),
                n_embd: c.n_embd,
            });
        }
        if self.offload.is_some() {
            return Err(EngineError::Offload(
                "a resumed pass runs on the mapped weights only: load the model without a budget"
                    .into(),
            ));
        }
        self.pass(
            Input::Stream {
                layer: first_layer,
                x: stream,
            },
            want,
            observer,
        )
    }

    fn pass<'o>(
        &mut self,
        input: Input<'_>,
        want: Logits,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<&[f32], EngineError> {
        let c = &self.model.config;
        let n = input.len(c.n_embd);
        if n == 0 {
            return Err(EngineError::Empty);
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
        pool.install(|| self.forward_inner(input, first_logit, observer))?;
        let rows = n - first_logit;
        Ok(&self.s.logits[..rows * c.n_vocab])
    }

    /// One forward pass: embed (or take the given stream) -> every layer (attention, FFN) ->
    /// final norm and LM head.
    fn forward_inner<'o>(
        &mut self,
        input: Input<'_>,
        first_logit: usize,
        mut observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        let n = input.len(c.n_embd);
        let pos0 = self.kv.len;
        if let Some(o) = self.offload.as_mut() {
            // The KV cache grows inside the budget: room comes from the neuron memory.
            let kv = self.kv.bytes_at(pos0 + n, n, c.kv_dim());
            o.charge_kv(kv as u64, pos0 + n)?;
        }
        let (first_layer, resumed) = match input {
            Input::Tokens(tokens) => {
                self.embed(tokens)?;
                if c.embd_scale != 1.0 {
                    let x = &mut self.s.x[..n * c.n_embd];
                    x.iter_mut().for_each(|v| *v *= c.embd_scale);
                }
                (0, false)
            }
            Input::Stream { layer, x } => {
                grow(&mut self.s.x, x.len()).copy_from_slice(x);
                (layer, true)
            }
        };
        self.s.rope.fill(&self.inv_freq, pos0, n);
        if let Some(f) = &self.inv_freq_local {
            self.s.rope_local.fill(f, pos0, n);
        }
        for (li, l) in m.weights.layers.iter().enumerate().skip(first_layer) {
            if let Some(o) = observer.as_deref_mut() {
                o.observe_stream(li, &self.s.x[..n * c.n_embd]);
            }
            let streamed = match self.offload.as_mut() {
                Some(o) => o.stream_attention(li)?,
                None => false,
            };
            let Engine {
                ks,
                s,
                kv,
                offload,
                packed,
                ..
            } = self;
            let mats = attention_mats(offload.as_ref(), streamed, packed.as_ref(), f, li, l);
            attention::block(ks, f, c, l, mats, s, kv, li, pos0, n);
            self.ffn_layer(li, l, n, observer.as_deref_mut())?;
        }
        if resumed {
            // Sliding-window rings may have written over what the next positions attend to.
            self.kv.truncate(pos0);
        } else {
            self.kv.len = pos0 + n;
        }
        self.head(n, first_logit, observer)
    }

    /// Embedding rows of `tokens` into `s.x`: from the mapping, or (offloaded) from flash where
    /// not resident.
    fn embed(&mut self, tokens: &[TokenId]) -> Result<(), EngineError> {
        let m = self.model;
        let d = m.config.n_embd;
        let embd = m.weights.token_embd.mat(&m.file);
        let x = grow(&mut self.s.x, tokens.len() * d);
        match self.offload.as_mut() {
            Some(o) if o.streams_embedding() => o.embed(&embd, tokens, x)?,
            _ => {
                for (t, &tok) in tokens.iter().enumerate() {
                    embd.dequantize_row(tok as usize, &mut x[t * d..(t + 1) * d]);
                }
            }
        }
        Ok(())
    }

    /// Final norm and LM head for the rows from `first_logit` on, into `s.logits`. An
    /// observer sees every row's normalized state.
    fn head<'o>(
        &mut self,
        n: usize,
        first_logit: usize,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        let d = c.n_embd;
        let rows = n - first_logit;
        let s = &mut self.s;
        let normed = if observer.is_some() { 0 } else { first_logit };
        rms_norm_rows(
            &s.x[normed * d..],
            m.weights.output_norm.f32s(f),
            c.rms_eps,
            d,
            n - normed,
            &mut s.xn,
        );
        if let Some(o) = observer {
            o.observe_head(&s.xn[..n * d]);
            s.xn.copy_within(first_logit * d..n * d, 0);
        }
        let out = match &self.packed {
            Some(p) => p.output(&m.weights.output, f),
            None => m.weights.output.mat(f),
        };
        let logits = grow(&mut s.logits, rows * c.n_vocab);
        s.acts.quantize(out.ty.act_kind(), &s.xn[..rows * d], d);
        match self.offload.as_mut() {
            Some(o) if o.streams_output() && rows == 1 && self.head.active() => self
                .head
                .run_offloaded(&self.ks, o, &out, &s.acts, logits)?,
            Some(o) if o.streams_output() => o.lm_head(&self.ks, &out, &s.acts, rows, logits)?,
            _ if rows == 1 && self.head.active() => self.head.run(&self.ks, &out, &s.acts, logits),
            _ => matmul(&self.ks, &out, &s.acts, logits),
        }
        Ok(())
    }

    /// Layer `li`'s FFN on the normalised stream, its output (normalised again where the
    /// layer says so) added to the residual stream.
    fn ffn_layer<'o>(
        &mut self,
        li: usize,
        l: &LayerWeights,
        n: usize,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        let nd = n * c.n_embd;
        let s = &mut self.s;
        rms_norm_rows(&s.x, l.ffn_norm.f32s(f), c.rms_eps, c.n_embd, n, &mut s.xn);
        let Some(post) = &l.post_ffn_norm else {
            return self.ffn_output(li, l, n, observer);
        };
        // Every FFN path adds into the stream: run it on zeros to get the output alone.
        grow(&mut s.resid, nd).copy_from_slice(&s.x[..nd]);
        s.x[..nd].fill(0.0);
        self.ffn_output(li, l, n, observer)?;
        let s = &mut self.s;
        for (x, r) in s.x[..nd]
            .chunks_exact_mut(c.n_embd)
            .zip(s.resid.chunks_exact(c.n_embd))
        {
            rms_norm_in_place(x, post.f32s(f), c.rms_eps);
            x.iter_mut().zip(r).for_each(|(x, r)| *x += r);
        }
        Ok(())
    }

    /// Layer `li`'s FFN of `s.xn`, added to `s.x`: routed experts, the sparse pipeline for a
    /// decoded token, masked sparse work for a batch, or dense (whole matrices from the
    /// mapping, packed, or staged from flash unit by unit).
    fn ffn_output<'o>(
        &mut self,
        li: usize,
        l: &LayerWeights,
        n: usize,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        let s = &mut self.s;
        if let Some(router) = &l.router {
            moe::route_tokens(&self.ks, c, &router.mat(f), s, &mut self.routes, n);
            if n == 1 && self.sparse.is_some() {
                // The chosen experts as units of the sparse FFN.
                let units: Vec<(usize, f32)> = self
                    .routes
                    .picked
                    .iter()
                    .map(|&(e, w)| (li * c.n_expert + e, w))
                    .collect();
                return self.sparse_token(li, l, &units);
            }
            let o = self.offload.as_mut();
            return moe::experts(&self.ks, c, f, l, li, &self.routes, s, o, observer);
        }
        if self.sparse.is_some() && n == 1 {
            return self.sparse_token(li, l, &[(li, 1.0)]);
        }
        // Whole matrices: from the file mapping (or its packed copy), or staged from flash.
        let staged = match &mut self.offload {
            Some(o) => Some(o.stage_unit(li, (li + 1 < c.n_layer).then_some(li + 1))?),
            None => None,
        };
        let s = &mut self.s;
        let mats = match (&self.offload, staged, &self.packed) {
            (Some(o), Some(b), _) => o.stage_mats(b, li, c.n_embd).into(),
            (_, _, Some(p)) => p.ffn(li, [&l.gate, &l.up, &l.down], f),
            _ => [&l.gate, &l.up, &l.down].map(|t| t.mat(f)),
        };
        if let Some(sp) = self.sparse.filter(|sp| sp.batches_too) {
            let [gate, up, down] = mats;
            let dense_bytes = (gate.bytes().len() + up.bytes().len() + down.bytes().len()) as u64;
            let sl = &sp.layers[li];
            let down_t = if staged.is_some() {
                down
            } else {
                sl.down_t.mat()
            };
            ffn::sparse_batch(
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
        let transposed = staged.is_some() || l.down_transposed;
        ffn::dense(&self.ks, c.ffn_act, mats, transposed, s, observer, li, n);
        Ok(())
    }

    /// The sparse pipeline for the decoded token: `units` of layer `li` with their weights.
    fn sparse_token(
        &mut self,
        li: usize,
        l: &LayerWeights,
        units: &[(usize, f32)],
    ) -> Result<(), EngineError> {
        let m = self.model;
        let f = &m.file;
        let sp = self.sparse.expect("sparse weights are set");
        let step = pipeline::Step {
            ks: &self.ks,
            act: m.config.ffn_act,
            sparse: sp,
            use_predictor: sp.use_predictor,
            cluster: self.cluster,
            layer: li,
            units,
            dense_bytes: l.gate.bytes(f) + l.up.bytes(f) + l.down.bytes(f),
        };
        let record = self.record.as_mut();
        let (s, b, stats) = (&mut self.s, &mut self.step, &mut self.stats);
        match self.offload.as_mut() {
            Some(o) => pipeline::token(&step, s, b, o, stats, record),
            None => {
                let mut mapped = Mapped::new(f, l, sp, m.config.n_ff);
                pipeline::token(&step, s, b, &mut mapped, stats, record)
            }
        }
    }
}

/// Layer `li`'s attention projections: streamed from flash (`streamed`, read in by
/// `Offload::stream_attention`), packed, or mapped.
fn attention_mats<'a>(
    offload: Option<&'a Offload>,
    streamed: bool,
    packed: Option<&'a PackedWeights>,
    f: &'a pi2_model::GgufFile,
    li: usize,
    l: &'a LayerWeights,
) -> [MatRef<'a>; 4] {
    let tvs = [&l.wq, &l.wk, &l.wv, &l.wo];
    match (offload, streamed, packed) {
        (Some(o), true, _) => o.attention_mats(li),
        (_, _, Some(p)) => p.attn(li, tvs, f),
        _ => tvs.map(|w| w.mat(f)),
    }
}
