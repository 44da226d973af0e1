//! The attention block of one layer: norm, Q/K/V projections (+ biases), RoPE, the KV cache,
//! causal softmax attention per (token, head), the output projection and the residual add.

use crate::kv::{KvCache, KvView};
use crate::scratch::{add_rows, grow, rms_norm_in_place, rms_norm_rows, rope, Scratch};
use pi2_kernels::{matmul, matmul_many, ActBuf, KernelSet, MatRef};
use pi2_model::{GgufFile, LayerWeights, ModelConfig, TensorView};
use rayon::prelude::*;

thread_local! {
    /// Attention scores of the (token, head) task running on this worker (grows to the context).
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Layer `li`'s attention over the `n` tokens of `s.x` at positions `pos0..`, with projection
/// matrices `[wq, wk, wv, wo]` (mapped, packed or streamed: the caller's choice).
#[allow(clippy::too_many_arguments)]
pub(crate) fn block(
    ks: &KernelSet,
    f: &GgufFile,
    c: &ModelConfig,
    l: &LayerWeights,
    [wq, wk, wv, wo]: [MatRef<'_>; 4],
    s: &mut Scratch,
    kv: &mut KvCache,
    li: usize,
    pos0: usize,
    n: usize,
) {
    let heads = c.heads(li);
    let (d, qd, kvd, hd) = (c.n_embd, c.q_dim(li), c.kv_dim(li), heads.head_dim);
    // A layer that shares an earlier layer's keys and values computes only queries.
    let kv_source = c.kv_source(li);
    let own_kv = kv_source == li;
    rms_norm_rows(&s.x, l.attn_norm.f32s(f), c.rms_eps, d, n, &mut s.xn);
    // Q, K and V share the input; quantize it once per activation format. With an output
    // gate, each head's Q rows are followed by its gate rows.
    let gated = c.attn_output_gate;
    let q = grow(&mut s.q, n * qd * (1 + gated as usize));
    let xn = &s.xn[..n * d];
    match own_kv {
        true => {
            let k = grow(&mut s.k, n * kvd);
            let v = grow(&mut s.v, n * kvd);
            let jobs = [
                (wq, l.bq.as_ref(), q),
                (wk, l.bk.as_ref(), k),
                (wv, l.bv.as_ref(), v),
            ];
            project_many(ks, f, &mut s.acts, xn, d, jobs);
        }
        false => project_many(ks, f, &mut s.acts, xn, d, [(wq, l.bq.as_ref(), q)]),
    }
    if gated {
        split_gate(&mut s.q, grow(&mut s.gate, n * qd), n, c.n_head, hd);
    }
    // Per head, or over each token's whole vector: the weights' length says which.
    let norm = |x: &mut [f32], w: &TensorView| {
        let w = w.f32s(f);
        x.chunks_exact_mut(w.len())
            .for_each(|h| rms_norm_in_place(h, w, c.rms_eps));
    };
    if let Some(qn) = &l.q_norm {
        norm(&mut s.q[..n * qd], qn);
    }
    if let (Some(kn), true) = (&l.k_norm, own_kv) {
        norm(&mut s.k[..n * kvd], kn);
    }
    if c.v_norm && own_kv {
        s.v[..n * kvd]
            .chunks_exact_mut(hd)
            .for_each(|h| rms_norm_unweighted(h, c.rms_eps));
    }
    if c.rope_in(li) {
        let half = heads.n_rot / 2;
        let tables = if c.window(li).is_some() {
            &s.rope_local
        } else {
            &s.rope
        };
        let (cos, sin) = (&tables.cos[..n * half], &tables.sin[..n * half]);
        for t in 0..n {
            let (ct, st) = (
                &cos[t * half..(t + 1) * half],
                &sin[t * half..(t + 1) * half],
            );
            for h in s.q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                rope(h, heads.n_rot, c.rope_kind, ct, st);
            }
            let k = match own_kv {
                true => &mut s.k[t * kvd..(t + 1) * kvd],
                false => &mut [],
            };
            for h in k.chunks_exact_mut(hd) {
                rope(h, heads.n_rot, c.rope_kind, ct, st);
            }
        }
    }
    if let Some(temp) = c.attn_temperature {
        for (t, q) in s.q[..n * qd].chunks_exact_mut(qd).enumerate() {
            let f = temp.at(pos0 + t);
            q.iter_mut().for_each(|x| *x *= f);
        }
    }
    let cache = match own_kv {
        true => kv.append(li, pos0, &s.k[..n * kvd], &s.v[..n * kvd], kvd),
        false => kv.view(kv_source),
    };
    attend(
        ks,
        c,
        li,
        &s.q[..n * qd],
        &cache,
        pos0,
        l.sinks.as_ref().map(|t| t.f32s(f)),
        grow(&mut s.att, n * qd),
    );
    if gated {
        (s.att[..n * qd].iter_mut())
            .zip(&s.gate[..n * qd])
            .for_each(|(a, &g)| *a /= 1.0 + (-g).exp());
    }
    s.acts.quantize(wo.ty.act_kind(), &s.att[..n * qd], qd);
    let o = grow(&mut s.o, n * d);
    matmul(ks, &wo, &s.acts, o);
    add_rows(o, l.bo.as_ref().map(|b| b.f32s(f)));
    if let Some(w) = &l.post_attn_norm {
        let w = w.f32s(f);
        o.chunks_exact_mut(d)
            .for_each(|r| rms_norm_in_place(r, w, c.rms_eps));
    }
    // `o * 1.0` is `o`: without a residual scale the sum is as before, bit for bit.
    let scale = c.residual_scale;
    s.x[..n * d]
        .iter_mut()
        .zip(&s.o[..n * d])
        .for_each(|(x, o)| *x += o * scale);
}

/// RMS norm without weights (ggml's `rms_norm` alone: Gemma 4's values).
fn rms_norm_unweighted(x: &mut [f32], eps: f32) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= r);
}

