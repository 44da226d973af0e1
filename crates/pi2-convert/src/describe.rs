//! What profiling and conversion found, as text for people: the per-layer table and the
//! clustered head ([`ConvertReport`]), the sensitivity table with its held-out check
//! ([`SensitivityTable`]), a profile's summary ([`ProfileSummary`]), stand-ins' planted rates
//! against measured ones ([`PlantedTable`]) and experts' counts ([`ExpertTable`]).

use crate::moe::ExpertCounts;
use crate::sensitivity::QualityChoice;
use crate::ConvertReport;
use pi2_model::stand_in::{RateComparison, StandInSpec};
use std::fmt;

/// Per layer: confirm threshold, fired share, predictor rank, recall and candidates; then the
/// clustered head's shape and fidelity.
impl fmt::Display for ConvertReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "layer  threshold  fired  rank  recall  candidates")?;
        for (i, r) in self.layers.iter().enumerate() {
            let (t, fired, rank, recall, cand) =
                (r.threshold, r.fired, r.rank, r.recall, r.candidates);
            writeln!(
                f,
                "{i:>5}  {t:>9.4}  {fired:>5.3}  {rank:>4}  {recall:>6.3}  {cand:>10.3}"
            )?;
        }
        let n = self.layers.len() as f32;
        let mean =
            |v: &dyn Fn(&crate::LayerReport) -> f32| self.layers.iter().map(v).sum::<f32>() / n;
        write!(
            f,
            "mean   {:>9}  {:>5.3}  {:>4.0}  {:>6.3}  {:>10.3}",
            "",
            mean(&|r| r.fired),
            mean(&|r| r.rank as f32),
            mean(&|r| r.recall),
            mean(&|r| r.candidates)
        )?;
        if let Some(h) = &self.head {
            write!(
                f,
                "\nhead: {} clusters of {} rows, centroids {:.1} MB ({:.1}% of the output matrix); \
                 scoring {:.0}% of the rows, held-out calibration tokens: top-1 agreement {:.2}%, \
                 mass {:.3} ({} tokens)",
                h.clusters,
                h.cluster,
                h.centroid_bytes as f64 / 1e6,
                100.0 * h.centroid_bytes as f64 / h.output_bytes as f64,
                100.0 * h.share,
                100.0 * h.check.top1,
                h.check.mass,
                h.check.tokens
            )?;
        }
        Ok(())
    }
}

/// The sensitivity table of `--sparsity auto` and its held-out check, on the last `held_out`
/// share of the calibration tokens.
pub struct SensitivityTable<'a> {
    pub choice: &'a QualityChoice,
    pub held_out: f32,
}

impl fmt::Display for SensitivityTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.choice;
        let tokens = c.sensitivity.tokens;
        writeln!(f, "sensitivity (KL divergence from dense, nats/token, {tokens} tokens; one layer sparse at a time):")?;
        let levels: Vec<String> = c
            .sensitivity
            .levels
            .iter()
            .map(|s| format!("{s:>7.2}"))
            .collect();
        writeln!(f, "layer  {}  chosen  threshold", levels.join(" "))?;
        for (l, kl) in c.sensitivity.kl.iter().enumerate() {
            let row: Vec<String> = kl.iter().map(|v| format!("{v:>7.4}")).collect();
            let (s, t) = (c.sparsity[l], c.thresholds[l]);
            writeln!(f, "{l:>5}  {}  {s:>6.2}  {t:>9.4}", row.join(" "))?;
        }
        let mean = c.sparsity.iter().sum::<f32>() / c.sparsity.len().max(1) as f32;
        write!(
            f,
            "held-out perplexity (the last {:.0}% of the calibration tokens): dense {:.4}, sparse {:.4} ({:+.2}%); mean sparsity {:.3}; {} held-out checks",
            100.0 * self.held_out,
            c.dense_ppl,
            c.sparse_ppl,
            100.0 * (c.sparse_ppl / c.dense_ppl - 1.0),
            mean,
            c.budgets.len()
        )
    }
}

/// Per layer of a profile: the threshold at the reference sparsity, how many neurons are
/// active on most tokens or never, co-activation lift, and the cache hit rates at 25%.
pub struct ProfileSummary<'a>(pub &'a pi2_sparse::Profile);

