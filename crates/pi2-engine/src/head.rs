//! The sparse output head: decode scores every vocabulary row cheaply from factors `pi2
//! convert` stored (`pi2_model::bundle::HEAD_*`), bounds each score's distance from the exact
//! logit, and computes exactly only the rows that could be the token the sampler needs.
//!
//! The guarantee: a row left out has an upper bound below the `k`-th largest lower bound (for
//! greedy, below the best exact logit of the best-bounded row's group, which is at least that),
//! so it cannot be among the top `k` exact logits; the rows computed are computed by the dense
//! head's own kernel over whole groups of eight rows (bit for bit the dense values), so greedy
//! decoding picks exactly the dense token, ties included (every row tied with the maximum is a
//! candidate). The bound is the factors' (see `pi2_convert::head`) plus a floating-point
//! allowance for both kernels of `(blocks + 8) * 2^-20` times the operands' norms, generous
//! against the `blocks + 3` roundings per dot product an error analysis gives.
//!
//! When the bound cannot separate (more than [`HeadNeed::fallback_share`] of the rows would be
//! computed), the step falls back to the dense product and says so in [`HeadStats`].

use crate::offload::Offload;
use crate::sampler::SamplerConfig;
use crate::EngineError;
use half::f16;
use half::slice::HalfFloatSliceExt;
use pi2_io::IoError;
use pi2_kernels::{matmul, ActBuf, ActKind, KernelSet, MatRef, PackedMat, QuantType};
use pi2_model::bundle::{HEAD_BASIS, HEAD_BOUNDS, HEAD_COEF, KEY_HEAD_GROUPS};
use pi2_model::{GgufFile, Model};
use rayon::prelude::*;

/// Rows per parallel task of the bound pass (and per f16 conversion).
const CHUNK: usize = 2048;
/// Rows computed together: the kernels' group, so values match the dense product bit for bit.
const GROUP: usize = 8;

/// What the sampler needs from the head.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadNeed {
    /// Every row that could be among the `top_k` largest logits is computed (1: greedy).
    pub top_k: usize,
    /// Also every row within `margin` of the `top_k`-th largest (temperature sampling without
    /// top-k: rows further below have a probability under `exp(-margin / T)` of the top's).
    pub margin: f32,
    /// Above this share of the rows, the dense product is cheaper: fall back.
    pub fallback_share: f32,
}

impl HeadNeed {
    /// Greedy decoding: the argmax, exactly.
    pub fn greedy() -> Self {
        Self {
            top_k: 1,
            margin: 0.0,
            fallback_share: 0.25,
        }
    }

    /// What `cfg` samples from: exactly its top-k when it has one (top-p and min-p then work
    /// inside it); else exactly the rows min-p keeps (within `ln(1 / min_p)` of the top); else
    /// the rows within `temperature * ln(1e6)` of the top (an approximation: rows further down
    /// have under a millionth of the top's probability each). `None` (dense) with a repetition
    /// penalty, which can lower the top rows below ones the bound left out.
    pub fn for_sampler(cfg: &SamplerConfig) -> Option<Self> {
        if cfg.repeat_penalty != 1.0 {
            return None;
        }
        if cfg.temperature <= 0.0 {
            return Some(Self::greedy());
        }
        let margin = match cfg.min_p > 0.0 {
            true => -cfg.min_p.ln(),
            false => cfg.temperature * 1e6f32.ln(),
        };
        Some(match cfg.top_k {
            0 => Self {
                margin,
                ..Self::greedy()
            },
            k => Self {
                top_k: k,
                ..Self::greedy()
            },
        })
    }
}

/// What the sparse head did, summed over decode steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadStats {
    /// Steps that ran the sparse head (fallbacks included).
    pub steps: u64,
    /// Output rows computed exactly (whole groups of eight; a fallback counts every row).
    pub rows: u64,
    /// Bytes of output rows read (from memory or flash).
    pub bytes: u64,
    /// Of those, bytes read from flash (an offload that streams output rows).
    pub flash_bytes: u64,
    /// Steps where the bound could not separate and the dense product ran.
    pub fallbacks: u64,
}

/// A converted model's sparse-head factors, borrowed from the file (coefficients repacked).
pub struct SparseHead<'m> {
    d: usize,
    vocab: usize,
    rank: usize,
    /// Group boundaries after `rank`, the last `d`.
    groups: Vec<usize>,
    basis: &'m [f16],
    coef: PackedOrMapped<'m>,
    /// `(3 + groups) x vocab`: coefficient norm, row norm, quantization error, group norms.
    bounds: &'m [f16],
}

