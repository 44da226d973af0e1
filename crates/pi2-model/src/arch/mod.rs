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
mod gpt_oss;
mod rope;
use rope::rope;
pub use rope::Yarn;
mod granite;
mod lfm2;
mod llama;
mod mistral3;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3moe;
mod smallthinker;
mod smollm3;

pub use family::{Family, QkNorm, FAMILIES};

use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};
use pi2_kernels::{MatRef, QuantType};

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
    /// Layers that mix tokens by a short convolution instead of attention (LFM2).
    pub short_conv: Option<ShortConv>,
    /// Routers read each layer's input before attention (un-normed) rather than the FFN's
    /// normed input (SmallThinker).
    pub route_before_attention: bool,
}

/// Short causal convolutions in place of attention (LFM2): each channel of `B * x` convolved
/// with its own `len` taps over the current and the `len - 1` previous positions.
#[derive(Clone, Debug, PartialEq)]
pub struct ShortConv {
    pub len: usize,
    /// Per layer: whether it convolves (otherwise it attends).
    pub layers: Vec<bool>,
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

/// The tensors of one transformer block.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: TensorView,
    pub wq: TensorView,
    pub wk: TensorView,
    pub wv: TensorView,
    pub bq: Option<TensorView>,
    pub bk: Option<TensorView>,
    pub bv: Option<TensorView>,
    /// RMS norms of Q and K before RoPE: of each head (Gemma 3, Qwen3; `head_dim` weights) or
    /// of each token's whole vector (OLMoE; `q_dim`/`kv_dim` weights).
    pub q_norm: Option<TensorView>,
    pub k_norm: Option<TensorView>,
    pub wo: TensorView,
    /// A convolution layer's taps (LFM2; `n_embd` rows of [`ShortConv::len`], oldest position
    /// first). Such a layer has no attention: `wq`, `wk` and `wv` hold its B, C and x
    /// projections and `wo` its output projection.
    pub conv: Option<TensorView>,
    /// RMS norm of the attention output before the residual add (Gemma).
    pub post_attn_norm: Option<TensorView>,
    pub ffn_norm: TensorView,
    /// RMS norm of the FFN output before the residual add (Gemma).
    pub post_ffn_norm: Option<TensorView>,
    /// FFN neurons: row i of gate and up, column i of down, form neuron i.
    pub gate: TensorView,
    pub up: TensorView,
    /// `ffn_down` (`n_embd` rows of `n_ff`), or in converted files `ffn_down_t`, stored
    /// transposed (`n_ff` rows of `n_embd`: neuron i's down column is row i).
    pub down: TensorView,
    pub down_transposed: bool,
    /// A converted file's copy of the source's `ffn_down` (in the source's neuron order), for
    /// layers that run dense.
    pub down_dense: Option<TensorView>,
    /// The attention output's bias (gpt-oss).
    pub bo: Option<TensorView>,
    /// Per head, the sink logit every query's softmax also counts (gpt-oss).
    pub sinks: Option<TensorView>,
    /// The router's bias, and each expert's gate, up and down biases (stacked: `n_expert`
    /// rows of `n_ff`, `n_ff` and `n_embd`) (gpt-oss).
    pub router_bias: Option<TensorView>,
    pub expert_biases: Option<[TensorView; 3]>,
    /// Mixture-of-experts layers: the router. `gate`, `up` and `down` then stack the experts
    /// (expert e owns rows `e*n_ff..(e+1)*n_ff` of gate and up, `e*n_embd..` of down, or
    /// `e*n_ff..` of a transposed down).
    pub router: Option<TensorView>,
    /// Added to each expert's probability for the choice only (`ffn_exp_probs_b`: DeepSeek-V3's
    /// rule, LFM2-MoE).
    pub expert_select_bias: Option<TensorView>,
}

