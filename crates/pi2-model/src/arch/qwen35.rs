//! Qwen3.5 dense (`qwen35`, llama.cpp's `src/models/qwen35.cpp`; Qwen3.5-0.8B to 27B): three of
//! every four layers (`full_attention_interval`, or `attention.recurrent_layers`) are gated
//! delta nets (linear attention: Q, K and V through a causal convolution and SiLU, Q and K
//! L2-normed, a `head_dim` x `head_dim` state per value head decayed by
//! `exp(softplus(alpha + dt) * a)` and updated by the delta rule with sigmoid `beta`, the
//! output RMS-normed per head and gated by SiLU of `attn_gate`); the others attend with
//! per-head Q/K norms, interleaved M-RoPE over part of each head (text positions) and an
//! output gate (each head's Q rows followed by gate rows whose sigmoid scales the attention
//! output). The FFN's norm is `post_attention_norm`.

use super::family::{Family, QkNorm};
use super::mixer::{DeltaNet, Mixer};
use super::{get_usize, get_usize_or, Arch, FfnAct, GateFunc, ModelConfig, RopeKind};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};

pub const FAMILY: Family = Family {
    arch: Arch::Qwen35,
    name: "qwen35",
    features: "gated delta nets (linear attention with a recurrent state) in 3 of 4 layers, gated attention with per-head Q/K norms and partial interleaved M-RoPE",
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
    ffn_norm: "post_attention_norm.weight",
    output_norm: "output_norm.weight",
    sinks: false,
    biases: false,
};

/// Largest delta-net head pi2 runs (Qwen3.5's is 128).
const MAX_HEAD: usize = 256;

pub(super) fn hyper(f: &GgufFile, a: &str, c: &mut ModelConfig) -> Result<()> {
    let dn = delta_net(f, a)?;
    let recurrent = recurrent_layers(f, a, c.n_layer)?;
    for (m, r) in c.mixers.iter_mut().zip(recurrent) {
        if r {
            *m = Mixer::DeltaNet(dn);
        }
    }
    c.attn_output_gate = true;
    let key = format!("{a}.rope.dimension_sections");
    let sections = f.get(&key).and_then(Value::as_array).map(|v| {
        v.iter()
            .map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok()))
            .collect::<Option<Vec<_>>>()
    });
    c.rope_sections = match sections {
        Some(Some(s)) if s.len() == 4 && s.iter().all(|&x| x <= c.n_rot) => {
            Some([s[0], s[1], s[2], s[3]])
        }
        None => return Err(ModelError::MissingKey(key)),
        _ => {
            return Err(ModelError::Corrupt(format!(
                "{key} is not four section sizes within the rotated dimensions"
            )))
        }
    };
    Ok(())
}

fn delta_net(f: &GgufFile, a: &str) -> Result<DeltaNet> {
    let k = |s: &str| format!("{a}.ssm.{s}");
    let dn = DeltaNet {
        taps: get_usize(f, &k("conv_kernel"))?,
        k_heads: get_usize(f, &k("group_count"))?,
        v_heads: get_usize(f, &k("time_step_rank"))?,
        head_dim: get_usize(f, &k("state_size"))?,
    };
    let inner = get_usize(f, &k("inner_size"))?;
    let valid = (2..=64).contains(&dn.taps)
        && (1..=MAX_HEAD).contains(&dn.head_dim)
        && (1..=256).contains(&dn.v_heads)
        && dn.k_heads > 0
        && dn.v_heads.is_multiple_of(dn.k_heads)
        && inner == dn.value_dim();
    if !valid {
        return Err(ModelError::Unsupported(format!(
            "a gated delta net of {} taps, {} key heads and {} value heads of {} (inner size {inner}): pi2 runs 2-64 taps, heads up to {MAX_HEAD} wide, value heads a multiple of key heads filling the inner size",
            dn.taps, dn.k_heads, dn.v_heads, dn.head_dim
        )));
    }
    Ok(dn)
}

/// Per layer, whether it is a delta net: `attention.recurrent_layers` when the file lists
/// them, else all but every `full_attention_interval`-th (4).
fn recurrent_layers(f: &GgufFile, a: &str, n_layer: usize) -> Result<Vec<bool>> {
    let key = format!("{a}.attention.recurrent_layers");
    if let Some(v) = f.get(&key) {
        let flags: Option<Vec<bool>> = v
            .as_array()
            .map(|xs| {
                xs.iter()
                    .map(|x| x.as_bool().or(x.as_u64().map(|n| n != 0)))
                    .collect()
            })
            .and_then(|x| x);
        return match flags {
            Some(flags) if flags.len() == n_layer => Ok(flags),
            _ => Err(ModelError::Corrupt(format!(
                "{key} is not one flag per layer ({n_layer})"
            ))),
        };
    }
    let interval = get_usize_or(f, &format!("{a}.full_attention_interval"), 4)?;
    if interval == 0 {
        return Err(ModelError::Corrupt(format!(
            "{a}.full_attention_interval = 0 is not a layer pattern"
        )));
    }
    Ok((0..n_layer).map(|i| (i + 1) % interval != 0).collect())
}
