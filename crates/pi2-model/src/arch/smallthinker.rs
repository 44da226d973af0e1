//! SmallThinker (`smallthinker`, llama.cpp's `src/models/smallthinker.cpp`; SmallThinker-4B-A0.6B
//! and 21B-A3B): every FFN a mixture of ReGLU experts whose router reads the layer's input
//! before attention (un-normed), so a token's experts are known one attention block early;
//! the gating function from `expert_gating_func`, the chosen weights renormalised. With
//! `attention.sliding_window` in the file, layers slide over 4096 tokens (llama.cpp's fixed
//! window) except every `attention.sliding_window_pattern`-th from the first (4), and those
//! global layers run without RoPE; sliding layers take `rope.freq_base_swa` when given.

use super::family::{Family, QkNorm};
use super::{
    get_f32_or, get_usize_or, Arch, EveryNth, FfnAct, GateFunc, ModelConfig, RopeKind,
    SlidingWindow,
};
use crate::error::Result;
use crate::gguf::GgufFile;

pub const FAMILY: Family = Family {
    arch: Arch::Smallthinker,
    name: "smallthinker",
    features: "experts routed from the layer's input before attention (gating from the file, renormalised), ReGLU experts, 4096-token windows with every 4th layer global and without RoPE",
    rope: RopeKind::Neox,
    ffn_act: FfnAct::Relu,
    qkv_bias: false,
    qk_norm: QkNorm::None,
    needs_experts: true,
    expert_size_key: false,
    renormalize_experts: true,
    gate: GateFunc::Softmax,
    gate_key: true,
    post_norms: false,
    scale_embeddings: false,
    hyper,
    ffn_norm: "ffn_norm.weight",
    output_norm: "output_norm.weight",
    sinks: false,
    biases: false,
};

/// llama.cpp's window for this family, whatever length the file gives.
const WINDOW: usize = 4096;
/// llama.cpp's step of layers without RoPE once the model slides (its default).
const NO_ROPE_STEP: usize = 4;

fn hyper(f: &GgufFile, a: &str, c: &mut ModelConfig) -> Result<()> {
    c.route_before_attention = true;
    if get_usize_or(f, &format!("{a}.attention.sliding_window"), 0)? == 0 {
        return Ok(());
    }
    let period = get_usize_or(f, &format!("{a}.attention.sliding_window_pattern"), 4)?;
    c.sliding_window = Some(SlidingWindow {
        len: WINDOW,
        global: (period > 0).then(|| EveryNth::first_of(period)),
        rope_base: get_f32_or(f, &format!("{a}.rope.freq_base_swa"), c.rope_base)?,
        heads: None,
    });
    // llama.cpp rotates every layer when the step equals the layer count.
    if c.n_layer != NO_ROPE_STEP {
        c.rope_skip = Some(EveryNth::first_of(NO_ROPE_STEP));
    }
    Ok(())
}
