//! The pi2 neuron-bundle format, in one place: a GGUF file written by `pi2 convert` in which
//! each FFN layer is re-laid out hot neurons first, neuron `j` being row `j` of
//! `blk.N.ffn_gate.weight`, row `j` of `blk.N.ffn_up.weight` and row `j` of
//! `blk.N.ffn_down_t.weight` (its down column, stored transposed), each part readable on its
//! own from tensor data aligned on the I/O granule. `blk.N.ffn_perm` (I32) maps file neurons to
//! the source model's; predictors are `blk.N.fc1.weight` (`rank x n_embd`), `blk.N.fc2.weight`
//! (`n_ff x rank`) and `blk.N.fc2.bias`. Mixture-of-experts layers stack experts in the `_exps`
//! tensors. Metadata `pi2.*` holds the format version, thresholds, predictor cuts and the
//! profile.
//!
//! The last tensor, `pi2.checksums`, holds a CRC-32 of every row of every other tensor
//! ([`crate::checksum`]): neuron rows read from flash are checked as they land.
//!
//! The sparse output head, when `pi2 convert` made one, is `head.basis`, `head.coef` and
//! `head.bounds` with the group boundaries in `pi2.head.groups`.
//!
//! PowerInfer's sparse GGUF files (predictors `blk.N.fc1/fc2`, `ffn_down_t`, no `pi2.version`)
//! are read as bundles too.
//!
//! The loader (`pi2-engine`), the offloaded FFN and the planner find neurons through
//! [`neuron_parts`]; the converter writes names and keys from here.

use crate::{GgufFile, LayerWeights, ModelError, Result, Value};
use pi2_kernels::QuantType;

/// The format version this pi2 writes and reads.
/// Version 2 added the checksum table ([`crate::checksum`]).
pub const FORMAT_VERSION: u32 = 2;

pub const KEY_VERSION: &str = "pi2.version";
pub const KEY_THRESHOLDS: &str = "pi2.sparse.thresholds";
pub const KEY_SPARSITY: &str = "pi2.sparse.sparsity";
pub const KEY_ACTIVATION: &str = "pi2.sparse.activation";
pub const KEY_GRANULE: &str = "pi2.io.granule";
pub const KEY_PREDICTOR_KIND: &str = "pi2.predictor.kind";
pub const KEY_CUTS: &str = "pi2.predictor.cuts";
pub const KEY_RECALL: &str = "pi2.predictor.recall";
pub const KEY_CANDIDATES: &str = "pi2.predictor.candidates";
pub const KEY_PROFILE: &str = "pi2.profile";
pub const KEY_SOURCE: &str = "pi2.source";
pub const KEY_MOE_CALIBRATION_TOKENS: &str = "pi2.moe.calibration_tokens";
/// The sparse output head (optional; see `pi2_engine::SparseHead`): group boundaries of the
/// basis after the scored coordinates (`rank, .., n_embd`, U32 array).
pub const KEY_HEAD_GROUPS: &str = "pi2.head.groups";
/// The head's basis, F16 `n_embd x n_embd`: row `j` is basis vector `j` (`y = basis * h`).
pub const HEAD_BASIS: &str = "head.basis";
/// The head's scored coefficients, Q8_0 `n_vocab x rank`: row `i` is output row `i`'s first
/// `rank` coordinates in the basis' dual.
pub const HEAD_COEF: &str = "head.coef";
/// The head's per-row bounds, F16 `(3 + groups) x n_vocab`, each rounded up: the norm of the
/// stored coefficients, the norm of the output row, the coefficients' quantization error,
/// then the row's norm in each further group of coordinates.
pub const HEAD_BOUNDS: &str = "head.bounds";
/// PowerInfer's predictor threshold (a probability).
pub const KEY_POWERINFER_THRESHOLD: &str = "powerinfer.sparse_threshold";
pub use crate::gguf::GGML_I32;

/// A bundle tensor of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tensor {
    Gate,
    Up,
    DownT,
    Perm,
    Fc1,
    Fc2,
    Fc2Bias,
    GateExps,
    UpExps,
    DownTExps,
    PermExps,
    FreqExps,
}

impl Tensor {
    /// The tensor's name in layer `li`.
    pub fn name(self, li: usize) -> String {
        let s = match self {
            Tensor::Gate => "ffn_gate.weight",
            Tensor::Up => "ffn_up.weight",
            Tensor::DownT => "ffn_down_t.weight",
            Tensor::Perm => "ffn_perm",
            Tensor::Fc1 => "fc1.weight",
            Tensor::Fc2 => "fc2.weight",
            Tensor::Fc2Bias => "fc2.bias",
            Tensor::GateExps => "ffn_gate_exps.weight",
            Tensor::UpExps => "ffn_up_exps.weight",
            Tensor::DownTExps => "ffn_down_t_exps.weight",
            Tensor::PermExps => "ffn_perm_exps",
            Tensor::FreqExps => "ffn_freq_exps",
        };
        format!("blk.{li}.{s}")
    }
}

