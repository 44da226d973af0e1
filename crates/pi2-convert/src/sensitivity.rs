//! Measuring what threshold sparsity costs in quality: each layer's sensitivity (the divergence
//! from the dense model when only that layer is sparse), and the perplexity of a per-layer
//! choice on held-out text. Both run the dense kernels with neurons below the threshold dropped
//! ([`FfnObserver::confirm_threshold`]), which is what sparse decode computes, minus the
//! predictor's misses.

use pi2_engine::{nll, Engine, EngineError, Logits};
use pi2_model::TokenId;
use pi2_sparse::{FfnObserver, Profile, Sensitivity};
use rayon::prelude::*;

/// Reference probabilities kept per position: the dense model's top entries and the rest's mass.
const TOP: usize = 64;

/// Drops neurons below each layer's threshold (`None`: the layer stays dense); with `streams`,
/// keeps the residual stream entering every layer (a dense pass's, for resumed ones).
struct Confirm<'a> {
    thresholds: &'a [Option<f32>],
    streams: Option<&'a mut Vec<Vec<f32>>>,
}

impl FfnObserver for Confirm<'_> {
    fn observe(&mut self, _layer: usize, _x: &[f32], _gate: &[f32]) {}

    fn observe_stream(&mut self, layer: usize, x: &[f32]) {
        if let Some(streams) = self.streams.as_deref_mut() {
            streams.resize_with(streams.len().max(layer + 1), Vec::new);
            streams[layer].clear();
            streams[layer].extend_from_slice(x);
        }
    }

    fn confirm_threshold(&self, layer: usize) -> Option<f32> {
        self.thresholds.get(layer).copied().flatten()
    }
}

/// Divergences are averaged over the second half of each chunk, as llama-perplexity scores:
/// every scored token has context, and the output matrix (the largest cost of a small model's
/// pass) runs for half the tokens.
fn second_half(n: usize) -> usize {
    n / 2
}

/// One position's dense next-token distribution, truncated to its top entries.
struct TopDist {
    ids: Vec<u32>,
    log_p: Vec<f64>,
    rest: f64,
}

fn log_softmax_norm(logits: &[f32]) -> (f64, f64) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    (max, sum.ln())
}

fn top_dist(logits: &[f32], idx: &mut [u32]) -> TopDist {
    let (max, lse) = log_softmax_norm(logits);
    for (i, v) in idx.iter_mut().enumerate() {
        *v = i as u32;
    }
    let k = TOP.min(logits.len());
    idx.select_nth_unstable_by(k - 1, |&a, &b| {
        logits[b as usize].total_cmp(&logits[a as usize])
    });
    let ids = idx[..k].to_vec();
    let log_p: Vec<f64> = ids
        .iter()
        .map(|&i| logits[i as usize] as f64 - max - lse)
        .collect();
    let rest = (1.0 - log_p.iter().map(|l| l.exp()).sum::<f64>()).max(0.0);
    TopDist { ids, log_p, rest }
}

/// KL(reference || logits) over the reference's top entries and the rest's mass (a lower
/// bound on the full divergence that is tight when the top entries hold most of the mass).
fn divergence(r: &TopDist, logits: &[f32]) -> f64 {
    let (max, lse) = log_softmax_norm(logits);
    let mut kl = 0.0;
    let mut q_top = 0.0;
    for (&i, &lp) in r.ids.iter().zip(&r.log_p) {
        let lq = logits[i as usize] as f64 - max - lse;
        q_top += lq.exp();
        kl += lp.exp() * (lp - lq);
    }
    if r.rest > 1e-12 {
        let q_rest = (1.0 - q_top).max(1e-12);
        kl += r.rest * (r.rest.ln() - q_rest.ln());
    }
    kl.max(0.0)
}

