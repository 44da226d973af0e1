//! Full-size stand-in models: the exact shapes of Llama-2 7B/13B, Mistral 7B, Mixtral 8x7B and
//! (without its biases) Qwen2.5-1.5B
//! with deterministic random weights built so that, when the model runs, its FFN neurons fire
//! at planted rates. Their outputs mean nothing; they exist to measure speed and memory on the
//! I/O, cache and compute regime of real sparse models whose weights cannot be downloaded here.
//!
//! # How the activation statistics are planted
//! Channel 0 of the residual stream is a constant `A`: every token embedding has `A` there,
//! and the attention output and FFN down matrices have a zero row 0, so no layer changes it.
//! After RMSNorm (all norm weights 1) the FFN input is `(A, x_rest) / rms`, so neuron i's gate
//! pre-activation is `(w_i0 * A + w_i,rest . x_rest) / rms`. Its sign, which is all a ReLU
//! looks at, ignores `rms`. Over tokens, `w_i,rest . x_rest` is close to a zero-mean normal
//! with standard deviation `|w_i,rest| * sigma_x` (the embedding entries are independent,
//! uniform, of standard deviation `sigma_x`; the layers add only a small `EPS` of mixing), so
//! `w_i0 = z_i * |w_i,rest| * sigma_x / A` makes neuron i fire with probability `Phi(z_i)`.
//! The target rates `p_i = Phi(z_i)` follow a capped power law over a random ranking of each
//! layer's (and expert's) neurons, `p(r) = min(P_MAX, c / (r + 1)^alpha)`, with `c` set so
//! their mean is the requested rate: a few neurons fire for most tokens, most rarely.
//! For SiLU models the same construction plants the rate of `gate > 0`. With dReLU the up
//! projection is rectified too, so a neuron contributes on about half of its firing tokens.
//! The router of a mixture of experts is random; its channel-0 weights, scaled like the gates',
//! give each expert a mild popularity bias (`ROUTER_BIAS` standard deviations of its random
//! logit part), so routing is uneven but every expert is used, as in trained mixtures.

use crate::arch::{FfnAct, KEY_FFN_ACTIVATION};
use crate::gguf::{GgufFile, Value};
use crate::rng::Rng;
use crate::writer::TensorLayout;

mod shapes;
mod table;
use crate::ModelError;
use pi2_kernels::QuantType;
pub use shapes::{Shape, SHAPES};
use table::{metadata, Table};

/// Cap of a planted firing rate.
pub const P_MAX: f32 = 0.95;
/// Standard deviation of each layer's contribution to the residual stream, relative to the
/// embedding's: small, so the planted rates hold in every layer.
const EPS: f32 = 0.03;

/// Standard deviation of an expert's router bias, in units of its logit's random part.
const ROUTER_BIAS: f32 = 0.3;
/// Half-width of the uniform embedding entries.
const EMBD_SCALE: f32 = 1.0;

/// Metadata keys recording how a stand-in was made (read back to verify it).
pub const KEY_SHAPE: &str = "pi2.synth.shape";
pub const KEY_RATE: &str = "pi2.synth.rate";
pub const KEY_ALPHA: &str = "pi2.synth.alpha";
pub const KEY_SEED: &str = "pi2.synth.seed";

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct StandInSpec {
    pub shape: Shape,
    pub ffn_act: FfnAct,
    /// Type of every matrix (embedding and output included).
    pub quant: QuantType,
    /// Mean planted firing rate per layer (e.g. 0.1 for ReLU-family models).
    pub rate: f32,
    /// Power-law exponent of the hotness.
    pub alpha: f32,
    pub seed: u64,
}

impl StandInSpec {
    /// The spec a stand-in file was made from, if it is one.
    pub fn from_file(f: &GgufFile) -> Option<StandInSpec> {
        let shape = Shape::by_name(f.get(KEY_SHAPE)?.as_str()?)?;
        let ffn_act = match f.get(KEY_FFN_ACTIVATION) {
            Some(v) => FfnAct::parse(v.as_str()?)?,
            None => FfnAct::Silu,
        };
        let quant = f
            .tensor("blk.0.attn_q.weight")
            .and_then(|t| QuantType::from_ggml_id(t.ggml_type))?;
        Some(StandInSpec {
            shape,
            ffn_act,
            quant,
            rate: f.get(KEY_RATE)?.as_f64()? as f32,
            alpha: f.get(KEY_ALPHA)?.as_f64()? as f32,
            seed: f.get(KEY_SEED)?.as_u64()?,
        })
    }

