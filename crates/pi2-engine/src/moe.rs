//! Mixture-of-experts FFN layers: the router picks each token's top `n_expert_used` experts,
//! weighted by the softmax over their logits (Mixtral's rule). A batch groups its tokens by
//! expert, so each chosen expert's matrices are multiplied once (offloaded: staged from flash
//! expert by expert through the store, the next one read while this one is computed). A decoded token with
//! sparse weights instead runs its chosen experts as units of one sparse step (`pipeline.rs`).

use crate::error::EngineError;
use crate::ffn::{accumulate_down_t, gated, project_pair};
use crate::scratch::{add_rows, grow, Scratch};
use crate::weights::Store;
use pi2_kernels::{matmul, KernelSet, MatRef};
use pi2_model::{GateFunc, Gating, GgufFile, LayerWeights, ModelConfig};
use pi2_sparse::FfnObserver;

/// Tokens per expert of one layer's batch, and the last token's picks.
#[derive(Default)]
pub(crate) struct Routes {
    /// Per expert, the (token, weight) pairs routed to it.
    pub per_expert: Vec<Vec<(usize, f32)>>,
    /// The experts the last routed token chose, with their weights.
    pub picked: Vec<(usize, f32)>,
    pub stats: RoutingStats,
    /// Units the next layer's router picks from this layer's input (a decoded token under a
    /// store that streams experts): read ahead while this layer computes.
    pub guess: Vec<usize>,
}

impl Routes {
    /// Each expert's weights times its own factor (`ffn_down_exps.scale`: Gemma 4's per-expert
    /// scale of its output).
    pub fn scale(&mut self, factors: &[f32]) {
        for (e, toks) in self.per_expert.iter_mut().enumerate() {
            toks.iter_mut().for_each(|(_, w)| *w *= factors[e]);
        }
        self.picked.iter_mut().for_each(|(e, w)| *w *= factors[*e]);
    }
}

/// Gemma 4's router input into `s.xn`: the `n` rows of `stream` RMS-normed, times
/// `router_scale`, over sqrt(n_embd).
pub(crate) fn scaled_router_input(
    c: &ModelConfig,
    router_scale: &[f32],
    stream: &[f32],
    n: usize,
    xn: &mut Vec<f32>,
) {
    let d = c.n_embd;
    crate::scratch::rms_norm_rows(stream, router_scale, c.rms_eps, d, n, xn);
    let inv = (d as f32).sqrt().recip();
    xn[..n * d].iter_mut().for_each(|v| *v *= inv);
}

/// How tokens were routed since the last reset: what decides how well a cache of experts
/// serves them (how uneven the experts' popularity is, how often a token reuses its
/// predecessor's experts).
#[derive(Clone, Debug, Default)]
pub struct RoutingStats {
    /// Per layer and expert (`layer * n_expert + e`): tokens routed to it.
    pub counts: Vec<u64>,
    /// Token-layers routed, and the expert slots among them that the previous token routed
    /// in the same layer chose too.
    pub routings: u64,
    pub repeated: u64,
    n_expert: usize,
    /// Per layer: the previous token's experts.
    last: Vec<Vec<usize>>,
}

impl RoutingStats {
    fn note(&mut self, li: usize, n_layer: usize, n_expert: usize, picked: &[(usize, f32)]) {
        if self.counts.len() != n_layer * n_expert {
            *self = RoutingStats {
                counts: vec![0; n_layer * n_expert],
                n_expert,
                last: vec![Vec::new(); n_layer],
                ..Default::default()
            };
        }
        self.routings += 1;
        let last = &mut self.last[li];
        self.repeated += picked.iter().filter(|p| last.contains(&p.0)).count() as u64;
        last.clear();
        last.extend(picked.iter().map(|p| p.0));
        for p in picked {
            self.counts[li * n_expert + p.0] += 1;
        }
    }

