//! Ministral 3 (`mistral3`, llama.cpp's `src/models/mistral3.cpp`): Llama's layers with YaRN
//! (`rope.scaling.yarn_log_multiplier` set) and Llama 4's attention temperature, the query at
//! position `p` multiplied by `1 + attention.temperature_scale * ln(floor(p / L) + 1)` with `L`
//! the context before extension (`rope.scaling.original_context_length`, required with it).

use super::family::{Family, QkNorm};
use super::{
    get_usize_or, positive_or_unset, Arch, AttnTemperature, FfnAct, GateFunc, ModelConfig, RopeKind,
};
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
    if c.n_rot != c.head_dim {
        return Err(ModelError::Corrupt(format!(
            "{a}: RoPE turns {} of {} head dimensions; this family turns them all",
            c.n_rot, c.head_dim
        )));
    }
    if let Some(s) = positive_or_unset(f, &format!("{a}.attention.scale"))? {
        c.attn_scale = s;
    }
    let Some(scale) = positive_or_unset(f, &format!("{a}.attention.temperature_scale"))? else {
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