    /// Planted firing probability of each neuron of `layer` (and `expert`), in file order.
    pub fn planted_rates(&self, layer: usize, expert: usize) -> Vec<f32> {
        let n = self.shape.n_ff;
        let by_rank = power_law(n, self.rate, self.alpha);
        // A random ranking: hot neurons are scattered, as in trained models.
        let mut order: Vec<usize> = (0..n).collect();
        let mut rng = Rng::new(mix(self.seed, 0x0A4E, (layer * 1024 + expert) as u64));
        for i in (1..n).rev() {
            order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut rates = vec![0.0; n];
        for (rank, &neuron) in order.iter().enumerate() {
            rates[neuron] = by_rank[rank];
        }
        rates
    }
}

/// Planted firing rates against measured ones, for checking that a profile sees what was
/// planted.
#[derive(Clone, Copy, Debug)]
pub struct RateComparison {
    pub mean_planted: f64,
    pub mean_measured: f64,
    /// Pearson correlation of the two per neuron.
    pub correlation: f64,
    /// Share of all firing held by the top 20% of neurons: planted, measured.
    pub top_share: (f32, f32),
}

impl RateComparison {
    pub fn of(planted: &[f32], measured: &[f32]) -> Self {
        let n = planted.len() as f64;
        let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let (mp, mm) = (mean(planted), mean(measured));
        let cov: f64 = planted
            .iter()
            .zip(measured)
            .map(|(&x, &y)| (x as f64 - mp) * (y as f64 - mm))
            .sum();
        let var = |v: &[f32], m: f64| v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>();
        let top_share = |v: &[f32]| {
            let mut s = v.to_vec();
            s.sort_by(|a, b| b.total_cmp(a));
            let total: f32 = s.iter().sum();
            s[..s.len() / 5].iter().sum::<f32>() / total.max(1e-9)
        };
        Self {
            mean_planted: mp,
            mean_measured: mm,
            correlation: cov / (var(planted, mp) * var(measured, mm)).sqrt(),
            top_share: (top_share(planted), top_share(measured)),
        }
    }
}

/// `n` rates `min(P_MAX, c / (r + 1)^alpha)` by rank with mean `mean` (`c` by bisection).
fn power_law(n: usize, mean: f32, alpha: f32) -> Vec<f32> {
    let mean = mean.clamp(1e-4, P_MAX) as f64;
    let at = |c: f64| -> Vec<f32> {
        (0..n)
            .map(|r| (c / ((r + 1) as f64).powf(alpha as f64)).min(P_MAX as f64) as f32)
            .collect()
    };
    let avg = |v: &[f32]| v.iter().map(|&p| p as f64).sum::<f64>() / n as f64;
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while avg(&at(hi)) < mean && hi < 1e12 {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if avg(&at(mid)) < mean {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    at(hi)
}

/// The standard normal quantile (Acklam's rational approximation, relative error < 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut r = Rng::new(seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.rotate_left(32));
    r.next_u64()
}

/// What one tensor holds, for generating its rows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Embedding,
    /// Uniform rows of half-width `scale`; row 0 zero when `zero_row0` (attention output,
    /// down: they must not touch the constant channel).
    Uniform {
        scale: f32,
        zero_row0: bool,
    },
    /// Gate rows of `layer`: uniform, channel 0 planted.
    Gate {
        layer: usize,
        scale: f32,
    },
    /// Router rows: uniform, channel 0 a small random bias.
    Router {
        scale: f32,
    },
    Ones,
    Zeros,
}

/// A stand-in model ready to be streamed: metadata, tensor directory, and row generation.
pub struct StandIn {
    pub spec: StandInSpec,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorLayout>,
    kinds: Vec<Kind>,
    /// Per tensor: rows and row length.
    geometry: Vec<(usize, usize)>,
    /// Per layer and expert: each neuron's planted z-score.
    z: Vec<Vec<f32>>,
    a: f32,
    sigma_x: f32,
}

impl StandIn {
    /// Plan a stand-in with the tokenizer (every `tokenizer.*` key) of `tokenizer_source`.
    pub fn new(spec: StandInSpec, tokenizer_source: &GgufFile) -> Result<StandIn, ModelError> {
        check_spec(&spec)?;
        let tok: Vec<(String, Value)> = tokenizer_source
            .metadata
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .cloned()
            .collect();
        let n_vocab = tok
            .iter()
            .find(|(k, _)| k == "tokenizer.ggml.tokens")
            .and_then(|(_, v)| v.array_len())
            .ok_or(ModelError::Tokenizer(
                "the tokenizer source has no `tokenizer.ggml.tokens`".into(),
            ))?;
        let mut metadata = metadata(&spec, n_vocab);
        metadata.extend(tok);
        let s = spec.shape;
        let d = s.n_embd;
        let experts = s.n_expert.max(1);
        // Scales (see the module notes): gate and up pre-activations of standard deviation
        // about 1 (the FFN input's non-constant channels carry about half its unit mean
        // square); attention and FFN outputs of standard deviation EPS * sigma_x per channel.
        let sigma_x = EMBD_SCALE / 3f32.sqrt();
        let table = Table::new(&spec, n_vocab, sigma_x);
        let z = (0..s.n_layer * experts)
            .map(|i| {
                spec.planted_rates(i / experts, i % experts)
                    .into_iter()
                    .map(|p| normal_quantile(p as f64) as f32)
                    .collect()
            })
            .collect();
        Ok(StandIn {
            spec,
            metadata,
            tensors: table.tensors,
            kinds: table.kinds,
            geometry: table.geometry,
            z,
            // The constant channel carries as much energy as the rest of the embedding.
            a: sigma_x * ((d - 1) as f32).sqrt(),
            sigma_x,
        })
    }

