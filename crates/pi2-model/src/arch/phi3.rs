//! Phi-3, Phi-3.5 and Phi-4-mini (`phi3`, llama.cpp's `src/models/phi3.cpp`): Q, K and V in one
//! `attn_qkv` tensor, gate and up in one `ffn_up` of twice the rows (`swiglu`: SiLU of the first
//! half times the second), NeoX RoPE over part of each head (`rope.dimension_count`), its
//! divisors `rope_factors_short` or `_long` by the context (long past
//! `rope.scaling.original_context_length`), and `rope.scaling.attn_factor` on the rotated
//! dimensions. A sliding window in the file is ignored, as llama.cpp ignores it for this family.

use super::family::{plain, Family, QkNorm};
use super::{Arch, FfnAct, GateFunc, RopeKind};

pub const FAMILY: Family = Family {
    arch: Arch::Phi3,
    name: "phi3",
    features: "fused QKV and gate-up, partial NeoX RoPE with short/long factors",
    rope: RopeKind::Neox,
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
    hyper: plain,
    ffn_norm: "ffn_norm.weight",
    output_norm: "output_norm.weight",
    sinks: false,
    biases: false,
};