/// Whether a tensor's rows are neuron parts (FFN gate/up/down, dense or stacked experts): what
/// an offloaded model leaves on flash.
pub fn is_neuron_tensor(name: &str) -> bool {
    name.starts_with("blk.")
        && [
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down_t.weight",
            "ffn_down.weight",
            "ffn_gate_exps.weight",
            "ffn_up_exps.weight",
            "ffn_down_t_exps.weight",
            "ffn_down_exps.weight",
        ]
        .iter()
        .any(|s| name.ends_with(s))
}

/// What a GGUF file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A plain model.
    Plain,
    /// Written by `pi2 convert`.
    Pi2,
    /// A PowerInfer sparse file.
    PowerInfer,
}

/// The kind of `f`.
pub fn kind(f: &GgufFile) -> Kind {
    if f.get(KEY_VERSION).is_some() {
        Kind::Pi2
    } else if f.tensor(&Tensor::Fc1.name(0)).is_some() {
        Kind::PowerInfer
    } else {
        Kind::Plain
    }
}

/// Refuses a converted file of another format version, or without its checksum table.
pub fn check_version(f: &GgufFile) -> Result<()> {
    let v = f.get(KEY_VERSION).and_then(Value::as_u64);
    if v != Some(FORMAT_VERSION as u64) {
        return Err(ModelError::Corrupt(format!(
            "converted-model format version {v:?}; this pi2 reads {FORMAT_VERSION} (convert the model again with this pi2)"
        )));
    }
    if f.tensor(crate::checksum::TENSOR).is_none() {
        return Err(ModelError::Corrupt(format!(
            "the converted model has no `{}` table (convert the model again with this pi2)",
            crate::checksum::TENSOR
        )));
    }
    Ok(())
}

/// Where the rows of one FFN part of one unit lie: row `i` at `offset + i * row_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeuronPart {
    /// Absolute file offset of row 0.
    pub offset: u64,
    pub ty: QuantType,
    pub row_bytes: usize,
}

impl NeuronPart {
    /// Absolute file offset of row `i`.
    pub fn row_offset(&self, i: usize) -> u64 {
        self.offset + (i * self.row_bytes) as u64
    }
}

/// The gate, up and (transposed) down parts of unit `e` of layer `l` (expert `e` of a stacked
/// mixture, or 0): `n_ff` rows each, experts following each other in the stacked tensors.
pub fn neuron_parts(
    f: &GgufFile,
    l: &LayerWeights,
    n_ff: usize,
    experts: usize,
    e: usize,
) -> Result<[NeuronPart; 3]> {
    let part = |name: &str| -> Result<NeuronPart> {
        let t = f
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let ty = QuantType::from_ggml_id(t.ggml_type).ok_or_else(|| {
            ModelError::UnsupportedTensorType {
                name: name.into(),
                ty: t.type_name().into(),
            }
        })?;
        let rows = (n_ff * experts) as u64;
        if rows == 0 || t.size % rows != 0 {
            return Err(ModelError::Corrupt(format!(
                "`{name}` holds {} bytes, not {rows} rows of neurons",
                t.size
            )));
        }
        let row_bytes = (t.size / rows) as usize;
        Ok(NeuronPart {
            offset: f.data_offset + t.offset + (e * n_ff * row_bytes) as u64,
            ty,
            row_bytes,
        })
    };
    Ok([part(&l.gate.name)?, part(&l.up.name)?, part(&l.down.name)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_neuron_tensors() {
        assert_eq!(Tensor::DownT.name(3), "blk.3.ffn_down_t.weight");
        assert_eq!(Tensor::FreqExps.name(0), "blk.0.ffn_freq_exps");
        for t in [
            Tensor::Gate,
            Tensor::Up,
            Tensor::DownT,
            Tensor::GateExps,
            Tensor::DownTExps,
        ] {
            assert!(is_neuron_tensor(&t.name(7)), "{t:?}");
        }
        for t in [Tensor::Perm, Tensor::Fc1, Tensor::Fc2Bias, Tensor::FreqExps] {
            assert!(!is_neuron_tensor(&t.name(7)), "{t:?}");
        }
        assert!(!is_neuron_tensor("token_embd.weight"));
    }
}
