//! Llama-family architectures: hyper-parameters from GGUF metadata and the tensor directory,
//! checked for presence, shape and type at load so the engine never meets a surprise. What each
//! family computes differently is a [`Family`] value in the family's own module; adding a family
//! is a module and a line in [`family::FAMILIES`].

mod family;
mod view;
pub use view::TensorView;
mod ffn_act;
pub use ffn_act::{FfnAct, KEY_FFN_ACTIVATION};
mod gemma2;
mod gemma3;
mod gemma4;
mod gpt_oss;
mod rope;
use rope::rope;
pub use rope::Yarn;
mod granite;
mod lfm2;
mod lfm2moe;
mod llama;
mod mistral3;
mod mixer;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen35;
mod qwen35moe;
mod qwen3moe;
mod smallthinker;
mod smollm3;
use mixer::head_count_kv;
pub use mixer::{DeltaNet, Mixer};
mod weights;
pub use weights::{
    DeltaWeights, ExpertNorms, LayerWeights, PerLayerGate, PerLayerInput, SharedExpert, Weights,
};

pub use family::{Family, QkNorm, FAMILIES};

use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};

/// Supported architectures (`general.architecture`); each one's rules are its [`Family`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Olmoe,
    Smollm3,
    Granite,
    Gemma2,
    Gemma3,
    GptOss,
    Mistral3,
    Phi3,
    Lfm2,
    Smallthinker,
    Qwen35,
    Qwen35Moe,
    Lfm2Moe,
    Gemma4,
}

impl Arch {
    /// The family's rules.
    pub fn family(self) -> &'static Family {
        FAMILIES
            .into_iter()
            .find(|f| f.arch == self)
            .expect("every architecture has its family in FAMILIES")
    }

    pub fn name(self) -> &'static str {
        self.family().name
    }

    /// The family named `name` in `general.architecture`.
    pub fn from_name(name: &str) -> Option<Arch> {
        FAMILIES
            .into_iter()
            .find(|f| f.name == name)
            .map(|f| f.arch)
    }
}

/// How RoPE pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    /// (x[2i], x[2i+1]) rotate together.
    Norm,
    /// (x[i], x[i + n_rot/2]) rotate together.
    Neox,
}