    /// Share of a token's chosen experts its predecessor chose too (in the same layer).
    pub fn reuse(&self) -> f64 {
        let slots = self.routings * self.last.first().map_or(0, Vec::len) as u64;
        self.repeated as f64 / slots.max(1) as f64
    }

    /// Per layer: the most chosen expert's share of the layer's routings, and the share of
    /// experts that take `mass` of them (fewest first: most popular first).
    pub fn popularity(&self, mass: f64) -> Vec<(f64, f64)> {
        (self.counts.chunks(self.n_expert.max(1)))
            .map(|layer| {
                let mut c = layer.to_vec();
                c.sort_unstable_by(|a, b| b.cmp(a));
                let total = c.iter().sum::<u64>().max(1) as f64;
                let (mut sum, mut k) = (0u64, 0);
                while k < c.len() && (sum as f64) < mass * total {
                    sum += c[k];
                    k += 1;
                }
                (c[0] as f64 / total, k as f64 / c.len() as f64)
            })
            .collect()
    }
}

/// A layer's router: its matrix (a row per expert), the bias of its logits (gpt-oss) and
/// the bias added to the probabilities for the choice only (LFM2-MoE).
pub(crate) struct Router<'a> {
    pub mat: MatRef<'a>,
    pub bias: Option<&'a [f32]>,
    pub select: Option<&'a [f32]>,
}

impl<'a> Router<'a> {
    /// Layer `l`'s router, if it is a mixture.
    pub fn of(l: &LayerWeights, f: &'a GgufFile) -> Option<Self> {
        Some(Router {
            mat: l.router.as_ref()?.mat(f),
            bias: l.router_bias.as_ref().map(|b| b.f32s(f)),
            select: l.expert_select_bias.as_ref().map(|b| b.f32s(f)),
        })
    }

    /// The router's logits for the `n` rows of `x` (`d` wide) into `s.logits`.
    fn logits(&self, ks: &KernelSet, x: &[f32], d: usize, n: usize, s: &mut Scratch) {
        let logits = grow(&mut s.logits, n * self.mat.rows);
        s.acts.quantize(self.mat.ty.act_kind(), &x[..n * d], d);
        matmul(ks, &self.mat, &s.acts, logits);
        add_rows(logits, self.bias);
    }
}

/// What a router reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RouterInput {
    /// The FFN's normed input (`s.xn`).
    Normed,
    /// The residual stream (`s.x`): a layer's input, before attention (SmallThinker).
    Stream,
}

/// Routes the `n` tokens of `input` through `router`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn route_tokens(
    ks: &KernelSet,
    c: &ModelConfig,
    li: usize,
    router: &Router<'_>,
    input: RouterInput,
    s: &mut Scratch,
    routes: &mut Routes,
    n: usize,
) {
    let (d, ne) = (c.n_embd, c.n_expert);
    let rows = match input {
        RouterInput::Normed => &mut s.xn,
        RouterInput::Stream => &mut s.x,
    };
    let x = std::mem::take(rows);
    router.logits(ks, &x, d, n, s);
    match input {
        RouterInput::Normed => s.xn = x,
        RouterInput::Stream => s.x = x,
    }
    routes.per_expert.iter_mut().for_each(Vec::clear);
    routes.per_expert.resize_with(ne, Vec::new);
    for t in 0..n {
        route(
            &s.logits[t * ne..(t + 1) * ne],
            router.select,
            c.n_expert_used,
            c.gating,
            &mut routes.picked,
        );
        for &(e, w) in &routes.picked {
            routes.per_expert[e].push((t, w));
        }
        (routes.stats).note(li, c.n_layer, ne, &routes.picked);
    }
}

