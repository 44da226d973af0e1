//! Low-rank neuron predictors `score = fc2 . h(fc1 . x) + bias`, built two ways:
//!
//! - [`lowrank`] (training-free, seconds): the rank-`r` subspace that best reconstructs the
//!   gate pre-activations `W_gate x` over the calibration inputs (top eigenvectors `U` of
//!   `W_gate C W_gate^T`, `C` the input covariance); `fc1 = U^T W_gate`, `fc2 = U`, `h` the
//!   identity. The score approximates `gate . x`, and a neuron is a candidate when
//!   `|act(score)| >= cut`.
//! - [`train`]: PowerInfer's form (`h` = ReLU) trained on (x, fired) pairs with a class-weighted
//!   logistic loss, Adam, and early stopping on a held-out split; a candidate has `score > cut`.
//!
//! Either way `cut` is then set on the held-out split for a target recall, and the rank is chosen
//! per layer to minimise the bytes a decode step reads (predictor + candidate gate rows).

use crate::{Activation, SparseError};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// How a predictor's score names candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PredictorKind {
    /// ReLU hidden layer; the score is a logit; candidate when `score > cut`.
    Trained,
    /// Linear hidden layer; the score approximates `gate . x`; candidate when
    /// `|act(score)| >= cut`.
    Lowrank,
}

impl PredictorKind {
    pub fn name(self) -> &'static str {
        match self {
            PredictorKind::Trained => "trained",
            PredictorKind::Lowrank => "lowrank",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "trained" => Some(PredictorKind::Trained),
            "lowrank" => Some(PredictorKind::Lowrank),
            _ => None,
        }
    }
    /// Whether the hidden layer has a ReLU.
    pub fn relu(self) -> bool {
        self == PredictorKind::Trained
    }
    /// The value compared with `cut` (larger = more likely to fire).
    #[inline]
    pub fn value(self, score: f32, act: Activation) -> f32 {
        match self {
            PredictorKind::Trained => score,
            PredictorKind::Lowrank => act.apply(score).abs(),
        }
    }
}

/// One layer's predictor, f32 row-major.
#[derive(Clone, Debug)]
pub struct Predictor {
    pub kind: PredictorKind,
    pub rank: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    /// `rank x n_embd`.
    pub fc1: Vec<f32>,
    /// `n_ff x rank`.
    pub fc2: Vec<f32>,
    /// `n_ff`.
    pub bias: Vec<f32>,
    pub cut: f32,
}

/// A predictor and how it did on the held-out split.
#[derive(Clone, Debug)]
pub struct Fit {
    pub predictor: Predictor,
    /// Fraction of firing neurons that were candidates.
    pub recall: f32,
    /// Fraction of neurons that were candidates.
    pub candidates: f32,
}

/// Settings of [`lowrank`] and [`train`].
#[derive(Clone, Debug)]
pub struct FitConfig {
    pub activation: Activation,
    /// Recall the cut is set for on the held-out split.
    pub target_recall: f32,
    /// Ranks tried are multiples of `rank_step` up to `max_rank`.
    pub rank_step: usize,
    pub max_rank: usize,
    /// Bytes of one gate row and of one predictor weight (rank choice weighs them).
    pub gate_row_bytes: f32,
    pub predictor_weight_bytes: f32,
    /// Training: passes over the training split at most, batch size, learning rate, seed.
    pub epochs: usize,
    pub batch: usize,
    pub learning_rate: f32,
    pub seed: u64,
}

impl Default for FitConfig {
    fn default() -> Self {
        Self {
            activation: Activation::Silu,
            target_recall: 0.97,
            rank_step: 32,
            max_rank: 192,
            gate_row_bytes: 360.0,
            predictor_weight_bytes: 34.0 / 32.0,
            epochs: 12,
            batch: 256,
            learning_rate: 2e-3,
            seed: 0x5eed,
        }
    }
}

/// Calibration pairs of one layer: inputs and which neurons fired (bit per neuron), split into a
/// training part (the first tokens) and a held-out part (the rest). Samples made with
/// [`LayerSamples::fired_only`] keep no inputs (a conversion that fits no predictor needs
/// only the bits, a tenth of the memory).
#[derive(Clone, Debug, Default)]
pub struct LayerSamples {
    pub n_embd: usize,
    pub n_ff: usize,
    /// Every token's input (`len() * n_embd`), or nothing when made `fired_only`.
    pub x: Vec<f32>,
    fired: Vec<u64>,
    tokens: usize,
    keep_inputs: bool,
    /// Tokens `..train` are for fitting, `train..` held out.
    pub train: usize,
}

