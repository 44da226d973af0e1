//! Recording activations and summarising them into a [`Profile`].

use crate::coact::coactivation;
pub use crate::coact::Coactivation;
use crate::codes::Codes;
use crate::hitrate::{hit_rates, HitPoint};
use crate::{code_edge, score_code, FfnObserver, SparseError, Trace};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const PROFILE_FORMAT: &str = "pi2-profile";
/// Bumped whenever a field changes meaning; readers refuse other versions.
pub const PROFILE_VERSION: u32 = 1;
/// The sparsity levels every profile carries thresholds for.
pub const SPARSITY_LEVELS: [f32; 10] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9];
/// Cache sizes (fractions of a layer's neurons) of the hit-rate curves.
const CACHE_SIZES: [f32; 12] = [
    0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0,
];
/// Pinned-set fractions tried for the best pinned/LRU split.
const PINNED_STEPS: [f32; 7] = [0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5];

/// The FFN's activation function on the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    Silu,
    Gelu,
    Relu,
}

impl Activation {
    pub fn apply(self, g: f32) -> f32 {
        match self {
            Activation::Silu => g / (1.0 + (-g).exp()),
            Activation::Gelu => {
                0.5 * g * (1.0 + (0.797_884_6 * (g + 0.044_715 * g * g * g)).tanh())
            }
            Activation::Relu => g.max(0.0),
        }
    }

    /// Whether a neuron with gate pre-activation `g` fires at `threshold`: its activation is not
    /// zero and reaches the threshold (so threshold 0 is exact for ReLU: `g > 0`).
    #[inline]
    pub fn fires(self, g: f32, threshold: f32) -> bool {
        let a = self.apply(g);
        a != 0.0 && a.abs() >= threshold
    }
}

/// The model a profile belongs to (checked before a profile is used).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub architecture: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub activation: Activation,
    pub file_name: String,
    pub file_bytes: u64,
}