/// Hyper-parameters of a llama-family transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates.
    pub n_rot: usize,
    pub rope_kind: RopeKind,
    pub rope_base: f32,
    /// Linear position scaling (1.0 = none).
    pub rope_freq_scale: f32,
    pub rms_eps: f32,
    pub ffn_act: FfnAct,
    /// How a mixture-of-experts layer weights the experts it chose.
    pub gating: Gating,
    /// Experts per FFN layer (0: a dense FFN). Each expert has `n_ff` neurons.
    pub n_expert: usize,
    /// Experts each token is routed to.
    pub n_expert_used: usize,
    /// Neurons of a mixture's shared expert, where its layers have one (see
    /// [`LayerWeights::shared`]).
    pub n_ff_shared: usize,
    /// A mixture's first layers with a dense FFN instead (LFM2-MoE's
    /// `leading_dense_block_count`), and their neurons (`feed_forward_length`).
    pub dense_lead: usize,
    pub n_ff_dense: usize,
    /// Factor of the token embeddings as they enter the first layer (1: none).
    pub embd_scale: f32,
    /// Factor of the attention scores (usually `1 / sqrt(head_dim)`).
    pub attn_scale: f32,
    /// Sliding-window attention: the window's length in tokens, the layers that attend
    /// globally instead, and the sliding layers' RoPE base. `None`: every layer attends to the
    /// whole context.
    pub sliding_window: Option<SlidingWindow>,
    /// Layers without RoPE.
    pub rope_skip: Option<EveryNth>,
    /// Factor of the attention and FFN outputs as they join the residual stream (1: none).
    pub residual_scale: f32,
    /// The logits are divided by it (1: none).
    pub logit_scale: f32,
    /// Attention scores soft-capped: `cap * tanh(score / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits soft-capped the same way, after `logit_scale`.
    pub final_softcap: Option<f32>,
    /// YaRN context extension (with `rope_freq_scale` its factor's inverse).
    pub yarn: Option<Yarn>,
    /// Factor of the rotated dimensions of Q and K (`rope.scaling.attn_factor`; YaRN's).
    pub rope_mscale: f32,
    /// The context before any extension: longer contexts take `rope_factors_long`.
    pub n_ctx_orig: usize,
    /// Queries scaled by a temperature that grows with position (Llama 4, Ministral 3).
    pub attn_temperature: Option<AttnTemperature>,
    /// How each layer mixes tokens (attention unless the family says otherwise).
    pub mixers: Vec<Mixer>,
    /// Each head's Q projection is followed by as many rows of an output gate: the attention
    /// output is multiplied by their sigmoid before `wo` (Qwen3.5).
    pub attn_output_gate: bool,
    /// Interleaved multimodal RoPE sections (Qwen3.5's `rope.dimension_sections`): for text,
    /// the rotated pairs outside the first three sections stay unrotated.
    pub rope_sections: Option<[usize; 4]>,
    /// Routers read each layer's input before attention (un-normed) rather than the FFN's
    /// normed input (SmallThinker).
    pub route_before_attention: bool,
    /// Layers from this one on compute no keys and values: each attends to those of the last
    /// layer of its kind before it (Gemma 4's shared KV; `n_layer`: none).
    pub kv_shared_from: usize,
    /// Values RMS-normed per head without weights before they are cached (Gemma 4).
    pub v_norm: bool,
    /// Width of each layer's own slice of a token's per-layer input (Gemma 4's per-layer
    /// embeddings, see [`PerLayerInput`]; 0: none).
    pub n_embd_per_layer: usize,
    /// Neurons of each layer's FFN where they differ between layers (Gemma 4's wider FFN in
    /// the layers that share KV); empty: see [`ModelConfig::ffn_size`].
    pub ffn_sizes: Vec<usize>,
}

/// The head shape of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates.
    pub n_rot: usize,
}

/// Llama 4's attention temperature: the query at position `p` is multiplied by
/// `1 + scale * ln(floor(p / length) + 1)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnTemperature {
    pub scale: f32,
    pub length: usize,
}

impl AttnTemperature {
    pub fn at(&self, pos: usize) -> f32 {
        (((pos / self.length) + 1) as f32).ln() * self.scale + 1.0
    }
}

/// How a token's chosen experts are weighted (llama.cpp's `build_moe_ffn`): each expert's
/// probability from the router's logits ([`GateFunc`]), the `n_expert_used` largest chosen (a
/// layer's selection bias added for the choice only), their weights renormalised to sum to one
/// or not, then scaled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gating {
    pub func: GateFunc,
    pub renormalize: bool,
    /// `expert_weights_scale` (1: none).
    pub scale: f32,
}

/// How router logits become expert probabilities (llama.cpp's `expert_gating_func`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateFunc {
    /// The softmax over all experts (1).
    Softmax,
    /// Each logit's sigmoid (2).
    Sigmoid,
    /// The logits chosen, then the softmax over the chosen (3; gpt-oss).
    SoftmaxWeight,
}

impl GateFunc {
    /// The function of `expert_gating_func = id`, if pi2 computes it.
    pub fn from_id(id: u64) -> Option<GateFunc> {
        match id {
            1 => Some(GateFunc::Softmax),
            2 => Some(GateFunc::Sigmoid),
            3 => Some(GateFunc::SoftmaxWeight),
            _ => None,
        }
    }
}

/// Which layers attend to a recent window only, and how far (see [`ModelConfig::window`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingWindow {
    pub len: usize,
    /// The layers that attend globally (`None`: every layer slides).
    pub global: Option<EveryNth>,
    pub rope_base: f32,
    /// The sliding layers' head shape where it differs from the global layers' (Gemma 4's
    /// `key_length_swa`, `rope.dimension_count_swa`).
    pub heads: Option<Heads>,
}

