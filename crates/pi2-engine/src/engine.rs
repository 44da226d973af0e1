//! The engine: one model, one sequence's KV cache, a worker pool, and a [`Store`] that says
//! where the weights are. It is built once from its configuration and parts ([`EngineParts`]):
//! dense or sparse FFN, in memory or offloaded. A forward pass is embed -> layers (attention,
//! FFN) -> head (`engine/forward.rs`); each stage lives in the file named after it
//! (`attention.rs`, `ffn.rs`, `moe.rs`, `pipeline.rs`), working in `scratch.rs`'s buffers.

use crate::error::EngineError;
use crate::head::{ClusteredHead, HeadRef, HeadState, HeadStats};
use crate::kv::KvCache;
use crate::moe::{Routes, RoutingStats};
use crate::offload::{ExpertStream, Offload, Offloaded, Streamed};
use crate::pipeline::StepBuffers;
use crate::scratch::Scratch;
use crate::sparse::{SparseFfn, SparseStats};
use crate::weights::{FfnCopies, Resident, Store};
use pi2_kernels::{KernelSet, Tier};
use pi2_model::{Model, TokenId};
use pi2_sparse::FfnObserver;

mod forward;
mod memory;
mod sequences;

pub use memory::{kv_bytes_full, kv_bytes_start, scratch_bytes};
pub use sequences::SequenceCache;

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
    /// residency or thread count). One huge cluster turns the pipeline's overlap off.
    pub cluster: usize,
    /// Copy the matrices multiplied whole into the row-interleaved layout (`PackedMat`) before
    /// the first pass: about twice the matvec speed; `false` keeps every tensor in the file
    /// mapping. Offloaded models always keep the mapping (their budget counts it).
    pub repack: bool,
    /// Record every sparse decode step's candidate and confirmed neurons
    /// ([`Engine::take_neuron_record`]; the planner's model profile).
    pub record_neurons: bool,
    /// Share of the output rows the clustered head scores exactly (`None`: the file's; 1: all
    /// of them, the dense head).
    pub head_share: Option<f32>,
    /// Also compute the whole output matrix every step and count how the clustered head's
    /// selection agrees with it ([`Engine::head_stats`]; perplexity's check, slower).
    pub head_check: bool,
    /// Run a converted model's layers dense when their whole FFN is in memory and the sparse
    /// FFN computes every gate row anyway (no predictor): the plain model's kernels on the
    /// source's down matrix the file keeps, about twice the sparse step's speed. `false`: the
    /// sparse step everywhere (offloaded and in-memory sparse decode then agree bit for bit).
    pub dense_resident: bool,
    /// Rows of logits one forward pass returns at most (1 for generation; a checked draft
    /// returns one per drafted token and one more): memory budgets charge them.
    pub logit_rows: usize,
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
            record_neurons: false,
            head_share: None,
            head_check: false,
            dense_resident: true,
            logit_rows: 1,
        }
    }
}

impl EngineConfig {
    /// The context length this configuration gives `model` (its training context for 0).
    pub fn context(&self, model: &Model) -> usize {
        match self.n_ctx {
            0 => model.config.n_ctx_train,
            n => n,
        }
    }
}

/// What an engine computes with besides the dense model: the sparse FFN of a converted model,
/// its clustered output head loaded once to share between engines (without one, an engine
/// loads the file's own), and an offload that reads what the memory budget cannot hold from
/// flash (it needs the sparse FFN; size it with [`kv_bytes_start`], [`kv_bytes_full`] and
/// [`scratch_bytes`]).
#[derive(Default)]
pub struct EngineParts<'m> {
    pub sparse: Option<&'m SparseFfn<'m>>,
    pub head: Option<&'m ClusteredHead<'m>>,
    pub offload: Option<Offload>,
    /// A plain mixture-of-experts model's experts streamed from flash (no sparse FFN).
    pub experts: Option<ExpertStream>,
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

/// What a pass computes, passed down the forward pass as a value (never a flag on the engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// A lone token of a sparse model is a decode step (the sparse FFN); a batch runs the
    /// batch FFN (dense, or masked sparse for perplexity).
    Plain,
    /// A prompt: even a lone token runs the batch FFN ([`Engine::forward_prompt`]).
    Prompt,
    /// A batch standing for one-token decode steps (a checked draft, batched sequences): each
    /// token computes what its own step computes, bit for bit ([`Engine::forward_decode`]).
    Decode,
    /// A self-draft from what is resident: nothing read ([`Engine::forward_resident`]).
    Resident,
}