enum PackedOrMapped<'m> {
    Packed(PackedMat),
    Mapped(MatRef<'m>),
}

fn corrupt(msg: String) -> EngineError {
    EngineError::Model(pi2_model::ModelError::Corrupt(format!(
        "sparse head: {msg}"
    )))
}

fn f16s<'m>(f: &'m GgufFile, name: &str, dims: [usize; 2]) -> Result<&'m [f16], EngineError> {
    let t = f
        .tensor(name)
        .ok_or_else(|| corrupt(format!("`{name}` is missing")))?;
    let want = [dims[1] as u64, dims[0] as u64];
    if t.ggml_type != QuantType::F16.ggml_id() || t.dims[..] != want {
        return Err(corrupt(format!(
            "`{name}` is {} {:?}, expected F16 {want:?}",
            t.type_name(),
            t.dims
        )));
    }
    bytemuck::try_cast_slice(f.tensor_data(t)).map_err(|e| corrupt(format!("`{name}`: {e}")))
}

impl<'m> SparseHead<'m> {
    /// The factors of a converted model, if it has them (`None` for a model without);
    /// `pack`: copy the coefficients into the kernels' faster layout (not under a memory budget,
    /// which counts the mapped tensors: no copies).
    pub fn load(model: &'m Model, pack: bool) -> Result<Option<Self>, EngineError> {
        let f = &model.file;
        let Some(groups) = f.get(KEY_HEAD_GROUPS) else {
            return Ok(None);
        };
        let c = &model.config;
        let (d, vocab) = (c.n_embd, c.n_vocab);
        let groups: Vec<usize> = groups
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|v| v.as_u64().map(|x| x as usize))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| corrupt(format!("`{KEY_HEAD_GROUPS}` is not a number array")))?;
        let t = f
            .tensor(HEAD_COEF)
            .ok_or_else(|| corrupt(format!("`{HEAD_COEF}` is missing")))?;
        let rank = t.dims.first().copied().unwrap_or(0) as usize;
        let increasing = std::iter::once(rank)
            .chain(groups.iter().copied())
            .collect::<Vec<_>>()
            .windows(2)
            .all(|w| w[0] < w[1]);
        if groups.last() != Some(&d) || !increasing || !rank.is_multiple_of(32) || rank == 0 {
            return Err(corrupt(format!(
                "rank {rank} and groups {groups:?} do not split width {d}"
            )));
        }
        if t.ggml_type != QuantType::Q8_0.ggml_id() || t.dims[..] != [rank as u64, vocab as u64] {
            return Err(corrupt(format!(
                "`{HEAD_COEF}` is {} {:?}, expected Q8_0 [{rank}, {vocab}]",
                t.type_name(),
                t.dims
            )));
        }
        let coef = MatRef::new(QuantType::Q8_0, vocab, rank, f.tensor_data(t))
            .map_err(|e| corrupt(format!("`{HEAD_COEF}`: {e}")))?;
        let basis = f16s(f, HEAD_BASIS, [d, d])?;
        let bounds = f16s(f, HEAD_BOUNDS, [3 + groups.len(), vocab])?;
        let mut head = Self::from_parts(groups, basis, coef, bounds)?;
        if !pack {
            head.coef = PackedOrMapped::Mapped(coef);
        }
        Ok(Some(head))
    }

    /// A head from its parts (what [`SparseHead::load`] reads from a file): group boundaries
    /// after the rank, ending at the width `d`; the `d x d` basis; `vocab x rank` Q8_0
    /// coefficients; `(3 + groups) x vocab` bounds. The coefficients are repacked.
    pub fn from_parts(
        groups: Vec<usize>,
        basis: &'m [f16],
        coef: MatRef<'m>,
        bounds: &'m [f16],
    ) -> Result<Self, EngineError> {
        let (vocab, rank) = (coef.rows, coef.cols);
        let d = groups.last().copied().unwrap_or(0);
        let increasing = std::iter::once(rank)
            .chain(groups.iter().copied())
            .collect::<Vec<_>>()
            .windows(2)
            .all(|w| w[0] < w[1]);
        if coef.ty != QuantType::Q8_0 || coef.is_packed() || !increasing || groups.is_empty() {
            return Err(corrupt(format!(
                "{} coefficients of rank {rank} and groups {groups:?} do not split a width",
                coef.ty
            )));
        }
        if basis.len() != d * d || bounds.len() != (3 + groups.len()) * vocab {
            return Err(corrupt(format!(
                "basis of {} and bounds of {} values for width {d}, {vocab} rows, {} groups",
                basis.len(),
                bounds.len(),
                groups.len()
            )));
        }
        let coef = match PackedMat::pack(&coef) {
            Some(p) => PackedOrMapped::Packed(p),
            None => PackedOrMapped::Mapped(coef),
        };
        Ok(Self {
            d,
            vocab,
            rank,
            groups,
            basis,
            coef,
            bounds,
        })
    }

    /// Bytes resident for the head (basis, coefficients, bounds).
    pub fn bytes(&self) -> usize {
        let coef = match &self.coef {
            PackedOrMapped::Packed(p) => p.bytes(),
            PackedOrMapped::Mapped(m) => m.bytes().len(),
        };
        2 * (self.basis.len() + self.bounds.len()) + coef
    }

    /// Bytes of the head's per-step buffers beyond its factors (scores, bounds, sorting).
    pub fn scratch_bytes(&self) -> usize {
        4 * 3 * self.vocab + 8 * 4 * self.d + 16 * self.vocab.div_ceil(GROUP)
    }

    /// Scored coordinates per row.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Checks the head against the output matrix it will bound.
    pub fn check(&self, out: &MatRef<'_>) -> Result<(), EngineError> {
        if out.rows != self.vocab || out.cols != self.d {
            return Err(corrupt(format!(
                "factors for {}x{}, output matrix {}x{}",
                self.vocab, self.d, out.rows, out.cols
            )));
        }
        Ok(())
    }

    fn coef(&self) -> MatRef<'_> {
        match &self.coef {
            PackedOrMapped::Packed(p) => p.mat(),
            PackedOrMapped::Mapped(m) => *m,
        }
    }
}

