//! The clustered output head (the idea of FlashHead, arXiv 2603.14591, built from the paper):
//! the output matrix's rows are grouped into clusters of equal size, each cluster's centroid
//! (the mean of its rows) is stored beside the matrix, and decode scores the centroids, takes
//! the best clusters and computes only their rows exactly (`pi2_engine::ClusteredHead`).
//!
//! A centroid's score is exactly the mean logit of its rows, so what decides quality is how far
//! a cluster's logits spread around that mean for the hidden states the model produces: the
//! expected squared spread of row `w` from centroid `c` is `(w - c)^T E[h h^T] (w - c)`.
//! Clustering rows after scaling each coordinate by a power of its calibration root mean
//! square makes the clustering's metric follow that spread (a full whitening by `E[h h^T]^1/2`
//! fits the calibration genre better and others worse; measured in `docs/head.md`).
//!
//! Each cluster also stores the direction along which its rows' logits spread most for those
//! hidden states (the top singular vector of its residuals `w - c` whitened by `E[h h^T]^1/2`,
//! mapped back by least squares) and each row's coordinate along it. Decode ranks clusters by
//! `c.h + ucb * spread * |g.h|` (the mean logit plus how far the cluster's best row can reach
//! along its direction), and a row left out gets `c.h + a * g.h` instead of the mean alone:
//! both measured to matter for perplexity, where a plausible token left out is paid for in
//! full.
//!
//! Clusters are equal-size leaves of recursive splits at the median of each node's principal
//! direction (power iteration), so every cluster is `cluster` rows (the last may be fewer) and
//! starts at a multiple of 8 in the stored order, where the kernels' row groups are. Clusters
//! are stored hottest first: by how often calibration hidden states select them, so that a
//! resident prefix of the matrix serves the most selections under a memory budget.

use crate::ConvertError;
use pi2_kernels::MatRef;
use rayon::prelude::*;

/// How to cluster the output head.
#[derive(Clone, Copy, Debug)]
pub struct HeadConfig {
    /// Rows per cluster (a multiple of 8).
    pub cluster: usize,
    /// Coordinates are scaled by their calibration root mean square to this power before
    /// clustering (0: the rows as they are; 1: the "second moment" scaling).
    pub scale_power: f32,
    /// Share of the rows decode scores exactly (by whole clusters): the calibration's
    /// selection frequencies, which order the clusters, are counted at this share.
    pub share: f32,
    /// Weight of a cluster's reach along its direction in its selection score.
    pub ucb: f32,
    /// Type the output rows are stored in (`None`: the source's): a smaller type reads fewer
    /// bytes per chosen cluster under a memory budget, at some quality.
    pub row_type: Option<pi2_kernels::QuantType>,
}

impl Default for HeadConfig {
    fn default() -> Self {
        Self {
            cluster: 16,
            scale_power: 0.5,
            share: 0.4,
            ucb: 0.5,
            row_type: None,
        }
    }
}

/// A clustered head: the row order (clusters contiguous, hottest first), and in that order the
/// centroids, directions, spreads, each row's coordinate, and how often calibration selected
/// each cluster.
#[derive(Clone, Debug)]
pub struct ClusteredHead {
    pub cluster: usize,
    /// Stored row `j` is the source output row `order[j]`.
    pub order: Vec<u32>,
    /// Centroids, `clusters x d` f32.
    pub centroids: Vec<f32>,
    /// Each cluster's direction, `clusters x d` f32.
    pub directions: Vec<f32>,
    /// Each cluster's largest `|coef|`.
    pub spread: Vec<f32>,
    /// Per stored row, its coordinate along its cluster's direction.
    pub coef: Vec<f32>,
    /// Per stored cluster, the share of calibration tokens that selected it.
    pub frequency: Vec<f32>,
}

impl ClusteredHead {
    pub fn clusters(&self) -> usize {
        self.frequency.len()
    }
}

/// How well a head's selection holds on held-out hidden states, against the whole matrix.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeadCheck {
    /// Tokens checked.
    pub tokens: usize,
    /// Share of them whose exact top row is among the scored rows.
    pub top1: f32,
    /// Mean softmax mass of the exact logits on the scored rows.
    pub mass: f32,
}

