//! The tensor element types the kernels understand, and their byte geometry.

use crate::quant::{self, QK, QK_K};
use std::fmt;

/// Errors from building kernel views over caller-provided bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A row length that is not a whole number of blocks.
    #[error("{ty} rows must be a multiple of {} elements, got {cols}", ty.block_len())]
    RowNotBlockAligned { ty: QuantType, cols: usize },
    /// The byte slice does not hold `rows x cols` elements of the type.
    #[error("{ty} matrix {rows}x{cols} needs {expected} bytes, got {got}")]
    SizeMismatch {
        ty: QuantType,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    /// The bytes are not aligned for the block type's fields.
    #[error("{ty} data must be {align}-byte aligned")]
    Misaligned { ty: QuantType, align: usize },
}

/// A weight element type (GGML numbering, see [`QuantType::from_ggml_id`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    Q2_K,
    Q3_K,
    MXFP4,
}

/// The activation format a weight type's dot product consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActKind {
    /// Plain f32 (F32, F16 and BF16 weights).
    F32,
    /// [`quant::BlockQ8`], 32 per block (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4).
    Q8,
    /// [`quant::BlockQ8K`], 256 per block (k-quants, IQ4_XS).
    Q8K,
}

impl QuantType {
    pub const ALL: [QuantType; 16] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::IQ4_NL,
        Self::IQ4_XS,
        Self::Q2_K,
        Self::Q3_K,
        Self::MXFP4,
    ];

    /// Map a GGML type id (as stored in GGUF tensor infos) to a supported type.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            39 => Self::MXFP4,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            20 => Self::IQ4_NL,
            23 => Self::IQ4_XS,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// The GGML type id.
    pub fn ggml_id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::MXFP4 => 39,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::IQ4_NL => 20,
            Self::IQ4_XS => 23,
            Self::BF16 => 30,
        }
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0
            | Self::Q4_1
            | Self::Q5_0
            | Self::Q5_1
            | Self::Q8_0
            | Self::IQ4_NL
            | Self::MXFP4 => QK,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::IQ4_XS => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        use std::mem::size_of;
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => size_of::<quant::BlockQ4_0>(),
            Self::Q4_1 => size_of::<quant::BlockQ4_1>(),
            Self::Q5_0 => size_of::<quant::BlockQ5_0>(),
            Self::Q5_1 => size_of::<quant::BlockQ5_1>(),
            Self::Q8_0 => size_of::<quant::BlockQ8_0>(),
            Self::Q4_K => size_of::<quant::BlockQ4K>(),
            Self::Q5_K => size_of::<quant::BlockQ5K>(),
            Self::Q6_K => size_of::<quant::BlockQ6K>(),
            Self::IQ4_NL => size_of::<quant::BlockIQ4NL>(),
            Self::IQ4_XS => size_of::<quant::BlockIQ4XS>(),
            Self::Q2_K => size_of::<quant::BlockQ2K>(),
            Self::Q3_K => size_of::<quant::BlockQ3K>(),
            Self::MXFP4 => size_of::<quant::BlockMXFP4>(),
        }
    }

    /// Alignment the block's fields need when viewed in place.
    pub fn align(self) -> usize {
        match self {
            Self::F32 => 4,
            _ => 2,
        }
    }

    /// Bytes of a row of `cols` elements, or `None` if `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if !cols.is_multiple_of(self.block_len()) {
            return None;
        }
        (cols / self.block_len()).checked_mul(self.block_bytes())
    }

    /// The activation format this type's dot product consumes.
    pub fn act_kind(self) -> ActKind {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => ActKind::F32,
            Self::Q4_0
            | Self::Q4_1
            | Self::Q5_0
            | Self::Q5_1
            | Self::Q8_0
            | Self::IQ4_NL
            | Self::MXFP4 => ActKind::Q8,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::IQ4_XS => {
                ActKind::Q8K
            }
        }
    }

    /// Quantize one row (a whole number of blocks) with the reference quantizer, or `None` for
    /// Q2_K, Q3_K, Q5_K and Q6_K (pi2 reads them but does not make them).
    pub fn quantize_row(self, x: &[f32]) -> Option<Vec<u8>> {
        fn blocks<B: crate::quant::QuantBlock + bytemuck::Pod>(
            x: &[f32],
            q: fn(&[f32]) -> B,
        ) -> Vec<u8> {
            let bs: Vec<B> = x.chunks_exact(B::LEN).map(q).collect();
            bytemuck::cast_slice(&bs).to_vec()
        }
        if !x.len().is_multiple_of(self.block_len()) {
            return None;
        }
        Some(match self {
            Self::F32 => bytemuck::cast_slice(x).to_vec(),
            Self::F16 => x
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            Self::BF16 => x
                .iter()
                .flat_map(|&v| quant::bf16::f32_to_bf16(v).to_le_bytes())
                .collect(),
            Self::Q4_0 => blocks(x, quant::BlockQ4_0::quantize),
            Self::Q4_1 => blocks(x, quant::BlockQ4_1::quantize),
            Self::Q5_0 => blocks(x, quant::BlockQ5_0::quantize),
            Self::Q5_1 => blocks(x, quant::BlockQ5_1::quantize),
            Self::Q8_0 => blocks(x, quant::BlockQ8_0::quantize),
            Self::Q4_K => blocks(x, quant::BlockQ4K::quantize),
            Self::IQ4_NL => blocks(x, quant::BlockIQ4NL::quantize),
            Self::MXFP4 => blocks(x, quant::BlockMXFP4::quantize),
            Self::IQ4_XS => blocks(x, quant::BlockIQ4XS::quantize),
            Self::Q2_K | Self::Q3_K | Self::Q5_K | Self::Q6_K => return None,
        })
    }

    /// Expand one row to f32 (`out.len()` elements, a whole number of blocks).
    pub fn dequantize_row(self, row: &[u8], out: &mut [f32]) {
        use crate::quant::QuantBlock;
        fn blocks<B: QuantBlock>(row: &[u8], out: &mut [f32]) {
            let bs: &[B] = bytemuck::cast_slice(row);
            for (b, o) in bs.iter().zip(out.chunks_exact_mut(B::LEN)) {
                b.dequantize(o);
            }
        }
        match self {
            Self::F32 => out.copy_from_slice(bytemuck::cast_slice(&row[..out.len() * 4])),
            Self::F16 => quant::f16::dequantize(bytemuck::cast_slice(&row[..out.len() * 2]), out),
            Self::BF16 => quant::bf16::dequantize(bytemuck::cast_slice(&row[..out.len() * 2]), out),
            Self::Q4_0 => blocks::<quant::BlockQ4_0>(row, out),
            Self::Q4_1 => blocks::<quant::BlockQ4_1>(row, out),
            Self::Q5_0 => blocks::<quant::BlockQ5_0>(row, out),
            Self::Q5_1 => blocks::<quant::BlockQ5_1>(row, out),
            Self::Q8_0 => blocks::<quant::BlockQ8_0>(row, out),
            Self::Q4_K => blocks::<quant::BlockQ4K>(row, out),
            Self::Q5_K => blocks::<quant::BlockQ5K>(row, out),
            Self::Q6_K => blocks::<quant::BlockQ6K>(row, out),
            Self::IQ4_NL => blocks::<quant::BlockIQ4NL>(row, out),
            Self::IQ4_XS => blocks::<quant::BlockIQ4XS>(row, out),
            Self::Q2_K => blocks::<quant::BlockQ2K>(row, out),
            Self::Q3_K => blocks::<quant::BlockQ3K>(row, out),
            Self::MXFP4 => blocks::<quant::BlockMXFP4>(row, out),
        }
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ4_XS => "IQ4_XS",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::MXFP4 => "MXFP4",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in QuantType::ALL {
            assert_eq!(QuantType::from_ggml_id(t.ggml_id()), Some(t));
        }
        assert_eq!(QuantType::from_ggml_id(16), None); // IQ2_XXS unsupported
    }

    #[test]
    fn row_bytes() {
        assert_eq!(QuantType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(QuantType::Q6_K.row_bytes(512), Some(420));
        assert_eq!(QuantType::Q4_K.row_bytes(576), None);
        assert_eq!(QuantType::F16.row_bytes(3), Some(6));
    }
}