/// Per layer and per level of `levels`, the mean divergence (nats per token) from the dense
/// model over `tokens` (the second half of each chunk) when only that layer drops the neurons
/// below its profile threshold for that level. `progress(done, total)` after each pass. Costs
/// one dense pass over `tokens`, then per layer and level a pass resumed at that layer from
/// the dense pass's stream (the layers below are unchanged): about half of
/// `n_layer * levels` full passes. Holds one chunk's stream at every layer.
pub fn measure_sensitivity(
    engine: &mut Engine<'_>,
    profile: &Profile,
    tokens: &[TokenId],
    chunk: usize,
    levels: &[f32],
    mut progress: impl FnMut(usize, usize),
) -> Result<Sensitivity, crate::ConvertError> {
    let n_layer = profile.layers.len();
    let model_layers = engine.model().config.n_layer;
    if n_layer != model_layers {
        return Err(crate::ConvertError::Refused(format!(
            "the profile has {n_layer} layers and the model {model_layers}: profile this model with `pi2 profile`"
        )));
    }
    let chunks: Vec<&[TokenId]> = tokens.chunks(chunk.max(1)).collect();
    let total = chunks.len() * (1 + n_layer * levels.len());
    let v = engine.model().config.n_vocab;
    let level_thresholds = profile
        .layers
        .iter()
        .map(|l| levels.iter().map(|&s| l.threshold_for(s)).collect())
        .collect::<Result<Vec<Vec<f32>>, _>>()?;
    let mut kl = vec![vec![0.0; levels.len()]; n_layer];
    let (mut scored, mut done) = (0, 0);
    let mut streams: Vec<Vec<f32>> = Vec::new();
    let mut thresholds = vec![None; n_layer];
    for part in chunks {
        let first = second_half(part.len()).min(part.len() - 1);
        engine.truncate(0);
        let mut dense = Confirm {
            thresholds: &thresholds,
            streams: Some(&mut streams),
        };
        let logits = engine.forward_observed(part, Logits::From(first), Some(&mut dense))?;
        let reference: Vec<TopDist> = logits
            .par_chunks_exact(v)
            .map_init(|| vec![0u32; v], |idx, row| top_dist(row, idx))
            .collect();
        // The resumed passes run at the chunk's own positions.
        engine.truncate(0);
        done += 1;
        progress(done, total);
        for l in 0..n_layer {
            for (j, &t) in level_thresholds[l].iter().enumerate() {
                thresholds[l] = Some(t);
                let mut obs = Confirm {
                    thresholds: &thresholds,
                    streams: None,
                };
                let logits = engine.resume_observed(
                    l,
                    part,
                    &streams[l],
                    Logits::From(first),
                    Some(&mut obs),
                )?;
                // Rows in parallel (a softmax over the vocabulary each), summed in order.
                let rows: Vec<f64> = logits
                    .par_chunks_exact(v)
                    .zip(&reference)
                    .map(|(row, r)| divergence(r, row))
                    .collect();
                kl[l][j] += rows.iter().sum::<f64>();
                done += 1;
                progress(done, total);
            }
            thresholds[l] = None;
        }
        scored += reference.len();
    }
    engine.truncate(0);
    kl.iter_mut()
        .flatten()
        .for_each(|k| *k /= scored.max(1) as f64);
    let s = Sensitivity {
        levels: levels.to_vec(),
        kl,
        tokens: scored,
    };
    s.check(n_layer)?;
    Ok(s)
}

/// Tokens per forward pass of [`perplexity`].
const PERPLEXITY_BATCH: usize = 128;

