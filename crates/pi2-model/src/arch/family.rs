//! What one family of models computes differently from the others, as a value: each family's
//! module (`llama.rs`, `qwen2.rs`, ...) holds one [`Family`], and the registry below lists them.
//! Loading reads these values; no other code asks which family a model is.

use super::{Arch, FfnAct, GateFunc, ModelConfig, RopeKind};
use crate::error::Result;
use crate::gguf::GgufFile;

/// A family's differences from the plain pre-norm transformer (RMS norm, attention with RoPE,
/// a gated FFN).
#[derive(Debug)]
pub struct Family {
    pub arch: Arch,
    /// `general.architecture`, and the prefix of the family's metadata keys.
    pub name: &'static str,
    /// What `pi2 info` says the family adds.
    pub features: &'static str,
    pub rope: RopeKind,
    /// The FFN nonlinearity when the file names none.
    pub ffn_act: FfnAct,
    /// Q, K and V biases are required (otherwise they are used when present).
    pub qkv_bias: bool,
    /// RMS norms of Q and K before RoPE (required when the family has them, never read
    /// otherwise).
    pub qk_norm: QkNorm,
    /// RMS norms of the attention and FFN outputs before their residual adds.
    pub post_norms: bool,
    /// Token embeddings scaled by sqrt(width) as they enter the first layer.
    pub scale_embeddings: bool,
    /// A mixture of experts only: files without experts are refused.
    pub needs_experts: bool,
    /// Without `expert_feed_forward_length`, experts have the dense size over the experts used
    /// (llama.cpp's rule for the families that have the key); otherwise `feed_forward_length`.
    pub expert_size_key: bool,
    /// Chosen experts' weights renormalised to sum to one (Mixtral, Qwen3-MoE) or not (OLMoE).
    pub renormalize_experts: bool,
    /// How router logits become expert weights, unless the file says (see `gate_key`).
    pub gate: GateFunc,
    /// The file's `expert_gating_func` is required and says how (LFM2-MoE, SmallThinker).
    pub gate_key: bool,
    /// The family's own hyper-parameters, from the file's keys (prefix given) into the shared
    /// config: sliding windows, scales, layers without RoPE.
    pub hyper: fn(&GgufFile, &str, &mut ModelConfig) -> Result<()>,
    /// The tensor of each layer's norm before its FFN (`ffn_norm`, or gpt-oss's
    /// `post_attention_norm`).
    pub ffn_norm: &'static str,
    /// The tensor of the final norm before the head (`output_norm`, or LFM2's
    /// `token_embd_norm`).
    pub output_norm: &'static str,
    /// Per head, a learned logit every query also attends to ("attention sinks", gpt-oss).
    pub sinks: bool,
    /// Biases of the attention output, the router and each expert's projections (gpt-oss).
    pub biases: bool,
}

/// Where Q and K are RMS-normed before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Each head, with one head's weights.
    PerHead,
    /// Each token's whole Q (and K) vector.
    Whole,
}

/// No hyper-parameters of its own.
pub fn plain(_: &GgufFile, _: &str, _: &mut ModelConfig) -> Result<()> {
    Ok(())
}

/// Every family pi2 reads, in the order errors list them.
pub const FAMILIES: [&Family; 18] = [
    &super::llama::FAMILY,
    &super::qwen2::FAMILY,
    &super::qwen3::FAMILY,
    &super::qwen3moe::FAMILY,
    &super::olmoe::FAMILY,
    &super::smollm3::FAMILY,
    &super::granite::FAMILY,
    &super::gemma2::FAMILY,
    &super::gemma3::FAMILY,
    &super::gemma4::FAMILY,
    &super::gpt_oss::FAMILY,
    &super::mistral3::FAMILY,
    &super::phi3::FAMILY,
    &super::lfm2::FAMILY,
    &super::smallthinker::FAMILY,
    &super::qwen35::FAMILY,
    &super::qwen35moe::FAMILY,
    &super::lfm2moe::FAMILY,
];
