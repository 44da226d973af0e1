//! Per-layer token inputs (Gemma 4, llama.cpp's `project_per_layer_inputs` and the end of each
//! layer in `gemma4.cpp`): every token brings a slice for each layer, from a table of its own
//! and a projection of its embedding, that each layer gates into its residual stream after the
//! FFN; then the layer's output scale.

use crate::scratch::{grow, rms_norm_in_place, Scratch};
use pi2_kernels::{matmul, KernelSet};
use pi2_model::{FfnAct, GgufFile, LayerWeights, ModelConfig, PerLayerInput};

/// The per-layer inputs of `n` tokens in `s.per_layer` (token-major: `n_layer` slices of
/// `n_embd_per_layer` per token), which holds their rows of the per-layer table on entry, from
/// their scaled embeddings in `s.x`.
pub(crate) fn inputs(
    ks: &KernelSet,
    f: &GgufFile,
    c: &ModelConfig,
    p: &PerLayerInput,
    n: usize,
    s: &mut Scratch,
) {
    let (d, w) = (c.n_embd, c.n_embd_per_layer);
    let row = w * c.n_layer;
    let proj = p.model_proj.mat(f);
    s.acts.quantize(proj.ty.act_kind(), &s.x[..n * d], d);
    let mixed = grow(&mut s.gate, n * row);
    matmul(ks, &proj, &s.acts, mixed);
    let (proj_scale, table_scale) = ((d as f32).sqrt().recip(), (w as f32).sqrt());
    let norm = p.proj_norm.f32s(f);
    let slices = mixed
        .chunks_exact_mut(w)
        .zip(s.per_layer.chunks_exact_mut(w));
    for (slice, own) in slices {
        slice.iter_mut().for_each(|v| *v *= proj_scale);
        rms_norm_in_place(slice, norm, c.rms_eps);
        for (v, e) in own.iter_mut().zip(slice.iter()) {
            *v = (e + *v * table_scale) * std::f32::consts::FRAC_1_SQRT_2;
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
