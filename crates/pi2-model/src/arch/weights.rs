//! The weights of a model as views of its file: every tensor a family needs, found and checked
//! for shape and type at load.

use super::{DeltaNet, Mixer, ModelConfig, QkNorm, TensorView};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use pi2_kernels::{MatRef, QuantType};

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
    /// A convolution layer's taps (LFM2; `n_embd` rows of its taps, oldest position first).
    /// Such a layer has no attention: `wq`, `wk` and `wv` hold its B, C and x projections and
    /// `wo` its output projection.
    pub conv: Option<TensorView>,
    /// A gated delta net layer's own tensors (Qwen3.5). Such a layer has no attention: `wq`
    /// holds its Q, K and V projection (`attn_qkv`, before the convolution), `wk` its output
    /// gate (`attn_gate`), `wv` its beta projection (`ssm_beta`) and `wo` its output
    /// projection (`ssm_out`).
    pub delta: Option<DeltaWeights>,
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
    /// Added to each expert's probability for the choice only (`exp_probs_b`: DeepSeek-V3's
    /// rule, LFM2-MoE).
    pub expert_select_bias: Option<TensorView>,
    /// A mixture layer's shared expert, which every token runs beside its chosen ones
    /// (Qwen2-MoE, Qwen3.5-MoE).
    pub shared: Option<SharedExpert>,
    /// The layer's output (its residual stream) is multiplied by this one value (Gemma 4).
    pub out_scale: Option<TensorView>,
    /// A mixture layer whose experts and dense FFN (its `shared`) each have their own norms
    /// (Gemma 4).
    pub expert_norms: Option<ExpertNorms>,
    /// Each expert's output is multiplied by its value (`ffn_down_exps.scale`, Gemma 4).
    pub expert_scale: Option<TensorView>,
    /// How the layer adds its slice of the token's per-layer input (Gemma 4).
    pub per_layer: Option<PerLayerGate>,
}

/// Gemma 4's mixture layer: the experts' input is the stream normed by `pre_experts`, their
/// weighted sum normed by `post_experts`; the dense FFN beside them (the layer's `shared`) reads
/// the stream normed by `ffn_norm`, its output normed by `post_dense`; the two outputs are
/// summed (then the layer's post-FFN norm). The router reads the stream RMS-normed, divided by
/// sqrt(n_embd) and multiplied by `router_scale`.
#[derive(Clone, Debug)]
pub struct ExpertNorms {
    pub pre_experts: TensorView,
    pub post_experts: TensorView,
    pub post_dense: TensorView,
    pub router_scale: TensorView,
}

fn expert_norms(
    f: &GgufFile,
    c: &ModelConfig,
    moe: bool,
    n: &dyn Fn(&str) -> String,
) -> Result<Option<ExpertNorms>> {
    if !moe || f.tensor_position(&n("pre_ffw_norm_2.weight")).is_none() {
        return Ok(None);
    }
    let d = c.n_embd;
    Ok(Some(ExpertNorms {
        pre_experts: f32_view(f, &n("pre_ffw_norm_2.weight"), d)?,
        post_experts: f32_view(f, &n("post_ffw_norm_2.weight"), d)?,
        post_dense: f32_view(f, &n("post_ffw_norm_1.weight"), d)?,
        router_scale: f32_view(f, &n("ffn_gate_inp.scale"), d)?,
    }))
}

/// A layer's use of its per-layer input `p` (`n_embd_per_layer` wide): after the FFN, the
/// stream `x` gets `post_norm(proj(gelu(inp_gate x) * p))` added.
#[derive(Clone, Debug)]
pub struct PerLayerGate {
    pub inp_gate: TensorView,
    pub proj: TensorView,
    pub post_norm: TensorView,
}

/// Per-layer token embeddings (Gemma 4): for token `t`, layer `l`'s input is
/// `(rms_norm(model_proj e / sqrt(n_embd))_l * proj_norm + token_embd[t]_l * sqrt(w)) / sqrt(2)`
/// with `e` the scaled embedding, `w` the slice width and `_l` layer `l`'s slice.
#[derive(Clone, Debug)]
pub struct PerLayerInput {
    /// A row of `n_layer` slices per token.
    pub token_embd: TensorView,
    pub model_proj: TensorView,
    pub proj_norm: TensorView,
}

/// An expert every token runs (`ffn_{gate,up,down}_shexp`, `n_ff_shared` neurons), its output
/// scaled by the sigmoid of the token's dot product with `gate_inp` (`ffn_gate_inp_shexp`)
/// when the layer has one.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    pub gate: TensorView,
    pub up: TensorView,
    pub down: TensorView,
    pub gate_inp: Option<TensorView>,
}