/// Moves each head's gate rows (after its Q rows in `q`) into `gate`, leaving Q compact
/// (`n_head * hd` per token): in place, each head moves down, never over one not yet moved.
fn split_gate(q: &mut [f32], gate: &mut [f32], n: usize, n_head: usize, hd: usize) {
    for i in 0..n * n_head {
        let (from, to) = (2 * i * hd, i * hd);
        gate[to..to + hd].copy_from_slice(&q[from + hd..from + 2 * hd]);
        q.copy_within(from..from + hd, to);
    }
}

/// Causal attention, one task per (token, head): `out` gets each head's softmax-weighted
/// values over the cached positions up to its own (the last `window` of them in a
/// sliding-window layer); with `sinks`, each head's softmax also counts its sink logit (which
/// weights no value).
#[allow(clippy::too_many_arguments)]
fn attend(
    ks: &KernelSet,
    c: &ModelConfig,
    li: usize,
    qs: &[f32],
    cache: &KvView<'_>,
    pos0: usize,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let heads = c.heads(li);
    let (qd, kvd, hd) = (c.q_dim(li), c.kv_dim(li), heads.head_dim);
    let group = c.n_head / heads.n_head_kv;
    // RoPE's factor of the rotated dimensions is in its tables (see `RopeTables::fill`).
    let scale = c.attn_scale;
    let cap = c.attn_softcap;
    out.par_chunks_mut(hd).enumerate().for_each(|(i, out)| {
        let (t, h) = (i / c.n_head, i % c.n_head);
        let kvh = h / group;
        let qv = &qs[t * qd + h * hd..t * qd + (h + 1) * hd];
        let len = pos0 + t + 1;
        let first = cache.window.map_or(0, |w| len.saturating_sub(w));
        SCORES.with_borrow_mut(|scores| {
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for p in first..len {
                let at = p % cache.ring * kvd + kvh * hd;
                let kv = &cache.k[at..at + hd];
                let mut sc = (ks.f16)(kv, qv) * scale;
                if let Some(cap) = cap {
                    sc = cap * (sc / cap).tanh();
                }
                max = max.max(sc);
                scores.push(sc);
            }
            let sink = sinks.map(|s| s[h]);
            if let Some(sk) = sink {
                max = max.max(sk);
            }
            let mut sum = 0.0;
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                sum += *sc;
            }
            if let Some(sk) = sink {
                sum += (sk - max).exp();
            }
            out.fill(0.0);
            for (p, &w) in (first..).zip(scores.iter()) {
                let at = p % cache.ring * kvd + kvh * hd;
                let vv = &cache.v[at..at + hd];
                (ks.axpy_f16)(w / sum, vv, out);
            }
        });
    });
}

/// Several projections of the same input `x` (rows of `d`): consecutive matrices that take
/// the same activation format share one quantization and one parallel region; each output row
/// gets its bias.
pub(crate) fn project_many<const J: usize>(
    ks: &KernelSet,
    f: &GgufFile,
    acts: &mut ActBuf,
    x: &[f32],
    d: usize,
    jobs: [(MatRef<'_>, Option<&TensorView>, &mut [f32]); J],
) {
    let biases = jobs.each_ref().map(|j| j.1);
    let mut pairs = jobs.map(|(w, _, out)| (w, out));
    let mut start = 0;
    while start < J {
        let kind = pairs[start].0.ty.act_kind();
        let end = (start..J)
            .find(|&j| pairs[j].0.ty.act_kind() != kind)
            .unwrap_or(J);
        acts.quantize(kind, x, d);
        matmul_many(ks, acts, &mut pairs[start..end]);
        start = end;
    }
    for ((_, out), bias) in pairs.iter_mut().zip(biases) {
        add_rows(out, bias.map(|b| b.f32s(f)));
    }
}