/// All weight views of a model.
#[derive(Clone, Debug)]
pub struct Weights {
    pub token_embd: TensorView,
    pub output_norm: TensorView,
    /// The LM head; the token embedding when the model ties them.
    pub output: TensorView,
    pub tied_output: bool,
    /// Llama-3 style per-frequency RoPE divisors (`rope_freqs.weight`), if present.
    pub rope_freqs: Option<TensorView>,
    /// Phi-3's divisors for contexts up to `n_ctx_orig` and beyond it
    /// (`rope_factors_short`/`_long.weight`), if present.
    pub rope_short: Option<TensorView>,
    pub rope_long: Option<TensorView>,
    pub layers: Vec<LayerWeights>,
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
        // A mixture's experts have a size of their own where the family says so (llama.cpp:
        // the dense size over the experts used when the key is absent).
        let n_ff = match (n_expert > 0, f.get(&k("expert_feed_forward_length"))) {
            (true, Some(_)) => get_usize(f, &k("expert_feed_forward_length"))?,
            (true, None) if fam.expert_size_key => {
                get_usize(f, &k("feed_forward_length"))? / n_expert_used.max(1)
            }
            _ => get_usize(f, &k("feed_forward_length"))?,
        };
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
            short_conv: None,
            route_before_attention: false,
        };
        (fam.hyper)(f, a, &mut config)?;
        let free = attention_free_layers(f, a, n_layer)?;
        if free.iter().any(|&x| x) && config.short_conv.is_none() {
            return Err(ModelError::Unsupported(format!(
                "layers without attention heads ({a}.attention.head_count_kv has zeros) in a `{a}` model"
            )));
        }
        Ok(config)
    }

    /// Whether layer `li` rotates Q and K.
    pub fn rope_in(&self, li: usize) -> bool {
        self.rope_skip.is_none_or(|skip| !skip.has(li))
    }

    /// Whether layer `li` mixes tokens by a short convolution (see [`ShortConv`]) rather than
    /// attention.
    pub fn conv_layer(&self, li: usize) -> bool {
        (self.short_conv.as_ref()).is_some_and(|s| s.layers.get(li) == Some(&true))
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

    /// Width of the Q projection output.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the K and V projection outputs.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// KV heads: one count, or one per layer (LFM2) where every layer that attends has the same
/// count (0 marks a layer without attention, see [`attention_free_layers`]).
fn head_count_kv(f: &GgufFile, key: &str, n_head: usize) -> Result<usize> {
    let Some(items) = f.get(key).and_then(Value::as_array) else {
        return get_usize_or(f, key, n_head);
    };
    let counts: Vec<u64> = per_layer_counts(items, key)?;
    let mut nonzero = counts.iter().filter(|&&c| c > 0);
    let first = nonzero.next().copied().unwrap_or(0);
    if first == 0 || nonzero.any(|&c| c != first) {
        return Err(ModelError::Unsupported(format!(
            "{key} = {counts:?}: pi2 needs one KV head count for every layer that attends"
        )));
    }
    usize::try_from(first).map_err(|_| ModelError::Corrupt(format!("{key} is out of range")))
}

fn per_layer_counts(items: &[Value], key: &str) -> Result<Vec<u64>> {
    items
        .iter()
        .map(|v| {
            v.as_u64().ok_or(ModelError::WrongKeyType {
                key: key.into(),
                expected: "array of unsigned integers",
                got: v.type_name(),
            })
        })
        .collect()
}

/// Per layer, whether `{a}.attention.head_count_kv` gives it no KV heads (a per-layer array
/// with zeros: LFM2's convolution layers); a single count: none.
pub(crate) fn attention_free_layers(f: &GgufFile, a: &str, n_layer: usize) -> Result<Vec<bool>> {
    let key = format!("{a}.attention.head_count_kv");
    let Some(items) = f.get(&key).and_then(Value::as_array) else {
        return Ok(vec![false; n_layer]);
    };
    if items.len() != n_layer {
        return Err(ModelError::Corrupt(format!(
            "{key} has {} entries for {n_layer} layers",
            items.len()
        )));
    }
    Ok(per_layer_counts(items, &key)?
        .iter()
        .map(|&c| c == 0)
        .collect())
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

/// Look up `name` and check its GGML dims (`[cols]` or `[cols, rows]`) and type.
/// A layer's Q, K and V projections: three tensors, or the row ranges of a fused `attn_qkv`
/// (Phi-3; llama.cpp takes either for every family).
fn qkv(f: &GgufFile, c: &ModelConfig, n: &dyn Fn(&str) -> String) -> Result<[TensorView; 3]> {
    let (q, kv) = (c.q_dim(), c.kv_dim());
    match optional(view(f, &n("attn_qkv.weight"), &[c.n_embd, q + 2 * kv]))? {
        Some(fused) => Ok(fused.split(&[q, kv, kv]).try_into().expect("three parts")),
        None => Ok([
            view(f, &n("attn_q.weight"), &[c.n_embd, q])?,
            view(f, &n("attn_k.weight"), &[c.n_embd, kv])?,
            view(f, &n("attn_v.weight"), &[c.n_embd, kv])?,
        ]),
    }
}

/// A convolution layer's B, C and x projections (the row blocks of `shortconv.in_proj`), its
/// output projection and its taps (LFM2).
fn short_conv(
    f: &GgufFile,
    c: &ModelConfig,
    n: &dyn Fn(&str) -> String,
) -> Result<([TensorView; 3], TensorView, Option<TensorView>)> {
    let d = c.n_embd;
    let taps = c.short_conv.as_ref().map_or(0, |s| s.len);
    let conv = f32_rows(f, &n("shortconv.conv.weight"), [taps, d])?;
    let input = view(f, &n("shortconv.in_proj.weight"), &[d, 3 * d])?;
    let out = view(f, &n("shortconv.out_proj.weight"), &[d, d])?;
    let bcx = input.split(&[d, d, d]).try_into().expect("three parts");
    Ok((bcx, out, Some(conv)))
}

/// A dense layer's gate and up projections fused in one `ffn_up` of twice the rows, gate
/// first (Phi-3's `swiglu` of a fused up), when the layer has no `ffn_gate`.
fn fused_up(
    f: &GgufFile,
    c: &ModelConfig,
    n: &dyn Fn(&str) -> String,
) -> Result<Option<[TensorView; 2]>> {
    let dims = [c.n_embd, 2 * c.n_ff];
    let fused = f
        .tensor(&n("ffn_up.weight"))
        .is_some_and(|t| t.dims.iter().map(|&d| d as usize).eq(dims));
    if c.n_expert > 0 || f.tensor_position(&n("ffn_gate.weight")).is_some() || !fused {
        return Ok(None);
    }
    let v = view(f, &n("ffn_up.weight"), &dims)?;
    Ok(Some(
        v.split(&[c.n_ff, c.n_ff]).try_into().expect("two parts"),
    ))
}

fn view(f: &GgufFile, name: &str, dims: &[usize]) -> Result<TensorView> {
    let index = f
        .tensor_position(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    let t = &f.tensors[index];
    let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    if t.dims != want {
        return Err(ModelError::TensorShape {
            name: name.into(),
            expected: want,
            got: t.dims.clone(),
        });
    }
    let ty =
        QuantType::from_ggml_id(t.ggml_type).ok_or_else(|| ModelError::UnsupportedTensorType {
            name: name.into(),
            ty: t.type_name().into(),
        })?;
    let (cols, rows) = (dims[0], dims[1..].iter().product::<usize>());
    MatRef::new(ty, rows, cols, f.tensor_data(t))
        .map_err(|e| ModelError::Corrupt(format!("tensor `{name}`: {e}")))?;
    Ok(TensorView {
        name: name.into(),
        ty,
        rows,
        cols,
        index,
        first_row: 0,
    })
}

/// A vector tensor that the engine reads as plain f32 (norms, biases).
fn f32_view(f: &GgufFile, name: &str, len: usize) -> Result<TensorView> {
    let v = view(f, name, &[len])?;
    if v.ty != QuantType::F32 {
        return Err(ModelError::Unsupported(format!(
            "tensor `{name}` must be F32, found {}",
            v.ty
        )));
    }
    Ok(v)
}

/// Rows of f32 vectors (a bias per expert): GGML dims `[len, rows]`.
fn f32_rows(f: &GgufFile, name: &str, dims: [usize; 2]) -> Result<TensorView> {
    let v = view(f, name, &dims)?;
    if v.ty != QuantType::F32 {
        return Err(ModelError::Unsupported(format!(
            "tensor `{name}` must be F32, found {}",
            v.ty
        )));
    }
    Ok(v)
}

fn optional<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(ModelError::MissingTensor(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

impl Weights {
    /// The RoPE divisors for a context of `n_ctx` tokens: Llama 3's, or Phi-3's short or long
    /// ones (long past the context before extension, as llama.cpp chooses them).
    pub fn rope_factors(&self, c: &ModelConfig, n_ctx: usize) -> Option<&TensorView> {
        self.rope_freqs.as_ref().or(match n_ctx > c.n_ctx_orig {
            true => self.rope_long.as_ref(),
            false => self.rope_short.as_ref(),
        })
    }

    /// Find and check every tensor the architecture needs.
    pub fn from_gguf(f: &GgufFile, c: &ModelConfig) -> Result<Self> {
        let token_embd = view(f, "token_embd.weight", &[c.n_embd, c.n_vocab])?;
        let output_norm = f32_view(f, c.arch.family().output_norm, c.n_embd)?;
        let (output, tied_output) =
            match optional(view(f, "output.weight", &[c.n_embd, c.n_vocab]))? {
                Some(o) => (o, false),
                None => (token_embd.clone(), true),
            };
        let rope_freqs = optional(f32_view(f, "rope_freqs.weight", c.n_rot / 2))?;
        let rope_short = optional(f32_view(f, "rope_factors_short.weight", c.n_rot / 2))?;
        let rope_long = optional(f32_view(f, "rope_factors_long.weight", c.n_rot / 2))?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            let fam = c.arch.family();
            // A family's extra norms: required where it has them, never read elsewhere.
            let norm_if = |has: bool, name: &str, len| -> Result<Option<TensorView>> {
                match has {
                    true => f32_view(f, &n(name), len).map(Some),
                    false => Ok(None),
                }
            };
            let attends = !c.conv_layer(i);
            // Q and K norms: per head (one head's weights), or over each token's whole vector.
            let qk_norm = |name: &str, whole: usize| match fam.qk_norm {
                _ if !attends => Ok(None),
                QkNorm::None => Ok(None),
                QkNorm::PerHead => norm_if(true, name, c.head_dim),
                QkNorm::Whole => norm_if(true, name, whole),
            };
            let bias = |s: &str, len| -> Result<Option<TensorView>> {
                let b = optional(f32_view(f, &n(s), len))?;
                if fam.qkv_bias && b.is_none() {
                    return Err(ModelError::MissingTensor(n(s)));
                }
                Ok(b)
            };
            // Looked up after the other tensors (struct fields evaluate in order), so a missing
            // layer reports its first tensor.
            let down = || -> Result<(TensorView, bool)> {
                if c.n_expert > 0 {
                    let dims = [c.n_ff, c.n_embd, c.n_expert];
                    if let Some(d) = optional(view(f, &n("ffn_down_exps.weight"), &dims))? {
                        return Ok((d, false));
                    }
                    // Converted files: each expert's down matrix transposed (neuron i = row i).
                    let dims = [c.n_embd, c.n_ff, c.n_expert];
                    return match optional(view(f, &n("ffn_down_t_exps.weight"), &dims))? {
                        Some(d) => Ok((d, true)),
                        None => Err(ModelError::MissingTensor(n("ffn_down_exps.weight"))),
                    };
                }
                // A converted file's transposed rows first (it may keep the source's too).
                match optional(view(f, &n("ffn_down_t.weight"), &[c.n_embd, c.n_ff]))? {
                    Some(d) => Ok((d, true)),
                    None => match optional(view(f, &n("ffn_down.weight"), &[c.n_ff, c.n_embd]))? {
                        Some(d) => Ok((d, false)),
                        None => Err(ModelError::MissingTensor(n("ffn_down.weight"))),
                    },
                }
            };
            let down_transposed: bool;
            // Stacked expert tensors (`*_exps`), as llama.cpp writes Mixtral since 2024.
            let (ffn, ffn_dims) = if c.n_expert > 0 {
                ("_exps", vec![c.n_embd, c.n_ff, c.n_expert])
            } else {
                ("", vec![c.n_embd, c.n_ff])
            };
            let attn_norm = f32_view(f, &n("attn_norm.weight"), c.n_embd)?;
            let ([wq, wk, wv], wo, conv) = match attends {
                true => (
                    qkv(f, c, &n)?,
                    view(f, &n("attn_output.weight"), &[c.q_dim(), c.n_embd])?,
                    None,
                ),
                false => short_conv(f, c, &n)?,
            };
            let fused = fused_up(f, c, &n)?;
            layers.push(LayerWeights {
                attn_norm,
                wq,
                wk,
                wv,
                bq: bias("attn_q.bias", c.q_dim())?,
                bk: bias("attn_k.bias", c.kv_dim())?,
                bv: bias("attn_v.bias", c.kv_dim())?,
                q_norm: qk_norm("attn_q_norm.weight", c.q_dim())?,
                k_norm: qk_norm("attn_k_norm.weight", c.kv_dim())?,
                wo,
                conv,
                post_attn_norm: norm_if(fam.post_norms, "post_attention_norm.weight", c.n_embd)?,
                ffn_norm: f32_view(f, &n(fam.ffn_norm), c.n_embd)?,
                post_ffn_norm: norm_if(fam.post_norms, "post_ffw_norm.weight", c.n_embd)?,
                gate: match &fused {
                    Some([g, _]) => g.clone(),
                    None => view(f, &n(&format!("ffn_gate{ffn}.weight")), &ffn_dims)?,
                },
                up: match fused {
                    Some([_, u]) => u,
                    None => view(f, &n(&format!("ffn_up{ffn}.weight")), &ffn_dims)?,
                },
                down: {
                    let (d, t) = down()?;
                    down_transposed = t;
                    d
                },
                down_transposed,
                down_dense: match down_transposed && c.n_expert == 0 {
                    true => optional(view(f, &n("ffn_down.weight"), &[c.n_ff, c.n_embd]))?,
                    false => None,
                },
                router: if c.n_expert > 0 {
                    Some(view(f, &n("ffn_gate_inp.weight"), &[c.n_embd, c.n_expert])?)
                } else {
                    None
                },
                bo: norm_if(fam.biases, "attn_output.bias", c.n_embd)?,
                sinks: norm_if(fam.sinks, "attn_sinks.weight", c.n_head)?,
                router_bias: norm_if(fam.biases, "ffn_gate_inp.bias", c.n_expert)?,
                expert_select_bias: match c.n_expert > 0 {
                    true => optional(f32_view(f, &n("ffn_exp_probs_b.bias"), c.n_expert))?,
                    false => None,
                },
                expert_biases: match fam.biases {
                    true => Some([
                        f32_rows(f, &n("ffn_gate_exps.bias"), [c.n_ff, c.n_expert])?,
                        f32_rows(f, &n("ffn_up_exps.bias"), [c.n_ff, c.n_expert])?,
                        f32_rows(f, &n("ffn_down_exps.bias"), [c.n_embd, c.n_expert])?,
                    ]),
                    false => None,
                },
            });
        }
        Ok(Self {
            token_embd,
            output_norm,
            output,
            tied_output,
            rope_freqs,
            rope_short,
            rope_long,
            layers,
        })
    }
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