/// The tensors of a gated delta net layer besides its four projections (see
/// [`LayerWeights::delta`]).
#[derive(Clone, Debug)]
pub struct DeltaWeights {
    /// Per value head, the decay's input projection (`ssm_alpha`, `n_embd` wide), its bias
    /// (`ssm_dt.bias`) and factor (`ssm_a`: `-exp(A_log)`).
    pub alpha: TensorView,
    pub dt_bias: TensorView,
    pub a: TensorView,
    /// The convolution's taps over Q, K and V (`conv_dim` rows of `taps`).
    pub conv: TensorView,
    /// The output's RMS norm (one head's weights), gated by SiLU of `wk`'s output.
    pub norm: TensorView,
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
    /// Per-layer token embeddings, where the model has them.
    pub per_layer: Option<PerLayerInput>,
    pub layers: Vec<LayerWeights>,
}

fn per_layer_input(f: &GgufFile, c: &ModelConfig) -> Result<Option<PerLayerInput>> {
    let w = c.n_embd_per_layer * c.n_layer;
    if c.n_embd_per_layer == 0 {
        return Ok(None);
    }
    Ok(Some(PerLayerInput {
        token_embd: view(f, "per_layer_token_embd.weight", &[w, c.n_vocab])?,
        model_proj: view(f, "per_layer_model_proj.weight", &[c.n_embd, w])?,
        proj_norm: f32_view(f, "per_layer_proj_norm.weight", c.n_embd_per_layer)?,
    }))
}

fn per_layer_gate(
    f: &GgufFile,
    c: &ModelConfig,
    n: &dyn Fn(&str) -> String,
) -> Result<Option<PerLayerGate>> {
    let (d, w) = (c.n_embd, c.n_embd_per_layer);
    if w == 0 {
        return Ok(None);
    }
    Ok(Some(PerLayerGate {
        inp_gate: view(f, &n("inp_gate.weight"), &[d, w])?,
        proj: view(f, &n("proj.weight"), &[w, d])?,
        post_norm: f32_view(f, &n("post_norm.weight"), d)?,
    }))
}

/// A layer's Q, K and V projections: three tensors, or the row ranges of a fused `attn_qkv`
/// (Phi-3; llama.cpp takes either for every family). Without `attn_v`, the values are the keys'
/// projection (Gemma 4's `attention_k_eq_v`); a layer that shares another's keys and values may
/// lack both (its `wk` and `wv` are then its `wq`, never multiplied: see
/// [`ModelConfig::kv_source`]).
fn qkv(
    f: &GgufFile,
    c: &ModelConfig,
    li: usize,
    n: &dyn Fn(&str) -> String,
) -> Result<[TensorView; 3]> {
    // With an output gate, each head's Q rows are followed by as many gate rows.
    let q = c.q_dim(li) * (1 + c.attn_output_gate as usize);
    let kv = c.kv_dim(li);
    if let Some(fused) = optional(view(f, &n("attn_qkv.weight"), &[c.n_embd, q + 2 * kv]))? {
        return Ok(fused.split(&[q, kv, kv]).try_into().expect("three parts"));
    }
    let wq = view(f, &n("attn_q.weight"), &[c.n_embd, q])?;
    let wk = view(f, &n("attn_k.weight"), &[c.n_embd, kv]);
    let wk = match c.kv_source(li) != li {
        true => optional(wk)?.unwrap_or_else(|| wq.clone()),
        false => wk?,
    };
    let wv = optional(view(f, &n("attn_v.weight"), &[c.n_embd, kv]))?.unwrap_or_else(|| wk.clone());
    Ok([wq, wk, wv])
}

/// A layer's token mixer: its four projections (see [`LayerWeights`]) and, for a convolution
/// or a delta net, its own tensors.
struct MixerTensors {
    w: [TensorView; 3],
    wo: TensorView,
    conv: Option<TensorView>,
    delta: Option<DeltaWeights>,
}

fn mixer(
    f: &GgufFile,
    c: &ModelConfig,
    li: usize,
    n: &dyn Fn(&str) -> String,
) -> Result<MixerTensors> {
    let d = c.n_embd;
    match c.mixer(li) {
        Mixer::Attention => Ok(MixerTensors {
            w: qkv(f, c, li, n)?,
            wo: view(f, &n("attn_output.weight"), &[c.q_dim(li), d])?,
            conv: None,
            delta: None,
        }),
        Mixer::ShortConv { taps } => {
            let conv = f32_rows(f, &n("shortconv.conv.weight"), [taps, d])?;
            let input = view(f, &n("shortconv.in_proj.weight"), &[d, 3 * d])?;
            Ok(MixerTensors {
                w: input.split(&[d, d, d]).try_into().expect("three parts"),
                wo: view(f, &n("shortconv.out_proj.weight"), &[d, d])?,
                conv: Some(conv),
                delta: None,
            })
        }
        Mixer::DeltaNet(dn) => delta_net(f, c, dn, n),
    }
}