/// Every `period`-th layer, from layer `first` on (`layer % period == first`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EveryNth {
    pub period: usize,
    pub first: usize,
}

impl EveryNth {
    /// The last layer of every `period` (`(layer + 1) % period == 0`: Gemma's global layers,
    /// SmolLM3's layers without RoPE); 1: every layer.
    pub fn last_of(period: usize) -> Self {
        EveryNth {
            period,
            first: period - 1,
        }
    }

    /// The first layer of every `period` (SmallThinker's global layers).
    pub fn first_of(period: usize) -> Self {
        EveryNth { period, first: 0 }
    }

    pub fn has(&self, li: usize) -> bool {
        li % self.period == self.first
    }
}

fn key<'a>(f: &'a GgufFile, k: &str) -> Result<&'a Value> {
    f.get(k)
        .ok_or_else(|| ModelError::MissingKey(k.to_string()))
}

pub(crate) fn get_usize(f: &GgufFile, k: &str) -> Result<usize> {
    let v = key(f, k)?;
    v.as_u64()
        .and_then(|x| usize::try_from(x).ok())
        .ok_or(ModelError::WrongKeyType {
            key: k.into(),
            expected: "unsigned integer",
            got: v.type_name(),
        })
}

pub(crate) fn get_usize_or(f: &GgufFile, k: &str, default: usize) -> Result<usize> {
    if f.get(k).is_some() {
        get_usize(f, k)
    } else {
        Ok(default)
    }
}

/// A hyper-parameter that is a positive factor when set; absent or 0 (llama.cpp's "not set")
/// is `None`, anything else no model uses is an error naming it.
pub(crate) fn positive_or_unset(f: &GgufFile, key: &str) -> Result<Option<f32>> {
    match get_f32_or(f, key, 0.0)? {
        0.0 => Ok(None),
        v if v.is_finite() && v > 0.0 => Ok(Some(v)),
        v => Err(ModelError::Corrupt(format!(
            "hyper-parameter `{key}` is {v}, which no model uses"
        ))),
    }
}

pub(crate) fn get_f32_or(f: &GgufFile, k: &str, default: f32) -> Result<f32> {
    match f.get(k) {
        None => Ok(default),
        Some(v) => v
            .as_f64()
            .map(|x| x as f32)
            .ok_or(ModelError::WrongKeyType {
                key: k.into(),
                expected: "float",
                got: v.type_name(),
            }),
    }
}

/// Sanity bound for sizes read from metadata (guards against absurd allocations).
pub(crate) const MAX_DIM: usize = 1 << 20;

