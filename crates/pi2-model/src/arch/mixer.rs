//! How each layer mixes tokens: attention, or where the file says so a short convolution
//! (LFM2), read from per-layer metadata.

use super::get_usize_or;
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};

/// KV heads: one count, or one per layer (LFM2) where every layer that attends has the same
/// count (0 marks a layer without attention, see [`attention_free_layers`]).
pub(super) fn head_count_kv(f: &GgufFile, key: &str, n_head: usize) -> Result<usize> {
    let Some(items) = f.get(key).and_then(Value::as_array) else {
        return get_usize_or(f, key, n_head);
    };
    let counts: Vec<u64> = per_layer_counts(items, key)?;
    let mut nonzero = counts.iter().filter(|&&c| c > 0);
    let first = nonzero.next().copied().unwrap_or(0);
    if first == 0 || nonzero.any(|&c| c != first) {
        return Err(ModelError::Unsupported(format!(
            "{key} = {counts:?}: pi2 needs one KV head count for every layer that attends"
        )));
    }
    usize::try_from(first).map_err(|_| ModelError::Corrupt(format!("{key} is out of range")))
}

fn per_layer_counts(items: &[Value], key: &str) -> Result<Vec<u64>> {
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
pub(crate) fn attention_free_layers(f: &GgufFile, a: &str, n_layer: usize) -> Result<Vec<bool>> {
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
