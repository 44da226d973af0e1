//! Ministral 3 (`mistral3`, llama.cpp's `src/models/mistral3.cpp`): Llama's layers with YaRN
//! (`rope.scaling.yarn_log_multiplier` set) and Llama 4's attention temperature, the query at
//! position `p` multiplied by `1 + attention.temperature_scale * ln(floor(p / L) + 1)` with `L`
//! the context before extension (`rope.scaling.original_context_length`, required with it).

use super::family::{Family, QkNorm};
use super::{get_f32_or, get_usize_or, Arch, AttnTemperature, FfnAct, ModelConfig, RopeKind};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

pub const FAMILY: Family = Family {
    arch: Arch::Mistral3,
    name: "mistral3",
    features: "YaRN, attention temperature growing with position",
    rope: RopeKind::Norm,
    ffn_act: FfnAct::Silu,
    qkv_bias: false,
    qk_norm: QkNorm::None,
    needs_experts: false,
    expert_size_key: false,
    renormalize_experts: true,
    post_norms: false,
    scale_embeddings: false,
    hyper,
    ffn_norm: "ffn_norm.weight",
    sinks: false,
    biases: false,
};

fn hyper(f: &GgufFile, a: &str, c: &mut ModelConfig) -> Result<()> {
    if c.n_rot != c.head_dim {
        return Err(ModelError::Corrupt(format!(
            "{a}: RoPE turns {} of {} head dimensions; this family turns them all",
            c.n_rot, c.head_dim
        )));
    }
    if let Some(s) = set(f, &format!("{a}.attention.scale"))? {
        c.attn_scale = s;
    }
    let Some(scale) = set(f, &format!("{a}.attention.temperature_scale"))? else {
        return Ok(());
    };
    let length = get_usize_or(f, &format!("{a}.rope.scaling.original_context_length"), 0)?;
    if length == 0 {
        return Err(ModelError::MissingKey(format!(
            "{a}.rope.scaling.original_context_length (the attention temperature's length)"
        )));
    }
    c.attn_temperature = Some(AttnTemperature { scale, length });
    Ok(())
}

/// A positive value of `key`; absent or 0 (llama.cpp's "not set") is `None`.
fn set(f: &GgufFile, key: &str) -> Result<Option<f32>> {
    match get_f32_or(f, key, 0.0)? {
        0.0 => Ok(None),
        v if v.is_finite() && v > 0.0 => Ok(Some(v)),
        v => Err(ModelError::Corrupt(format!(
            "hyper-parameter `{key}` is {v}, which no model uses"
        ))),
    }
}
