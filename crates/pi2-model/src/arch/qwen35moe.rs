//! Qwen3.5 mixture of experts (`qwen35moe`, llama.cpp's `src/models/qwen35moe.cpp`;
//! Qwen3.5-35B-A3B, 122B-A10B): Qwen3.5's layers (gated delta nets and gated attention, see
//! `qwen35.rs`) with every FFN a mixture: softmax routing, top-k renormalised, experts of
//! `expert_feed_forward_length`, and a shared expert (`expert_shared_feed_forward_length`)
//! whose output is scaled by the sigmoid of its own gate.

use super::family::{Family, QkNorm};
use super::{Arch, FfnAct, GateFunc, RopeKind};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen35Moe,
    name: "qwen35moe",
    features: "Qwen3.5's gated delta nets and gated attention; experts (softmax, top-k, renormalised) with a sigmoid-gated shared expert",
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
    hyper: super::qwen35::hyper,
    ffn_norm: "post_attention_norm.weight",
    output_norm: "output_norm.weight",
    sinks: false,
    biases: false,
};