impl LayerSamples {
    pub fn new(n_embd: usize, n_ff: usize) -> Self {
        Self {
            n_embd,
            n_ff,
            keep_inputs: true,
            ..Self::default()
        }
    }

    /// Samples that record which neurons fired but not the inputs: enough for placement and
    /// firing rates, not for fitting a predictor.
    pub fn fired_only(n_embd: usize, n_ff: usize) -> Self {
        Self {
            keep_inputs: false,
            ..Self::new(n_embd, n_ff)
        }
    }

    /// Tokens recorded.
    pub fn len(&self) -> usize {
        self.tokens
    }

    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    fn words(&self) -> usize {
        self.n_ff.div_ceil(64)
    }

    /// Add one token: its FFN input and gate pre-activations; a neuron fired when
    /// `|act(gate)| >= threshold`.
    pub fn push(&mut self, x: &[f32], gate: &[f32], threshold: f32, act: Activation) {
        if self.keep_inputs {
            self.x.extend_from_slice(x);
        }
        self.tokens += 1;
        let w0 = self.fired.len();
        self.fired.resize(w0 + self.words(), 0);
        set_fired(&mut self.fired[w0..], gate, threshold, act);
    }

    /// [`LayerSamples::push`] for a batch of tokens (`x`: `m * n_embd`, `gate`: `m * n_ff`),
    /// their fired bits computed in parallel (an activation per neuron each: the calibration
    /// pass waited on this).
    pub fn push_batch(&mut self, x: &[f32], gate: &[f32], threshold: f32, act: Activation) {
        if self.keep_inputs {
            self.x.extend_from_slice(x);
        }
        let w = self.words();
        let w0 = self.fired.len();
        let m = gate.len() / self.n_ff;
        self.tokens += m;
        self.fired.resize(w0 + m * w, 0);
        self.fired[w0..]
            .par_chunks_mut(w)
            .zip(gate.par_chunks_exact(self.n_ff))
            .for_each(|(bits, g)| set_fired(bits, g, threshold, act));
    }

    pub fn fired(&self, t: usize, i: usize) -> bool {
        self.fired[t * self.words() + i / 64] >> (i % 64) & 1 == 1
    }

    /// Hold out the last `fraction` of the tokens.
    pub fn hold_out(&mut self, fraction: f32) {
        let n = self.len();
        self.train = n - ((n as f32 * fraction).round() as usize).clamp(1, n.saturating_sub(1));
    }
}

/// Sets bit `i` of `bits` for every neuron `i` of one token's `gate` that fires.
fn set_fired(bits: &mut [u64], gate: &[f32], threshold: f32, act: Activation) {
    for (i, &g) in gate.iter().enumerate() {
        if act.fires(g, threshold) {
            bits[i / 64] |= 1 << (i % 64);
        }
    }
}

/// `c (m x n) = a (m x k) . b^T (b: n x k)`, all row-major.
fn mm_bt(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= n * k && c.len() >= m * n);
    // SAFETY: the sizes are checked above; strides describe row-major / transposed views.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            1,
            k as isize,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    }
}

/// `c (m x n) = a (m x k) . b (k x n)`, row-major.
fn mm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: as above.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    }
}

/// `c (m x n) += a^T . b` with `a: k x m`, `b: k x n`, row-major.
fn mm_at_acc(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32]) {
    assert!(a.len() >= k * m && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: as above.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            1,
            m as isize,
            b.as_ptr(),
            n as isize,
            1,
            1.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    }
}

impl Predictor {
    /// Scores of `n` inputs (`x`: `n x n_embd`) -> `n x n_ff`.
    pub fn scores(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut h = vec![0.0; n * self.rank];
        mm_bt(x, &self.fc1, n, self.n_embd, self.rank, &mut h);
        if self.kind.relu() {
            h.iter_mut().for_each(|v| *v = v.max(0.0));
        }
        let mut s = vec![0.0; n * self.n_ff];
        mm_bt(&h, &self.fc2, n, self.rank, self.n_ff, &mut s);
        for row in s.chunks_exact_mut(self.n_ff) {
            row.iter_mut().zip(&self.bias).for_each(|(v, b)| *v += b);
        }
        s
    }