/// What a pass starts from: tokens to embed, or the residual stream entering a layer.
#[derive(Clone, Copy)]
enum Input<'a> {
    Tokens(&'a [TokenId]),
    /// The stream entering `layer` at the positions of `tokens` (whose per-layer inputs the
    /// layers may need).
    Stream {
        layer: usize,
        x: &'a [f32],
        tokens: &'a [TokenId],
    },
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
    cluster: usize,
    /// Where the weights are.
    store: Box<dyn Store + 'm>,
    head: HeadState<'m>,
    prepared: bool,
    /// KV bytes and positions of this engine's other sequences, kept outside it
    /// ([`Engine::set_parked_kv`]).
    parked_kv: (usize, usize),
}

impl<'m> Engine<'m> {
    /// A dense engine for `model`, weights in memory.
    pub fn new(model: &'m Model, cfg: &EngineConfig) -> Result<Self, EngineError> {
        Self::with_parts(model, cfg, EngineParts::default())
    }

    /// An engine with `parts`: the sparse FFN (checked against the model), and an offload
    /// (which needs the sparse FFN and must be built for this model).
    pub fn with_parts(
        model: &'m Model,
        cfg: &EngineConfig,
        parts: EngineParts<'m>,
    ) -> Result<Self, EngineError> {
        let ks = match cfg.tier {
            None => *KernelSet::best(),
            Some(t) => KernelSet::for_tier(t).ok_or(EngineError::TierUnsupported(t.name()))?,
        };
        let pool = thread_pool(cfg)?;
        let c = &model.config;
        let n_ctx = cfg.context(model);
        if n_ctx == 0 || n_ctx > MAX_CTX {
            return Err(EngineError::ContextSize {
                n_ctx,
                max: MAX_CTX,
            });
        }
        if let Some(sp) = parts.sparse {
            check_sparse(model, sp)?;
            if model
                .weights
                .layers
                .iter()
                .any(|l| l.expert_biases.is_some())
            {
                return Err(EngineError::Offload(
                    "the sparse FFN does not carry biased experts (gpt-oss): run the file as it is (under --mem-budget its experts stream)".into(),
                ));
            }
        }
        check_head(model, parts.head.is_some(), cfg.head_share)?;
        let head = match parts.head {
            Some(h) => Some(HeadRef::Shared(h)),
            // Its own, packed as the other matrices are (never under a budget, which counts
            // the mapped tensors).
            None => ClusteredHead::load(model, parts.offload.is_none() && cfg.repack)?
                .map(|h| HeadRef::Own(Box::new(h))),
        };
        // Dense where resident: a sparse FFN that computes every gate row anyway, unless the
        // caller records which neurons fire (only the sparse step knows).
        let dense = cfg.dense_resident
            && !cfg.record_neurons
            && parts.sparse.is_some_and(|sp| !sp.use_predictor);
        let store: Box<dyn Store + 'm> = match (parts.offload, parts.experts) {
            (Some(_), Some(_)) => {
                return Err(EngineError::Offload(
                    "an engine offloads neurons or streams experts, not both".into(),
                ))
            }
            (None, Some(x)) => {
                if parts.sparse.is_some() || c.n_expert == 0 {
                    return Err(EngineError::Offload(
                        "streamed experts are for a plain mixture-of-experts model".into(),
                    ));
                }
                Box::new(Streamed::new(model, x, cfg.repack))
            }
            (Some(o), None) => {
                if parts.sparse.is_none() {
                    return Err(EngineError::Offload(
                        "offloading needs the sparse FFN of a converted model".into(),
                    ));
                }
                if o.units() != c.n_layer * c.n_expert.max(1) || o.n_ff() != c.n_ff {
                    return Err(EngineError::Offload("built for another model".into()));
                }
                Box::new(Offloaded::new(model, o, dense))
            }
            (None, None) => {
                let ffn = match parts.sparse {
                    Some(_) => FfnCopies::Mapped,
                    None => FfnCopies::Whole,
                };
                Box::new(Resident::new(model, cfg.repack, ffn, dense))
            }
        };
        let (inv_freq, inv_freq_local) = rope_frequencies(model, n_ctx);
        Ok(Self {
            model,
            ks,
            pool: std::sync::Arc::new(pool),
            n_ctx,
            kv: KvCache::new(c, n_ctx),
            s: Scratch::default(),
            step: StepBuffers::default(),
            routes: Routes::default(),
            inv_freq,
            inv_freq_local,
            sparse: parts.sparse,
            stats: sparse_stats(model, parts.sparse.is_some()),
            record: cfg.record_neurons.then(Vec::new),
            cluster: cfg.cluster.clamp(4, 1 << 30).div_ceil(4) * 4,
            store,
            head: HeadState::new(head, cfg.head_share, cfg.head_check),
            prepared: false,
            parked_kv: (0, 0),
        })
    }

    /// Start-up work that belongs to loading (the row-interleaved copies of an in-memory
    /// model), done by the first [`Engine::forward`]; call it earlier to keep it out of the
    /// first token's time.
    pub fn prepare(&mut self) {
        if !self.prepared {
            let pool = self.pool.clone();
            self.store.prepare(&self.ks, &pool);
            self.prepared = true;
        }
    }

    /// Bytes of the row-interleaved copies of the weights (0 before [`Engine::prepare`]).
    pub fn packed_bytes(&self) -> usize {
        self.store.copied_bytes()
    }

    /// The offloaded FFN, if any (budget, statistics).
    pub fn offload(&self) -> Option<&Offload> {
        self.store.offload()
    }

    pub fn offload_mut(&mut self) -> Option<&mut Offload> {
        self.store.offload_mut()
    }

    /// The streamed experts, when this engine streams a plain model's experts.
    pub fn experts(&self) -> Option<&ExpertStream> {
        self.store.experts()
    }

    pub fn experts_mut(&mut self) -> Option<&mut ExpertStream> {
        self.store.experts_mut()
    }

    /// Whether the FFN runs sparsely (decode) from the converted model's neuron rows.
    pub fn is_sparse(&self) -> bool {
        self.sparse.is_some()
    }

    /// Neurons per cluster in sparse decode.
    pub fn cluster(&self) -> usize {
        self.cluster
    }

    /// The steps recorded since the last call (recording continues); empty unless the
    /// configuration asked for [`EngineConfig::record_neurons`].
    pub fn take_neuron_record(&mut self) -> Vec<NeuronStep> {
        self.record.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// What the sparse FFN has done since the engine was built or [`Engine::reset_stats`].
    pub fn sparse_stats(&self) -> &SparseStats {
        &self.stats
    }

    /// What the clustered head did since the engine was built or [`Engine::reset_stats`].
    pub fn head_stats(&self) -> HeadStats {
        self.head.stats
    }

    /// Zero the sparse FFN's, the head's and the offload's counts.
    pub fn reset_stats(&mut self) {
        self.stats = sparse_stats(self.model, self.sparse.is_some());
        self.head.stats = HeadStats::default();
        if let Some(o) = self.store.offload_mut() {
            o.reset_stats();
        }
        if let Some(x) = self.store.experts_mut() {
            x.reset_stats();
        }
        self.routes.stats = RoutingStats::default();
    }

    /// How a mixture of experts routed tokens since the last reset (empty for a dense model).
    pub fn routing_stats(&self) -> &RoutingStats {
        &self.routes.stats
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

    /// Writes the KV cache (its `n_past` positions, every layer's cells and recurrent states) to
    /// `w`: llama-server's slot save.
    pub fn save_cache(&self, w: &mut dyn std::io::Write) -> Result<(), EngineError> {
        self.kv
            .write(w)
            .map_err(|e| EngineError::CacheFile(format!("cannot write it: {e}")))
    }

    /// Replaces the KV cache with one [`Engine::save_cache`] wrote for this model and context
    /// (under a budget, charged to it); returns the positions it holds. On an error the cache
    /// is as it was.
    pub fn load_cache(&mut self, r: &mut dyn std::io::Read) -> Result<usize, EngineError> {
        let mut kv = KvCache::new(&self.model.config, self.n_ctx);
        let n = kv.read(r).map_err(EngineError::CacheFile)?;
        let (parked, parked_positions) = self.parked_kv;
        let bytes = kv.bytes() + parked;
        self.store.charge_kv(bytes as u64, n + parked_positions)?;
        self.kv = kv;
        Ok(n)
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

    /// Evaluates prompt `tokens` at the next positions; returns the last token's logits. As
    /// [`Engine::forward`], except that a lone token runs as a prompt batch does (the dense FFN
    /// of a sparse model), not as a decode step: a prompt gives the same logits whether its
    /// start was cached or not.
    pub fn forward_prompt(&mut self, tokens: &[TokenId]) -> Result<&[f32], EngineError> {
        self.check_tokens(tokens)?;
        self.pass(Input::Tokens(tokens), Logits::Last, Pass::Prompt, None)
    }

    /// [`Engine::forward`] for a batch that stands for decode steps (a draft being checked):
    /// each token's logits are its one-token step's, bit for bit (the sparse FFN through the
    /// step's pipeline on the weights read once for the batch, products row by row), where a
    /// prompt batch runs the dense FFN and shares weight loads between rows.
    pub fn forward_decode(
        &mut self,
        tokens: &[TokenId],
        want: Logits,
    ) -> Result<&[f32], EngineError> {
        self.check_tokens(tokens)?;
        self.pass(Input::Tokens(tokens), want, Pass::Decode, None)
    }

    /// One decode step of `token` computed from what is in memory now, reading nothing for the
    /// FFN or the output rows: a memory budget's pinned and cached neurons take part (the
    /// others count as not firing) and the clustered head scores only its resident clusters.
    /// A cheap guess of the next token's logits (a self-draft); the engine's counts are left as
    /// they were. In memory it is [`Engine::forward`].
    pub fn forward_resident(&mut self, token: TokenId) -> Result<&[f32], EngineError> {
        let (stats, head) = (self.stats.clone(), self.head.stats);
        let offload = self.store.offload().map(|o| o.stats().clone());
        self.head.resident_rows = Some(self.store.output_resident_rows());
        let done = self
            .check_tokens(&[token])
            .and_then(|()| self.pass(Input::Tokens(&[token]), Logits::Last, Pass::Resident, None))
            .map(<[f32]>::len);
        self.head.resident_rows = None;
        (self.stats, self.head.stats) = (stats, head);
        if let (Some(o), Some(st)) = (self.store.offload_mut(), offload) {
            o.restore_stats(st);
        }
        Ok(&self.s.logits[..done?])
    }

    /// Whether [`Engine::forward_decode`] computes a batch exactly as one-token steps do (up to
    /// rounding): not for a sparse mixture-of-experts model, whose batches route experts densely.
    pub fn checks_batches_as_decode(&self) -> bool {
        self.sparse.is_none() || self.model.config.n_expert == 0
    }

    /// [`Engine::forward`], reporting every FFN layer's input and gate pre-activations to
    /// `observer` (activation profiling).
    pub fn forward_observed<'o>(
        &mut self,
        tokens: &[TokenId],
        want: Logits,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<&[f32], EngineError> {
        self.check_tokens(tokens)?;
        // Observers (profiles, calibration) keep one row of counts per layer.
        if observer.is_some() && !self.model.config.ffn_sizes.is_empty() {
            return Err(pi2_model::ModelError::Unsupported(
                "profiling or converting a model whose layers have FFNs of different sizes (Gemma 4's wider layers) is not done yet: run it in memory (without --mem-budget)".into(),
            )
            .into());
        }
        self.pass(Input::Tokens(tokens), want, Pass::Plain, observer)
    }

    fn check_tokens(&self, tokens: &[TokenId]) -> Result<(), EngineError> {
        let c = &self.model.config;
        match tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            Some(&bad) => Err(EngineError::BadToken(bad, c.n_vocab)),
            None => Ok(()),
        }
    }

    /// Layers `first_layer..` and the head over `stream`, the residual stream of `tokens`
    /// entering `first_layer` at the next positions (`n * n_embd` for `n` tokens, as
    /// [`FfnObserver::observe_stream`] saw it), without extending the context: the layers
    /// below hold nothing for these positions, so nothing else may attend to them (and where
    /// the pass wrote over a sliding window the next positions need, the context is lost, as
    /// [`Engine::truncate`] loses it: [`Engine::n_past`] says). What a change to one layer
    /// costs is measured this way without running the layers below it again (they are the
    /// same as in the dense pass that saw the stream). A layer that reads a lower layer's keys
    /// and values (Gemma 4's shared KV) reads what that dense pass wrote there.
    pub fn resume_observed<'o>(
        &mut self,
        first_layer: usize,
        tokens: &[TokenId],
        stream: &[f32],
        want: Logits,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<&[f32], EngineError> {
        let c = &self.model.config;
        if first_layer >= c.n_layer || stream.len() != tokens.len() * c.n_embd {
            return Err(EngineError::Resume {
                layer: first_layer,
                n_layer: c.n_layer,
                len: stream.len(),
                tokens: tokens.len(),
                n_embd: c.n_embd,
            });
        }
        self.check_tokens(tokens)?;
        // Layers that read a lower layer's keys and values (Gemma 4's shared KV) read what the
        // dense pass over these positions left there.
        let end = self.kv.len + tokens.len();
        let unwritten = (first_layer..c.n_layer)
            .map(|li| (li, c.kv_source(li)))
            .find(|&(_, src)| src < first_layer && !self.kv.holds(src, end));
        if let Some((layer, from)) = unwritten {
            return Err(EngineError::ResumeShared {
                first: first_layer,
                layer,
                from,
            });
        }
        if self.store.offload().is_some() {
            return Err(EngineError::Offload(
                "a resumed pass runs on the mapped weights only: load the model without a budget"
                    .into(),
            ));
        }
        self.pass(
            Input::Stream {
                layer: first_layer,
                x: stream,
                tokens,
            },
            want,
            Pass::Plain,
            observer,
        )
    }

    fn pass<'o>(
        &mut self,
        input: Input<'_>,
        want: Logits,
        pass: Pass,
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
        pool.install(|| self.forward_inner(input, first_logit, pass, observer))?;
        let rows = n - first_logit;
        Ok(&self.s.logits[..rows * c.n_vocab])
    }
}