fn delta_net(
    f: &GgufFile,
    c: &ModelConfig,
    dn: DeltaNet,
    n: &dyn Fn(&str) -> String,
) -> Result<MixerTensors> {
    let (d, hv) = (c.n_embd, dn.v_heads);
    Ok(MixerTensors {
        w: [
            view(f, &n("attn_qkv.weight"), &[d, dn.conv_dim()])?,
            view(f, &n("attn_gate.weight"), &[d, dn.value_dim()])?,
            view(f, &n("ssm_beta.weight"), &[d, hv])?,
        ],
        wo: view(f, &n("ssm_out.weight"), &[dn.value_dim(), d])?,
        conv: None,
        delta: Some(DeltaWeights {
            alpha: view(f, &n("ssm_alpha.weight"), &[d, hv])?,
            dt_bias: f32_view(f, &n("ssm_dt.bias"), hv)?,
            a: f32_view(f, &n("ssm_a"), hv)?,
            conv: f32_rows(f, &n("ssm_conv1d.weight"), [dn.taps, dn.conv_dim()])?,
            norm: f32_view(f, &n("ssm_norm.weight"), dn.head_dim)?,
        }),
    })
}

/// A layer's down projection: a mixture's stacked experts, a converted file's transposed rows
/// (neuron i = row i), or the source's `ffn_down`; and whether it is transposed.
fn ffn_down(
    f: &GgufFile,
    c: &ModelConfig,
    moe: bool,
    ff: usize,
    n: &dyn Fn(&str) -> String,
) -> Result<(TensorView, bool)> {
    if moe {
        let dims = [c.n_ff, c.n_embd, c.n_expert];
        if let Some(d) = optional(view(f, &n("ffn_down_exps.weight"), &dims))? {
            return Ok((d, false));
        }
        let dims = [c.n_embd, c.n_ff, c.n_expert];
        return match optional(view(f, &n("ffn_down_t_exps.weight"), &dims))? {
            Some(d) => Ok((d, true)),
            None => Err(ModelError::MissingTensor(n("ffn_down_exps.weight"))),
        };
    }
    // A converted file's transposed rows first (it may keep the source's too).
    match optional(view(f, &n("ffn_down_t.weight"), &[c.n_embd, ff]))? {
        Some(d) => Ok((d, true)),
        None => match optional(view(f, &n("ffn_down.weight"), &[ff, c.n_embd]))? {
            Some(d) => Ok((d, false)),
            None => Err(ModelError::MissingTensor(n("ffn_down.weight"))),
        },
    }
}

/// A mixture layer's shared expert, when the file has one; a fused `ffn_gate_up_exps` is refused
/// by name (pi2 reads gate and up apart).
fn shared_expert(
    f: &GgufFile,
    c: &ModelConfig,
    moe: bool,
    n: &dyn Fn(&str) -> String,
) -> Result<Option<SharedExpert>> {
    if !moe {
        return Ok(None);
    }
    if f.tensor_position(&n("ffn_gate_up_exps.weight")).is_some() {
        return Err(ModelError::Unsupported(format!(
            "`{}`: experts with gate and up fused in one tensor (re-convert with separate ffn_gate_exps and ffn_up_exps)",
            n("ffn_gate_up_exps.weight")
        )));
    }
    for scaled in [
        "ffn_gate_shexp.scale",
        "ffn_up_shexp.scale",
        "ffn_down_shexp.scale",
        "ffn_gate_exps.scale",
        "ffn_up_exps.scale",
    ] {
        if f.tensor_position(&n(scaled)).is_some() {
            return Err(ModelError::Unsupported(format!(
                "`{}`: per-tensor or per-expert weight scales other than the experts' down scale",
                n(scaled)
            )));
        }
    }
    let (d, ff) = (c.n_embd, c.n_ff_shared);
    // Gemma 4: a dense FFN of its own beside the experts, under the plain names.
    if f.tensor_position(&n("pre_ffw_norm_2.weight")).is_some() {
        return Ok(Some(SharedExpert {
            gate: view(f, &n("ffn_gate.weight"), &[d, ff])?,
            up: view(f, &n("ffn_up.weight"), &[d, ff])?,
            down: view(f, &n("ffn_down.weight"), &[ff, d])?,
            gate_inp: None,
        }));
    }
    let Some(up) = optional(view(f, &n("ffn_up_shexp.weight"), &[d, ff]))? else {
        return Ok(None);
    };
    Ok(Some(SharedExpert {
        gate: view(f, &n("ffn_gate_shexp.weight"), &[d, ff])?,
        up,
        down: view(f, &n("ffn_down_shexp.weight"), &[ff, d])?,
        gate_inp: optional(f32_view(f, &n("ffn_gate_inp_shexp.weight"), d))?,
    }))
}