    /// Set `cut` for `target` recall on tokens `range` of `samples`; returns (recall,
    /// candidate fraction) there.
    pub fn calibrate(
        &mut self,
        samples: &LayerSamples,
        range: std::ops::Range<usize>,
        target: f32,
        act: Activation,
    ) -> (f32, f32) {
        let n = range.len();
        let x = &samples.x[range.start * self.n_embd..range.end * self.n_embd];
        let s = self.scores(x, n);
        let mut fired_vals = Vec::new();
        let mut all_vals = Vec::with_capacity(s.len());
        for t in 0..n {
            for i in 0..self.n_ff {
                let v = self.kind.value(s[t * self.n_ff + i], act);
                all_vals.push(v);
                if samples.fired(range.start + t, i) {
                    fired_vals.push(v);
                }
            }
        }
        if fired_vals.is_empty() {
            self.cut = f32::INFINITY;
            return (1.0, 0.0);
        }
        fired_vals.sort_unstable_by(|a, b| b.total_cmp(a));
        let k = ((fired_vals.len() as f32 * target).ceil() as usize).clamp(1, fired_vals.len());
        let cut = fired_vals[k - 1];
        // Candidates are `value >= cut` for the gate form and `> cut` for logits: store the cut
        // one ulp below for logits so both tests keep the k-th firing neuron.
        self.cut = match self.kind {
            PredictorKind::Lowrank => cut,
            PredictorKind::Trained => cut.next_down(),
        };
        let is_cand = |v: f32| self.is_candidate_value(v);
        let recall =
            fired_vals.iter().filter(|&&v| is_cand(v)).count() as f32 / fired_vals.len() as f32;
        let cands = all_vals.iter().filter(|&&v| is_cand(v)).count() as f32 / all_vals.len() as f32;
        (recall, cands)
    }

    /// The candidate test on [`PredictorKind::value`].
    #[inline]
    pub fn is_candidate_value(&self, v: f32) -> bool {
        match self.kind {
            PredictorKind::Lowrank => v >= self.cut,
            PredictorKind::Trained => v > self.cut,
        }
    }

    /// Weights (fc1 + fc2) in elements.
    pub fn weights(&self) -> usize {
        self.rank * (self.n_embd + self.n_ff)
    }
}

fn check(samples: &LayerSamples) -> Result<(), SparseError> {
    if samples.x.len() != samples.len() * samples.n_embd {
        return Err(SparseError::Predictor(
            "these calibration samples kept no inputs (made `fired_only`): a predictor cannot be \
             fitted on them"
                .into(),
        ));
    }
    if samples.len() < 16 || samples.train == 0 || samples.train >= samples.len() {
        return Err(SparseError::Predictor(format!(
            "{} calibration tokens with {} for training: too few to fit and hold out",
            samples.len(),
            samples.train
        )));
    }
    Ok(())
}

/// Cost of a fit in bytes read per token: predictor weights + candidate gate rows.
fn cost(f: &Fit, cfg: &FitConfig) -> f32 {
    f.predictor.weights() as f32 * cfg.predictor_weight_bytes
        + f.candidates * f.predictor.n_ff as f32 * cfg.gate_row_bytes
}