impl ModelConfig {
    /// Read and validate the hyper-parameters.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let arch_name =
            key(f, "general.architecture")?
                .as_str()
                .ok_or(ModelError::WrongKeyType {
                    key: "general.architecture".into(),
                    expected: "string",
                    got: "other",
                })?;
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ModelError::UnsupportedArch(arch_name.to_string()))?;
        let fam = arch.family();
        let a = fam.name;
        let k = |s: &str| format!("{a}.{s}");
        let (n_expert, n_expert_used, gating) = experts(f, fam)?;
        let ffn_act = match f.get(KEY_FFN_ACTIVATION) {
            None => fam.ffn_act,
            Some(v) => v.as_str().and_then(FfnAct::parse).ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "FFN activation {KEY_FFN_ACTIVATION} = {v:?} (pi2 knows silu, reglu, drelu, geglu)"
                ))
            })?,
        };
        let n_embd = get_usize(f, &k("embedding_length"))?;
        let n_layer = get_usize(f, &k("block_count"))?;
        let (n_ff, n_ff_shared, per_layer_ff) = ffn_sizes(f, fam, n_expert, n_expert_used)?;
        let n_head = get_usize(f, &k("attention.head_count"))?;
        let n_head_kv = head_count_kv(f, &k("attention.head_count_kv"), n_head)?;
        let n_ctx_train = get_usize_or(f, &k("context_length"), 2048)?;
        check_layer_count(f, n_layer, &k("block_count"))?;
        for (name, v) in [
            ("embedding_length", n_embd),
            ("block_count", n_layer),
            ("feed_forward_length", n_ff),
            ("attention.head_count", n_head),
            ("attention.head_count_kv", n_head_kv),
        ] {
            if v == 0 || v > MAX_DIM {
                return Err(ModelError::Corrupt(format!(
                    "{a}.{name} = {v} is out of range"
                )));
            }
        }
        if n_embd % n_head != 0 && f.get(&k("attention.key_length")).is_none() {
            return Err(ModelError::Corrupt(format!(
                "embedding length {n_embd} is not divisible by {n_head} heads"
            )));
        }
        if n_head % n_head_kv != 0 {
            return Err(ModelError::Corrupt(format!(
                "{n_head} heads are not a multiple of {n_head_kv} KV heads"
            )));
        }
        let head_dim = get_usize_or(f, &k("attention.key_length"), n_embd / n_head)?;
        let v_dim = get_usize_or(f, &k("attention.value_length"), head_dim)?;
        if v_dim != head_dim {
            return Err(ModelError::Unsupported(format!(
                "value head size {v_dim} differs from key head size {head_dim}"
            )));
        }
        let rope = rope(f, a, head_dim, n_ctx_train)?;
        let (n_rot, rope_base, rope_freq_scale, yarn) =
            (rope.n_rot, rope.base, rope.freq_scale, rope.yarn);
        // Required, as llama.cpp requires it: a default would be a silent guess.
        let eps_key = k("attention.layer_norm_rms_epsilon");
        if f.get(&eps_key).is_none() {
            return Err(ModelError::MissingKey(eps_key));
        }
        let rms_eps = get_f32_or(f, &eps_key, 1e-5)?;
        check_hyper_parameters(rms_eps, rope_base, rope_freq_scale)?;
        let n_vocab = match f.get(&k("vocab_size")) {
            Some(_) => get_usize(f, &k("vocab_size"))?,
            None => f
                .get("tokenizer.ggml.tokens")
                .and_then(Value::array_len)
                .ok_or_else(|| ModelError::MissingKey("tokenizer.ggml.tokens".into()))?,
        };
        let mut config = Self {
            arch,
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_kind: fam.rope,
            rope_base,
            rope_freq_scale,
            rms_eps,
            ffn_act,
            n_expert,
            n_expert_used,
            n_ff_shared,
            dense_lead: 0,
            n_ff_dense: match n_expert > 0 {
                true => get_usize_or(f, &k("feed_forward_length"), 0)?,
                false => n_ff,
            },
            gating,
            embd_scale: match fam.scale_embeddings {
                true => (n_embd as f32).sqrt(),
                false => 1.0,
            },
            attn_scale: (head_dim as f32).sqrt().recip(),
            sliding_window: None,
            rope_skip: None,
            residual_scale: 1.0,
            logit_scale: 1.0,
            attn_softcap: None,
            final_softcap: None,
            yarn,
            rope_mscale: rope.mscale,
            n_ctx_orig: rope.n_ctx_orig,
            attn_temperature: None,
            mixers: vec![Mixer::Attention; n_layer],
            attn_output_gate: false,
            rope_sections: None,
            route_before_attention: false,
            kv_shared_from: n_layer,
            v_norm: false,
            n_embd_per_layer: 0,
            ffn_sizes: per_layer_ff,
        };
        (fam.hyper)(f, a, &mut config)?;
        if config.dense_lead > 0
            && (config.dense_lead >= n_layer || !(1..=MAX_DIM).contains(&config.n_ff_dense))
        {
            return Err(ModelError::Corrupt(format!(
                "{} leading dense layers of {} neurons in a {n_layer}-layer mixture is not a valid layout",
                config.dense_lead, config.n_ff_dense
            )));
        }
        check_head_counts(f, a, &config)?;
        config.check_layer_shapes()?;
        Ok(config)
    }

    /// Whether layer `li` rotates Q and K.
    pub fn rope_in(&self, li: usize) -> bool {
        self.rope_skip.is_none_or(|skip| !skip.has(li))
    }

    /// Whether layer `li`'s FFN is a mixture of experts.
    pub fn has_experts(&self, li: usize) -> bool {
        self.n_expert > 0 && li >= self.dense_lead
    }

    /// Neurons of layer `li`'s FFN (of each expert, in a mixture layer).
    pub fn ffn_size(&self, li: usize) -> usize {
        if let Some(&n) = self.ffn_sizes.get(li) {
            return n;
        }
        match self.n_expert > 0 && !self.has_experts(li) {
            true => self.n_ff_dense,
            false => self.n_ff,
        }
    }

    /// How layer `li` mixes tokens.
    pub fn mixer(&self, li: usize) -> Mixer {
        self.mixers.get(li).copied().unwrap_or(Mixer::Attention)
    }

    /// Whether RoPE pair `i` (of `n_rot / 2`) rotates with the position: all do, except under
    /// interleaved M-RoPE (llama.cpp's `imrope`, text positions) those outside the temporal,
    /// height and width sections, whose position is 0.
    pub fn rope_pair_rotates(&self, i: usize) -> bool {
        let Some(s) = self.rope_sections else {
            return true;
        };
        let sector = i % s.iter().sum::<usize>().max(1);
        match sector % 3 {
            1 => sector < 3 * s[1],
            2 => sector < 3 * s[2],
            _ => sector < 3 * s[0],
        }
    }

    /// The window layer `li` attends to (`None`: the whole context).
    pub fn window(&self, li: usize) -> Option<usize> {
        self.sliding_window
            .filter(|w| !w.global.is_some_and(|g| g.has(li)))
            .map(|w| w.len)
    }

    /// Refuse mixture-of-experts models in `what`, which handles dense FFNs only.
    pub fn require_dense_ffn(&self, what: &str) -> Result<()> {
        if self.n_expert > 0 {
            return Err(ModelError::Unsupported(format!(
                "{what} of mixture-of-experts models ({} experts per layer) is not supported yet",
                self.n_expert
            )));
        }
        Ok(())
    }

    /// Layer `li`'s head shape: a sliding layer's own where the family gives one.
    pub fn heads(&self, li: usize) -> Heads {
        match self.sliding_window.and_then(|w| w.heads) {
            Some(h) if self.window(li).is_some() => h,
            _ => Heads {
                n_head_kv: self.n_head_kv,
                head_dim: self.head_dim,
                n_rot: self.n_rot,
            },
        }
    }

    /// Width of layer `li`'s Q projection output.
    pub fn q_dim(&self, li: usize) -> usize {
        self.n_head * self.heads(li).head_dim
    }

    /// Width of layer `li`'s K and V projection outputs.
    pub fn kv_dim(&self, li: usize) -> usize {
        let h = self.heads(li);
        h.n_head_kv * h.head_dim
    }

    /// The widest Q and K/V projection outputs of any layer.
    pub fn widest_qkv(&self) -> (usize, usize) {
        (0..self.n_layer).fold((0, 0), |(q, kv), li| {
            (q.max(self.q_dim(li)), kv.max(self.kv_dim(li)))
        })
    }

    /// The layer whose keys and values layer `li` attends to: its own, or for a layer that
    /// shares KV, the last layer of its kind (sliding or global) that computes them (llama.cpp's
    /// rule: the layer before the first sharing one if global, the one before that if sliding).
    pub fn kv_source(&self, li: usize) -> usize {
        match li < self.kv_shared_from {
            true => li,
            false => self.kv_shared_from - 1 - self.window(li).is_some() as usize,
        }
    }

    /// Shapes that would make the engine index past a buffer: refused at load.
    fn check_layer_shapes(&self) -> Result<()> {
        for li in 0..self.n_layer {
            let h = self.heads(li);
            if h.n_head_kv == 0
                || !self.n_head.is_multiple_of(h.n_head_kv)
                || h.head_dim == 0
                || h.head_dim > MAX_DIM
            {
                return Err(ModelError::Corrupt(format!(
                    "layer {li}: {} heads of size {} with {} KV heads is not a valid layout",
                    self.n_head, h.head_dim, h.n_head_kv
                )));
            }
            if h.n_rot > h.head_dim || !h.n_rot.is_multiple_of(2) {
                return Err(ModelError::Corrupt(format!(
                    "layer {li}: {} rotated dimensions in heads of {}",
                    h.n_rot, h.head_dim
                )));
            }
            let src = self.kv_source(li);
            let same_kind = self.window(src) == self.window(li) && self.heads(src) == h;
            if li >= self.kv_shared_from
                && (src >= li || !same_kind || self.mixer(src) != Mixer::Attention)
            {
                return Err(ModelError::Corrupt(format!(
                    "layer {li} shares the keys and values of layer {src}, which is not an attention layer of its kind"
                )));
            }
        }
        if !self.ffn_sizes.is_empty() && self.ffn_sizes.len() != self.n_layer {
            return Err(ModelError::Corrupt(format!(
                "{} FFN sizes for {} layers",
                self.ffn_sizes.len(),
                self.n_layer
            )));
        }
        if self.ffn_sizes.iter().any(|&n| n == 0 || n > MAX_DIM) {
            return Err(ModelError::Corrupt(format!(
                "FFN sizes {:?} are out of range",
                self.ffn_sizes
            )));
        }
        Ok(())
    }
}