/// A dense layer's gate and up projections fused in one `ffn_up` of twice the rows, gate
/// first (Phi-3's `swiglu` of a fused up), when the layer has no `ffn_gate`.
fn fused_up(
    f: &GgufFile,
    c: &ModelConfig,
    moe: bool,
    ff: usize,
    n: &dyn Fn(&str) -> String,
) -> Result<Option<[TensorView; 2]>> {
    let dims = [c.n_embd, 2 * ff];
    let fused = f
        .tensor(&n("ffn_up.weight"))
        .is_some_and(|t| t.dims.iter().map(|&d| d as usize).eq(dims));
    if moe || f.tensor_position(&n("ffn_gate.weight")).is_some() || !fused {
        return Ok(None);
    }
    let v = view(f, &n("ffn_up.weight"), &dims)?;
    Ok(Some(v.split(&[ff, ff]).try_into().expect("two parts")))
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
            let attends = c.mixer(i) == Mixer::Attention;
            // A mixture's leading layers may be dense, of their own size.
            let (moe, ff) = (c.has_experts(i), c.ffn_size(i));
            // Q and K norms: per head (one head's weights), or over each token's whole vector.
            let qk_norm = |name: &str, whole: usize| match fam.qk_norm {
                _ if !attends => Ok(None),
                QkNorm::None => Ok(None),
                QkNorm::PerHead => norm_if(true, name, c.heads(i).head_dim),
                QkNorm::Whole => norm_if(true, name, whole),
            };
            let bias = |s: &str, len| -> Result<Option<TensorView>> {
                let b = optional(f32_view(f, &n(s), len))?;
                if fam.qkv_bias && b.is_none() {
                    return Err(ModelError::MissingTensor(n(s)));
                }
                Ok(b)
            };
            let down_transposed: bool;
            // Stacked expert tensors (`*_exps`), as llama.cpp writes Mixtral since 2024.
            let (ffn, ffn_dims) = if moe {
                ("_exps", vec![c.n_embd, c.n_ff, c.n_expert])
            } else {
                ("", vec![c.n_embd, ff])
            };
            let attn_norm = f32_view(f, &n("attn_norm.weight"), c.n_embd)?;
            let MixerTensors {
                w: [wq, wk, wv],
                wo,
                conv,
                delta,
            } = mixer(f, c, i, &n)?;
            let fused = fused_up(f, c, moe, ff, &n)?;
            layers.push(LayerWeights {
                attn_norm,
                wq,
                wk,
                wv,
                bq: bias("attn_q.bias", c.q_dim(i))?,
                bk: bias("attn_k.bias", c.kv_dim(i))?,
                bv: bias("attn_v.bias", c.kv_dim(i))?,
                q_norm: qk_norm("attn_q_norm.weight", c.q_dim(i))?,
                // A layer that shares another's keys norms none.
                k_norm: match c.kv_source(i) == i {
                    true => qk_norm("attn_k_norm.weight", c.kv_dim(i))?,
                    false => None,
                },
                wo,
                conv,
                delta,
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
                // Looked up after the other tensors (struct fields evaluate in order), so a
                // missing layer reports its first tensor.
                down: {
                    let (d, t) = ffn_down(f, c, moe, ff, &n)?;
                    down_transposed = t;
                    d
                },
                down_transposed,
                down_dense: match down_transposed && !moe {
                    true => optional(view(f, &n("ffn_down.weight"), &[ff, c.n_embd]))?,
                    false => None,
                },
                router: if moe {
                    Some(view(f, &n("ffn_gate_inp.weight"), &[c.n_embd, c.n_expert])?)
                } else {
                    None
                },
                bo: norm_if(fam.biases, "attn_output.bias", c.n_embd)?,
                sinks: norm_if(fam.sinks, "attn_sinks.weight", c.n_head)?,
                router_bias: norm_if(fam.biases && moe, "ffn_gate_inp.bias", c.n_expert)?,
                shared: shared_expert(f, c, moe, &n)?,
                expert_select_bias: match moe {
                    true => optional(f32_view(f, &n("exp_probs_b.bias"), c.n_expert))?,
                    false => None,
                },
                out_scale: optional(f32_view(f, &n("layer_output_scale.weight"), 1))?,
                expert_norms: expert_norms(f, c, moe, &n)?,
                expert_scale: match moe {
                    true => optional(f32_view(f, &n("ffn_down_exps.scale"), c.n_expert))?,
                    false => None,
                },
                per_layer: per_layer_gate(f, c, &n)?,
                expert_biases: match fam.biases && moe {
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
            per_layer: per_layer_input(f, c)?,
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
