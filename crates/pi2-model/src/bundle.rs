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
//! The clustered output head: `output.weight` holds the output rows in cluster order, hottest
//! cluster first (a tied embedding stays `token_embd.weight`, in vocabulary order), with
//! `head.order`, `head.centroids`, `head.directions`, `head.spread`, `head.coef` and
//! `head.frequency` beside it (see [`HEAD_ORDER`]).
//!
//! PowerInfer's sparse GGUF files (predictors `blk.N.fc1/fc2`, `ffn_down_t`, no `pi2.version`)
//! are read as bundles too.
//!
//! The loader (`pi2-engine`), the offloaded FFN and the planner find neurons through
//! [`neuron_parts`]; the converter writes names and keys from here.

use crate::{GgufFile, LayerWeights, ModelError, Result, Value};
use pi2_kernels::QuantType;

/// The format version this pi2 writes and reads.
/// Version 2 added the checksum table ([`crate::checksum`]); version 3 the clustered output
/// head (the output rows are stored in cluster order, so an older reader must refuse it).
pub const FORMAT_VERSION: u32 = 3;

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
/// The clustered output head (see `pi2_engine::ClusteredHead`): rows per cluster (U32; every
/// cluster but the last has this many, and starts at a multiple of 8).
pub const KEY_HEAD_CLUSTER: &str = "pi2.head.cluster";
/// Share of the output rows decode scores exactly by default (F32): the best clusters by
/// centroid score until they hold this share.
pub const KEY_HEAD_SHARE: &str = "pi2.head.share";
/// I32 `n_vocab`: the vocabulary id of each stored output row.
pub const HEAD_ORDER: &str = "head.order";
/// `clusters x n_embd` (Q8_0 where the width allows, else F32): each cluster's mean row, in
/// stored order.
pub const HEAD_CENTROIDS: &str = "head.centroids";
/// `clusters x n_embd`, the type of the centroids: each cluster's direction of largest logit
/// spread.
pub const HEAD_DIRECTIONS: &str = "head.directions";
/// F32 `clusters`: the largest `|coef|` of each cluster's rows.
pub const HEAD_SPREAD: &str = "head.spread";
/// F32 `n_vocab`: each stored row's coordinate along its cluster's direction.
pub const HEAD_COEF: &str = "head.coef";
/// F32 `clusters`: the share of calibration tokens that selected each cluster.
pub const HEAD_FREQUENCY: &str = "head.frequency";
/// Weight of a cluster's reach along its direction in its selection score (F32).
pub const KEY_HEAD_UCB: &str = "pi2.head.ucb";
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
