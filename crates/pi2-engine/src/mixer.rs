//! A layer's token mixer: attention ([`attention::block`]), a gated delta net
//! ([`crate::delta`], Qwen3.5), or in a convolution layer (LFM2) a short causal convolution. Such a layer projects its normed input to B, C and x, keeps
//! `B * x` of each position in the KV cache (exact f32 rows; its state is the positions the
//! cache holds, so a truncated cache rolls it back), convolves each channel over the current
//! and the previous `taps - 1` positions, multiplies by C and projects back.

use crate::attention::{self, project_many};
use crate::kv::KvCache;
use crate::scratch::{grow, rms_norm_rows, Scratch};
use crate::states::Keep;
use pi2_kernels::{matmul, KernelSet, MatRef};
use pi2_model::{GgufFile, LayerWeights, Mixer, ModelConfig};

/// Layer `li`'s token mixer over the `n` tokens of `s.x` at positions `pos0..`, its four
/// matrices from the store (`[wq, wk, wv, wo]`, or a convolution's `[B, C, x, out]`), added to
/// the residual stream; a recurrent layer keeps the states `keep` says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block(
    ks: &KernelSet,
    f: &GgufFile,
    c: &ModelConfig,
    l: &LayerWeights,
    mats: [MatRef<'_>; 4],
    s: &mut Scratch,
    kv: &mut KvCache,
    li: usize,
    pos0: usize,
    n: usize,
    keep: Keep,
) {
    match c.mixer(li) {
        Mixer::Attention => attention::block(ks, f, c, l, mats, s, kv, li, pos0, n),
        Mixer::ShortConv { .. } => {
            let taps = l.conv.as_ref().expect("a convolution layer has its taps");
            convolve(ks, f, c, l, taps.f32s(f), mats, s, kv, li, pos0, n)
        }
        Mixer::DeltaNet(dn) => {
            crate::delta::block(ks, f, c, l, dn, mats, s, kv, [li, pos0, n], keep)
        }
    }
}

/// The short convolution (llama.cpp's `ssm_conv` over `B * x`, state prepended): channel `ch`
/// of position `p` is `C[p][ch] * sum_j taps[ch][j] * Bx[p + 1 + j - len][ch]`, positions
/// before the first counting zero.
#[allow(clippy::too_many_arguments)]
fn convolve(
    ks: &KernelSet,
    f: &GgufFile,
    c: &ModelConfig,
    l: &LayerWeights,
    taps: &[f32],
    [wb, wc, wx, wo]: [MatRef<'_>; 4],
    s: &mut Scratch,
    kv: &mut KvCache,
    li: usize,
    pos0: usize,
    n: usize,
) {
    let d = c.n_embd;
    rms_norm_rows(&s.x, l.attn_norm.f32s(f), c.rms_eps, d, n, &mut s.xn);
    let b = grow(&mut s.q, n * d);
    let gate = grow(&mut s.k, n * d);
    let x = grow(&mut s.v, n * d);
    project_many(
        ks,
        f,
        &mut s.acts,
        &s.xn[..n * d],
        d,
        [(wb, None, b), (wc, None, gate), (wx, None, x)],
    );
    let bx = &mut s.q[..n * d];
    bx.iter_mut().zip(&s.v[..n * d]).for_each(|(b, x)| *b *= x);
    let y = grow(&mut s.att, n * d);
    kv.append_state(li, pos0, bx, d).convolve(taps, pos0, y);
    y.iter_mut().zip(&s.k[..n * d]).for_each(|(y, c)| *y *= c);
    let (input, scratch) = (&s.att[..n * d], &mut s.acts);
    add_output(ks, c, &wo, input, d, scratch, &mut s.o, &mut s.x);
}

/// A mixer's output: the `n` rows of `input` (`width` each) through `wo`, added to the residual
/// stream `x` (scaled as the model says; `o * 1.0` is `o`, bit for bit).
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_output(
    ks: &KernelSet,
    c: &ModelConfig,
    wo: &MatRef<'_>,
    input: &[f32],
    width: usize,
    acts: &mut pi2_kernels::ActBuf,
    o: &mut Vec<f32>,
    x: &mut [f32],
) {
    let (d, n) = (c.n_embd, input.len() / width);
    acts.quantize(wo.ty.act_kind(), input, width);
    matmul(ks, wo, acts, grow(o, n * d));
    let scale = c.residual_scale;
    (x[..n * d].iter_mut())
        .zip(&o[..n * d])
        .for_each(|(x, o)| *x += o * scale);
}
