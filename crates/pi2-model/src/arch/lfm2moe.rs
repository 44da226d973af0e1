//! LFM2-MoE (`lfm2moe`, llama.cpp's `src/models/lfm2moe.cpp`; LFM2-8B-A1B, 24B-A2B): LFM2's
//! convolution and attention layers (see `lfm2.rs`), the first `leading_dense_block_count`
//! FFNs dense (`feed_forward_length`), the others mixtures of `expert_feed_forward_length`
//! experts gated as `expert_gating_func` says (sigmoid), chosen with a selection bias
//! (`exp_probs_b`), renormalised.

use super::family::{Family, QkNorm};
use super::{get_usize_or, Arch, FfnAct, GateFunc, ModelConfig, RopeKind};
use crate::error::Result;
use crate::gguf::GgufFile;

pub const FAMILY: Family = Family {
    arch: Arch::Lfm2Moe,
    name: "lfm2moe",
    features: "LFM2's short convolutions and attention; experts after leading dense layers (gating from the file, a selection bias, renormalised)",
    rope: RopeKind::Neox,
    ffn_act: FfnAct::Silu,
    qkv_bias: false,
    qk_norm: QkNorm::PerHead,
    needs_experts: true,
    expert_size_key: false,
    renormalize_experts: true,
    gate: GateFunc::Sigmoid,
    gate_key: true,
    post_norms: false,
    scale_embeddings: false,
    hyper,
    ffn_norm: "ffn_norm.weight",
    output_norm: "token_embd_norm.weight",
    sinks: false,
    biases: false,
};

fn hyper(f: &GgufFile, a: &str, c: &mut ModelConfig) -> Result<()> {
    super::lfm2::hyper(f, a, c)?;
    c.dense_lead = get_usize_or(f, &format!("{a}.leading_dense_block_count"), 0)?;
    Ok(())
}
