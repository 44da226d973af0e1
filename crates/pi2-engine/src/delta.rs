//! A gated delta net layer (Qwen3.5's linear attention), as llama.cpp's `qwen35.cpp` and its
//! `gated_delta_net` operation compute it. From the normed input: Q, K and V through a causal
//! convolution (their rows kept exactly in the KV cache's ring) and SiLU; Q and K L2-normed
//! per head; per value head `h` (reading key head `h % k_heads`) a state `S` decayed by
//! `exp(g)`, `g = softplus(alpha + dt) * a`, then corrected by the delta rule
//! `S += k (beta (v - S^T k))^T` and read as `o = S^T q / sqrt(head_dim)`; each head's output
//! RMS-normed and multiplied by SiLU of the output gate, then projected back. Tokens run in
//! order (the state carries from one to the next); heads run in parallel.

use crate::attention::project_many;
use crate::kv::KvCache;
use crate::scratch::{grow, rms_norm_in_place, rms_norm_rows, Scratch};
use crate::states::Keep;
use pi2_kernels::{KernelSet, MatRef};
use pi2_model::{DeltaNet, FfnAct, GgufFile, LayerWeights, ModelConfig};
use rayon::prelude::*;

fn silu(x: f32) -> f32 {
    FfnAct::Silu.gate(x)
}

/// ggml's softplus: the identity past 20.
fn softplus(x: f32) -> f32 {
    match x > 20.0 {
        true => x,
        false => (1.0 + x.exp()).ln(),
    }
}

/// `x / sqrt(sum(x^2) + eps)`: llama.cpp's L2 norm of a delta net's Q and K heads.
fn l2_norm(x: &mut [f32], eps: f32) {
    let sum: f32 = x.iter().map(|v| v * v).sum();
    let scale = 1.0 / (sum + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= scale);
}

/// Layer `li` over the `n` tokens of `s.x` at positions `pos0..`, with its projections
/// `[qkv, output gate, beta, out]`, added to the residual stream; the states after its tokens
/// are kept as `keep` says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block(
    ks: &KernelSet,
    f: &GgufFile,
    c: &ModelConfig,
    l: &LayerWeights,
    dn: DeltaNet,
    [wqkv, wz, wbeta, wo]: [MatRef<'_>; 4],
    s: &mut Scratch,
    kv: &mut KvCache,
    [li, pos0, n]: [usize; 3],
    keep: Keep,
) {
    let dw = l.delta.as_ref().expect("a delta net layer has its tensors");
    let (d, hv, cd, vd) = (c.n_embd, dn.v_heads, dn.conv_dim(), dn.value_dim());
    rms_norm_rows(&s.x, l.attn_norm.f32s(f), c.rms_eps, d, n, &mut s.xn);
    let (qkv, z) = (grow(&mut s.q, n * cd), grow(&mut s.k, n * vd));
    let (beta, g) = (grow(&mut s.v, n * hv), grow(&mut s.gate, n * hv));
    let alpha = dw.alpha.mat(f);
    project_many(
        ks,
        f,
        &mut s.acts,
        &s.xn[..n * d],
        d,
        [
            (wqkv, None, qkv),
            (wz, None, z),
            (wbeta, None, beta),
            (alpha, Some(&dw.dt_bias), g),
        ],
    );
    let a = dw.a.f32s(f);
    for (t, (b, g)) in (s.v[..n * hv].iter_mut())
        .zip(&mut s.gate[..n * hv])
        .enumerate()
    {
        *b = 1.0 / (1.0 + (-*b).exp());
        *g = softplus(*g) * a[t % hv];
    }
    // Q, K and V through the causal convolution (their rows kept in the cache) and SiLU.
    let conv = grow(&mut s.att, n * cd);
    let rows = kv.append_state(li, pos0, &s.q[..n * cd], cd);
    rows.convolve(dw.conv.f32s(f), pos0, conv);
    conv.iter_mut().for_each(|v| *v = silu(*v));
    for row in s.att[..n * cd].chunks_exact_mut(cd) {
        for head in row[..2 * dn.key_dim()].chunks_exact_mut(dn.head_dim) {
            l2_norm(head, c.rms_eps);
        }
    }
    recur(dn, s, kv, [li, pos0, n], keep);
    // Each head's output normed and gated by SiLU of its gate rows.
    let norm = dw.norm.f32s(f);
    for (o, z) in (s.up[..n * vd].chunks_exact_mut(dn.head_dim)).zip(s.k.chunks_exact(dn.head_dim))
    {
        rms_norm_in_place(o, norm, c.rms_eps);
        o.iter_mut().zip(z).for_each(|(o, &z)| *o *= silu(z));
    }
    let (input, acts) = (&s.up[..n * vd], &mut s.acts);
    crate::mixer::add_output(ks, c, &wo, input, vd, acts, &mut s.o, &mut s.x);
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The recurrence over the batch's tokens: the state after `pos0 - 1` from the cache, each
/// token's heads in parallel into `s.up`, the states the cache keeps written back.
fn recur(dn: DeltaNet, s: &mut Scratch, kv: &mut KvCache, [li, pos0, n]: [usize; 3], keep: Keep) {
    let (hd, hk, hv) = (dn.head_dim, dn.k_heads, dn.v_heads);
    let (kd, cd, vd) = (dn.key_dim(), dn.conv_dim(), dn.value_dim());
    let scale = 1.0 / (hd as f32).sqrt();
    let states = kv.states(li);
    let mut work = std::mem::take(&mut s.state);
    states.begin(pos0, n, keep, &mut work);
    let out = grow(&mut s.up, n * vd);
    for t in 0..n {
        let row = &s.att[t * cd..(t + 1) * cd];
        let (q, k, v) = (&row[..kd], &row[kd..2 * kd], &row[2 * kd..]);
        let (beta, g) = (&s.v[t * hv..(t + 1) * hv], &s.gate[t * hv..(t + 1) * hv]);
        let heads = work
            .par_chunks_mut(hd * hd)
            .zip(out[t * vd..(t + 1) * vd].par_chunks_mut(hd));
        heads.enumerate().for_each(|(h, (m, o))| {
            let kh = h % hk;
            let (q, k) = (&q[kh * hd..(kh + 1) * hd], &k[kh * hd..(kh + 1) * hd]);
            let v = &v[h * hd..(h + 1) * hd];
            // The state is stored transposed: row j of `m` is column j of S.
            let decay = g[h].exp();
            m.iter_mut().for_each(|x| *x *= decay);
            let mut delta = [0f32; 256];
            for (j, dj) in delta[..hd].iter_mut().enumerate() {
                *dj = (v[j] - dot(&m[j * hd..(j + 1) * hd], k)) * beta[h];
            }
            for (r, &dj) in m.chunks_exact_mut(hd).zip(&delta[..hd]) {
                r.iter_mut().zip(k).for_each(|(x, &ki)| *x += ki * dj);
            }
            for (oj, r) in o.iter_mut().zip(m.chunks_exact(hd)) {
                *oj = dot(r, q) * scale;
            }
        });
        if states.keeps(t, n) {
            states.keep(pos0 + t, &work);
        }
    }
    states.end(pos0, n);
    s.state = work;
}