/// The type centroids are stored in: Q8_0 where the width is a multiple of its blocks.
pub fn centroid_type(d: usize) -> pi2_kernels::QuantType {
    match d.is_multiple_of(32) {
        true => pi2_kernels::QuantType::Q8_0,
        false => pi2_kernels::QuantType::F32,
    }
}

/// Most held-out tokens [`build_checked`] checks (each costs a whole-matrix product).
const CHECK_TOKENS: usize = 256;

/// [`build`], then the head's [`HeadCheck`] on `check` (held-out hidden states, rows of `d`).
pub fn build_checked(
    out: &MatRef<'_>,
    hidden: &[f32],
    check: &[f32],
    cfg: &HeadConfig,
) -> Result<(ClusteredHead, HeadCheck), ConvertError> {
    let head = build(out, hidden, cfg)?;
    let d = out.cols;
    let n = (check.len() / d).min(CHECK_TOKENS);
    let (k, s) = (head.clusters(), head.cluster);
    let m = picks(cfg.share, out.rows, s);
    let picked: Vec<Vec<bool>> = check[..n * d]
        .par_chunks_exact(d)
        .map(|h| {
            let sc: Vec<(f32, f32)> = (0..k)
                .map(|c| {
                    let span = c * d..(c + 1) * d;
                    let (cent, dir) = (&head.centroids[span.clone()], &head.directions[span]);
                    score(cent, dir, head.spread[c], cfg.ucb, h)
                })
                .collect();
            let mut best: Vec<usize> = (0..k).collect();
            best.sort_by(|&a, &b| sc[b].0.total_cmp(&sc[a].0).then(a.cmp(&b)));
            let mut picked = vec![false; k];
            best[..m].iter().for_each(|&c| picked[c] = true);
            picked
        })
        .collect();
    // Exact logits in stored order, a block of rows at a time (each block dequantized once for
    // every checked token), folded into each token's running softmax.
    let mut runs = vec![Softmax::default(); n];
    let mut block = Vec::new();
    for (b, rows) in head.order.chunks(CHECK_BLOCK_ROWS).enumerate() {
        block.resize(rows.len() * d, 0.0);
        block
            .par_chunks_mut(d)
            .zip(rows)
            .for_each(|(buf, &r)| out.dequantize_row(r as usize, buf));
        runs.par_iter_mut()
            .zip(check[..n * d].par_chunks_exact(d))
            .zip(&picked)
            .for_each(|((run, h), picked)| {
                for (i, w) in block.chunks_exact(d).enumerate() {
                    let j = b * CHECK_BLOCK_ROWS + i;
                    run.add(j, dot(w, h), picked[j / s]);
                }
            });
    }
    let check = HeadCheck {
        tokens: n,
        top1: runs
            .iter()
            .zip(&picked)
            .filter(|(r, p)| p[r.top / s])
            .count() as f32
            / n.max(1) as f32,
        mass: (runs.iter().map(|r| r.on / r.all).sum::<f64>() / n.max(1) as f64) as f32,
    };
    Ok((head, check))
}

/// Rows of the output matrix dequantized at once by [`build_checked`].
const CHECK_BLOCK_ROWS: usize = 4096;

/// One token's softmax over logits seen one at a time: the top row, and the sums of
/// `exp(logit - max)` over every row and over the scored rows, rescaled as the max grows.
#[derive(Clone, Copy)]
struct Softmax {
    top: usize,
    max: f64,
    all: f64,
    on: f64,
}

impl Default for Softmax {
    fn default() -> Self {
        Self {
            top: 0,
            max: f64::NEG_INFINITY,
            all: 0.0,
            on: 0.0,
        }
    }
}

impl Softmax {
    fn add(&mut self, row: usize, logit: f32, scored: bool) {
        let l = logit as f64;
        if l > self.max {
            // The first of equal logits stays the top.
            let rescale = (self.max - l).exp();
            self.all *= rescale;
            self.on *= rescale;
            self.max = l;
            self.top = row;
        }
        let e = (l - self.max).exp();
        self.all += e;
        self.on += if scored { e } else { 0.0 };
    }
}

/// Power-iteration steps per split.
const POWER_STEPS: usize = 8;
/// Rows per parallel task of a split.
const TASK_ROWS: usize = 2048;

