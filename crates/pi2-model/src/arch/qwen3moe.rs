//! Qwen3 mixtures of experts (`qwen3moe`, llama.cpp's `src/models/qwen3moe.cpp`; Qwen3-30B-A3B,
//! Qwen3-235B-A22B): Qwen3's attention (per-head Q/K norms, neox RoPE, its own head size), and
//! every FFN a mixture: softmax router, top-k, weights renormalised; experts of
//! `expert_feed_forward_length` neurons.

use super::family::{plain, Family, QkNorm};
use super::{Arch, FfnAct, GateFunc, RopeKind};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen3Moe,
    name: "qwen3moe",
    features: "experts (softmax, top-k, renormalised), per-head Q/K RMS norms, neox RoPE",
    rope: RopeKind::Neox,
    ffn_act: FfnAct::Silu,
    qkv_bias: false,
    qk_norm: QkNorm::PerHead,
    needs_experts: true,
    expert_size_key: true,
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