/// Each layer's KV head count in the file (one count, or one per layer) must be the one its
/// shape says: 0 for a layer without attention (LFM2's convolutions), its heads' otherwise.
fn check_head_counts(f: &GgufFile, a: &str, c: &ModelConfig) -> Result<()> {
    let counts = mixer::head_counts_kv(f, a, c.n_layer)?;
    for (li, count) in counts.into_iter().enumerate() {
        let attends = c.mixer(li) == Mixer::Attention;
        let want = attends.then(|| c.heads(li).n_head_kv);
        match (count, want) {
            (None, _) => {}
            (Some(0), None) => {}
            (Some(0), Some(_)) => {
                return Err(ModelError::Unsupported(format!(
                    "layers without attention heads ({a}.attention.head_count_kv has zeros) in a `{a}` model"
                )))
            }
            (Some(n), Some(w)) if n == w => {}
            (Some(n), _) => {
                return Err(ModelError::Unsupported(format!(
                    "{a}.attention.head_count_kv gives layer {li} {n} KV heads: pi2 needs one count for the layers of each kind"
                )))
            }
        }
    }
    Ok(())
}

/// A model's FFN sizes: of its layers (of each expert, in a mixture; the widest where
/// `feed_forward_length` gives one per layer), of a mixture's shared expert (0: none), and of
/// each layer where they differ.
fn ffn_sizes(
    f: &GgufFile,
    fam: &Family,
    n_expert: usize,
    n_expert_used: usize,
) -> Result<(usize, usize, Vec<usize>)> {
    let a = fam.name;
    let k = |s: &str| format!("{a}.{s}");
    if let Some(items) = f.get(&k("feed_forward_length")).and_then(Value::as_array) {
        let sizes = mixer::per_layer_counts(items, &k("feed_forward_length"))?;
        let sizes: Vec<usize> = sizes
            .into_iter()
            .map(|n| n.min(MAX_DIM as u64 + 1) as usize)
            .collect();
        if n_expert > 0 || sizes.is_empty() {
            return Err(ModelError::Unsupported(format!(
                "{} as an array in a mixture of experts",
                k("feed_forward_length")
            )));
        }
        let widest = sizes.iter().copied().max().unwrap_or(0);
        let uniform = sizes.iter().all(|&n| n == widest);
        return Ok((widest, 0, if uniform { Vec::new() } else { sizes }));
    }
    // A mixture's experts have a size of their own where the family says so (llama.cpp:
    // the dense size over the experts used when the key is absent).
    let n_ff = match (n_expert > 0, f.get(&k("expert_feed_forward_length"))) {
        (true, Some(_)) => get_usize(f, &k("expert_feed_forward_length"))?,
        (true, None) if fam.expert_size_key => {
            get_usize(f, &k("feed_forward_length"))? / n_expert_used.max(1)
        }
        _ => get_usize(f, &k("feed_forward_length"))?,
    };
    // A shared expert's size (Qwen2-MoE, Qwen3.5-MoE): its key, else the dense size.
    let n_ff_shared = match (n_expert > 0, f.get(&k("expert_shared_feed_forward_length"))) {
        (true, Some(_)) => get_usize(f, &k("expert_shared_feed_forward_length"))?,
        (true, None) => get_usize_or(f, &k("feed_forward_length"), 0)?,
        (false, _) => 0,
    };
    if n_ff_shared > MAX_DIM {
        return Err(ModelError::Corrupt(format!(
            "{a}.expert_shared_feed_forward_length = {n_ff_shared} is out of range"
        )));
    }
    Ok((n_ff, n_ff_shared, Vec::new()))
}

