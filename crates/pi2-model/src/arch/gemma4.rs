//! Gemma 4 (`gemma4`, llama.cpp's `src/models/gemma4.cpp`; E2B and E4B): Gemma 3's layers
//! (GeGLU, per-head Q/K norms, post-norms, scaled embeddings) with
//! - sliding layers (`attention.sliding_window_pattern`, one flag per layer) of their own head
//!   size, rotated dimensions and RoPE base (`key_length_swa`, `rope.dimension_count_swa`,
//!   `rope.freq_base_swa`), global layers with wider heads and "proportional" RoPE (its
//!   `rope_freqs` divisors leave the unrotated pairs at rest);
//! - values RMS-normed per head without weights, and no query scale (1, the norms set it);
//! - the last `attention.shared_kv_layers` layers computing no keys and values: each attends
//!   to those of the last earlier layer of its kind;
//! - per-layer token embeddings (`embedding_length_per_layer_input`): a table of a slice per
//!   layer for every token, mixed with a projection of the embedding and gated into the
//!   residual stream after each layer's FFN;
//! - a learned scale of each layer's output, where the file has one, a wider FFN in some
//!   layers (`feed_forward_length` per layer) and soft-capped logits (at 30 unless the file says);
//! - in the mixture (26B-A4B), a dense FFN beside the experts in every layer, each with norms of
//!   its own, the router on the scaled, normed stream and a scale per expert (see
//!   [`super::ExpertNorms`]).

use super::family::{Family, QkNorm};
use super::{
    get_f32_or, get_usize, get_usize_or, positive_or_unset, Arch, EveryNth, FfnAct, GateFunc,
    Heads, ModelConfig, RopeKind, SlidingWindow, MAX_DIM,
};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};

pub const FAMILY: Family = Family {
    arch: Arch::Gemma4,
    name: "gemma4",
    features: "GeGLU, per-head Q/K norms and V norm, post-norms, sliding layers of their own head size, proportional RoPE, KV shared across layers, per-layer token embeddings, layer scales",
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
    let k = |s: &str| format!("{a}.{s}");
    // The mixture (26B-A4B) runs a dense FFN of `feed_forward_length` beside its experts.
    if c.n_expert > 0 && c.n_ff_shared == 0 {
        return Err(ModelError::MissingKey(k("feed_forward_length")));
    }
    let head_dim = get_usize(f, &k("attention.key_length_swa"))?;
    let v_dim = get_usize(f, &k("attention.value_length_swa"))?;
    if v_dim != head_dim {
        return Err(ModelError::Unsupported(format!(
            "sliding layers' value head size {v_dim} differs from their key head size {head_dim}"
        )));
    }
    let global = global_layers(f, &k("attention.sliding_window_pattern"), c.n_layer)?;
    let kv_heads = |li: usize| kv_heads_of(f, &k("attention.head_count_kv"), li);
    // Layer 0 slides in every pattern pi2 reads; `global.first` is the first global layer.
    let (swa_kv, global_kv) = (kv_heads(0), kv_heads(global.first));
    if let Some(n) = global_kv {
        c.n_head_kv = n;
    }
    let heads = Heads {
        n_head_kv: swa_kv.unwrap_or(c.n_head_kv),
        head_dim,
        n_rot: get_usize_or(f, &k("rope.dimension_count_swa"), c.n_rot)?,
    };
    let len = get_usize(f, &k("attention.sliding_window"))?;
    if len == 0 || len > MAX_DIM * 16 {
        return Err(ModelError::Corrupt(format!(
            "{} = {len} is out of range",
            k("attention.sliding_window")
        )));
    }
    c.sliding_window = Some(SlidingWindow {
        len,
        global: Some(global),
        rope_base: get_f32_or(f, &k("rope.freq_base_swa"), 10000.0)?,
        heads: Some(heads),
    });
    let shared = get_usize_or(f, &k("attention.shared_kv_layers"), 0)?;
    // llama.cpp's rule reads the two layers before the first sharing one.
    if shared > 0 && shared + 2 > c.n_layer {
        return Err(ModelError::Corrupt(format!(
            "{} = {shared} leaves fewer than two layers of {} computing keys and values",
            k("attention.shared_kv_layers"),
            c.n_layer
        )));
    }
    c.kv_shared_from = c.n_layer - shared;
    c.n_embd_per_layer = get_usize(f, &k("embedding_length_per_layer_input"))?;
    if c.n_embd_per_layer > MAX_DIM {
        return Err(ModelError::Corrupt(format!(
            "{} = {} is out of range",
            k("embedding_length_per_layer_input"),
            c.n_embd_per_layer
        )));
    }
    c.attn_scale = 1.0;
    c.v_norm = true;
    // llama.cpp caps at 30 when the key is absent; 0 turns the cap off.
    c.final_softcap = match f.get(&k("final_logit_softcapping")) {
        None => Some(30.0),
        Some(_) => positive_or_unset(f, &k("final_logit_softcapping"))?,
    };
    Ok(())
}

/// Layer `li`'s entry of a per-layer KV head count array (`None`: one count for all, or an
/// entry out of range, which the generic check then names).
fn kv_heads_of(f: &GgufFile, key: &str, li: usize) -> Option<usize> {
    let n = f.get(key)?.as_array()?.get(li)?.as_u64()?;
    (1..=MAX_DIM as u64).contains(&n).then_some(n as usize)
}

/// The global layers of a per-layer sliding flag array: pi2 reads the pattern every Gemma 4
/// has (the last of every `period` layers global) and refuses others by name.
fn global_layers(f: &GgufFile, key: &str, n_layer: usize) -> Result<EveryNth> {
    let flags: Vec<bool> = match f.get(key).and_then(Value::as_array) {
        Some(items) => items
            .iter()
            .map(|v| {
                v.as_bool().ok_or(ModelError::WrongKeyType {
                    key: key.into(),
                    expected: "array of booleans",
                    got: v.type_name(),
                })
            })
            .collect::<Result<_>>()?,
        None => return Err(ModelError::MissingKey(key.into())),
    };
    if flags.len() != n_layer {
        return Err(ModelError::Corrupt(format!(
            "{key} has {} entries for {n_layer} layers",
            flags.len()
        )));
    }
    let period = flags.iter().position(|&swa| !swa).map(|i| i + 1);
    let every = period.map(EveryNth::last_of);
    match every {
        Some(g) if flags.iter().enumerate().all(|(li, &swa)| swa != g.has(li)) => Ok(g),
        _ => Err(ModelError::Unsupported(format!(
            "{key} = {flags:?}: pi2 reads sliding layers with the last of every N layers global"
        ))),
    }
}
