//! Gemma 2 (`gemma2`, llama.cpp's `src/models/gemma2.cpp`): GeGLU; norms after attention and
//! FFN too; embeddings scaled by sqrt(width); every other layer attends to a window (4096 tokens
//! unless `attention.sliding_window` says) with the global RoPE base (or `rope.freq_base_swa`);
//! attention scores and final logits soft-capped (`attn_logit_softcapping`, 50, and
//! `final_logit_softcapping`, 30, when absent); the 27B's query scale; output tied to the
//! embeddings.

use super::family::{Family, QkNorm};
use super::{get_f32_or, Arch, FfnAct, GateFunc, ModelConfig, RopeKind};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

pub const FAMILY: Family = Family {
    arch: Arch::Gemma2,
    name: "gemma2",
    features: "GeGLU, post-norms, scaled embeddings, alternating sliding windows, soft-capped attention and logits",
    rope: RopeKind::Neox,
    ffn_act: FfnAct::Gelu,
    qkv_bias: false,
    qk_norm: QkNorm::None,
    needs_experts: false,
    expert_size_key: false,
    renormalize_experts: true,
    gate: GateFunc::Softmax,
    gate_key: false,
    post_norms: true,
    scale_embeddings: true,
    hyper,
    ffn_norm: "ffn_norm.weight",
    output_norm: "output_norm.weight",
    sinks: false,
    biases: false,
};

fn hyper(f: &GgufFile, a: &str, c: &mut ModelConfig) -> Result<()> {
    let swa_base = get_f32_or(f, &format!("{a}.rope.freq_base_swa"), c.rope_base)?;
    c.sliding_window = Some(super::gemma3::sliding_window(
        f,
        a,
        Some(4096),
        2,
        swa_base,
    )?);
    if c.n_layer == 46 {
        c.attn_scale = ((c.n_embd / c.n_head) as f32).sqrt().recip();
    }
    let cap = |key: &str, default: f32| -> Result<f32> {
        match get_f32_or(f, &format!("{a}.{key}"), default)? {
            v if v.is_finite() && v > 0.0 => Ok(v),
            v => Err(ModelError::Corrupt(format!(
                "hyper-parameter `{a}.{key}` is {v}, which no model uses"
            ))),
        }
    };
    c.attn_softcap = Some(cap("attn_logit_softcapping", 50.0)?);
    c.final_softcap = Some(cap("final_logit_softcapping", 30.0)?);
    Ok(())
}