/// Perplexity of the model over `tokens` (chunks of `chunk`, each from an empty cache; every
/// position but a chunk's last predicts the next token: as many as the tokens allow, since the
/// quality check compares two runs on them) with per-layer confirm `thresholds` (`None`: dense).
pub fn perplexity(
    engine: &mut Engine<'_>,
    tokens: &[TokenId],
    chunk: usize,
    thresholds: Option<&[f32]>,
) -> Result<f64, EngineError> {
    let n_layer = engine.model().config.n_layer;
    let th: Vec<Option<f32>> = match thresholds {
        Some(t) => t.iter().map(|&v| Some(v)).collect(),
        None => vec![None; n_layer],
    };
    let v = engine.model().config.n_vocab;
    let mut obs = Confirm {
        thresholds: &th,
        streams: None,
    };
    let (mut sum, mut count) = (0.0, 0usize);
    for part in tokens.chunks(chunk.max(1)) {
        engine.truncate(0);
        // In batches of the chunk, the cache carried between them (as llama-perplexity runs
        // with a smaller batch): a 150k vocabulary's logits for 512 tokens are 311 MB.
        for (b, batch) in part.chunks(PERPLEXITY_BATCH).enumerate() {
            let logits = engine.forward_observed(batch, Logits::From(0), Some(&mut obs))?;
            let next = &part[(b * PERPLEXITY_BATCH + 1).min(part.len())..];
            // Rows in parallel (a softmax over the vocabulary each), summed in order.
            let rows: Vec<f64> = logits
                .par_chunks_exact(v)
                .zip(next)
                .map(|(row, &next)| nll(row, next))
                .collect();
            sum += rows.iter().sum::<f64>();
            count += rows.len();
        }
    }
    engine.truncate(0);
    Ok((sum / count.max(1) as f64).exp())
}

/// Settings of [`choose_sparsity`].
#[derive(Clone, Debug)]
pub struct QualityTarget {
    /// Largest perplexity increase allowed on held-out text (0.03: +3%).
    pub max_increase: f64,
    /// Levels each layer's sensitivity is measured at.
    pub levels: Vec<f32>,
    /// Highest sparsity any layer may get (never above the highest measured level: beyond it
    /// a divergence would be extrapolated, and it grows faster than the line through the
    /// measured points).
    pub max_sparsity: f32,
    /// Tokens per chunk (each from an empty cache).
    pub chunk: usize,
}

impl Default for QualityTarget {
    fn default() -> Self {
        Self {
            max_increase: 0.03,
            levels: vec![0.3, 0.6],
            max_sparsity: 0.9,
            chunk: 512,
        }
    }
}

/// What [`choose_sparsity`] chose and measured.
#[derive(Clone, Debug)]
pub struct QualityChoice {
    pub sensitivity: Sensitivity,
    /// Per layer: sparsity and confirm threshold.
    pub sparsity: Vec<f32>,
    pub thresholds: Vec<f32>,
    /// Held-out perplexity dense and with `thresholds`.
    pub dense_ppl: f64,
    pub sparse_ppl: f64,
    /// Divergence budgets whose choice was checked on the held-out tokens.
    pub budgets: Vec<f64>,
}