/// A family's experts: how many, how many each token uses, and how they are weighted.
fn experts(f: &GgufFile, fam: &Family) -> Result<(usize, usize, Gating)> {
    let k = |s: &str| format!("{}.{s}", fam.name);
    let n_expert = get_usize_or(f, &k("expert_count"), 0)?;
    let n_expert_used = get_usize_or(f, &k("expert_used_count"), 0)?;
    if n_expert > 256 || (n_expert > 0 && !(1..=n_expert).contains(&n_expert_used)) {
        return Err(ModelError::Corrupt(format!(
            "{} = {n_expert} with {} = {n_expert_used} is not a valid expert layout",
            k("expert_count"),
            k("expert_used_count")
        )));
    }
    if fam.needs_experts && n_expert == 0 {
        return Err(ModelError::Corrupt(format!(
            "`{}` is a mixture of experts but {} is missing or 0",
            fam.name,
            k("expert_count")
        )));
    }
    // llama.cpp reads `expert_weights_scale` for none of these families (DeepSeek's and
    // others' read it): a file's key is ignored here as it is there.
    let scale = 1.0;
    let used = if n_expert > 0 { n_expert_used } else { 0 };
    let func = match fam.gate_key && n_expert > 0 {
        true => {
            let key = k("expert_gating_func");
            let id = get_usize(f, &key)? as u64;
            GateFunc::from_id(id).ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "{key} = {id}: pi2 gates experts by softmax (1), sigmoid (2) or softmax of the chosen (3)"
                ))
            })?
        }
        false => fam.gate,
    };
    let gating = Gating {
        func,
        renormalize: fam.renormalize_experts,
        scale,
    };
    Ok((n_expert, used, gating))
}

