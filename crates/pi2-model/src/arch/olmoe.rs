//! OLMoE (`olmoe`, llama.cpp's `src/models/olmoe.cpp`; OLMoE-1B-7B): Q and K RMS-normed over
//! each token's whole vector (not per head) before neox RoPE; every FFN a mixture: softmax
//! router, top-k, weights not renormalised.

use super::family::{plain, Family, QkNorm};
use super::{Arch, FfnAct, GateFunc, RopeKind};

pub const FAMILY: Family = Family {
    arch: Arch::Olmoe,
    name: "olmoe",
    features: "experts (softmax, top-k, not renormalised), whole-vector Q/K RMS norms, neox RoPE",
    rope: RopeKind::Neox,
    ffn_act: FfnAct::Silu,
    qkv_bias: false,
    qk_norm: QkNorm::Whole,
    needs_experts: true,
    expert_size_key: false,
    renormalize_experts: false,
    gate: GateFunc::Softmax,
    gate_key: false,
    post_norms: false,
    scale_embeddings: false,
    hyper: plain,
    ffn_norm: "ffn_norm.weight",
    output_norm: "output_norm.weight",
    sinks: false,
    biases: false,
};