/// Per-step buffers of the sparse head (reused: no allocation per token).
#[derive(Default)]
pub struct HeadScratch {
    hq: Vec<f64>,
    y: Vec<f64>,
    y0: Vec<f32>,
    y0q: Vec<f64>,
    acts: ActBuf,
    /// Scores, then upper bounds.
    up: Vec<f32>,
    lo: Vec<f32>,
    sorted: Vec<f32>,
    ranges: Vec<(usize, usize)>,
    /// `ranges` without the group computed first (offloaded: not read twice).
    other_ranges: Vec<(usize, usize)>,
}

fn norm(it: impl Iterator<Item = f64>) -> f64 {
    it.map(|v| v * v).sum::<f64>().sqrt()
}

/// Rounding allowance of a dot product over `cols` elements (see the module docs).
fn allowance(cols: usize) -> f32 {
    (cols.div_ceil(32) + 8) as f32 * (2.0f32).powi(-20)
}

/// The logits `need` asks for, for the one token quantized in `acts`, into `logits` (rows left
/// out are `-inf`); `out` is the output matrix the dense head multiplies (checked with
/// [`SparseHead::check`] beforehand). Returns the rows computed and whether it fell back to
/// the dense product.
pub fn logits(
    ks: &KernelSet,
    head: &SparseHead<'_>,
    need: &HeadNeed,
    out: &MatRef<'_>,
    acts: &ActBuf,
    s: &mut HeadScratch,
    logits: &mut [f32],
) -> (usize, bool) {
    let vocab = head.vocab;
    let exact = |a: usize, b: usize, v: &mut [f32]| {
        matmul(ks, &out.rows(a..b), acts, v);
        Ok::<_, std::convert::Infallible>(())
    };
    let Ok(selected) = select(ks, head, need, acts, s, exact);
    match selected {
        Some(computed) if computed as f32 <= need.fallback_share * vocab as f32 => {
            logits.fill(f32::NEG_INFINITY);
            for &(a, b) in &s.ranges {
                matmul(ks, &out.rows(a..b), acts, &mut logits[a..b]);
            }
            (computed, false)
        }
        _ => {
            matmul(ks, out, acts, logits);
            (vocab, true)
        }
    }
}

/// The rows `need` would compute for the token quantized in `acts` whose exact logits are
/// `dense`, as ranges of row numbers, ignoring the fallback share (checks of the bound and of
/// what sampling from the candidates loses); `None` when the bound cannot separate at all.
pub fn candidates<'s>(
    ks: &KernelSet,
    head: &SparseHead<'_>,
    need: &HeadNeed,
    acts: &ActBuf,
    s: &'s mut HeadScratch,
    dense: &[f32],
) -> Option<&'s [(usize, usize)]> {
    let exact = |a: usize, b: usize, v: &mut [f32]| {
        v.copy_from_slice(&dense[a..b]);
        Ok::<_, std::convert::Infallible>(())
    };
    let Ok(selected) = select(ks, head, need, acts, s, exact);
    selected.map(|_| &s.ranges[..])
}