impl fmt::Display for ProfileSummary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.0;
        write!(
            f,
            "layer | threshold@{:.0}% | neurons active >50% of tokens | >90% | never | co-act lift | hit@25% (lru / pinned / best)",
            p.reference_sparsity * 100.0
        )?;
        for (i, l) in p.layers.iter().enumerate() {
            let n = l.frequency.len() as f32;
            let frac = |pred: &dyn Fn(f32) -> bool| {
                l.frequency.iter().filter(|&&f| pred(f)).count() as f32 / n * 100.0
            };
            let h = l
                .hit_rate
                .iter()
                .find(|h| (h.cache_fraction - 0.25).abs() < 1e-6);
            let hits = h.map_or("-".into(), |h| {
                format!("{:.2} / {:.2} / {:.2}", h.lru, h.pinned, h.best)
            });
            write!(
                f,
                "\n{i:>5} | {:>14.4} | {:>28.1}% | {:>3.1}% | {:>4.1}% | {:>11.1} | {hits}",
                l.reference_threshold,
                frac(&|f| f > 0.5),
                frac(&|f| f > 0.9),
                frac(&|f| f == 0.0),
                l.coactivation.mean_lift,
            )?;
        }
        Ok(())
    }
}

/// A stand-in model's planted firing rates against a profile's measured ones (fraction of
/// tokens with a positive gate, read at "active" = not zero).
pub struct PlantedTable<'a> {
    pub spec: &'a StandInSpec,
    pub profile: &'a pi2_sparse::Profile,
}

impl fmt::Display for PlantedTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.spec;
        writeln!(
            f,
            "planted vs measured firing rates ({}, alpha {}):",
            s.shape.name, s.alpha
        )?;
        write!(
            f,
            "layer | mean planted | mean measured | correlation | top 20% share planted / measured"
        )?;
        for (li, l) in self.profile.layers.iter().enumerate() {
            let c = RateComparison::of(&s.planted_rates(li, 0), &l.frequency);
            write!(
                f,
                "\n{li:>5} | {:>12.3} | {:>13.3} | {:>11.3} | {:.2} / {:.2}",
                c.mean_planted, c.mean_measured, c.correlation, c.top_share.0, c.top_share.1
            )?;
        }
        Ok(())
    }
}

/// Per layer of a mixture-of-experts model: how tokens spread over experts and how many of an
/// expert's neurons fire per routed token; for stand-ins (`spec`), against the planted rates.
pub struct ExpertTable<'a> {
    pub counts: &'a ExpertCounts,
    pub spec: Option<&'a StandInSpec>,
}

impl fmt::Display for ExpertTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (counts, ne) = (self.counts, self.counts.experts);
        let planted = match self.spec {
            Some(_) => " | planted | correlation (mean)",
            None => "",
        };
        write!(
            f,
            "layer | routed share min..max | active rate (mean over used experts){planted}"
        )?;
        for li in 0..counts.fired.len() / ne {
            let units = li * ne..(li + 1) * ne;
            let total: u64 = counts.routed[units.clone()].iter().sum();
            let share = |u: usize| counts.routed[u] as f64 / total.max(1) as f64;
            let (lo, hi) = units
                .clone()
                .map(share)
                .fold((1.0f64, 0.0f64), |(l, h), s| (l.min(s), h.max(s)));
            // Experts no token was routed to have no measured rates.
            let used: Vec<usize> = units.filter(|&u| counts.routed[u] > 0).collect();
            let k = used.len().max(1) as f64;
            let rate = used.iter().map(|&u| counts.active_rate(u)).sum::<f64>() / k;
            write!(f, "\n{li:>5} | {lo:>9.3}..{hi:<9.3} | {rate:>36.3}")?;
            if let Some(spec) = self.spec {
                let (mut planted, mut corr) = (0.0, 0.0);
                for &u in &used {
                    let p = spec.planted_rates(li, u % ne);
                    let routed = counts.routed[u].max(1) as f32;
                    let m: Vec<f32> = counts.fired[u].iter().map(|&n| n as f32 / routed).collect();
                    let c = RateComparison::of(&p, &m);
                    planted += c.mean_planted;
                    corr += c.correlation;
                }
                write!(f, " | {:>7.3} | {:>18.3}", planted / k, corr / k)?;
            }
        }
        Ok(())
    }
}