/// Per-layer sparsity for the fewest FFN bytes within `target.max_increase` of the dense
/// perplexity: each layer's sensitivity measured on `tuning` tokens, a divergence budget spent
/// where it saves most (`bytes_per_sparsity[l]`: what layer `l` saves per unit of sparsity), and
/// the largest budget whose choice passes on `held_out` tokens found by search. Divergence ranks
/// the layers but does not predict perplexity (the divergences of layers only roughly add up,
/// and a divergence is not a loss on real text), so only the held-out check decides.
pub fn choose_sparsity(
    engine: &mut Engine<'_>,
    profile: &Profile,
    tuning: &[TokenId],
    held_out: &[TokenId],
    bytes_per_sparsity: &[f64],
    target: &QualityTarget,
    mut progress: impl FnMut(&str, usize, usize),
) -> Result<QualityChoice, crate::ConvertError> {
    let sensitivity = measure_sensitivity(
        engine,
        profile,
        tuning,
        target.chunk,
        &target.levels,
        |d, t| progress("sensitivity", d, t),
    )?;
    let dense_ppl = perplexity(engine, held_out, target.chunk, None)?;
    let limit = (1.0 + target.max_increase).ln();
    let n_layer = profile.layers.len();
    let mut best = (vec![0.0; n_layer], vec![0.0; n_layer], dense_ppl);
    // Budgets known to pass / to fail.
    let (mut pass, mut fail): (Option<f64>, Option<f64>) = (None, None);
    let mut budget = limit;
    let mut budgets = Vec::new();
    let mut checked: Vec<(Vec<f32>, bool)> = Vec::new();
    for t in 0..CHECKS {
        progress("held-out check", t + 1, CHECKS);
        let top = target.levels.last().copied().unwrap_or(0.0);
        let sparsity =
            sensitivity.allocate(bytes_per_sparsity, budget, target.max_sparsity.min(top));
        let ok = match checked.iter().find(|(s, _)| *s == sparsity) {
            Some(&(_, ok)) => ok,
            None => {
                let thresholds = profile
                    .layers
                    .iter()
                    .zip(&sparsity)
                    .map(|(l, &s)| l.threshold_for(s))
                    .collect::<Result<Vec<f32>, _>>()?;
                let ppl = perplexity(engine, held_out, target.chunk, Some(&thresholds))?;
                budgets.push(budget);
                let ok = (ppl / dense_ppl).ln() <= limit;
                checked.push((sparsity.clone(), ok));
                if ok && saved(&sparsity, bytes_per_sparsity) > saved(&best.0, bytes_per_sparsity) {
                    best = (sparsity, thresholds, ppl);
                }
                ok
            }
        };
        if ok {
            pass = Some(pass.map_or(budget, |p| p.max(budget)));
        } else {
            fail = Some(fail.map_or(budget, |f| f.min(budget)));
        }
        budget = match (pass, fail) {
            (Some(p), Some(f)) if f / p < 1.2 => break,
            (Some(p), Some(f)) => (p * f).sqrt(),
            (Some(p), None) => p * 2.0,
            (None, Some(f)) => f / 2.0,
            (None, None) => break,
        };
    }
    let (sparsity, thresholds, sparse_ppl) = best;
    Ok(QualityChoice {
        sensitivity,
        sparsity,
        thresholds,
        dense_ppl,
        sparse_ppl,
        budgets,
    })
}

/// Held-out checks [`choose_sparsity`] runs at most.
const CHECKS: usize = 7;

