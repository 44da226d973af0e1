//! The sparse output head's factors, built from the output matrix and the second moment of the
//! final hidden states seen in calibration (training-free).
//!
//! A logit is `w . h` for output row `w` and final hidden state `h`. With `R` the basis (its
//! rows the eigenvectors of `E[h h^T]`, largest first, stored as F16) and `y = R h`, the logit
//! is exactly `z . y` for `z = R^-T w` (computed here in f64 against the stored basis, so the
//! identity holds for the basis as stored). The first `rank` coordinates of `z` are stored as
//! Q8_0 and give the score; the rest of the logit is bounded by Cauchy-Schwarz per group of
//! coordinates: `|z_g . y_g| <= |z_g| |y_g|`. Because calibration hidden states put most of
//! their energy in the first coordinates, the far groups' `|y_g|` are small and the bound is
//! tight where it matters. Every stored norm is rounded up.

use crate::ConvertError;
use half::f16;
use nalgebra::{DMatrix, SymmetricEigen};
use pi2_kernels::{MatRef, QuantType};
use rayon::prelude::*;

/// `sum h h^T` over the calibration tokens' final (normalized) hidden states.
#[derive(Clone, Debug)]
pub struct HiddenMoment {
    d: usize,
    n: u64,
    m: DMatrix<f64>,
}

impl HiddenMoment {
    pub fn new(d: usize) -> Self {
        Self {
            d,
            n: 0,
            m: DMatrix::zeros(d, d),
        }
    }

    /// Adds token rows (`rows.len()` a multiple of `d`).
    pub fn add(&mut self, rows: &[f32]) {
        let n = rows.len() / self.d;
        if n == 0 {
            return;
        }
        let h = DMatrix::from_iterator(self.d, n, rows.iter().map(|&v| v as f64));
        self.m.gemm(1.0, &h, &h.transpose(), 1.0);
        self.n += n as u64;
    }

    /// Tokens added.
    pub fn tokens(&self) -> u64 {
        self.n
    }
}

/// The stored factors of a sparse head (see `pi2_model::bundle::HEAD_*`).
#[derive(Clone, Debug)]
pub struct HeadFactors {
    pub rank: usize,
    /// Group boundaries after the scored coordinates: `rank < b1 < .. < n_embd`.
    pub groups: Vec<u32>,
    /// `n_embd x n_embd` F16, row `j` basis vector `j`.
    pub basis: Vec<f16>,
    /// Q8_0 rows of `rank` coefficients, one per output row.
    pub coef: Vec<u8>,
    /// `(3 + groups) x n_vocab` F16, rounded up (see the bundle docs).
    pub bounds: Vec<f16>,
}

impl HeadFactors {
    /// Bytes the factors hold (resident at run time).
    pub fn bytes(&self) -> usize {
        2 * self.basis.len() + self.coef.len() + 2 * self.bounds.len()
    }
}

/// Group boundaries after `rank`, each group twice the previous, the last ending at `d`.
fn group_bounds(rank: usize, d: usize) -> Vec<u32> {
    let mut b = vec![];
    let mut end = rank;
    while end < d {
        end = (end * 2).min(d);
        b.push(end as u32);
    }
    b
}

/// Bytes of the factors at `rank` for `vocab` rows of width `d`.
fn factor_bytes(rank: usize, d: usize, vocab: usize) -> usize {
    let g = group_bounds(rank, d).len();
    2 * d * d + vocab * (rank / 32 * QuantType::Q8_0.block_bytes() + 2 * (3 + g))
}

/// The rank for a resident share `share` of the output matrix: the largest multiple of 32 up
/// to `d / 4` whose factors fit, at least 32.
pub fn choose_rank(out: &MatRef<'_>, share: f32) -> usize {
    let budget = (share as f64 * (out.rows * out.row_bytes()) as f64) as usize;
    let mut rank = 32;
    while rank + 32 <= out.cols / 4 && factor_bytes(rank + 32, out.cols, out.rows) <= budget {
        rank += 32;
    }
    rank
}

/// f16 at least `x` (`x >= 0`): the nearest, or the next one up when the nearest is below.
fn f16_up(x: f64) -> f16 {
    let h = f16::from_f64(x);
    if h.to_f64() >= x {
        h
    } else {
        f16::from_bits(h.to_bits() + 1)
    }
}