/// Layers the metadata does not count would be dropped without a word: refuse them.
fn check_layer_count(f: &GgufFile, n_layer: usize, key: &str) -> Result<()> {
    let beyond = f.tensors.iter().find_map(|t| {
        let li: usize = t
            .name
            .strip_prefix("blk.")?
            .split('.')
            .next()?
            .parse()
            .ok()?;
        (li >= n_layer).then_some(li)
    });
    match beyond {
        Some(li) => Err(ModelError::Corrupt(format!(
            "the file has tensors of layer {li} but `{key}` says {n_layer} layers"
        ))),
        None => Ok(()),
    }
}

/// Values that would silently turn every activation into NaN or garbage.
fn check_hyper_parameters(rms_eps: f32, rope_base: f32, rope_freq_scale: f32) -> Result<()> {
    let checks = [
        (
            "attention.layer_norm_rms_epsilon",
            rms_eps,
            rms_eps > 0.0 && rms_eps < 1.0,
        ),
        ("rope.freq_base", rope_base, rope_base > 1.0),
        (
            "rope scaling factor",
            rope_freq_scale.recip(),
            rope_freq_scale.is_finite() && rope_freq_scale > 0.0,
        ),
    ];
    if let Some((key, v, _)) = checks.iter().find(|c| !(c.1.is_finite() && c.2)) {
        return Err(ModelError::Corrupt(format!(
            "hyper-parameter `{key}` is {v}, which no model uses"
        )));
    }
    Ok(())
}
