//! Granite 3.x dense (`granite`, llama.cpp's `src/models/granite.cpp`): Llama's layers with four
//! scales: the embeddings (`embedding_scale`), the attention scores (`attention.scale`, else
//! one over the square root of the head size), each block's output as it joins the residual
//! stream (`residual_scale`) and the logits (divided by `logit_scale`, required). RoPE is off
//! when `rope.scaling.finetuned` is false.

use super::family::{Family, QkNorm};
use super::{positive_or_unset, Arch, EveryNth, FfnAct, GateFunc, ModelConfig, RopeKind};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};

pub const FAMILY: Family = Family {
    arch: Arch::Granite,
    name: "granite",
    features: "embedding, attention, residual and logit scales",
    rope: RopeKind::Norm,
    ffn_act: FfnAct::Silu,
    qkv_bias: false,
    qk_norm: QkNorm::None,
    needs_experts: false,
    expert_size_key: false,
    renormalize_experts: true,
    gate: GateFunc::Softmax,
    gate_key: false,
    post_norms: false,
    scale_embeddings: false,
    hyper,
    ffn_norm: "ffn_norm.weight",
    output_norm: "output_norm.weight",
    sinks: false,
    biases: false,
};

fn hyper(f: &GgufFile, a: &str, c: &mut ModelConfig) -> Result<()> {
    let logit_key = format!("{a}.logit_scale");
    if f.get(&logit_key).is_none() {
        return Err(ModelError::MissingKey(logit_key));
    }
    // A key at 0 means "not set" to llama.cpp.
    let set = |key: &str| positive_or_unset(f, &format!("{a}.{key}"));
    c.logit_scale = set("logit_scale")?.unwrap_or(1.0);
    c.residual_scale = set("residual_scale")?.unwrap_or(1.0);
    c.embd_scale = set("embedding_scale")?.unwrap_or(1.0);
    if let Some(s) = set("attention.scale")? {
        c.attn_scale = s;
    }
    if f.get(&format!("{a}.rope.scaling.finetuned"))
        .and_then(Value::as_bool)
        == Some(false)
    {
        c.rope_skip = Some(EveryNth::last_of(1));
    }
    Ok(())
}