/// Clusters the rows of `out` (`vocab x d`) with calibration final hidden states `hidden`
/// (rows of `d`). Deterministic: the same inputs give the same head on any thread count.
pub fn build(
    out: &MatRef<'_>,
    hidden: &[f32],
    cfg: &HeadConfig,
) -> Result<ClusteredHead, ConvertError> {
    let (vocab, d) = (out.rows, out.cols);
    if cfg.cluster == 0 || !cfg.cluster.is_multiple_of(8) {
        return Err(ConvertError::Refused(format!(
            "head clusters of {} rows: a multiple of 8 is needed",
            cfg.cluster
        )));
    }
    if !(cfg.share > 0.0 && cfg.share <= 1.0) {
        return Err(ConvertError::Refused(format!(
            "head share {} is outside (0, 1]",
            cfg.share
        )));
    }
    let n_hidden = hidden.len() / d.max(1);
    if n_hidden == 0 {
        return Err(ConvertError::Refused(
            "no calibration hidden states for the output head".into(),
        ));
    }
    let scale = coordinate_scale(hidden, d, cfg.scale_power);
    let scaled = Rows {
        mat: out,
        scale: Some(&scale),
    };
    let mut leaves = Vec::new();
    split(
        &scaled,
        (0..vocab as u32).collect(),
        cfg.cluster,
        &mut leaves,
    );
    let rows = Rows {
        mat: out,
        scale: None,
    };
    let centroids: Vec<Vec<f32>> = leaves.par_iter().map(|c| mean(&rows, c)).collect();
    let white = whitening(hidden, d);
    let spreads = directions(&rows, &leaves, &centroids, &white);
    let frequency = selection_frequency(&centroids, &spreads, hidden, d, &leaves, cfg);
    // Hottest first (ties: the split order).
    let mut by_heat: Vec<usize> = (0..leaves.len()).collect();
    by_heat.sort_by(|&a, &b| frequency[b].total_cmp(&frequency[a]).then(a.cmp(&b)));
    // A short cluster goes last so that every other one starts at a multiple of the size.
    if let Some(p) = by_heat.iter().position(|&k| leaves[k].len() < cfg.cluster) {
        let short = by_heat.remove(p);
        by_heat.push(short);
    }
    Ok(ClusteredHead {
        cluster: cfg.cluster,
        order: by_heat.iter().flat_map(|&k| leaves[k].clone()).collect(),
        centroids: by_heat.iter().flat_map(|&k| centroids[k].clone()).collect(),
        directions: by_heat
            .iter()
            .flat_map(|&k| spreads[k].dir.clone())
            .collect(),
        spread: by_heat.iter().map(|&k| spreads[k].spread).collect(),
        coef: by_heat
            .iter()
            .flat_map(|&k| spreads[k].coef.clone())
            .collect(),
        frequency: by_heat.iter().map(|&k| frequency[k]).collect(),
    })
}

/// A cluster's direction of spread, its rows' coordinates along it, and the largest of those.
struct Spread {
    dir: Vec<f32>,
    coef: Vec<f32>,
    spread: f32,
}

/// `E[h h^T]^1/2` of the calibration hidden states (`d x d`, row-major), by a symmetric
/// eigendecomposition.
fn whitening(hidden: &[f32], d: usize) -> Vec<f32> {
    let n = (hidden.len() / d).max(1);
    let mut m = vec![0f32; d * d];
    // `h^T h` over the tokens (row-major `n x d`): one product.
    // SAFETY: the sizes match the strides: `hidden` is `n x d`, `m` is `d x d`.
    unsafe {
        matrixmultiply::sgemm(
            d,
            n,
            d,
            1.0 / n as f32,
            hidden.as_ptr(),
            1,
            d as isize,
            hidden.as_ptr(),
            d as isize,
            1,
            0.0,
            m.as_mut_ptr(),
            d as isize,
            1,
        );
    }
    let mat = nalgebra::DMatrix::from_iterator(d, d, m.iter().map(|&v| v as f64));
    let eig = nalgebra::SymmetricEigen::new(mat);
    let root = eig.eigenvalues.map(|l| l.max(0.0).sqrt());
    let w =
        &eig.eigenvectors * nalgebra::DMatrix::from_diagonal(&root) * eig.eigenvectors.transpose();
    (0..d * d).map(|i| w[(i / d, i % d)] as f32).collect()
}

