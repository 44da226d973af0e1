//! LFM2 (`lfm2`, llama.cpp's `src/models/lfm2.cpp`; LFM2-350M to 2.6B): most layers mix tokens
//! by a short causal convolution instead of attention (the layers whose
//! `attention.head_count_kv` entry is 0). Such a layer projects its normed input to B, C and x
//! (`shortconv.in_proj`, three row blocks), convolves B * x over the last
//! `shortconv.l_cache` positions with one kernel per channel (`shortconv.conv`), multiplies by
//! C and projects back (`shortconv.out_proj`). The attention layers norm each head of Q and K
//! before NeoX RoPE, and slide over `attention.sliding_window` tokens when the file gives one.
//! The final norm is named `token_embd_norm`.

use super::family::{Family, QkNorm};
use super::{Arch, FfnAct, GateFunc, Mixer, ModelConfig, RopeKind, SlidingWindow, MAX_DIM};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

pub const FAMILY: Family = Family {
    arch: Arch::Lfm2,
    name: "lfm2",
    features: "short causal convolutions in place of attention in most layers, per-head Q/K RMS norms, neox RoPE",
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
    hyper,
    ffn_norm: "ffn_norm.weight",
    output_norm: "token_embd_norm.weight",
    sinks: false,
    biases: false,
};

/// Longest convolution accepted (LFM2's is 3): each position keeps this many rows of state.
const MAX_CONV: usize = 64;

pub(super) fn hyper(f: &GgufFile, a: &str, c: &mut ModelConfig) -> Result<()> {
    let len_key = format!("{a}.shortconv.l_cache");
    let len = super::get_usize(f, &len_key)?;
    if !(2..=MAX_CONV).contains(&len) {
        return Err(ModelError::Corrupt(format!(
            "{len_key} = {len}: a short convolution spans 2 to {MAX_CONV} positions"
        )));
    }
    let free = super::mixer::attention_free_layers(f, a, c.n_layer)?;
    for (m, free) in c.mixers.iter_mut().zip(free) {
        if free {
            *m = Mixer::ShortConv { taps: len };
        }
    }
    let window = super::get_usize_or(f, &format!("{a}.attention.sliding_window"), 0)?;
    if window > MAX_DIM * 16 {
        return Err(ModelError::Corrupt(format!(
            "{a}.attention.sliding_window = {window} is out of range"
        )));
    }
    if window > 0 {
        // Every attention layer slides.
        c.sliding_window = Some(SlidingWindow {
            len: window,
            global: None,
            rope_base: c.rope_base,
            heads: None,
        });
    }
    Ok(())
}
