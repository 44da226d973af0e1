//! Llama 1-3, Mistral, SmolLM2 (`llama`): the plain pre-norm transformer; RoPE on adjacent
//! pairs (GGML's "normal" mode), optional Q/K/V biases, Llama 3's `rope_freqs`.

use super::family::{plain, Family, QkNorm};
use super::{Arch, FfnAct, GateFunc, RopeKind};

pub const FAMILY: Family = Family {
    arch: Arch::Llama,
    name: "llama",
    features: "RoPE on adjacent pairs",
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
    hyper: plain,
    ffn_norm: "ffn_norm.weight",
    output_norm: "output_norm.weight",
    sinks: false,
    biases: false,
};
