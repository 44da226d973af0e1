//! Gemma 3 (`gemma3`): GeGLU FFN; per-head Q/K RMS norms; norms after attention and FFN too;
//! embeddings scaled by sqrt(width); sliding-window layers between global ones, each with its
//! own RoPE base; neox RoPE.

use super::family::{Family, QkNorm};
use super::{Arch, EveryNth, FfnAct, GateFunc, ModelConfig, RopeKind, SlidingWindow, MAX_DIM};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

pub const FAMILY: Family = Family {
    arch: Arch::Gemma3,
    name: "gemma3",
    features: "GeGLU, per-head Q/K norms, post-norms, scaled embeddings, sliding windows",
    rope: RopeKind::Neox,
    ffn_act: FfnAct::Gelu,
    qkv_bias: false,
    qk_norm: QkNorm::PerHead,
    needs_experts: false,
    expert_size_key: false,
    renormalize_experts: true,
    gate: GateFunc::Softmax,
    gate_key: false,
    post_norms: true,
    scale_embeddings: true,
    hyper,
    ffn_norm: "ffn_norm.weight",
    output_norm: "output_norm.weight",
    sinks: false,
    biases: false,
};

fn hyper(f: &GgufFile, a: &str, c: &mut ModelConfig) -> Result<()> {
    c.sliding_window = Some(sliding_window(f, a, None, 6, 10000.0)?);
    // llama.cpp's rule for the query scale: the 27B model (62 layers) scales by width / heads,
    // the others by the head size.
    if c.n_layer == 62 {
        c.attn_scale = ((c.n_embd / c.n_head) as f32).sqrt().recip();
    }
    Ok(())
}

/// `attention.sliding_window` tokens (`len` when absent), every
/// `attention.sliding_window_pattern`-th layer global (`period` when absent, as llama.cpp fixes
/// it per family), sliding layers with RoPE base `rope_base`.
pub(super) fn sliding_window(
    f: &GgufFile,
    a: &str,
    len: Option<usize>,
    period: usize,
    rope_base: f32,
) -> Result<SlidingWindow> {
    let len_key = format!("{a}.attention.sliding_window");
    let len = match len {
        Some(l) => super::get_usize_or(f, &len_key, l)?,
        None => super::get_usize(f, &len_key)?,
    };
    let period = super::get_usize_or(f, &format!("{a}.attention.sliding_window_pattern"), period)?;
    if len == 0 || len > MAX_DIM * 16 || period == 0 || period > MAX_DIM {
        return Err(ModelError::Corrupt(format!(
            "sliding window of {len} tokens every {period} layers is not a valid layout"
        )));
    }
    Ok(SlidingWindow {
        len,
        global: Some(EveryNth::last_of(period)),
        rope_base,
        heads: None,
    })
}