    /// Rows and row length of tensor `t`.
    pub fn geometry(&self, t: usize) -> (usize, usize) {
        self.geometry[t]
    }

    /// Generate rows `rows` of tensor `t` into `out` (deterministic: any split of the rows
    /// over threads gives the same bytes).
    /// Writes the whole GGUF file to `out`: rows made in parallel batches, written in order;
    /// `progress` hears each batch's bytes.
    pub fn write(
        &self,
        out: &mut impl std::io::Write,
        progress: &mut dyn FnMut(u64),
    ) -> std::io::Result<()> {
        use rayon::prelude::*;
        const BATCH_BYTES: usize = 64 << 20;
        crate::writer::write_streamed(
            out,
            *b"GGUF",
            &self.metadata,
            32,
            &self.tensors,
            |t, out| {
                let (rows, _) = self.geometry(t);
                let row_bytes = (self.tensors[t].bytes as usize / rows).max(1);
                let per_batch = (BATCH_BYTES / row_bytes).max(1);
                let per_task = per_batch.div_ceil(rayon::current_num_threads() * 4).max(1);
                let mut start = 0;
                while start < rows {
                    let end = (start + per_batch).min(rows);
                    let parts: Vec<Vec<u8>> = (start..end)
                        .step_by(per_task)
                        .collect::<Vec<_>>()
                        .into_par_iter()
                        .map(|s| {
                            let mut buf = Vec::with_capacity(per_task * row_bytes);
                            self.fill_rows(t, s..(s + per_task).min(end), &mut buf);
                            buf
                        })
                        .collect();
                    for p in &parts {
                        out.write_all(p)?;
                        progress(p.len() as u64);
                    }
                    start = end;
                }
                Ok(())
            },
        )
    }

