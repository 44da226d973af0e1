//! A tensor of the file, or a row range of one, as the model's weights name it.

use crate::gguf::GgufFile;
use pi2_kernels::{MatRef, QuantType};

/// Where a tensor lives in the file and what it holds, checked at load.
#[derive(Clone, Debug)]
pub struct TensorView {
    pub name: String,
    pub ty: QuantType,
    /// Output dimension (GGML dims[1], or 1 for vectors).
    pub rows: usize,
    /// Contiguous dimension (GGML dims[0]).
    pub cols: usize,
    pub(super) index: usize,
    /// The first of the tensor's rows this view covers (a part of a fused tensor: Phi-3's
    /// `attn_qkv` and gate-and-up `ffn_up`).
    pub(super) first_row: usize,
}

impl TensorView {
    /// The matrix view of this tensor inside `f` (the file it was checked against).
    pub fn mat<'a>(&self, f: &'a GgufFile) -> MatRef<'a> {
        MatRef::new(self.ty, self.rows, self.cols, self.data(f))
            .expect("tensor geometry was validated at load")
    }

    /// The tensor as f32 values (F32 tensors only, checked at load).
    pub fn f32s<'a>(&self, f: &'a GgufFile) -> &'a [f32] {
        bytemuck::cast_slice(self.data(f))
    }

    /// The view's bytes.
    fn data<'a>(&self, f: &'a GgufFile) -> &'a [u8] {
        let (at, len) = self.span(f);
        &f.tensor_data(&f.tensors[self.index])[at..at + len]
    }

    /// Where the view starts inside its tensor's data, and its bytes.
    fn span(&self, f: &GgufFile) -> (usize, usize) {
        let t = &f.tensors[self.index];
        let rows: u64 = t.dims.iter().skip(1).product();
        let row = (t.size / rows.max(1)) as usize;
        (self.first_row * row, self.rows * row)
    }

    /// Drop this process's mapped pages of bytes `range` of the view (see
    /// [`GgufFile::release`]).
    pub fn release(&self, f: &GgufFile, range: std::ops::Range<usize>) {
        let at = self.span(f).0;
        f.release(&f.tensors[self.index], at + range.start..at + range.end);
    }

    /// Where the view's data starts in the file.
    pub fn file_offset(&self, f: &GgufFile) -> u64 {
        f.data_offset + f.tensors[self.index].offset + self.span(f).0 as u64
    }

    /// Bytes of data.
    pub fn bytes(&self, f: &GgufFile) -> u64 {
        self.span(f).1 as u64
    }

    /// The views of consecutive row ranges of `rows` each (a fused tensor's parts).
    pub(super) fn split(&self, rows: &[usize]) -> Vec<TensorView> {
        let mut first = self.first_row;
        rows.iter()
            .map(|&n| {
                let v = TensorView {
                    rows: n,
                    first_row: first,
                    ..self.clone()
                };
                first += n;
                v
            })
            .collect()
    }
}