/// The routed experts of layer `li` over the batch, each on the tokens routed to it, added to
/// `s.x` with their weights; each expert's matrices come from `store` (which may read the next
/// chosen expert meanwhile); `biases`: every expert's gate, up and down biases, stacked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn experts<'o>(
    ks: &KernelSet,
    c: &ModelConfig,
    li: usize,
    routes: &Routes,
    biases: Option<[&[f32]; 3]>,
    s: &mut Scratch,
    store: &mut dyn Store,
    mut observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
) -> Result<(), EngineError> {
    let (d, ff, ne) = (c.n_embd, c.n_ff, c.n_expert);
    let chosen: Vec<usize> = (routes.per_expert.iter().enumerate())
        .filter(|(_, t)| !t.is_empty())
        .map(|(e, _)| li * ne + e)
        .collect();
    // In waves of what the store holds at once, each wave's reads in flight together.
    let (mut wave_end, mut i) = (0, 0);
    while i < chosen.len() {
        if i == wave_end {
            wave_end = i + store.gather(&chosen[i..])?.clamp(1, chosen.len() - i);
            if i == 0 && !routes.guess.is_empty() {
                store.prefetch(&routes.guess)?;
            }
        }
        let (unit, next) = (chosen[i], chosen[..wave_end].get(i + 1).copied());
        i += 1;
        let (e, toks) = (unit % ne, &routes.per_expert[unit % ne]);
        let m = toks.len();
        let xe = grow(&mut s.q, m * d);
        for (j, &(t, _)) in toks.iter().enumerate() {
            xe[j * d..(j + 1) * d].copy_from_slice(&s.xn[t * d..(t + 1) * d]);
        }
        let mats = store.ffn(unit, next)?;
        let (g, u) = (grow(&mut s.gate, m * ff), grow(&mut s.up, m * ff));
        project_pair(
            ks,
            &mut s.acts,
            &s.q[..m * d],
            d,
            [(mats.gate, g), (mats.up, u)],
        );
        let bias = |k: usize, len: usize| biases.map(|b| &b[k][e * len..(e + 1) * len]);
        add_rows(&mut s.gate[..m * ff], bias(0, ff));
        add_rows(&mut s.up[..m * ff], bias(1, ff));
        if let Some(obs) = observer.as_deref_mut() {
            obs.observe_expert(li, e, &s.q[..m * d], &s.gate[..m * ff]);
        }
        gated(c.ffn_act, &mut s.gate[..m * ff], &s.up[..m * ff]);
        let o = grow(&mut s.o, m * d);
        if mats.down_transposed {
            o.fill(0.0);
            accumulate_down_t(
                ks,
                &mats.down,
                &s.gate[..m * ff],
                m,
                &mut s.partials,
                &mut s.o,
            );
        } else {
            s.acts
                .quantize(mats.down.ty.act_kind(), &s.gate[..m * ff], ff);
            matmul(ks, &mats.down, &s.acts, o);
        }
        add_rows(&mut s.o[..m * d], bias(2, d));
        for (j, &(t, w)) in toks.iter().enumerate() {
            let x = &mut s.x[t * d..(t + 1) * d];
            x.iter_mut()
                .zip(&s.o[j * d..(j + 1) * d])
                .for_each(|(x, o)| *x += w * o);
        }
    }
    Ok(())
}