/// Clusters whose residuals are whitened per task, this many at a time (bounded memory).
const SPREAD_BATCH: usize = 512;

/// Each cluster's direction of largest logit spread for the calibration hidden states: the top
/// right singular vector `v` of its residuals whitened by `white` (`X = (W - c) white`), the rows'
/// coordinates `a = X v`, and the direction `g` with `W - c ~ a g` (least squares).
fn directions(
    rows: &Rows<'_>,
    leaves: &[Vec<u32>],
    centroids: &[Vec<f32>],
    white: &[f32],
) -> Vec<Spread> {
    let d = rows.d();
    let mut out = Vec::with_capacity(leaves.len());
    for (lb, cb) in leaves
        .chunks(SPREAD_BATCH)
        .zip(centroids.chunks(SPREAD_BATCH))
    {
        let n: usize = lb.iter().map(Vec::len).sum();
        let mut resid = vec![0f32; n * d];
        let mut at = 0;
        for (leaf, c) in lb.iter().zip(cb) {
            for &i in leaf {
                let r = &mut resid[at * d..(at + 1) * d];
                rows.read(i, r);
                r.iter_mut().zip(c).for_each(|(o, &m)| *o -= m);
                at += 1;
            }
        }
        let mut x = vec![0f32; n * d];
        // SAFETY: `resid` is `n x d`, `white` `d x d`, `x` `n x d`, all row-major.
        unsafe {
            matrixmultiply::sgemm(
                n,
                d,
                d,
                1.0,
                resid.as_ptr(),
                d as isize,
                1,
                white.as_ptr(),
                d as isize,
                1,
                0.0,
                x.as_mut_ptr(),
                d as isize,
                1,
            );
        }
        let starts: Vec<usize> = lb
            .iter()
            .scan(0, |a, l| {
                let s = *a;
                *a += l.len();
                Some(s)
            })
            .collect();
        let part: Vec<Spread> = lb
            .par_iter()
            .zip(&starts)
            .map(|(leaf, &s)| {
                let span = s * d..(s + leaf.len()) * d;
                spread(&x[span.clone()], &resid[span], d)
            })
            .collect();
        out.extend(part);
    }
    out
}

/// Power-iteration steps for a cluster's top singular vector.
const SPREAD_STEPS: usize = 24;

/// One cluster's [`Spread`] from its whitened residuals `x` and residuals `r` (rows of `d`).
fn spread(x: &[f32], r: &[f32], d: usize) -> Spread {
    let n = x.len() / d;
    let mut v: Vec<f32> = (0..d).map(|j| 1.0 + (j % 7) as f32 * 0.1).collect();
    normalize(&mut v);
    for _ in 0..SPREAD_STEPS {
        let a: Vec<f32> = x.chunks_exact(d).map(|xr| dot(xr, &v)).collect();
        let mut next = vec![0f32; d];
        for (xr, &ai) in x.chunks_exact(d).zip(&a) {
            next.iter_mut().zip(xr).for_each(|(o, &xv)| *o += ai * xv);
        }
        if normalize(&mut next) == 0.0 {
            break;
        }
        v = next;
    }
    let coef: Vec<f32> = x.chunks_exact(d).map(|xr| dot(xr, &v)).collect();
    let aa: f32 = coef.iter().map(|a| a * a).sum();
    let mut dir = vec![0f32; d];
    if aa > 0.0 {
        for (rr, &ai) in r.chunks_exact(d).zip(&coef) {
            dir.iter_mut()
                .zip(rr)
                .for_each(|(o, &rv)| *o += ai * rv / aa);
        }
    }
    let spread = coef.iter().fold(0f32, |m, a| m.max(a.abs()));
    debug_assert_eq!(coef.len(), n);
    Spread { dir, coef, spread }
}

/// The output matrix's rows as f32 (each coordinate times `scale`), dequantized as they are
/// read: the matrix stays in the file's mapping, since a 150k-row vocabulary in f32 is over
/// 500 MB, more than the memory budgets conversions run under.
struct Rows<'a> {
    mat: &'a MatRef<'a>,
    scale: Option<&'a [f32]>,
}

