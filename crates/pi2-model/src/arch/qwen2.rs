//! Qwen2 and Qwen2.5 (`qwen2`): biases on Q, K and V; RoPE on split halves (GGML's "neox").

use super::family::{plain, Family, QkNorm};
use super::{Arch, FfnAct, GateFunc, RopeKind};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen2,
    name: "qwen2",
    features: "Q/K/V biases, neox RoPE",
    rope: RopeKind::Neox,
    ffn_act: FfnAct::Silu,
    qkv_bias: true,
    qk_norm: QkNorm::None,
    needs_experts: false,
    expert_size_key: false,
    renormalize_experts: true,
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
