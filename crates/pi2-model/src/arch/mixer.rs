//! How each layer mixes tokens: attention, a short convolution (LFM2) or a gated delta net
//! (Qwen3.5), read from per-layer metadata.

use super::get_usize_or;
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};

/// How a layer mixes tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    Attention,
    /// A short causal convolution of `B * x` over `taps` positions, gated by C (LFM2).
    ShortConv {
        taps: usize,
    },
    /// Linear attention with a recurrent state per head (Qwen3.5's gated delta net).
    DeltaNet(DeltaNet),
}

/// A gated delta net's shape: a causal convolution of `taps` positions over Q, K and V, `k_heads`
/// query/key heads and `v_heads` value heads (each value head reads key head `h % k_heads`), each
/// of `head_dim`, and per value head a `head_dim` x `head_dim` state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNet {
    pub taps: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub head_dim: usize,
}

impl DeltaNet {
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head_dim
    }

    /// Channels convolved: Q, K and V.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// f32 values of one state (every value head's matrix).
    pub fn state_len(&self) -> usize {
        self.v_heads * self.head_dim * self.head_dim
    }
}

/// KV heads: one count, or one per layer (LFM2, Gemma 4), then the first layer's that attends
/// (0 marks a layer without attention, see [`attention_free_layers`]); each layer's count is
/// checked against its shape once the family has said it (`check_head_counts`).
pub(super) fn head_count_kv(f: &GgufFile, key: &str, n_head: usize) -> Result<usize> {
    let Some(items) = f.get(key).and_then(Value::as_array) else {
        return get_usize_or(f, key, n_head);
    };
    let first = per_layer_counts(items, key)?
        .into_iter()
        .find(|&c| c > 0)
        .unwrap_or(0);
    usize::try_from(first).map_err(|_| ModelError::Corrupt(format!("{key} is out of range")))
}

/// Each layer's KV head count where the file gives one per layer.
pub(super) fn head_counts_kv(f: &GgufFile, a: &str, n_layer: usize) -> Result<Vec<Option<usize>>> {
    let key = format!("{a}.attention.head_count_kv");
    let Some(items) = f.get(&key).and_then(Value::as_array) else {
        return Ok(vec![None; n_layer]);
    };
    if items.len() != n_layer {
        return Err(ModelError::Corrupt(format!(
            "{key} has {} entries for {n_layer} layers",
            items.len()
        )));
    }
    Ok(per_layer_counts(items, &key)?
        .into_iter()
        .map(|c| Some(usize::try_from(c).unwrap_or(usize::MAX)))
        .collect())
}

pub(super) fn per_layer_counts(items: &[Value], key: &str) -> Result<Vec<u64>> {
    items
        .iter()
        .map(|v| {
            v.as_u64().ok_or(ModelError::WrongKeyType {
                key: key.into(),
                expected: "array of unsigned integers",
                got: v.type_name(),
            })
        })
        .collect()
}

/// Per layer, whether `{a}.attention.head_count_kv` gives it no KV heads (a per-layer array
/// with zeros: LFM2's convolution layers); a single count: none.
pub(super) fn attention_free_layers(f: &GgufFile, a: &str, n_layer: usize) -> Result<Vec<bool>> {
    let key = format!("{a}.attention.head_count_kv");
    let Some(items) = f.get(&key).and_then(Value::as_array) else {
        return Ok(vec![false; n_layer]);
    };
    if items.len() != n_layer {
        return Err(ModelError::Corrupt(format!(
            "{key} has {} entries for {n_layer} layers",
            items.len()
        )));
    }
    Ok(per_layer_counts(items, &key)?
        .iter()
        .map(|&c| c == 0)
        .collect())
}