impl Rows<'_> {
    fn d(&self) -> usize {
        self.mat.cols
    }

    /// Row `i` into `out` (`d` long).
    fn read(&self, i: u32, out: &mut [f32]) {
        self.mat.dequantize_row(i as usize, out);
        if let Some(scale) = self.scale {
            out.iter_mut().zip(scale).for_each(|(x, s)| *x *= s);
        }
    }
}

/// Per coordinate, the calibration root mean square to the power `p` (coordinates never seen
/// non-zero keep weight 1).
fn coordinate_scale(hidden: &[f32], d: usize, p: f32) -> Vec<f32> {
    let n = hidden.len() / d;
    let mut sq = vec![0f64; d];
    for h in hidden.chunks_exact(d) {
        sq.iter_mut()
            .zip(h)
            .for_each(|(s, &x)| *s += (x as f64) * (x as f64));
    }
    sq.iter()
        .map(|&s| {
            let rms = (s / n as f64).sqrt();
            if rms > 0.0 {
                rms.powf(p as f64) as f32
            } else {
                1.0
            }
        })
        .collect()
}

/// Splits `idx` (rows of `x`) at the median of its principal direction until every leaf holds
/// at most `size` rows; leaves are appended left to right. The left part of a split takes a
/// multiple of `size` rows, so only the last leaf can be short.
fn split(x: &Rows<'_>, idx: Vec<u32>, size: usize, out: &mut Vec<Vec<u32>>) {
    let n = idx.len();
    if n <= size {
        out.push(idx);
        return;
    }
    let dir = principal_direction(x, &idx);
    let mut buf = vec![0f32; x.d()];
    let mut keyed: Vec<(f32, u32)> = idx
        .iter()
        .map(|&i| {
            x.read(i, &mut buf);
            (dot(&buf, &dir), i)
        })
        .collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let k = n.div_ceil(size).div_ceil(2) * size;
    let right: Vec<u32> = keyed[k..].iter().map(|p| p.1).collect();
    let left: Vec<u32> = keyed[..k].iter().map(|p| p.1).collect();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    rayon::join(
        || split(x, left, size, &mut a),
        || split(x, right, size, &mut b),
    );
    out.append(&mut a);
    out.append(&mut b);
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The top principal direction of the rows `idx` of `x` (centered), by power iteration from a
/// fixed start; sums run over fixed tasks added in order, so the result does not depend on the
/// thread count.
fn principal_direction(x: &Rows<'_>, idx: &[u32]) -> Vec<f32> {
    let d = x.d();
    let mu = mean(x, idx);
    // A fixed, non-degenerate start.
    let mut v: Vec<f32> = (0..d)
        .map(|j| 1.0 + ((j * 2654435761) % 1000) as f32 / 1000.0)
        .collect();
    normalize(&mut v);
    for _ in 0..POWER_STEPS {
        let mv = dot(&mu, &v);
        let parts: Vec<Vec<f32>> = idx
            .par_chunks(TASK_ROWS)
            .map(|chunk| {
                let mut acc = vec![0f32; d];
                let mut r = vec![0f32; d];
                let mut p_sum = 0f32;
                for &i in chunk {
                    x.read(i, &mut r);
                    let p = dot(&r, &v) - mv;
                    p_sum += p;
                    acc.iter_mut().zip(&r).for_each(|(a, &xi)| *a += p * xi);
                }
                acc.push(p_sum);
                acc
            })
            .collect();
        let mut next = vec![0f32; d + 1];
        for p in &parts {
            next.iter_mut().zip(p).for_each(|(a, b)| *a += b);
        }
        let p_sum = next.pop().unwrap_or(0.0);
        next.iter_mut().zip(&mu).for_each(|(a, m)| *a -= m * p_sum);
        if normalize(&mut next) == 0.0 {
            break;
        }
        v = next;
    }
    v
}

fn normalize(v: &mut [f32]) -> f32 {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
    n
}

/// The mean of rows `idx` of `x`.
fn mean(x: &Rows<'_>, idx: &[u32]) -> Vec<f32> {
    let d = x.d();
    let mut m = vec![0f64; d];
    let mut r = vec![0f32; d];
    for &i in idx {
        x.read(i, &mut r);
        m.iter_mut().zip(&r).for_each(|(a, &b)| *a += b as f64);
    }
    m.iter()
        .map(|&s| (s / idx.len().max(1) as f64) as f32)
        .collect()
}

/// Clusters a token scores exactly at `share` of `vocab` rows in clusters of `cluster`.
pub fn picks(share: f32, vocab: usize, cluster: usize) -> usize {
    ((share as f64 * vocab as f64 / cluster as f64).ceil() as usize)
        .clamp(1, vocab.div_ceil(cluster))
}

/// A cluster's selection score for a token: its mean logit plus its reach along its direction.
fn score(c: &[f32], g: &[f32], spread: f32, ucb: f32, h: &[f32]) -> (f32, f32) {
    let p = dot(g, h);
    (dot(c, h) + ucb * spread * p.abs(), p)
}

/// How often each cluster is among the best-scored clusters at `cfg.share`, over the
/// calibration hidden states.
fn selection_frequency(
    centroids: &[Vec<f32>],
    spreads: &[Spread],
    hidden: &[f32],
    d: usize,
    leaves: &[Vec<u32>],
    cfg: &HeadConfig,
) -> Vec<f32> {
    let k = centroids.len();
    let vocab: usize = leaves.iter().map(Vec::len).sum();
    let m = picks(cfg.share, vocab, cfg.cluster);
    let counts: Vec<u32> = hidden
        .par_chunks_exact(d)
        .map(|h| {
            let scores: Vec<f32> = (0..k)
                .map(|c| {
                    score(
                        &centroids[c],
                        &spreads[c].dir,
                        spreads[c].spread,
                        cfg.ucb,
                        h,
                    )
                    .0
                })
                .collect();
            let mut best: Vec<usize> = (0..k).collect();
            best.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            let mut hit = vec![0u32; k];
            best[..m].iter().for_each(|&c| hit[c] = 1);
            hit
        })
        .reduce(
            || vec![0u32; k],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            },
        );
    let n = (hidden.len() / d) as f32;
    counts.iter().map(|&c| c as f32 / n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pi2_kernels::QuantType;

    fn f32_mat(rows: &[f32], d: usize) -> Vec<u8> {
        let _ = d;
        rows.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn clusters_are_equal_permutations_ordered_by_heat() {
        // 100 rows in 4 well separated families; hidden states point at family 2 mostly.
        let d = 8;
        let mut rows = Vec::new();
        for r in 0..100 {
            let fam = r % 4;
            for j in 0..d {
                let base = if j == fam { 5.0 } else { 0.0 };
                rows.push(base + ((r * 7 + j * 3) % 11) as f32 * 0.01);
            }
        }
        let bytes = f32_mat(&rows, d);
        let out = MatRef::new(QuantType::F32, 100, d, &bytes).unwrap();
        let mut hidden = Vec::new();
        for t in 0..50 {
            let mut h = vec![0.1f32; d];
            h[if t % 5 == 0 { 1 } else { 2 }] = 3.0;
            hidden.extend(h);
        }
        let cfg = HeadConfig {
            cluster: 8,
            share: 0.1,
            ..HeadConfig::default()
        };
        let head = build(&out, &hidden, &cfg).unwrap();
        let mut seen = head.order.clone();
        seen.sort();
        assert_eq!(seen, (0..100).collect::<Vec<u32>>());
        assert_eq!(head.clusters(), 13);
        assert_eq!(head.centroids.len(), 13 * d);
        // Hottest first, and the hottest cluster holds family-2 rows only.
        assert!(head.frequency.windows(2).take(11).all(|w| w[0] >= w[1]));
        assert!(head.order[..8].iter().all(|&r| r % 4 == 2));
        // Deterministic.
        let again = build(&out, &hidden, &cfg).unwrap();
        assert_eq!(again.order, head.order);
        assert_eq!(again.frequency, head.frequency);
    }

    #[test]
    fn refuses_bad_settings() {
        let bytes = f32_mat(&[0.0; 64], 8);
        let out = MatRef::new(QuantType::F32, 8, 8, &bytes).unwrap();
        let h = vec![1.0; 8];
        let bad = |cluster, share| {
            let cfg = HeadConfig {
                cluster,
                share,
                ..HeadConfig::default()
            };
            build(&out, &h, &cfg)
        };
        assert!(bad(12, 0.1).is_err());
        assert!(bad(8, 0.0).is_err());
        assert!(build(&out, &[], &HeadConfig::default()).is_err());
    }
}
