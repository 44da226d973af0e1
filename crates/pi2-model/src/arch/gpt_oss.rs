//! gpt-oss (`gpt-oss`, llama.cpp's `src/models/openai-moe.cpp`; gpt-oss-20b, gpt-oss-120b):
//! biased Q/K/V and output projections, a learned "sink" logit per head in every softmax,
//! every other layer attending to a window (`attention.sliding_window`, 128) with the same RoPE
//! (neox, YaRN), the FFN's norm named `post_attention_norm`, and every FFN a mixture: a biased
//! router, top-k then softmax over the chosen, biased experts of `expert_feed_forward_length`
//! neurons with gpt-oss's clamped SwiGLU.

use super::family::{Family, QkNorm};
use super::{Arch, FfnAct, GateFunc, ModelConfig, RopeKind};
use crate::error::Result;
use crate::gguf::GgufFile;

pub const FAMILY: Family = Family {
    arch: Arch::GptOss,
    name: "gpt-oss",
    features: "experts (biased router, top-k then softmax, biased experts, clamped SwiGLU), attention sinks, biased projections, alternating sliding windows, YaRN",
    rope: RopeKind::Neox,
    ffn_act: FfnAct::SwigluOai,
    qkv_bias: true,
    qk_norm: QkNorm::None,
    needs_experts: true,
    expert_size_key: true,
    renormalize_experts: false,
    gate: GateFunc::SoftmaxWeight,
    gate_key: false,
    post_norms: false,
    scale_embeddings: false,
    hyper,
    ffn_norm: "post_attention_norm.weight",
    output_norm: "output_norm.weight",
    sinks: true,
    biases: true,
};

fn hyper(f: &GgufFile, a: &str, c: &mut ModelConfig) -> Result<()> {
    // Sliding layers rotate as the others do (the same base, YaRN too).
    c.sliding_window = Some(super::gemma3::sliding_window(f, a, None, 2, c.rope_base)?);
    Ok(())
}
