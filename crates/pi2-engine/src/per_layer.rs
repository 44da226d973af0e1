//! Per-layer token inputs (Gemma 4, llama.cpp's `project_per_layer_inputs` and the end of each
//! layer in `gemma4.cpp`): every token brings a slice for each layer, from a table of its own
//! and a projection of its embedding, that each layer gates into its residual stream after the
//! FFN; then the layer's output scale.

use crate::scratch::{grow, rms_norm_in_place, Scratch};
use pi2_kernels::{matmul, KernelSet};
use pi2_model::{FfnAct, GgufFile, LayerWeights, ModelConfig, PerLayerInput, TokenId};

/// The per-layer inputs of `tokens` into `s.per_layer` (token-major: `n_layer` slices of
/// `n_embd_per_layer` per token), from their scaled embeddings in `s.x`.
pub(crate) fn inputs(
    ks: &KernelSet,
    f: &GgufFile,
    c: &ModelConfig,
    p: &PerLayerInput,
    tokens: &[TokenId],
    s: &mut Scratch,
) {
    let (n, d, w) = (tokens.len(), c.n_embd, c.n_embd_per_layer);
    let row = w * c.n_layer;
    let proj = p.model_proj.mat(f);
    s.acts.quantize(proj.ty.act_kind(), &s.x[..n * d], d);
    let out = grow(&mut s.per_layer, n * row);
    matmul(ks, &proj, &s.acts, out);
    let (proj_scale, table_scale) = ((d as f32).sqrt().recip(), (w as f32).sqrt());
    let norm = p.proj_norm.f32s(f);
    let table = p.token_embd.mat(f);
    let own = grow(&mut s.gate, row);
    for (t, &tok) in tokens.iter().enumerate() {
        table.dequantize_row(tok as usize, own);
        let mixed = &mut out[t * row..(t + 1) * row];
        for (slice, own) in mixed.chunks_exact_mut(w).zip(own.chunks_exact(w)) {
            slice.iter_mut().for_each(|v| *v *= proj_scale);
            rms_norm_in_place(slice, norm, c.rms_eps);
            for (v, &e) in slice.iter_mut().zip(own) {
                *v = (*v + e * table_scale) * std::f32::consts::FRAC_1_SQRT_2;
            }
        }
    }
}

/// The end of layer `li` for the `n` rows of `s.x`: its per-layer input gated in (where the
/// model has them, from `s.per_layer`), then its output scale.
pub(crate) fn finish_layer(
    ks: &KernelSet,
    f: &GgufFile,
    c: &ModelConfig,
    l: &LayerWeights,
    li: usize,
    n: usize,
    s: &mut Scratch,
) {
    let d = c.n_embd;
    if let Some(g) = &l.per_layer {
        let w = c.n_embd_per_layer;
        let (gate, proj) = (g.inp_gate.mat(f), g.proj.mat(f));
        s.acts.quantize(gate.ty.act_kind(), &s.x[..n * d], d);
        let h = grow(&mut s.up, n * w);
        matmul(ks, &gate, &s.acts, h);
        let row = w * c.n_layer;
        for (t, h) in h.chunks_exact_mut(w).enumerate() {
            let input = &s.per_layer[t * row + li * w..t * row + (li + 1) * w];
            for (v, &p) in h.iter_mut().zip(input) {
                *v = FfnAct::Gelu.gate(*v) * p;
            }
        }
        s.acts.quantize(proj.ty.act_kind(), &s.up[..n * w], w);
        let o = grow(&mut s.o, n * d);
        matmul(ks, &proj, &s.acts, o);
        let post = g.post_norm.f32s(f);
        for (x, o) in s.x[..n * d].chunks_exact_mut(d).zip(o.chunks_exact_mut(d)) {
            rms_norm_in_place(o, post, c.rms_eps);
            x.iter_mut().zip(o.iter()).for_each(|(x, o)| *x += o);
        }
    }
    if let Some(scale) = &l.out_scale {
        let scale = scale.f32s(f)[0];
        s.x[..n * d].iter_mut().for_each(|x| *x *= scale);
    }
}