/// The training-free predictor: see the module docs. `w_gate` is `n_ff x n_embd` (f32).
pub fn lowrank(
    w_gate: &[f32],
    samples: &LayerSamples,
    cfg: &FitConfig,
) -> Result<Fit, SparseError> {
    check(samples)?;
    let (d, ff) = (samples.n_embd, samples.n_ff);
    let n = samples.train;
    let x = &samples.x[..n * d];
    // Input covariance C = X^T X / n.
    let mut c = vec![0.0; d * d];
    mm_at_acc(x, x, d, n, d, &mut c);
    c.iter_mut().for_each(|v| *v /= n as f32);
    let r_max = cfg.max_rank.min(ff).min(d).max(1);
    // G v = W (C (W^T v)) without forming G (n_ff x n_ff).
    let apply = |q: &[f32], r: usize| -> Vec<f32> {
        // q: ff x r
        let mut wtq = vec![0.0; d * r]; // W^T q: d x r
        mm_at_acc(w_gate, q, d, ff, r, &mut wtq);
        let mut cw = vec![0.0; d * r];
        mm(&c, &wtq, d, d, r, &mut cw);
        let mut out = vec![0.0; ff * r];
        mm(w_gate, &cw, ff, d, r, &mut out);
        out
    };
    let mut rng = Rng(cfg.seed);
    let mut q: Vec<f32> = (0..ff * r_max).map(|_| rng.normal()).collect();
    orthonormalize(&mut q, ff, r_max);
    for _ in 0..12 {
        q = apply(&q, r_max);
        orthonormalize(&mut q, ff, r_max);
    }
    // Rayleigh-Ritz: order the basis by captured variance so prefixes are the best subspaces.
    let gq = apply(&q, r_max);
    let mut t = vec![0.0; r_max * r_max];
    mm_at_acc(&q, &gq, r_max, ff, r_max, &mut t);
    let (vals, vecs) = jacobi_eigen(&t, r_max);
    let mut order: Vec<usize> = (0..r_max).collect();
    order.sort_by(|&a, &b| vals[b].total_cmp(&vals[a]));
    let mut u = vec![0.0; ff * r_max];
    for i in 0..ff {
        for (jn, &jo) in order.iter().enumerate() {
            u[i * r_max + jn] = (0..r_max)
                .map(|k| q[i * r_max + k] as f64 * vecs[k * r_max + jo])
                .sum::<f64>() as f32;
        }
    }
    let mut best: Option<Fit> = None;
    let mut r = cfg.rank_step.min(r_max);
    while r <= r_max {
        // fc2 = U_r (ff x r); fc1 = U_r^T W (r x d).
        let fc2: Vec<f32> = (0..ff)
            .flat_map(|i| u[i * r_max..i * r_max + r].to_vec())
            .collect();
        let mut fc1 = vec![0.0; r * d];
        mm_at_acc(&fc2, w_gate, r, ff, d, &mut fc1);
        let mut p = Predictor {
            kind: PredictorKind::Lowrank,
            rank: r,
            n_embd: d,
            n_ff: ff,
            fc1,
            fc2,
            bias: vec![0.0; ff],
            cut: 0.0,
        };
        let (recall, candidates) = p.calibrate(
            samples,
            samples.train..samples.len(),
            cfg.target_recall,
            cfg.activation,
        );
        let fit = Fit {
            predictor: p,
            recall,
            candidates,
        };
        if best.as_ref().is_none_or(|b| cost(&fit, cfg) < cost(b, cfg)) {
            best = Some(fit);
        }
        r += cfg.rank_step;
    }
    Ok(best.expect("at least one rank is tried"))
}