impl ModelInfo {
    /// Whether a profile of `self` can be used with `other` (same shapes; the file may differ,
    /// e.g. another quantization of the same weights).
    pub fn check_compatible(&self, other: &ModelInfo) -> Result<(), SparseError> {
        let shape = |m: &ModelInfo| {
            format!(
                "{} with {} layers, width {}, {} FFN neurons ({:?})",
                m.architecture, m.n_layer, m.n_embd, m.n_ff, m.activation
            )
        };
        if shape(self) != shape(other) {
            return Err(SparseError::ModelMismatch {
                want: shape(self),
                got: shape(other),
            });
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub file: String,
    pub tokens: usize,
}

#[derive(Clone, Debug)]
pub struct ProfileConfig {
    /// The sparsity at which "active" is decided for frequencies, co-activation and the trace.
    pub reference_sparsity: f32,
    /// Decide "active" as "activation not zero" instead (ReLU family: each layer's natural
    /// sparsity); `reference_sparsity` is then ignored and the profile records the achieved
    /// mean sparsity in its place.
    pub nonzero: bool,
}

impl Default for ProfileConfig {
    fn default() -> Self {
        Self {
            reference_sparsity: 0.5,
            nonzero: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerProfile {
    /// `(sparsity, threshold)` for each of [`SPARSITY_LEVELS`]: a fraction `sparsity` of the
    /// (token, neuron) scores `|act(gate . x)|` lie below `threshold`, to the 4.4% resolution of
    /// the score codes (the achieved fraction is stored, not the requested one).
    pub thresholds: Vec<(f32, f32)>,
    /// Threshold at the reference sparsity.
    pub reference_threshold: f32,
    /// Per neuron: fraction of tokens it is active at the reference threshold.
    pub frequency: Vec<f32>,
    /// Per neuron: mean and max of `|act(gate . x)|`.
    pub mean_abs: Vec<f32>,
    pub max_abs: Vec<f32>,
    /// Count of scores per code (see [`crate::score_code`]).
    pub histogram: Vec<u64>,
    pub coactivation: Coactivation,
    /// Hit rate of a per-layer neuron cache against its size, on the recorded trace.
    pub hit_rate: Vec<HitPoint>,
}

impl LayerProfile {
    /// The threshold giving `sparsity` (interpolating the histogram to the nearest code edge).
    pub fn threshold_for(&self, sparsity: f32) -> Result<f32, SparseError> {
        if !(0.0..1.0).contains(&sparsity) {
            return Err(SparseError::BadSparsity(sparsity));
        }
        Ok(code_edge(threshold_code(&self.histogram, sparsity).0))
    }
}

/// The smallest code `c` such that at least `sparsity` of the scores are below `edge(c)`, and
/// the fraction actually below it.
fn threshold_code(hist: &[u64], sparsity: f32) -> (u8, f32) {
    let total: u64 = hist.iter().sum();
    if total == 0 || sparsity <= 0.0 {
        return (0, 0.0);
    }
    let mut below = 0u64;
    for (c, &h) in hist.iter().enumerate() {
        if below as f64 >= sparsity as f64 * total as f64 {
            return (c as u8, below as f32 / total as f32);
        }
        below += h;
    }
    (255, below as f32 / total as f32)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub format: String,
    pub version: u32,
    pub model: ModelInfo,
    pub calibration: Calibration,
    pub reference_sparsity: f32,
    pub layers: Vec<LayerProfile>,
}

impl Profile {
    /// Writes the profile through a new temporary file in the same folder, renamed over `path`
    /// at the end: an interrupted save never leaves a half-written profile.
    pub fn save(&self, path: &Path) -> Result<(), SparseError> {
        let io = |source| SparseError::Io {
            path: path.display().to_string(),
            source,
        };
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        // Mode 0666 before the umask, as a plain create would give (not tempfile's 0600).
        let mut tmp = tempfile::Builder::new()
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(dir)
            .map_err(io)?;
        std::io::Write::write_all(&mut tmp, self.to_json().as_bytes()).map_err(io)?;
        tmp.persist(path).map_err(|e| io(e.error))?;
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Profile, SparseError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SparseError::Io {
            path: p.clone(),
            source,
        })?;
        Self::from_json(&text, &p)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("profiles serialise")
    }

    /// Parse and check a profile; `origin` names where it came from in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Profile, SparseError> {
        let p = origin.to_string();
        let bad = |msg: String| SparseError::BadProfile {
            path: p.clone(),
            msg,
        };
        // The header first (other fields skipped, nothing large allocated): a file that is not
        // a profile of this version gets that error, not a field-by-field one. The profile is
        // then read straight into its types (a generic JSON tree of it would take about ten
        // times its size at the peak).
        #[derive(Deserialize)]
        struct Header {
            format: Option<String>,
            version: Option<serde_json::Value>,
        }
        let h: Header = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if h.format.as_deref() != Some(PROFILE_FORMAT) {
            return Err(bad("no `format: pi2-profile` field".into()));
        }
        let version = h.version.unwrap_or(serde_json::Value::Null);
        if version != PROFILE_VERSION {
            return Err(bad(format!(
                "version {version} (this pi2 reads {PROFILE_VERSION})"
            )));
        }
        let prof: Profile = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let m = &prof.model;
        let consistent = prof.layers.len() == m.n_layer
            && prof.layers.iter().all(|l| {
                l.frequency.len() == m.n_ff
                    && l.mean_abs.len() == m.n_ff
                    && l.max_abs.len() == m.n_ff
                    && l.coactivation.partner.len() == m.n_ff
                    && l.coactivation.p_partner.len() == m.n_ff
                    && l.histogram.len() == 256
            });
        if !consistent {
            return Err(SparseError::BadProfile {
                path: p,
                msg: "per-layer arrays do not match the model's shape".into(),
            });
        }
        // Values the converter and planner index or divide by: in range, finite.
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite() && *x >= 0.0);
        if let Some((li, what)) = prof.layers.iter().enumerate().find_map(|(li, l)| {
            let bad = if l.coactivation.partner.iter().any(|&j| j as usize >= m.n_ff) {
                Some("a co-activation partner outside the layer")
            } else if !finite(&l.frequency) || l.frequency.iter().any(|&f| f > 1.0) {
                Some("a frequency outside 0..1")
            } else if !finite(&l.coactivation.p_partner)
                || !finite(&l.mean_abs)
                || !finite(&l.max_abs)
            {
                Some("a negative or non-finite statistic")
            } else if l.thresholds.is_empty()
                || l.thresholds
                    .iter()
                    .any(|&(s, t)| !(0.0..=1.0).contains(&s) || !t.is_finite() || t < 0.0)
                || !l.reference_threshold.is_finite()
            {
                Some("a missing or non-finite threshold")
            } else {
                None
            };
            bad.map(|w| (li, w))
        }) {
            return Err(SparseError::BadProfile {
                path: p,
                msg: format!("layer {li} has {what}"),
            });
        }
        Ok(prof)
    }

    /// The profile with neurons renumbered: new neuron `j` of layer `l` is old neuron
    /// `perm[l][j]` (converted models store neurons hot-first).
    pub fn permuted(&self, perm: &[Vec<u32>]) -> Profile {
        let mut out = self.clone();
        for (l, p) in out.layers.iter_mut().zip(perm) {
            let mut new_id = vec![0u32; p.len()];
            for (j, &old) in p.iter().enumerate() {
                new_id[old as usize] = j as u32;
            }
            let pick = |v: &Vec<f32>| p.iter().map(|&o| v[o as usize]).collect::<Vec<f32>>();
            l.frequency = pick(&l.frequency);
            l.mean_abs = pick(&l.mean_abs);
            l.max_abs = pick(&l.max_abs);
            l.coactivation.p_partner = pick(&l.coactivation.p_partner);
            l.coactivation.partner = p
                .iter()
                .map(|&o| new_id[l.coactivation.partner[o as usize] as usize])
                .collect();
        }
        out
    }

    /// Mean over layers of the hit-rate curves.
    pub fn mean_hit_rate(&self) -> Vec<HitPoint> {
        let n = self.layers.len().max(1) as f32;
        let mut out = self.layers[0].hit_rate.clone();
        for (k, p) in out.iter_mut().enumerate() {
            p.lru = self.layers.iter().map(|l| l.hit_rate[k].lru).sum::<f32>() / n;
            p.pinned = self
                .layers
                .iter()
                .map(|l| l.hit_rate[k].pinned)
                .sum::<f32>()
                / n;
            p.best = self.layers.iter().map(|l| l.hit_rate[k].best).sum::<f32>() / n;
            p.best_pinned_fraction = self
                .layers
                .iter()
                .map(|l| l.hit_rate[k].best_pinned_fraction)
                .sum::<f32>()
                / n;
        }
        out
    }
}

/// Records one byte per (layer, token, neuron): the score code of `|act(gate . x)|`, in
/// memory or (after [`Profiler::spill_to`]) in temporary files.
pub struct Profiler {
    n_ff: usize,
    act: Activation,
    codes: Vec<Codes>,
    /// Each layer's histogram of codes so far.
    histograms: Vec<Vec<u64>>,
    sum_abs: Vec<Vec<f64>>,
    max_abs: Vec<Vec<f32>>,
    /// One batch's absolute activations and codes (reused).
    scores: Vec<f32>,
    batch: Vec<u8>,
    /// The first failure to keep codes in their file, reported by `finish`.
    spill_error: Option<String>,
}

/// Neurons per parallel task when summing a batch.
const NEURON_BLOCK: usize = 512;

impl Profiler {
    pub fn new(n_layer: usize, n_ff: usize, act: Activation) -> Profiler {
        Profiler {
            n_ff,
            act,
            codes: (0..n_layer).map(|_| Codes::in_memory()).collect(),
            histograms: vec![vec![0; 256]; n_layer],
            sum_abs: vec![vec![0.0; n_ff]; n_layer],
            max_abs: vec![vec![0.0; n_ff]; n_layer],
            scores: Vec::new(),
            batch: Vec::new(),
            spill_error: None,
        }
    }

    /// Keep the codes in unnamed temporary files in `dir` (removed by the system when the
    /// profiler is dropped) instead of memory: profiling then holds one batch of codes. Call
    /// before the first observation.
    pub fn spill_to(mut self, dir: &Path) -> Result<Profiler, SparseError> {
        let io = |source| SparseError::Io {
            path: dir.display().to_string(),
            source,
        };
        if self.codes.iter().any(|c| c.len() > 0) {
            return Err(io(std::io::Error::other(
                "codes are already recorded in memory",
            )));
        }
        for c in &mut self.codes {
            *c = Codes::in_file(dir).map_err(io)?;
        }
        Ok(self)
    }

    /// Tokens recorded (by the first layer).
    pub fn tokens(&self) -> usize {
        self.codes
            .first()
            .map_or(0, |c| (c.len() / self.n_ff.max(1) as u64) as usize)
    }

    /// Bytes of codes held in memory so far.
    pub fn bytes(&self) -> usize {
        self.codes.iter().map(Codes::memory_bytes).sum()
    }

    /// Summarises the recording: thresholds, statistics, co-activation, hit-rate curves, and the
    /// trace at the reference sparsity.
    pub fn finish(
        mut self,
        model: ModelInfo,
        calibration: Calibration,
        cfg: &ProfileConfig,
    ) -> Result<(Profile, Trace), SparseError> {
        if !(0.0..1.0).contains(&cfg.reference_sparsity) {
            return Err(SparseError::BadSparsity(cfg.reference_sparsity));
        }
        let tokens = self.tokens();
        if tokens == 0 {
            return Err(SparseError::Empty);
        }
        if let Some(e) = self.spill_error.take() {
            return Err(SparseError::Io {
                path: "the profiler's temporary files".into(),
                source: std::io::Error::other(e),
            });
        }
        let n = self.n_ff;
        let mut trace = Trace::new(self.codes.len(), n, tokens);
        let mut zeros = 0u64;
        // Counts and the trace first; then the costly per-layer summaries (each over the
        // finished trace) in parallel.
        let mut firing = Vec::new();
        let histograms = std::mem::take(&mut self.histograms);
        for (li, (codes, histogram)) in self.codes.iter_mut().zip(histograms).enumerate() {
            zeros += histogram[0];
            // Code 0 holds exactly the zero activations when `nonzero` matters (see `observe`).
            let ref_code = match cfg.nonzero {
                true => 1,
                false => threshold_code(&histogram, cfg.reference_sparsity).0,
            };
            let mut counts = vec![0u64; n];
            let mut t = 0;
            codes
                .for_each_rows(n, |rows| {
                    for row in rows.chunks_exact(n) {
                        for (i, &c) in row.iter().enumerate() {
                            if c >= ref_code {
                                counts[i] += 1;
                                trace.set(li, t, i);
                            }
                        }
                        t += 1;
                    }
                })
                .map_err(|source| SparseError::Io {
                    path: "the profiler's temporary files".into(),
                    source,
                })?;
            firing.push((histogram, ref_code, counts));
        }
        let layers: Vec<LayerProfile> = firing
            .into_par_iter()
            .enumerate()
            .map(|(li, (histogram, ref_code, counts))| {
                let thresholds = SPARSITY_LEVELS
                    .iter()
                    .map(|&s| {
                        let (c, achieved) = threshold_code(&histogram, s);
                        (achieved, code_edge(c))
                    })
                    .collect();
                LayerProfile {
                    thresholds,
                    reference_threshold: if cfg.nonzero {
                        0.0
                    } else {
                        code_edge(ref_code)
                    },
                    frequency: counts.iter().map(|&c| c as f32 / tokens as f32).collect(),
                    mean_abs: self.sum_abs[li]
                        .iter()
                        .map(|&s| (s / tokens as f64) as f32)
                        .collect(),
                    max_abs: self.max_abs[li].clone(),
                    coactivation: coactivation(&trace, li, &counts),
                    hit_rate: hit_rates(&trace, li, &counts, &CACHE_SIZES, &PINNED_STEPS),
                    histogram,
                }
            })
            .collect();
        Ok((
            Profile {
                format: PROFILE_FORMAT.into(),
                version: PROFILE_VERSION,
                model,
                calibration,
                reference_sparsity: if cfg.nonzero {
                    zeros as f32 / (tokens * n * self.codes.len()) as f32
                } else {
                    cfg.reference_sparsity
                },
                layers,
            },
            trace,
        ))
    }
}

impl FfnObserver for Profiler {
    fn observe(&mut self, layer: usize, _x: &[f32], gate: &[f32]) {
        let n = self.n_ff;
        let act = self.act;
        let rows = gate.len() / n;
        let scores = &mut self.scores;
        scores.clear();
        scores.resize(rows * n, 0.0);
        let codes = &mut self.batch;
        codes.clear();
        codes.resize(rows * n, 0);
        // Tokens in parallel (an activation and a code per neuron), then neurons in parallel
        // (sums over tokens): the profiling pass waited on this.
        codes
            .par_chunks_mut(n)
            .zip(scores.par_chunks_mut(n))
            .zip(gate.par_chunks_exact(n))
            .for_each(|((codes, scores), gate)| {
                for ((c, s), &g) in codes.iter_mut().zip(scores.iter_mut()).zip(gate) {
                    *s = act.apply(g).abs();
                    // ReLU: any non-zero activation gets a code above 0, so code 0 means
                    // exactly zero and "active" can be exact.
                    let exact = act == Activation::Relu && *s > 0.0;
                    *c = score_code(*s).max(exact as u8);
                }
            });
        let histogram = &mut self.histograms[layer];
        self.batch.iter().for_each(|&c| histogram[c as usize] += 1);
        if let Err(e) = self.codes[layer].append(&self.batch) {
            self.spill_error.get_or_insert(e.to_string());
        }
        let scores = &self.scores;
        self.sum_abs[layer]
            .par_chunks_mut(NEURON_BLOCK)
            .zip(self.max_abs[layer].par_chunks_mut(NEURON_BLOCK))
            .enumerate()
            .for_each(|(b, (sum, max))| {
                let first = b * NEURON_BLOCK;
                for row in scores.chunks_exact(n) {
                    let row = &row[first..first + sum.len()];
                    for ((sum, max), &s) in sum.iter_mut().zip(max.iter_mut()).zip(row) {
                        *sum += s as f64;
                        *max = max.max(s);
                    }
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(n_layer: usize, n_ff: usize) -> ModelInfo {
        ModelInfo {
            architecture: "llama".into(),
            n_layer,
            n_embd: 8,
            n_ff,
            activation: Activation::Relu,
            file_name: "m.gguf".into(),
            file_bytes: 1,
        }
    }

    #[test]
    fn thresholds_frequencies_and_trace_follow_the_scores() {
        // Neuron i's gate is i/10 on every token (ReLU): sparsity s leaves the top (1-s) active.
        let (n_ff, tokens) = (20, 30);
        let mut p = Profiler::new(1, n_ff, Activation::Relu);
        let row: Vec<f32> = (0..n_ff).map(|i| i as f32 / 10.0).collect();
        for _ in 0..tokens {
            p.observe(0, &[], &row);
        }
        assert_eq!(p.tokens(), tokens);
        let cal = Calibration {
            file: "c.txt".into(),
            tokens,
        };
        let (prof, trace) = p
            .finish(info(1, n_ff), cal, &ProfileConfig::default())
            .unwrap();
        let l = &prof.layers[0];
        // Half the neurons (0..10) are below the reference threshold, 10..20 at or above it.
        assert_eq!(l.frequency[..10], [0.0; 10]);
        assert_eq!(l.frequency[10..], [1.0; 10]);
        assert!(l.reference_threshold > 0.9 && l.reference_threshold <= 1.0);
        assert_eq!(
            trace.active(0, 7).collect::<Vec<_>>(),
            (10..20).collect::<Vec<_>>()
        );
        // Always-on neurons are perfectly co-active; a cache of half the neurons hits after warm-up.
        assert_eq!(l.coactivation.p_partner[15], 1.0);
        let half = l.hit_rate.iter().find(|h| h.cache_fraction == 0.5).unwrap();
        assert!(half.pinned == 1.0 && half.best == 1.0);
        assert!((half.lru - 29.0 / 30.0).abs() < 1e-6);
        assert!((l.threshold_for(0.5).unwrap() - l.reference_threshold).abs() < 1e-9);
        assert!(l.threshold_for(1.5).is_err());
    }

    #[test]
    fn a_spilling_profiler_gives_the_in_memory_profile_and_trace() {
        let (n_layer, n_ff) = (3, 37);
        let dir = tempfile::tempdir().unwrap();
        let record = |mut p: Profiler| {
            let mut x = 1u32;
            for batch in [5usize, 1, 64, 7] {
                for l in 0..n_layer {
                    let gate: Vec<f32> = (0..batch * n_ff)
                        .map(|_| {
                            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                            (x >> 8) as f32 / (1u32 << 24) as f32 * 6.0 - 3.0
                        })
                        .collect();
                    p.observe(l, &[], &gate);
                }
            }
            assert_eq!(p.tokens(), 77);
            let cal = Calibration {
                file: "c.txt".into(),
                tokens: 77,
            };
            p.finish(info(n_layer, n_ff), cal, &ProfileConfig::default())
                .unwrap()
        };
        let in_memory = record(Profiler::new(n_layer, n_ff, Activation::Silu));
        // Spilling is chosen before recording, and then holds no codes in memory.
        let mut late = Profiler::new(n_layer, n_ff, Activation::Silu);
        late.observe(0, &[], &[0.5; 37]);
        assert!(late.spill_to(dir.path()).is_err());
        let mut early = Profiler::new(n_layer, n_ff, Activation::Silu)
            .spill_to(dir.path())
            .unwrap();
        early.observe(0, &[], &[0.5; 37]);
        assert_eq!(early.bytes(), 0);
        drop(early);
        let spilled = record(
            Profiler::new(n_layer, n_ff, Activation::Silu)
                .spill_to(dir.path())
                .unwrap(),
        );
        assert_eq!(in_memory.0, spilled.0);
        assert_eq!(in_memory.1, spilled.1);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn profiles_round_trip_and_bad_files_are_refused() {
        let mut p = Profiler::new(2, 4, Activation::Silu);
        for l in 0..2 {
            p.observe(l, &[], &[0.5, -3.0, 2.0, 0.0, 1.0, 1.0, -1.0, 4.0]);
        }
        let cal = Calibration {
            file: "c.txt".into(),
            tokens: 2,
        };
        let (prof, _) = p
            .finish(info(2, 4), cal, &ProfileConfig::default())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        prof.save(&path).unwrap();
        assert_eq!(Profile::load(&path).unwrap(), prof);

        std::fs::write(&path, "{\"format\": \"pi2-profile\", \"version\": 99}").unwrap();
        let e = Profile::load(&path).unwrap_err().to_string();
        assert!(e.contains("version 99"), "{e}");
        std::fs::write(&path, "garbage").unwrap();
        assert!(Profile::load(&path)
            .unwrap_err()
            .to_string()
            .contains("not a pi2 profile"));
        let mut short = prof.clone();
        short.layers[1].frequency.pop();
        short.save(&path).unwrap();
        assert!(Profile::load(&path)
            .unwrap_err()
            .to_string()
            .contains("shape"));

        // Values the converter would index or divide by.
        let mut far = prof.clone();
        far.layers[0].coactivation.partner[2] = 4;
        let mut short_p = prof.clone();
        short_p.layers[1].coactivation.p_partner.truncate(1);
        let mut nan = prof.clone();
        nan.layers[0].thresholds[0].1 = -1.0;
        let mut freq = prof.clone();
        freq.layers[1].frequency[0] = 2.0;
        for (bad, want) in [
            (far, "partner"),
            (short_p, "shape"),
            (nan, "threshold"),
            (freq, "frequency"),
        ] {
            let e = Profile::from_json(&bad.to_json(), "p.json")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{want}: {e}");
        }

        let mut other = info(2, 4);
        other.n_ff = 8;
        let e = prof.model.check_compatible(&other).unwrap_err().to_string();
        assert!(
            e.contains("4 FFN neurons") && e.contains("8 FFN neurons"),
            "{e}"
        );
    }
}
