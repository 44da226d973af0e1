//! Qwen3 dense (`qwen3`, llama.cpp's `src/models/qwen3.cpp`): no biases; each head of Q and K
//! RMS-normed (its own weights) before neox RoPE; a head size (`attention.key_length`) that
//! need not be width / heads.

use super::family::{plain, Family, QkNorm};
use super::{Arch, FfnAct, GateFunc, RopeKind};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen3,
    name: "qwen3",
    features: "per-head Q/K RMS norms, neox RoPE, head size apart from width",
    rope: RopeKind::Neox,
    ffn_act: FfnAct::Silu,
    qkv_bias: false,
    qk_norm: QkNorm::PerHead,
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