/// The trained predictor of rank `rank`: see the module docs.
pub fn train(samples: &LayerSamples, rank: usize, cfg: &FitConfig) -> Result<Fit, SparseError> {
    check(samples)?;
    let (d, ff) = (samples.n_embd, samples.n_ff);
    let n = samples.train;
    let mut rng = Rng(cfg.seed);
    // Class balance: each neuron's positives weigh (negatives / positives), capped.
    let mut pos = vec![0u32; ff];
    for t in 0..n {
        for (i, p) in pos.iter_mut().enumerate() {
            *p += samples.fired(t, i) as u32;
        }
    }
    let rate: Vec<f32> = pos
        .iter()
        .map(|&p| ((p as f32 + 0.5) / (n as f32 + 1.0)).clamp(1e-4, 1.0 - 1e-4))
        .collect();
    let pos_w: Vec<f32> = rate.iter().map(|&p| ((1.0 - p) / p).min(20.0)).collect();
    let mut p = Predictor {
        kind: PredictorKind::Trained,
        rank,
        n_embd: d,
        n_ff: ff,
        fc1: (0..rank * d)
            .map(|_| rng.normal() * (2.0 / d as f32).sqrt())
            .collect(),
        fc2: (0..ff * rank)
            .map(|_| rng.normal() * (1.0 / rank as f32).sqrt())
            .collect(),
        bias: rate.iter().map(|&p| (p / (1.0 - p)).ln()).collect(),
        cut: 0.0,
    };
    let mut adam = [
        Adam::new(p.fc1.len()),
        Adam::new(p.fc2.len()),
        Adam::new(ff),
    ];
    let held = samples.train..samples.len();
    let loss_on = |p: &Predictor, range: std::ops::Range<usize>| -> f32 {
        let s = p.scores(&samples.x[range.start * d..range.end * d], range.len());
        let mut l = 0.0;
        for (t, row) in s.chunks_exact(ff).enumerate() {
            for (i, &z) in row.iter().enumerate() {
                l += if samples.fired(range.start + t, i) {
                    pos_w[i] * softplus(-z)
                } else {
                    softplus(z)
                };
            }
        }
        l / (range.len() * ff) as f32
    };
    let mut best = (loss_on(&p, held.clone()), p.clone());
    let mut stale = 0;
    let b = cfg.batch.max(1);
    let mut order: Vec<usize> = (0..n).collect();
    let (mut h, mut s, mut ds, mut dh) = (vec![], vec![], vec![], vec![]);
    let mut xb = vec![];
    for _epoch in 0..cfg.epochs {
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        for batch in order.chunks(b) {
            let m = batch.len();
            xb.clear();
            for &t in batch {
                xb.extend_from_slice(&samples.x[t * d..(t + 1) * d]);
            }
            h.resize(m * rank, 0.0);
            mm_bt(&xb, &p.fc1, m, d, rank, &mut h);
            h.iter_mut().for_each(|v| *v = v.max(0.0));
            s.resize(m * ff, 0.0);
            mm_bt(&h, &p.fc2, m, rank, ff, &mut s);
            // dL/ds of the weighted logistic loss, averaged over the batch.
            ds.resize(m * ff, 0.0);
            for (k, &t) in batch.iter().enumerate() {
                for i in 0..ff {
                    let z = s[k * ff + i] + p.bias[i];
                    let sig = 1.0 / (1.0 + (-z).exp());
                    ds[k * ff + i] = if samples.fired(t, i) {
                        pos_w[i] * (sig - 1.0)
                    } else {
                        sig
                    } / m as f32;
                }
            }
            let mut g2 = vec![0.0; ff * rank];
            mm_at_acc(&ds, &h, ff, m, rank, &mut g2);
            let mut gb = vec![0.0; ff];
            for row in ds.chunks_exact(ff) {
                gb.iter_mut().zip(row).for_each(|(g, v)| *g += v);
            }
            dh.resize(m * rank, 0.0);
            mm(&ds, &p.fc2, m, ff, rank, &mut dh);
            dh.iter_mut().zip(&h).for_each(|(g, &hv)| {
                if hv <= 0.0 {
                    *g = 0.0
                }
            });
            let mut g1 = vec![0.0; rank * d];
            mm_at_acc(&dh, &xb, rank, m, d, &mut g1);
            adam[0].step(&mut p.fc1, &g1, cfg.learning_rate);
            adam[1].step(&mut p.fc2, &g2, cfg.learning_rate);
            adam[2].step(&mut p.bias, &gb, cfg.learning_rate);
        }
        let l = loss_on(&p, held.clone());
        if l < best.0 {
            best = (l, p.clone());
            stale = 0;
        } else {
            stale += 1;
            if stale >= 2 {
                break;
            }
        }
    }
    let mut p = best.1;
    let (recall, candidates) = p.calibrate(samples, held, cfg.target_recall, cfg.activation);
    Ok(Fit {
        predictor: p,
        recall,
        candidates,
    })
}

#[inline]
fn softplus(z: f32) -> f32 {
    if z > 20.0 {
        z
    } else {
        z.exp().ln_1p()
    }
}

struct Adam {
    m: Vec<f32>,
    v: Vec<f32>,
    t: i32,
}

impl Adam {
    fn new(n: usize) -> Self {
        Self {
            m: vec![0.0; n],
            v: vec![0.0; n],
            t: 0,
        }
    }
    fn step(&mut self, w: &mut [f32], g: &[f32], lr: f32) {
        let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
        self.t += 1;
        let (c1, c2) = (1.0 - b1.powi(self.t), 1.0 - b2.powi(self.t));
        for (((w, &g), m), v) in w.iter_mut().zip(g).zip(&mut self.m).zip(&mut self.v) {
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            *w -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
        }
    }
}