    pub fn fill_rows(&self, t: usize, rows: std::ops::Range<usize>, out: &mut Vec<u8>) {
        let (_, cols) = self.geometry[t];
        let ty = QuantType::from_ggml_id(self.tensors[t].ggml_type).expect("our own types");
        let mut x = vec![0.0f32; cols];
        for r in rows {
            let mut rng = Rng::new(mix(self.spec.seed, t as u64, r as u64));
            match self.kinds[t] {
                Kind::Ones => x.fill(1.0),
                Kind::Zeros => x.fill(0.0),
                Kind::Embedding => {
                    x.iter_mut().for_each(|v| *v = rng.uniform() * EMBD_SCALE);
                    x[0] = self.a;
                }
                Kind::Uniform { scale, zero_row0 } => {
                    if zero_row0 && self.is_row0(r) {
                        x.fill(0.0);
                    } else {
                        x.iter_mut().for_each(|v| *v = rng.uniform() * scale);
                    }
                }
                Kind::Router { scale } => {
                    x.iter_mut().for_each(|v| *v = rng.uniform() * scale);
                    let rest = x[1..].iter().map(|v| v * v).sum::<f32>().sqrt();
                    // Uniform on [-1, 1] has standard deviation 1/sqrt(3).
                    x[0] = x[0] / scale
                        * 3f32.sqrt()
                        * self.spec.shape.router_bias
                        * rest
                        * self.sigma_x
                        / self.a;
                }
                Kind::Gate { layer, scale } => {
                    x.iter_mut().for_each(|v| *v = rng.uniform() * scale);
                    let ff = self.spec.shape.n_ff;
                    let experts = self.spec.shape.n_expert.max(1);
                    let z = self.z[layer * experts + r / ff][r % ff];
                    let rest = x[1..].iter().map(|v| v * v).sum::<f32>().sqrt();
                    x[0] = z * rest * self.sigma_x / self.a;
                }
            }
            out.extend_from_slice(&ty.quantize_row(&x).expect("checked type"));
        }
    }

    /// Whether row `r` of tensor `t` writes channel 0 of the residual stream (row 0 of each
    /// expert's down matrix).
    fn is_row0(&self, r: usize) -> bool {
        r.is_multiple_of(self.spec.shape.n_embd)
    }

    /// Bytes of the whole file.
    pub fn file_bytes(&self) -> u64 {
        crate::writer::streamed_size(&self.metadata, 32, &self.tensors)
    }
}

/// Refuses stand-ins pi2 cannot make.
fn check_spec(spec: &StandInSpec) -> Result<(), ModelError> {
    let (s, q) = (spec.shape, spec.quant);
    if q.quantize_row(&vec![0.0; q.block_len()]).is_none() {
        return Err(ModelError::Unsupported(format!(
            "stand-ins in {q} (pi2 quantizes q4_0, q4_1, q5_0, q5_1, q4_k, q8_0, f16, f32)"
        )));
    }
    for (what, cols) in [("n_embd", s.n_embd), ("n_ff", s.n_ff)] {
        if cols % q.block_len() != 0 {
            return Err(ModelError::Unsupported(format!(
                "{what} {cols} is not a multiple of the {q} block"
            )));
        }
    }
    if !(0.0..=P_MAX).contains(&spec.rate) || spec.rate <= 0.0 || spec.alpha < 0.0 {
        return Err(ModelError::Unsupported(format!(
            "rate {} must be in (0, {P_MAX}] and alpha {} >= 0",
            spec.rate, spec.alpha
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_inverts_the_normal_cdf() {
        assert!(normal_quantile(0.5).abs() < 1e-9);
        assert!((normal_quantile(0.975) - 1.959_963_985).abs() < 1e-6);
        assert!((normal_quantile(0.01) + 2.326_347_874).abs() < 1e-6);
        assert!((normal_quantile(0.9) + normal_quantile(0.1)).abs() < 1e-9);
    }

    #[test]
    fn power_law_has_the_mean_and_the_cap() {
        for (n, mean) in [(1024, 0.1), (11008, 0.1), (14336, 0.3)] {
            let p = power_law(n, mean, 1.0);
            let avg = p.iter().sum::<f32>() / n as f32;
            assert!((avg - mean).abs() < 1e-3, "{avg}");
            assert!(p.windows(2).all(|w| w[0] >= w[1]));
            assert!(p[0] <= P_MAX);
            // At ReLU-like rates a hot head: the top fifth carries most activations.
            let top: f32 = p[..n / 5].iter().sum();
            assert!(mean > 0.1 || top / p.iter().sum::<f32>() > 0.6);
        }
    }
}