/// A layer's shared expert over the `n` tokens of `s.xn`, added to `s.x`, each token's output
/// scaled by the sigmoid of its dot product with the expert's gate (when it has one).
pub(crate) fn shared(
    ks: &KernelSet,
    c: &ModelConfig,
    [gate, up, down]: [MatRef<'_>; 3],
    gate_inp: Option<&[f32]>,
    s: &mut Scratch,
    n: usize,
) {
    let (d, ff) = (c.n_embd, gate.rows);
    let (g, u) = (grow(&mut s.gate, n * ff), grow(&mut s.up, n * ff));
    project_pair(ks, &mut s.acts, &s.xn[..n * d], d, [(gate, g), (up, u)]);
    gated(c.ffn_act, &mut s.gate[..n * ff], &s.up[..n * ff]);
    s.acts.quantize(down.ty.act_kind(), &s.gate[..n * ff], ff);
    matmul(ks, &down, &s.acts, grow(&mut s.o, n * d));
    for t in 0..n {
        let w = gate_inp.map_or(1.0, |wg| {
            let logit: f32 = (s.xn[t * d..(t + 1) * d].iter().zip(wg))
                .map(|(x, w)| x * w)
                .sum();
            1.0 / (1.0 + (-logit).exp())
        });
        (s.x[t * d..(t + 1) * d].iter_mut())
            .zip(&s.o[t * d..(t + 1) * d])
            .for_each(|(x, o)| *x += w * o);
    }
}

/// The units layer `li + 1`'s router picks for the one token whose residual stream is `s.x`
/// (normed with that layer's FFN norm, if its router reads a normed input): where the layer's
/// own input will be after this layer, guessed from where it is now.
#[allow(clippy::too_many_arguments)]
pub(crate) fn guess_next(
    ks: &KernelSet,
    c: &ModelConfig,
    li: usize,
    norm: Option<&[f32]>,
    router: &Router<'_>,
    s: &mut Scratch,
    out: &mut Vec<usize>,
) {
    let (d, ne) = (c.n_embd, c.n_expert);
    let mut xn = std::mem::take(&mut s.q);
    match norm {
        Some(norm) => crate::scratch::rms_norm(&s.x[..d], norm, c.rms_eps, grow(&mut xn, d)),
        None => grow(&mut xn, d).copy_from_slice(&s.x[..d]),
    }
    router.logits(ks, &xn, d, 1, s);
    s.q = xn;
    let mut picked = Vec::with_capacity(c.n_expert_used);
    route(
        &s.logits[..ne],
        router.select,
        c.n_expert_used,
        c.gating,
        &mut picked,
    );
    out.clear();
    out.extend(picked.iter().map(|&(e, _)| (li + 1) * ne + e));
}

/// Floor of the chosen weights' sum before renormalising (llama.cpp's: the smallest normal
/// f16), so that near-zero sigmoid weights never divide by zero.
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// The `k` experts with the largest probability under `gating.func` (plus `select`, the
/// layer's selection bias, for the choice only; ties: the lower index; NaN never chosen),
/// weighted by their probabilities (for [`GateFunc::SoftmaxWeight`]: the softmax over the
/// chosen logits), renormalised to sum to one when `gating` says so, then scaled. As
/// llama.cpp's `build_moe_ffn`.
pub(crate) fn route(
    logits: &[f32],
    select: Option<&[f32]>,
    k: usize,
    gating: Gating,
    out: &mut Vec<(usize, f32)>,
) {
    let mut buf = [0f32; 256];
    let probs = &mut buf[..logits.len()];
    match gating.func {
        GateFunc::Softmax => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            probs
                .iter_mut()
                .zip(logits)
                .for_each(|(p, &l)| *p = (l - max).exp());
            let sum: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= sum);
        }
        GateFunc::Sigmoid => {
            (probs.iter_mut().zip(logits)).for_each(|(p, &l)| *p = 1.0 / (1.0 + (-l).exp()))
        }
        GateFunc::SoftmaxWeight => probs.copy_from_slice(logits),
    }
    let score = |e: usize| probs[e] + select.map_or(0.0, |b| b[e]);
    out.clear();
    for _ in 0..k {
        let best = (0..probs.len())
            .filter(|e| !out.iter().any(|p| p.0 == *e))
            .fold(None, |b: Option<usize>, e| match b {
                // Keep `b` unless `e` is strictly larger (NaN never wins).
                Some(b) if score(e).partial_cmp(&score(b)) != Some(std::cmp::Ordering::Greater) => {
                    Some(b)
                }
                _ => Some(e),
            });
        let Some(e) = best else { break };
        out.push((e, probs[e]));
    }
    if gating.func == GateFunc::SoftmaxWeight {
        let max = out.iter().map(|p| p.1).fold(f32::NEG_INFINITY, f32::max);
        out.iter_mut().for_each(|p| p.1 = (p.1 - max).exp());
        let sum: f32 = out.iter().map(|p| p.1).sum();
        out.iter_mut().for_each(|p| p.1 /= sum);
    }
    if gating.renormalize {
        let sum = out.iter().map(|p| p.1).sum::<f32>().max(MIN_WEIGHT_SUM);
        out.iter_mut().for_each(|p| p.1 /= sum);
    }
    out.iter_mut().for_each(|p| p.1 *= gating.scale);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIXTRAL: Gating = Gating {
        func: GateFunc::Softmax,
        renormalize: true,
        scale: 1.0,
    };

    fn picks(r: &[(usize, f32)]) -> Vec<usize> {
        r.iter().map(|p| p.0).collect()
    }

    #[test]
    fn without_renormalising_the_weights_are_the_full_softmax_scaled() {
        let mut r = Vec::new();
        let olmoe = Gating {
            renormalize: false,
            scale: 2.0,
            ..MIXTRAL
        };
        route(&[0.0, 2.0, 1.0], None, 2, olmoe, &mut r);
        let z = 1.0 + 2f32.exp() + 1f32.exp();
        assert_eq!(picks(&r), [1, 2]);
        assert!((r[0].1 - 2.0 * 2f32.exp() / z).abs() < 1e-6, "{r:?}");
        assert!((r[1].1 - 2.0 * 1f32.exp() / z).abs() < 1e-6, "{r:?}");
    }

    #[test]
    fn routing_picks_the_top_experts_and_normalises_their_weights() {
        let mut r = Vec::new();
        route(&[0.0, 2.0, 1.0, 2.0], None, 2, MIXTRAL, &mut r);
        // Ties go to the lower index; weights are the softmax over the chosen logits.
        assert_eq!(picks(&r), [1, 3]);
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
        route(&[3.0, 1.0, f32::NEG_INFINITY], None, 2, MIXTRAL, &mut r);
        let e = (-2.0f32).exp();
        assert_eq!(r[0].0, 0);
        assert!((r[0].1 - 1.0 / (1.0 + e)).abs() < 1e-6);
        assert!((r[1].1 - e / (1.0 + e)).abs() < 1e-6);
        // The softmax of the chosen logits (gpt-oss) weighs them the same way.
        let chosen = Gating {
            func: GateFunc::SoftmaxWeight,
            renormalize: false,
            ..MIXTRAL
        };
        let mut w = Vec::new();
        route(&[3.0, 1.0, f32::NEG_INFINITY], None, 2, chosen, &mut w);
        assert_eq!(picks(&w), [0, 1]);
        assert!((w[0].1 - r[0].1).abs() < 1e-6 && (w[1].1 - r[1].1).abs() < 1e-6);
    }

    #[test]
    fn sigmoid_gates_choose_with_the_selection_bias_and_weigh_without_it() {
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        let lfm2moe = Gating {
            func: GateFunc::Sigmoid,
            renormalize: true,
            scale: 1.0,
        };
        let (logits, bias) = ([2.0, 0.0, 1.0, -1.0], [0.0, 0.5, 0.0, 2.0]);
        let mut r = Vec::new();
        route(&logits, Some(&bias), 2, lfm2moe, &mut r);
        // Scores with the bias: 0.88, 1.0, 0.73, 2.27.
        assert_eq!(picks(&r), [3, 1]);
        let (a, b) = (sigmoid(-1.0), sigmoid(0.0));
        assert!((r[0].1 - a / (a + b)).abs() < 1e-6, "{r:?}");
        assert!((r[1].1 - b / (a + b)).abs() < 1e-6, "{r:?}");
        // Not renormalised: the sigmoids themselves, scaled.
        let raw = Gating {
            renormalize: false,
            scale: 2.5,
            ..lfm2moe
        };
        route(&logits, None, 2, raw, &mut r);
        assert_eq!(picks(&r), [0, 2]);
        assert!((r[0].1 - 2.5 * sigmoid(2.0)).abs() < 1e-6);
        // Weights that sum to almost nothing are divided by a floor, never by zero.
        route(&[-200.0, -300.0], None, 1, lfm2moe, &mut r);
        assert!(r[0].1.is_finite());
    }
}
