//! SmolLM3 (`smollm3`, llama.cpp's `src/models/smollm3.cpp`): Llama's layers, except that every
//! fourth layer attends without RoPE (llama.cpp fixes the step at 4).

use super::family::{Family, QkNorm};
use super::{Arch, EveryNth, FfnAct, GateFunc, ModelConfig, RopeKind};
use crate::error::Result;
use crate::gguf::GgufFile;

pub const FAMILY: Family = Family {
    arch: Arch::Smollm3,
    name: "smollm3",
    features: "no RoPE in every fourth layer",
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

fn hyper(_: &GgufFile, _: &str, c: &mut ModelConfig) -> Result<()> {
    c.rope_skip = Some(EveryNth::last_of(4));
    Ok(())
}
