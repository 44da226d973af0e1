//! Row-interleaved copies ([`PackedMat`]) of the matrices the engine multiplies whole: the
//! attention projections, the output matrix and, for a dense FFN, gate/up/down (a converted
//! model's layers that run dense: the source's down matrix the file keeps). Their matvec
//! and GEMM run about twice as fast as on the file's row layout (see pi2-kernels' README), at
//! the cost of one copy made at start-up; the mapped pages of each packed tensor are then
//! released, so the process holds the weights once.
//!
//! Stacked experts pack in memory too (llama.cpp repacks them likewise): an expert is a range
//! of whole row groups of the copy.
//!
//! Matrices the engine reads row by row stay in the mapping: the token embedding, a sparse
//! FFN's neuron rows, transposed down rows, and everything of an offloaded model (its budget
//! accounts for the mapped tensors).

use pi2_kernels::{MatRef, PackedMat};
use pi2_model::{GgufFile, Model, TensorView};
use rayon::prelude::*;

/// The packed matrices of one model, by layer.
pub(crate) struct PackedWeights {
    /// The attention matrices' copies, each once.
    attn_copies: Vec<Option<PackedMat>>,
    /// Per layer: where wq, wk, wv and wo are in `attn_copies` (none: not copied).
    attn: Vec<[Option<usize>; 4]>,
    /// Per layer: gate, up, down (empty when the FFN is not packed).
    ffn: Vec<[Option<PackedMat>; 3]>,
    output: Option<PackedMat>,
}

impl PackedWeights {
    /// Packs every packable whole-matrix tensor of `model` (the FFN too if `ffn`), in
    /// parallel on the current rayon pool, releasing each tensor's mapped pages once copied.
    pub(crate) fn build(model: &Model, ffn: bool) -> Self {
        let f = &model.file;
        let w = &model.weights;
        let pack_all = |tvs: Vec<&TensorView>| -> Vec<Option<PackedMat>> {
            tvs.into_par_iter().map(|tv| pack(f, tv)).collect()
        };
        // Each matrix once: not the keys' and values' of a layer that reads another's (Gemma 4's
        // shared KV, never multiplied), and a view of a matrix already listed (values that are
        // the keys' projection) takes that one's copy.
        let c = &model.config;
        let mut attn_tvs: Vec<&TensorView> = Vec::new();
        let mut attn = Vec::with_capacity(w.layers.len());
        for (li, l) in w.layers.iter().enumerate() {
            let used = [true, c.kv_source(li) == li, c.kv_source(li) == li, true];
            let mut at = [None; 4];
            for (i, tv) in [&l.wq, &l.wk, &l.wv, &l.wo].into_iter().enumerate() {
                if !used[i] {
                    continue;
                }
                let seen = (attn_tvs.iter()).rposition(|t| same(f, t, tv));
                at[i] = Some(seen.unwrap_or_else(|| {
                    attn_tvs.push(tv);
                    attn_tvs.len() - 1
                }));
            }
            attn.push(at);
        }
        let attn_copies = pack_all(attn_tvs);
        let ffn = if ffn {
            // A layer of experts packs only where each expert's rows are whole groups.
            let whole = |n: usize| n.is_multiple_of(pi2_kernels::packed::GROUP_ROWS);
            let stacked_fits = whole(c.n_ff) && whole(c.n_embd);
            let tvs: Vec<Option<&TensorView>> = w
                .layers
                .iter()
                .flat_map(|l| {
                    let fits = l.router.is_none() || stacked_fits;
                    [&l.gate, &l.up, l.down_dense.as_ref().unwrap_or(&l.down)]
                        .map(|t| fits.then_some(t))
                })
                .collect();
            let tvs = tvs
                .into_par_iter()
                .map(|tv| tv.and_then(|tv| pack(f, tv)))
                .collect::<Vec<_>>();
            let mut it = tvs.into_iter();
            (0..w.layers.len())
                .map(|_| std::array::from_fn(|_| it.next().flatten()))
                .collect()
        } else {
            Vec::new()
        };
        Self {
            attn_copies,
            attn,
            ffn,
            output: pack(f, &w.output),
        }
    }

    /// Layer `li`'s attention projections, packed where they could be.
    pub(crate) fn attn<'a>(
        &'a self,
        li: usize,
        tvs: [&TensorView; 4],
        f: &'a GgufFile,
    ) -> [MatRef<'a>; 4] {
        let copy = |i: usize| self.attn[li][i].and_then(|k| self.attn_copies[k].as_ref());
        std::array::from_fn(|i| view(copy(i), tvs[i], f))
    }

    /// Layer `li`'s gate, up and down, packed where they could be.
    pub(crate) fn ffn<'a>(
        &'a self,
        li: usize,
        tvs: [&TensorView; 3],
        f: &'a GgufFile,
    ) -> [MatRef<'a>; 3] {
        std::array::from_fn(|i| view(self.ffn.get(li).and_then(|l| l[i].as_ref()), tvs[i], f))
    }

    /// The output matrix, packed if it could be.
    pub(crate) fn output<'a>(&'a self, tv: &TensorView, f: &'a GgufFile) -> MatRef<'a> {
        view(self.output.as_ref(), tv, f)
    }

    /// Bytes of the packed copies.
    pub(crate) fn bytes(&self) -> usize {
        let layers = self.attn_copies.iter().chain(self.ffn.iter().flatten());
        layers
            .chain(std::iter::once(&self.output))
            .flatten()
            .map(PackedMat::bytes)
            .sum()
    }
}

/// Whether two views are the same rows of the same tensor.
fn same(f: &GgufFile, a: &TensorView, b: &TensorView) -> bool {
    (a.file_offset(f), a.rows, a.cols) == (b.file_offset(f), b.rows, b.cols)
}

fn view<'a>(p: Option<&'a PackedMat>, tv: &TensorView, f: &'a GgufFile) -> MatRef<'a> {
    p.map_or_else(|| tv.mat(f), PackedMat::mat)
}

/// The packed copy of a 2-D tensor whose type has an interleaved form; the mapped pages of
/// the rows copied are released as the copy proceeds, so a large matrix is never held twice.
fn pack(f: &GgufFile, tv: &TensorView) -> Option<PackedMat> {
    let m = tv.mat(f);
    PackedMat::pack_with(&m, |rows| tv.release(f, 0..rows * m.row_bytes()))
}