/// Orthonormalize the `r` columns of the row-major `n x r` matrix `q`: Gram-Schmidt in f64,
/// run twice (one pass loses orthogonality when a column is nearly dependent on earlier ones); a
/// column that vanishes is replaced by a unit vector orthogonalized like the others.
fn orthonormalize(q: &mut [f32], n: usize, r: usize) {
    let mut cols: Vec<Vec<f64>> = (0..r)
        .map(|j| (0..n).map(|i| q[i * r + j] as f64).collect())
        .collect();
    for j in 0..r {
        let scale = cols[j].iter().map(|v| v * v).sum::<f64>().sqrt();
        for pass in 0..3 {
            let (done, rest) = cols.split_at_mut(j);
            let cj = &mut rest[0];
            for ck in done.iter() {
                let dot = dot_f64(cj, ck);
                cj.iter_mut().zip(ck).for_each(|(a, b)| *a -= dot * b);
            }
            let norm = dot_f64(&cols[j], &cols[j]).sqrt();
            if norm > 1e-9 * scale.max(1e-300) || pass == 2 {
                cols[j].iter_mut().for_each(|v| *v /= norm.max(1e-300));
                if pass >= 1 {
                    break;
                }
            } else {
                // Dependent column: restart from a unit vector.
                cols[j] = (0..n).map(|i| (i == (j * 7919) % n) as u8 as f64).collect();
            }
        }
    }
    for (j, c) in cols.iter().enumerate() {
        for (i, v) in c.iter().enumerate() {
            q[i * r + j] = *v as f32;
        }
    }
}

/// Dot product in eight independent partial sums: the compiler can keep them in vector
/// registers (one running sum cannot be vectorized without reordering it), which makes
/// `orthonormalize`, the largest cost of `pi2 convert`, several times faster.
fn dot_f64(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// Eigenvalues and eigenvectors (columns of the row-major result) of a symmetric `n x n` matrix,
/// by cyclic Jacobi rotations.
fn jacobi_eigen(a: &[f32], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut a: Vec<f64> = a.iter().map(|&v| v as f64).collect();
    // Symmetrize (the product is symmetric up to rounding).
    for i in 0..n {
        for j in 0..i {
            let m = 0.5 * (a[i * n + j] + a[j * n + i]);
            a[i * n + j] = m;
            a[j * n + i] = m;
        }
    }
    let mut v = vec![0.0f64; n * n];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    for _sweep in 0..30 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * n + j].powi(2))
            .sum();
        let diag: f64 = (0..n).map(|i| a[i * n + i].powi(2)).sum();
        if off <= 1e-22 * diag.max(1e-300) {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq.abs() < 1e-300 {
                    continue;
                }
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    ((0..n).map(|i| a[i * n + i]).collect(), v)
}