/// Scores and bounds every row, then puts the groups of eight rows that could hold what
/// `need` asks for into `s.ranges` (merged); `exact(a, b, v)` gives the exact logits of rows
/// `a..b` (the best-bounded row's group, which raises the greedy bar). Returns the rows
/// selected, or `None` when no finite bar exists.
fn select<E>(
    ks: &KernelSet,
    head: &SparseHead<'_>,
    need: &HeadNeed,
    acts: &ActBuf,
    s: &mut HeadScratch,
    exact: impl FnOnce(usize, usize, &mut [f32]) -> Result<(), E>,
) -> Result<Option<usize>, E> {
    let (d, r, vocab) = (head.d, head.rank, head.vocab);
    s.hq.resize(d, 0.0);
    acts.dequantize_row(0, &mut s.hq);
    let hn = norm(s.hq.iter().copied());
    // y = basis * h in f64 (the products of f16 and f32 values are exact there).
    s.y.resize(d, 0.0);
    let hq = &s.hq;
    let row_buf = || vec![0.0f32; d];
    s.y.par_chunks_mut(64)
        .enumerate()
        .for_each_init(row_buf, |row, (c, ys)| {
            for (k, y) in ys.iter_mut().enumerate() {
                let j = c * 64 + k;
                head.basis[j * d..(j + 1) * d].convert_to_f32_slice(row);
                *y = row.iter().zip(hq).map(|(&b, &h)| b as f64 * h).sum();
            }
        });
    s.y0.clear();
    s.y0.extend(s.y[..r].iter().map(|&v| v as f32));
    s.acts.quantize(ActKind::Q8, &s.y0, r);
    s.y0q.resize(r, 0.0);
    s.acts.dequantize_row(0, &mut s.y0q);
    let q_err = norm(s.y[..r].iter().zip(&s.y0q).map(|(a, b)| a - b)) as f32;
    let y0n = norm(s.y[..r].iter().copied()) as f32;
    let y0qn = norm(s.y0q.iter().copied()) as f32;
    let mut start = r;
    let gn: Vec<f32> = head
        .groups
        .iter()
        .map(|&end| {
            let g = norm(s.y[start..end].iter().copied()) as f32;
            start = end;
            g
        })
        .collect();
    // Scores, then each row's bound.
    s.up.resize(vocab, 0.0);
    s.lo.resize(vocab, 0.0);
    matmul(ks, &head.coef(), &s.acts, &mut s.up);
    let per_cn = q_err + allowance(r) * y0qn;
    let per_wn = 2.0 * allowance(d) * hn as f32;
    let n_stats = 3 + head.groups.len();
    s.up.par_chunks_mut(CHUNK)
        .zip(s.lo.par_chunks_mut(CHUNK))
        .enumerate()
        .for_each(|(c, (up, lo))| {
            let i0 = c * CHUNK;
            // On the stack: no allocation per token.
            let mut col_buf = [0.0f32; CHUNK];
            let mut e_buf = [0.0f32; CHUNK];
            let (col, e) = (&mut col_buf[..up.len()], &mut e_buf[..up.len()]);
            for k in 0..n_stats {
                let f = match k {
                    0 => per_cn,
                    1 => per_wn,
                    2 => y0n,
                    g => gn[g - 3],
                };
                let b = &head.bounds[k * vocab + i0..k * vocab + i0 + up.len()];
                b.convert_to_f32_slice(col);
                e.iter_mut().zip(col.iter()).for_each(|(e, &v)| *e += v * f);
            }
            for ((u, l), &e) in up.iter_mut().zip(lo.iter_mut()).zip(e.iter()) {
                // A relative and an absolute hair for this sum's own rounding.
                let e = e * 1.001 + 1e-6;
                *l = *u - e;
                *u += e;
            }
        });
    let mut threshold = kth_largest(&s.lo, need.top_k, &mut s.sorted);
    if need.top_k == 1 {
        // The exact logits of the best-bounded row's group raise the bar: every row that can
        // beat (or tie) the maximum reaches at least the best exact value seen.
        if let Some(best) = (0..vocab).max_by(|&a, &b| s.lo[a].total_cmp(&s.lo[b])) {
            let a = best / GROUP * GROUP;
            let b = (a + GROUP).min(vocab);
            let mut best_group = [0.0f32; GROUP];
            exact(a, b, &mut best_group[..b - a])?;
            threshold = best_group[..b - a]
                .iter()
                .copied()
                .fold(threshold, f32::max);
        }
    }
    threshold -= need.margin;
    // Candidate groups of eight, merged into ranges.
    s.ranges.clear();
    let mut computed = 0;
    for g in 0..vocab.div_ceil(GROUP) {
        let (a, b) = (g * GROUP, ((g + 1) * GROUP).min(vocab));
        if !s.up[a..b].iter().any(|&u| u >= threshold) {
            continue;
        }
        computed += b - a;
        match s.ranges.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => s.ranges.push((a, b)),
        }
    }
    Ok(threshold.is_finite().then_some(computed))
}