/// Builds the factors of output matrix `out` (`n_vocab x n_embd`) at `rank` from the hidden
/// states' moment.
pub fn build_head(
    out: &MatRef<'_>,
    moment: &HiddenMoment,
    rank: usize,
) -> Result<HeadFactors, ConvertError> {
    let (d, vocab) = (out.cols, out.rows);
    if moment.d != d || moment.n == 0 {
        return Err(ConvertError::Refused(format!(
            "sparse head: {} calibration states of width {} for an output matrix of width {d}",
            moment.n, moment.d
        )));
    }
    if !rank.is_multiple_of(32) || rank == 0 || rank >= d {
        return Err(ConvertError::Refused(format!(
            "sparse head: rank {rank} must be a multiple of 32 below {d}"
        )));
    }
    let eig = SymmetricEigen::new(moment.m.clone() / moment.n as f64);
    let mut order: Vec<usize> = (0..d).collect();
    order.sort_by(|&a, &b| eig.eigenvalues[b].total_cmp(&eig.eigenvalues[a]));
    let mut basis = vec![f16::ZERO; d * d];
    for (j, &e) in order.iter().enumerate() {
        for k in 0..d {
            basis[j * d + k] = f16::from_f64(eig.eigenvectors[(k, e)]);
        }
    }
    let r = DMatrix::from_fn(d, d, |j, k| basis[j * d + k].to_f64());
    let dual = r
        .try_inverse()
        .ok_or_else(|| ConvertError::Refused("sparse head: the basis is singular".into()))?
        .transpose();
    let groups = group_bounds(rank, d);
    let n_stats = 3 + groups.len();
    let chunk = 1024;
    let parts: Vec<RowFactors> = (0..vocab.div_ceil(chunk))
        .into_par_iter()
        .map(|c| {
            factor_rows(
                out,
                &dual,
                rank,
                &groups,
                c * chunk..((c + 1) * chunk).min(vocab),
            )
        })
        .collect();
    let mut coef = Vec::with_capacity(vocab * rank / 32 * QuantType::Q8_0.block_bytes());
    let mut bounds = vec![f16::ZERO; n_stats * vocab];
    let mut i = 0;
    for (c, fixed, norms) in parts {
        coef.extend_from_slice(&c);
        for (k, (f, g)) in fixed.iter().zip(&norms).enumerate() {
            for (s, &v) in f.iter().chain(g).enumerate() {
                bounds[s * vocab + i + k] = f16_up(v);
            }
        }
        i += fixed.len();
    }
    Ok(HeadFactors {
        rank,
        groups,
        basis,
        coef,
        bounds,
    })
}

/// Some rows' Q8_0 coefficients, (coefficient norm, row norm, quantization error) and
/// per-group norms.
type RowFactors = (Vec<u8>, Vec<[f64; 3]>, Vec<Vec<f64>>);

/// Rows `rows` of `out`: their [`RowFactors`].
fn factor_rows(
    out: &MatRef<'_>,
    dual: &DMatrix<f64>,
    rank: usize,
    groups: &[u32],
    rows: std::ops::Range<usize>,
) -> RowFactors {
    let d = out.cols;
    let mut row = vec![0.0f32; d];
    let mut w = DMatrix::zeros(d, rows.len());
    for (k, i) in rows.clone().enumerate() {
        out.dequantize_row(i, &mut row);
        w.column_mut(k)
            .iter_mut()
            .zip(&row)
            .for_each(|(o, &v)| *o = v as f64);
    }
    // z = R^-T w for every row at once.
    let z = dual * &w;
    let norm = |it: &mut dyn Iterator<Item = f64>| it.map(|v| v * v).sum::<f64>().sqrt();
    let mut coef = Vec::new();
    let (mut fixed, mut per_group) = (Vec::new(), Vec::new());
    let mut c = vec![0.0f32; rank];
    let mut back = vec![0.0f32; rank];
    for k in 0..rows.len() {
        let zk = z.column(k);
        c.iter_mut()
            .zip(zk.iter())
            .for_each(|(o, &v)| *o = v as f32);
        let q = QuantType::Q8_0
            .quantize_row(&c)
            .expect("rank is a multiple of 32");
        QuantType::Q8_0.dequantize_row(&q, &mut back);
        coef.extend_from_slice(&q);
        let qerr = norm(&mut zk.iter().zip(&back).take(rank).map(|(&a, &b)| a - b as f64));
        let cn = norm(&mut back.iter().map(|&v| v as f64));
        let wn = norm(&mut w.column(k).iter().copied());
        fixed.push([cn, wn, qerr]);
        let mut start = rank;
        per_group.push(
            groups
                .iter()
                .map(|&end| {
                    let g = norm(&mut zk.iter().skip(start).take(end as usize - start).copied());
                    start = end as usize;
                    g
                })
                .collect(),
        );
    }
    (coef, fixed, per_group)
}
