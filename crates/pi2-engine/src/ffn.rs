//! The FFN of one layer over a batch: dense (gate and up by GEMM, the activation, down), or
//! sparse as masked dense work (the same result as the token-by-token sparse path, with every
//! neuron's activation known so the predictor's recall is measured). The two-phase sparse
//! path of a single token is `pipeline.rs`; mixtures of experts are `moe.rs`.

use crate::neurons::{fires, is_candidate, predict};
use crate::scratch::{grow, Scratch};
use crate::sparse::{SparseLayer, SparseStats};
use pi2_kernels::{axpy_rows_by, matmul, matmul_many, ActBuf, KernelSet, MatRef};
use pi2_model::FfnAct;
use pi2_sparse::FfnObserver;
use rayon::prelude::*;

/// Dense FFN of the `n` tokens of `s.xn`, added to `s.x`. `down` is `ffn_down` (rows of `n_ff`)
/// or, if `down_transposed`, one row per neuron.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense<'o>(
    ks: &KernelSet,
    act: FfnAct,
    [gate, up, down]: [MatRef<'_>; 3],
    down_transposed: bool,
    s: &mut Scratch,
    observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    li: usize,
    n: usize,
) {
    let (d, ff) = (gate.cols, gate.rows);
    let gate_out = grow(&mut s.gate, n * ff);
    let up_out = grow(&mut s.up, n * ff);
    project_pair(
        ks,
        &mut s.acts,
        &s.xn[..n * d],
        d,
        [(gate, gate_out), (up, up_out)],
    );
    let mut threshold = None;
    if let Some(o) = observer {
        o.observe(li, &s.xn[..n * d], &s.gate[..n * ff]);
        threshold = o.confirm_threshold(li);
    }
    match threshold {
        Some(t) => gated_confirmed(act, t, &mut s.gate[..n * ff], &s.up[..n * ff]),
        None => gated(act, &mut s.gate[..n * ff], &s.up[..n * ff]),
    }
    if down_transposed {
        accumulate_down_t(ks, &down, &s.gate[..n * ff], n, &mut s.partials, &mut s.x);
        return;
    }
    s.acts.quantize(down.ty.act_kind(), &s.gate[..n * ff], ff);
    let o = grow(&mut s.o, n * d);
    matmul(ks, &down, &s.acts, o);
    s.x[..n * d]
        .iter_mut()
        .zip(&s.o[..n * d])
        .for_each(|(x, o)| *x += o);
}

/// A converted layer's dense FFN of the `n` tokens of `s.xn`, added to `s.x`: gate and up in
/// the file's neuron order; with the source's down matrix, their coefficients put back in the
/// source's order (the same products as the plain model's dense FFN, row for row), else the
/// file's transposed down rows accumulated per neuron, only the neurons that fire at
/// `threshold` when given (the sparse step's function, summed in another order).
pub(crate) fn dense_converted(
    ks: &KernelSet,
    act: FfnAct,
    d: &crate::weights::DenseFfn<'_>,
    threshold: Option<f32>,
    s: &mut Scratch,
    n: usize,
) {
    use crate::weights::DenseDown;
    let (dim, ff) = (d.gate.cols, d.gate.rows);
    let gate_out = grow(&mut s.gate, n * ff);
    let up_out = grow(&mut s.up, n * ff);
    project_pair(
        ks,
        &mut s.acts,
        &s.xn[..n * dim],
        dim,
        [(d.gate, gate_out), (d.up, up_out)],
    );
    let (down, perm) = match &d.down {
        DenseDown::Transposed(down_t) => {
            match threshold {
                Some(t) => gated_confirmed(act, t, &mut s.gate[..n * ff], &s.up[..n * ff]),
                None => gated(act, &mut s.gate[..n * ff], &s.up[..n * ff]),
            }
            accumulate_down_t(ks, down_t, &s.gate[..n * ff], n, &mut s.partials, &mut s.x);
            return;
        }
        DenseDown::Source { down, perm } => (down, perm),
    };
    gated(act, &mut s.gate[..n * ff], &s.up[..n * ff]);
    // The up buffer holds the coefficients in the source's order.
    for (file, src) in s.gate[..n * ff]
        .chunks_exact(ff)
        .zip(s.up[..n * ff].chunks_exact_mut(ff))
    {
        for (&j, &v) in perm.iter().zip(file) {
            src[j as usize] = v;
        }
    }
    s.acts.quantize(down.ty.act_kind(), &s.up[..n * ff], ff);
    let o = grow(&mut s.o, n * dim);
    matmul(ks, down, &s.acts, o);
    s.x[..n * dim]
        .iter_mut()
        .zip(&s.o[..n * dim])
        .for_each(|(x, o)| *x += o);
}

/// Neuron i's coefficient: `gate[i] = act(gate[i]) * up_act(up[i])`.
pub(crate) fn gated(act: FfnAct, gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = act.gate(*g) * act.up(u);
    }
}

/// [`gated`] with every neuron that does not fire at `threshold` dropped (coefficient 0).
pub(crate) fn gated_confirmed(act: FfnAct, threshold: f32, gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let a = act.gate(*g);
        *g = if fires(a, threshold) {
            a * act.up(u)
        } else {
            0.0
        };
    }
}

