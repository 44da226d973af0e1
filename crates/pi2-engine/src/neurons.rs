//! Which neurons a token needs: the predictor's candidate scores, the candidate test, and the
//! firing rule. Shared by the batch FFN (`ffn.rs`) and the token pipeline (`pipeline.rs`).

use crate::scratch::{grow, Scratch};
use crate::sparse::{PredictorWeights, SparseLayer};
use pi2_kernels::{matmul, KernelSet};
use pi2_model::FfnAct;

/// Candidate scores of the predictor for `n` tokens of `s.xn` into `s.pred_s` (`n * n_ff`).
pub(crate) fn predict(
    ks: &KernelSet,
    s: &mut Scratch,
    sl: &SparseLayer<'_>,
    d: usize,
    ff: usize,
    n: usize,
) {
    let p = sl.predictor.as_ref().expect("checked by the caller");
    let r = p.rank();
    let (fc1, fc2) = (p.fc1.mat(), p.fc2.mat());
    s.acts.quantize(fc1.ty.act_kind(), &s.xn[..n * d], d);
    let h = grow(&mut s.pred_h, n * r);
    matmul(ks, &fc1, &s.acts, h);
    if p.kind.relu() {
        h.iter_mut().for_each(|v| *v = v.max(0.0));
    }
    s.acts.quantize(fc2.ty.act_kind(), &s.pred_h[..n * r], r);
    let sc = grow(&mut s.pred_s, n * ff);
    matmul(ks, &fc2, &s.acts, sc);
    if let Some(b) = &p.bias {
        for row in sc.chunks_exact_mut(ff) {
            row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
        }
    }
}

/// Whether a predictor score names a neuron as a candidate.
#[inline]
pub(crate) fn is_candidate(p: &PredictorWeights<'_>, act: FfnAct, score: f32) -> bool {
    match p.kind {
        pi2_sparse::PredictorKind::Trained => score > p.cut,
        // As pi2-sparse measured the cut (`PredictorKind::value`).
        pi2_sparse::PredictorKind::Lowrank => act.gate(score).abs() >= p.cut,
    }
}

/// A neuron fires when its gate activation is not zero and reaches the threshold: with a
/// ReLU-family FFN and threshold 0 that is exact (`> 0`), with SiLU `|act| >= threshold`.
#[inline]
pub fn fires(act: f32, threshold: f32) -> bool {
    act != 0.0 && act.abs() >= threshold
}