fn saved(sparsity: &[f32], bytes: &[f64]) -> f64 {
    sparsity
        .iter()
        .zip(bytes)
        .map(|(&s, &b)| f64::from(s) * b)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pi2_engine::EngineConfig;
    use pi2_kernels::QuantType;
    use pi2_model::synth::{build, SynthSpec};
    use pi2_model::{GgufFile, Model};
    use pi2_sparse::{Activation, ModelInfo, ProfileConfig, Profiler};

    fn profiled(m: &Model, e: &mut Engine<'_>, tokens: &[TokenId]) -> Profile {
        let c = &m.config;
        let mut p = Profiler::new(c.n_layer, c.n_ff, Activation::Silu);
        e.forward_observed(tokens, Logits::Last, Some(&mut p))
            .unwrap();
        e.truncate(0);
        let info = ModelInfo {
            architecture: "llama".into(),
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_ff: c.n_ff,
            activation: Activation::Silu,
            file_name: "synth".into(),
            file_bytes: 0,
        };
        let cal = pi2_sparse::Calibration {
            file: "synth".into(),
            tokens: tokens.len(),
        };
        p.finish(info, cal, &ProfileConfig::default()).unwrap().0
    }

    /// Runs `tokens` in chunks of `chunk` (each from an empty cache) with `thresholds` and calls
    /// `each(chunk_index, position, logits)` for every position from `from(chunk_len)` on.
    fn run_chunks(
        engine: &mut Engine<'_>,
        tokens: &[TokenId],
        chunk: usize,
        thresholds: &[Option<f32>],
        from: fn(usize) -> usize,
        mut each: impl FnMut(usize, usize, &[f32]),
    ) -> Result<(), EngineError> {
        let v = engine.model().config.n_vocab;
        let mut obs = Confirm {
            thresholds,
            streams: None,
        };
        for (ci, part) in tokens.chunks(chunk.max(1)).enumerate() {
            engine.truncate(0);
            let first = from(part.len()).min(part.len() - 1);
            let logits = engine.forward_observed(part, Logits::From(first), Some(&mut obs))?;
            for (p, row) in logits.chunks_exact(v).enumerate() {
                each(ci, first + p, row);
            }
        }
        engine.truncate(0);
        Ok(())
    }

    /// The resumed passes measure what whole passes with one sparse layer measure, over
    /// several chunks.
    #[test]
    fn resumed_sensitivity_is_whole_pass_sensitivity() {
        let spec = SynthSpec {
            n_embd: 64,
            n_ff: 192,
            n_layer: 3,
            weight_type: QuantType::Q8_0,
            ..SynthSpec::default()
        };
        let m = Model::from_file(GgufFile::from_bytes(&build(&spec).to_bytes()).unwrap()).unwrap();
        let cfg = EngineConfig {
            threads: 2,
            n_ctx: 128,
            ..EngineConfig::default()
        };
        let mut e = Engine::new(&m, &cfg).unwrap();
        let tokens: Vec<TokenId> = (0..100).map(|i| (i * 37 + 5) % 256).collect();
        let p = profiled(&m, &mut e, &tokens);
        let levels = [0.3, 0.7];
        let got = measure_sensitivity(&mut e, &p, &tokens, 40, &levels, |_, _| {}).unwrap();
        let mut reference = Vec::new();
        let mut idx = vec![0u32; m.config.n_vocab];
        let dense = vec![None; 3];
        run_chunks(&mut e, &tokens, 40, &dense, second_half, |_, _, row| {
            reference.push(top_dist(row, &mut idx))
        })
        .unwrap();
        assert_eq!(got.tokens, reference.len());
        // A profile of another model is refused, not indexed out of bounds.
        let mut short = p.clone();
        short.layers.pop();
        let err = measure_sensitivity(&mut e, &short, &tokens, 40, &levels, |_, _| {});
        assert!(matches!(err, Err(crate::ConvertError::Refused(_))));
        for l in 0..3 {
            for (j, &s) in levels.iter().enumerate() {
                let mut th = dense.clone();
                th[l] = Some(p.layers[l].threshold_for(s).unwrap());
                let mut k = 0;
                let mut sum = 0.0;
                run_chunks(&mut e, &tokens, 40, &th, second_half, |_, _, row| {
                    sum += divergence(&reference[k], row);
                    k += 1;
                })
                .unwrap();
                let want = sum / k as f64;
                assert!(want > 0.0, "layer {l} level {s}: nothing dropped");
                let err = (got.kl[l][j] - want).abs();
                assert!(
                    err <= 1e-4 * want + 1e-9,
                    "layer {l} level {s}: {} vs {want}",
                    got.kl[l][j]
                );
            }
        }
    }

    #[test]
    fn divergence_is_zero_for_the_reference_and_grows_with_distance() {
        let a: Vec<f32> = (0..200).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
        let mut idx = vec![0u32; a.len()];
        let r = top_dist(&a, &mut idx);
        assert!(divergence(&r, &a) < 1e-9);
        let near: Vec<f32> = a
            .iter()
            .enumerate()
            .map(|(i, v)| v + (i % 3) as f32 * 0.01)
            .collect();
        let far: Vec<f32> = a
            .iter()
            .enumerate()
            .map(|(i, v)| v + (i % 3) as f32 * 0.5)
            .collect();
        let (dn, df) = (divergence(&r, &near), divergence(&r, &far));
        assert!(dn > 0.0 && df > 10.0 * dn, "{dn} {df}");
    }
}