/// A small deterministic generator (splitmix64) for initialisation and shuffling.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        ((self.next() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer whose gate is exactly low-rank: the lowrank predictor must find every firing
    /// neuron with few candidates, and training must beat chance by far.
    fn synthetic(n: usize, d: usize, ff: usize, true_rank: usize) -> (Vec<f32>, LayerSamples) {
        let mut rng = Rng(7);
        let a: Vec<f32> = (0..ff * true_rank).map(|_| rng.normal()).collect();
        let b: Vec<f32> = (0..true_rank * d)
            .map(|_| rng.normal() / (d as f32).sqrt())
            .collect();
        let mut w = vec![0.0; ff * d];
        mm(&a, &b, ff, true_rank, d, &mut w);
        let mut s = LayerSamples::new(d, ff);
        for _ in 0..n {
            let x: Vec<f32> = (0..d).map(|_| rng.normal()).collect();
            let mut g = vec![0.0; ff];
            mm_bt(&x, &w, 1, d, ff, &mut g);
            s.push(&x, &g, 0.5, Activation::Silu);
        }
        s.hold_out(0.25);
        (w, s)
    }

    #[test]
    fn lowrank_recovers_a_low_rank_gate() {
        let (w, s) = synthetic(400, 64, 128, 8);
        let cfg = FitConfig {
            rank_step: 8,
            max_rank: 32,
            gate_row_bytes: 100.0,
            ..FitConfig::default()
        };
        let fit = lowrank(&w, &s, &cfg).unwrap();
        assert!(fit.recall >= 0.97, "recall {}", fit.recall);
        // exact low-rank: scores equal the gate, so candidates ~= the firing fraction
        let fired = (s.train..s.len())
            .map(|t| (0..128).filter(|&i| s.fired(t, i)).count())
            .sum::<usize>() as f32
            / ((s.len() - s.train) * 128) as f32;
        assert!(
            fit.candidates <= fired + 0.05,
            "{} vs {}",
            fit.candidates,
            fired
        );
        assert!(fit.predictor.rank >= 8);
    }

    #[test]
    fn training_learns_the_firing_pattern() {
        let (_, s) = synthetic(600, 32, 64, 4);
        let cfg = FitConfig {
            epochs: 40,
            batch: 32,
            learning_rate: 5e-3,
            ..FitConfig::default()
        };
        let fit = train(&s, 32, &cfg).unwrap();
        assert!(fit.recall >= 0.95, "recall {}", fit.recall);
        let fired = (s.train..s.len())
            .map(|t| (0..64).filter(|&i| s.fired(t, i)).count())
            .sum::<usize>() as f32
            / ((s.len() - s.train) * 64) as f32;
        // a useless predictor needs every neuron for 97% recall
        assert!(
            fit.candidates < fired + 0.6 * (1.0 - fired),
            "{} vs {fired}",
            fit.candidates
        );
    }

    #[test]
    fn eigen_and_orthonormalization() {
        let a = [4.0f32, 1.0, 0.0, 1.0, 3.0, 0.0, 0.0, 0.0, 1.0];
        let (vals, vecs) = jacobi_eigen(&a, 3);
        for j in 0..3 {
            for i in 0..3 {
                let av: f64 = (0..3).map(|k| a[i * 3 + k] as f64 * vecs[k * 3 + j]).sum();
                assert!((av - vals[j] * vecs[i * 3 + j]).abs() < 1e-9);
            }
        }
        let n = 20;
        let mut rng = Rng(3);
        let m: Vec<f32> = (0..n * n).map(|_| rng.normal()).collect();
        let mut a = vec![0.0; n * n];
        mm_bt(&m, &m, n, n, n, &mut a);
        let (vals, v) = jacobi_eigen(&a, n);
        for i in 0..n {
            for j in 0..n {
                let dot: f64 = (0..n).map(|k| v[k * n + i] * v[k * n + j]).sum();
                assert!(
                    (dot - (i == j) as u8 as f64).abs() < 1e-6,
                    "V^T V [{i},{j}] = {dot}"
                );
                let av: f64 = (0..n).map(|k| a[i * n + k] as f64 * v[k * n + j]).sum();
                assert!((av - vals[j] * v[i * n + j]).abs() < 1e-3 * vals[j].abs().max(1.0));
            }
        }
        let mut q = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 7.0];
        orthonormalize(&mut q, 3, 2);
        let dot: f32 = (0..3).map(|i| q[i * 2] * q[i * 2 + 1]).sum();
        assert!(dot.abs() < 1e-5);
    }

    #[test]
    fn a_batch_of_tokens_is_recorded_as_one_at_a_time() {
        let (d, ff, m) = (8, 70, 5);
        let mut rng = Rng(9);
        let x: Vec<f32> = (0..m * d).map(|_| rng.normal()).collect();
        let gate: Vec<f32> = (0..m * ff).map(|_| rng.normal()).collect();
        let (mut one, mut batch) = (LayerSamples::new(d, ff), LayerSamples::new(d, ff));
        for (xt, gt) in x.chunks_exact(d).zip(gate.chunks_exact(ff)) {
            one.push(xt, gt, 0.3, Activation::Silu);
        }
        batch.push_batch(&x, &gate, 0.3, Activation::Silu);
        // Fired-only samples keep the same bits and count, no inputs, and refuse a fit.
        let mut bits = LayerSamples::fired_only(d, ff);
        bits.push_batch(&x, &gate, 0.3, Activation::Silu);
        assert_eq!((bits.len(), &bits.fired), (batch.len(), &batch.fired));
        assert!(bits.x.is_empty());
        bits.hold_out(0.2);
        let err = lowrank(&vec![0.0; ff * d], &bits, &FitConfig::default()).unwrap_err();
        assert!(err.to_string().contains("kept no inputs"), "{err}");
        assert_eq!((one.x, one.fired), (batch.x, batch.fired));
    }

    #[test]
    fn too_few_samples_is_an_error() {
        let mut s = LayerSamples::new(4, 4);
        s.push(&[0.0; 4], &[1.0; 4], 0.1, Activation::Silu);
        assert!(matches!(
            train(&s, 32, &FitConfig::default()),
            Err(SparseError::Predictor(_))
        ));
    }
}