/// The `k`-th largest of `v` (`k >= 1`; the smallest if `k > v.len()`).
fn kth_largest(v: &[f32], k: usize, buf: &mut Vec<f32>) -> f32 {
    if k <= 1 {
        return v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    }
    buf.clear();
    buf.extend_from_slice(v);
    let k = k.min(buf.len());
    let (_, kth, _) = buf.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    *kth
}

/// Whether a model file carries sparse-head factors.
pub fn has_head(f: &GgufFile) -> bool {
    f.get(KEY_HEAD_GROUPS).is_some()
}

/// An engine's sparse head: the factors, what the sampler needs, buffers and counts.
#[derive(Default)]
pub(crate) struct HeadState<'m> {
    pub(crate) head: Option<&'m SparseHead<'m>>,
    pub(crate) need: Option<HeadNeed>,
    pub(crate) scratch: HeadScratch,
    pub(crate) stats: HeadStats,
}

impl HeadState<'_> {
    /// Whether one token's logits go through the sparse head.
    pub(crate) fn active(&self) -> bool {
        self.head.is_some() && self.need.is_some()
    }

    /// [`HeadState::run`] for an offload that streams output rows: the candidate rows not
    /// resident are read from flash (sorted, merged into ranges of whole groups); a fallback
    /// streams the whole matrix as the dense head does.
    pub(crate) fn run_offloaded(
        &mut self,
        ks: &KernelSet,
        o: &mut Offload,
        out: &MatRef<'_>,
        acts: &ActBuf,
        out_logits: &mut [f32],
    ) -> Result<(), IoError> {
        let (Some(head), Some(need)) = (self.head, self.need.as_ref()) else {
            return o.lm_head(ks, out, acts, 1, out_logits);
        };
        let vocab = head.vocab;
        let (mut flash, mut best) = (0, (0, 0));
        let exact = |a: usize, b: usize, v: &mut [f32]| {
            flash += o.lm_head_rows(ks, out, acts, &[(a, b)], out_logits)?;
            v.copy_from_slice(&out_logits[a..b]);
            best = (a, b);
            Ok::<_, IoError>(())
        };
        let selected = select(ks, head, need, acts, &mut self.scratch, exact)?;
        let rows = match selected {
            Some(rows) if rows as f32 <= need.fallback_share * vocab as f32 => {
                // The best-bounded group is already computed: keep it, read the others.
                let (a, b) = best;
                let mut kept = [0.0f32; GROUP];
                kept[..b - a].copy_from_slice(&out_logits[a..b]);
                out_logits.fill(f32::NEG_INFINITY);
                out_logits[a..b].copy_from_slice(&kept[..b - a]);
                let s = &mut self.scratch;
                s.other_ranges.clear();
                for &(x, y) in &s.ranges {
                    for part in [(x, y.min(a)), (x.max(b), y)] {
                        if part.0 < part.1 {
                            s.other_ranges.push(part);
                        }
                    }
                }
                flash += o.lm_head_rows(ks, out, acts, &s.other_ranges, out_logits)?;
                rows
            }
            _ => {
                let before = o.stats().out_bytes;
                o.lm_head(ks, out, acts, 1, out_logits)?;
                flash += o.stats().out_bytes - before;
                self.stats.fallbacks += 1;
                vocab
            }
        };
        let st = &mut self.stats;
        st.steps += 1;
        st.rows += rows as u64;
        st.bytes += (rows * out.row_bytes()) as u64;
        st.flash_bytes += flash;
        Ok(())
    }

    /// [`logits`] with the counts kept.
    pub(crate) fn run(
        &mut self,
        ks: &KernelSet,
        out: &MatRef<'_>,
        acts: &ActBuf,
        out_logits: &mut [f32],
    ) {
        let (Some(head), Some(need)) = (self.head, self.need.as_ref()) else {
            return;
        };
        let (rows, fell_back) = logits(ks, head, need, out, acts, &mut self.scratch, out_logits);
        let st = &mut self.stats;
        st.steps += 1;
        st.rows += rows as u64;
        st.bytes += (rows * out.row_bytes()) as u64;
        st.fallbacks += fell_back as u64;
    }
}