/// `outs[j] = x W_j^T` for two matrices sharing the input (one quantization when their
/// activation formats agree).
pub(crate) fn project_pair(
    ks: &KernelSet,
    acts: &mut ActBuf,
    x: &[f32],
    d: usize,
    mut jobs: [(MatRef<'_>, &mut [f32]); 2],
) {
    let (k0, k1) = (jobs[0].0.ty.act_kind(), jobs[1].0.ty.act_kind());
    if k0 == k1 {
        acts.quantize(k0, x, d);
        matmul_many(ks, acts, &mut jobs);
    } else {
        for (w, out) in jobs {
            acts.quantize(w.ty.act_kind(), x, d);
            matmul(ks, &w, acts, out);
        }
    }
}

/// The sparse FFN over a batch with the same result as running the token path per token,
/// computed as masked dense work: all gate and up rows (GEMM, so every neuron's activation is
/// known and the predictor's recall is measured), coefficients zeroed outside
/// candidates-that-pass, then the transposed down rows accumulated per neuron.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sparse_batch(
    ks: &KernelSet,
    s: &mut Scratch,
    st: &mut SparseStats,
    li: usize,
    n: usize,
    sl: &SparseLayer<'_>,
    use_predictor: bool,
    [gate, up, down_t]: [MatRef<'_>; 3],
    dense_bytes: u64,
    act: FfnAct,
) {
    let (d, ff) = (gate.cols, gate.rows);
    let predictor = use_predictor.then_some(()).and(sl.predictor.as_ref());
    if predictor.is_some() {
        predict(ks, s, sl, d, ff, n);
    }
    let gate_out = grow(&mut s.gate, n * ff);
    let up_out = grow(&mut s.up, n * ff);
    project_pair(
        ks,
        &mut s.acts,
        &s.xn[..n * d],
        d,
        [(gate, gate_out), (up, up_out)],
    );
    let (mut nc, mut nf, mut active, mut found) = (0u64, 0u64, 0u64, 0u64);
    for t in 0..n {
        for i in 0..ff {
            let k = t * ff + i;
            let a = act.gate(s.gate[k]);
            let fires = fires(a, sl.threshold);
            let cand = predictor.is_none_or(|p| is_candidate(p, act, s.pred_s[k]));
            nc += cand as u64;
            active += fires as u64;
            found += (fires && cand) as u64;
            nf += (fires && cand) as u64;
            s.gate[k] = if fires && cand {
                a * act.up(s.up[k])
            } else {
                0.0
            };
        }
    }
    accumulate_down_t(ks, &down_t, &s.gate[..n * ff], n, &mut s.partials, &mut s.x);

    st.token_layers += n as u64;
    st.candidates += nc;
    st.confirmed += nf;
    st.layer_candidates[li] += nc;
    st.layer_tokens[li] += n as u64;
    st.layer_true_active[li] += active;
    st.layer_true_found[li] += found;
    let pred_bytes = predictor.map_or(0, |p| p.bytes()) as u64;
    st.ffn_bytes += n as u64 * pred_bytes
        + nc * gate.row_bytes() as u64
        + nf * (up.row_bytes() + down_t.row_bytes()) as u64;
    st.dense_ffn_bytes += n as u64 * dense_bytes;
}

/// `x[t] += sum_i coeff[t][i] * down_t.row(i)` for `n` tokens: the down projection from its
/// transposed rows. Neuron ranges go to the worker threads, each with its own partial sums; a
/// neuron whose coefficients are all zero is never read.
pub(crate) fn accumulate_down_t(
    ks: &KernelSet,
    down_t: &MatRef<'_>,
    coeff: &[f32],
    n: usize,
    partials: &mut Vec<f32>,
    x: &mut [f32],
) {
    let (ff, d) = (down_t.rows, down_t.cols);
    let threads = rayon::current_num_threads();
    let chunk = ff.div_ceil(threads);
    let tasks = ff.div_ceil(chunk);
    let partials = grow(partials, tasks * n * d);
    partials.fill(0.0);
    partials
        .par_chunks_mut(n * d)
        .enumerate()
        .for_each(|(task, y)| {
            let rows = task * chunk..((task + 1) * chunk).min(ff);
            for (t, yt) in y.chunks_exact_mut(d).enumerate() {
                let c = &coeff[t * ff + rows.start..t * ff + rows.end];
                axpy_rows_by(ks, down_t.ty, |j| down_t.row(rows.start + j), c, yt);
            }
        });
    for part in partials.chunks_exact(n * d) {
        x[..n * d].iter_mut().zip(part).for_each(|(x, p)| *x += p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_is_exact_for_relu_and_a_threshold_for_silu() {
        let relu = FfnAct::Relu;
        assert!(!fires(relu.gate(-1.0), 0.0));
        assert!(!fires(relu.gate(0.0), 0.0));
        assert!(fires(relu.gate(1e-30), 0.0));
        assert!(fires(FfnAct::Silu.gate(-1.0), 0.2));
        assert!(!fires(FfnAct::Silu.gate(-0.1), 0.2));
    }
}