/// The compute threads, pinned where the configuration says (checked against the CPUs this
/// process may use).
fn thread_pool(cfg: &EngineConfig) -> Result<rayon::ThreadPool, EngineError> {
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
    rayon::ThreadPoolBuilder::new()
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
        })
}

/// RoPE inverse frequencies, and the sliding-window layers' own when their base differs
/// (llama.cpp's `rope_freq_*_swa`: their own base, unscaled).
fn rope_frequencies(model: &Model, n_ctx: usize) -> (Vec<f32>, Option<Vec<f32>>) {
    let c = &model.config;
    let freq_factors = model
        .weights
        .rope_factors(c, n_ctx)
        .map(|t| t.f32s(&model.file));
    // YaRN: per pair, between the interpolated (scaled) and the plain frequency.
    let corr = c.yarn.map(|y| y.corr_dims(c.n_rot, c.rope_base));
    let inv_freq: Vec<f32> = (0..c.n_rot / 2)
        .map(|i| {
            let plain = c.rope_base.powf(-2.0 * i as f32 / c.n_rot as f32);
            let scale = match (c.yarn, corr) {
                (Some(y), Some(dims)) => {
                    let mix = y.extrapolation(i, dims);
                    c.rope_freq_scale * (1.0 - mix) + mix
                }
                _ => c.rope_freq_scale,
            };
            // Pairs M-RoPE leaves at position 0 for text do not turn.
            let turns = c.rope_pair_rotates(i) as u8 as f32;
            turns * plain * scale / freq_factors.map_or(1.0, |ff| ff[i])
        })
        .collect();
    // Sliding layers with a base or head shape of their own rotate plainly (Gemma 3 and 4);
    // with the same, as the others do (gpt-oss, YaRN included).
    let local = c
        .sliding_window
        .map(|w| match w.rope_base == c.rope_base && w.heads.is_none() {
            true => inv_freq.clone(),
            false => {
                let n_rot = w.heads.map_or(c.n_rot, |h| h.n_rot);
                (0..n_rot / 2)
                    .map(|i| w.rope_base.powf(-2.0 * i as f32 / n_rot as f32))
                    .collect()
            }
        });
    (inv_freq, local)
}

/// Zeroed counts of the sparse FFN (fractions are of the neurons a dense step computes: the
/// chosen experts').
fn sparse_stats(model: &Model, sparse: bool) -> SparseStats {
    let c = &model.config;
    if !sparse {
        return SparseStats::default();
    }
    SparseStats {
        n_ff: c.n_ff * c.n_expert_used.max(1),
        layer_true_active: vec![0; c.n_layer],
        layer_true_found: vec![0; c.n_layer],
        layer_candidates: vec![0; c.n_layer],
        layer_tokens: vec![0; c.n_layer],
        ..SparseStats::default()
    }
}

/// A head given must be the model's; a head share is a share.
fn check_head(model: &Model, given: bool, share: Option<f32>) -> Result<(), EngineError> {
    let has = model
        .file
        .get(pi2_model::bundle::KEY_HEAD_CLUSTER)
        .is_some();
    if given && !has {
        return Err(EngineError::Head("the model has no clustered head".into()));
    }
    if let Some(s) = share.filter(|s| !(*s > 0.0 && *s <= 1.0)) {
        return Err(EngineError::Head(format!(
            "head share {s} is outside (0, 1]"
        )));
    }
    Ok(())
}

/// Checks the sparse FFN's units against `model`'s shapes.
fn check_sparse(model: &Model, sp: &SparseFfn<'_>) -> Result<(), EngineError> {
    let c = &model.config;
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
    Ok(())
}
