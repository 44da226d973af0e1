//! The clustered output head. A converted file stores the output rows in clusters of equal size
//! (`pi2_convert::head`), hottest cluster first, with each cluster's centroid `c` (the mean of
//! its rows), its direction of largest spread `g`, how far its rows reach along it (`spread`)
//! and each row's coordinate `a` along it. For each token the head scores every cluster
//! (two small products: `c.h + ucb * spread * |g.h|`), takes the best clusters until they hold
//! the configured share of the rows, and computes those rows exactly with the dense kernel,
//! through the engine's store (so an offloaded model reads only the chosen clusters that are
//! not resident). A row left out gets `c.h + a * g.h`, its cluster's mean logit corrected along
//! the direction, so that a plausible token left out is not scored far below its logit
//! (perplexity pays for such tokens in full).
//!
//! What this approximates is measured, not bounded: with a check on, every step also computes
//! the whole matrix and [`HeadStats`] counts how often the exact top row was among the scored
//! rows and the dense distribution's mass on them (`pi2 perplexity` reports both).

use crate::error::EngineError;
use crate::weights::Store;
use pi2_kernels::{ActBuf, KernelSet, MatRef, PackedMat, QuantType};
use pi2_model::bundle::{
    HEAD_CENTROIDS, HEAD_COEF, HEAD_DIRECTIONS, HEAD_FREQUENCY, HEAD_ORDER, HEAD_SPREAD,
    KEY_HEAD_CLUSTER, KEY_HEAD_SHARE, KEY_HEAD_UCB,
};
use pi2_model::{GgufFile, Model};

/// A converted model's clustered head, borrowed from the file (centroids packed in memory).
pub struct ClusteredHead<'m> {
    vocab: usize,
    d: usize,
    cluster: usize,
    /// Stored row `j` is vocabulary row `order[j]`.
    order: &'m [u32],
    centroids: Centroids<'m>,
    directions: Centroids<'m>,
    spread: &'m [f32],
    coef: &'m [f32],
    frequency: &'m [f32],
    share: f32,
    ucb: f32,
}

enum Centroids<'m> {
    Mapped(MatRef<'m>),
    Packed(PackedMat),
}

fn corrupt(msg: String) -> EngineError {
    EngineError::Model(pi2_model::ModelError::Corrupt(format!(
        "clustered head: {msg}"
    )))
}

fn tensor<'m>(
    f: &'m GgufFile,
    name: &str,
    want: &[u64],
) -> Result<(&'m pi2_model::TensorInfo, &'m [u8]), EngineError> {
    let t = f
        .tensor(name)
        .ok_or_else(|| corrupt(format!("`{name}` is missing")))?;
    if t.dims[..] != *want {
        return Err(corrupt(format!(
            "`{name}` is {:?}, expected {want:?}",
            t.dims
        )));
    }
    Ok((t, f.tensor_data(t)))
}

impl<'m> ClusteredHead<'m> {
    /// The head of a converted model, if it has one; `pack`: copy the centroids into the
    /// kernels' faster layout (not under a memory budget, which counts the mapped tensors).
    pub fn load(model: &'m Model, pack: bool) -> Result<Option<Self>, EngineError> {
        let f = &model.file;
        let Some(cluster) = f.get(KEY_HEAD_CLUSTER) else {
            return Ok(None);
        };
        let c = &model.config;
        let (vocab, d) = (c.n_vocab, c.n_embd);
        let cluster = cluster
            .as_u64()
            .filter(|&s| s > 0 && s % 8 == 0 && s <= vocab as u64)
            .ok_or_else(|| corrupt(format!("`{KEY_HEAD_CLUSTER}` is not a multiple of 8")))?
            as usize;
        let share = f
            .get(KEY_HEAD_SHARE)
            .and_then(|v| v.as_f64())
            .filter(|s| *s > 0.0 && *s <= 1.0)
            .ok_or_else(|| corrupt(format!("`{KEY_HEAD_SHARE}` is not a share in (0, 1]")))?
            as f32;
        let out = model.weights.output.mat(f);
        if (out.rows, out.cols) != (vocab, d) {
            return Err(corrupt(format!(
                "the output matrix is {}x{}, the model {vocab}x{d}",
                out.rows, out.cols
            )));
        }
        let clusters = vocab.div_ceil(cluster);
        let (t, order) = tensor(f, HEAD_ORDER, &[vocab as u64])?;
        if t.ggml_type != pi2_model::bundle::GGML_I32 {
            return Err(corrupt(format!("`{HEAD_ORDER}` is not I32")));
        }
        let order: &[u32] =
            bytemuck::try_cast_slice(order).map_err(|e| corrupt(format!("`{HEAD_ORDER}`: {e}")))?;
        // A permutation: every vocabulary row once.
        let mut seen = vec![false; vocab];
        for &r in order {
            match seen.get_mut(r as usize) {
                Some(s) if !*s => *s = true,
                _ => return Err(corrupt(format!("`{HEAD_ORDER}` is not a permutation"))),
            }
        }
        let rows = |name: &str| -> Result<Centroids<'m>, EngineError> {
            let (t, bytes) = tensor(f, name, &[d as u64, clusters as u64])?;
            let ty = QuantType::from_ggml_id(t.ggml_type)
                .ok_or_else(|| corrupt(format!("`{name}` has an unknown type")))?;
            let m = MatRef::new(ty, clusters, d, bytes)
                .map_err(|e| corrupt(format!("`{name}`: {e}")))?;
            Ok(match pack.then(|| PackedMat::pack(&m)).flatten() {
                Some(p) => Centroids::Packed(p),
                None => Centroids::Mapped(m),
            })
        };
        let (centroids, directions) = (rows(HEAD_CENTROIDS)?, rows(HEAD_DIRECTIONS)?);
        let f32s = |name: &str, len: usize| -> Result<&'m [f32], EngineError> {
            let (t, bytes) = tensor(f, name, &[len as u64])?;
            if t.ggml_type != QuantType::F32.ggml_id() {
                return Err(corrupt(format!("`{name}` is not F32")));
            }
            let v: &[f32] =
                bytemuck::try_cast_slice(bytes).map_err(|e| corrupt(format!("`{name}`: {e}")))?;
            match v.iter().all(|x| x.is_finite()) {
                true => Ok(v),
                false => Err(corrupt(format!(
                    "`{name}` holds a value that is not finite"
                ))),
            }
        };
        let ucb = f
            .get(KEY_HEAD_UCB)
            .and_then(|v| v.as_f64())
            .filter(|u| u.is_finite() && *u >= 0.0)
            .ok_or_else(|| corrupt(format!("`{KEY_HEAD_UCB}` is not a weight >= 0")))?
            as f32;
        Ok(Some(Self {
            vocab,
            d,
            cluster,
            order,
            centroids,
            directions,
            spread: f32s(HEAD_SPREAD, clusters)?,
            coef: f32s(HEAD_COEF, vocab)?,
            frequency: f32s(HEAD_FREQUENCY, clusters)?,
            share,
            ucb,
        }))
    }

    /// Rows per cluster.
    pub fn cluster(&self) -> usize {
        self.cluster
    }

    pub fn clusters(&self) -> usize {
        self.vocab.div_ceil(self.cluster)
    }

    /// The centroid and direction matrices every token scores.
    pub fn probes(&self) -> [MatRef<'_>; 2] {
        [Self::rows(&self.centroids), Self::rows(&self.directions)]
    }

    /// The share of rows scored exactly that the file was converted for.
    pub fn share(&self) -> f32 {
        self.share
    }

    /// Per stored cluster, the share of calibration tokens that selected it (hottest first).
    pub fn frequency(&self) -> &[f32] {
        self.frequency
    }

    /// Bytes the head holds resident beside the output matrix: centroids, directions, order,
    /// coefficients, spreads and frequencies.
    pub fn bytes(&self) -> usize {
        let rows = |c: &Centroids<'_>| match c {
            Centroids::Mapped(m) => m.bytes().len(),
            Centroids::Packed(p) => p.bytes(),
        };
        rows(&self.centroids) + rows(&self.directions) + 4 * (2 * self.vocab + 2 * self.clusters())
    }

    /// Bytes of the per-step buffers for `n` token rows.
    pub fn scratch_bytes(&self, n: usize) -> usize {
        4 * n * (2 * self.vocab + self.clusters())
    }

    fn rows<'a>(c: &'a Centroids<'_>) -> MatRef<'a> {
        match c {
            Centroids::Mapped(m) => *m,
            Centroids::Packed(p) => p.mat(),
        }
    }

    /// Clusters a token scores exactly at `share`.
    fn picks(&self, share: f32) -> usize {
        ((share as f64 * self.vocab as f64 / self.cluster as f64).ceil() as usize)
            .clamp(1, self.clusters())
    }
}

/// What the head did, summed over steps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HeadStats {
    /// Token rows whose logits went through the clustered head.
    pub steps: u64,
    /// Output rows computed exactly.
    pub rows: u64,
    /// Bytes of output rows and centroids multiplied.
    pub bytes: u64,
    /// Of the output rows, bytes read from flash.
    pub flash_bytes: u64,
    /// Steps checked against the whole matrix, those whose exact top row was scored, and the
    /// summed softmax mass of the exact logits on the scored rows.
    pub checked: u64,
    pub top1: u64,
    pub mass: f64,
}

impl HeadStats {
    /// Share of checked steps whose exact top row was scored exactly.
    pub fn top1_agreement(&self) -> Option<f64> {
        (self.checked > 0).then(|| self.top1 as f64 / self.checked as f64)
    }

    /// Mean dense softmax mass on the scored rows over the checked steps.
    pub fn mass(&self) -> Option<f64> {
        (self.checked > 0).then(|| self.mass / self.checked as f64)
    }
}

/// A head shared between engines (the runtime loads one per model), or an engine's own.
pub(crate) enum HeadRef<'m> {
    Shared(&'m ClusteredHead<'m>),
    Own(Box<ClusteredHead<'m>>),
}

impl<'m> std::ops::Deref for HeadRef<'m> {
    type Target = ClusteredHead<'m>;
    fn deref(&self) -> &ClusteredHead<'m> {
        match self {
            HeadRef::Shared(h) => h,
            HeadRef::Own(h) => h,
        }
    }
}

/// The engine's head: the clustered head if the model has one, its share, buffers and counts.
pub(crate) struct HeadState<'m> {
    head: Option<HeadRef<'m>>,
    /// Rows scored exactly; 1: every row (the dense head, through the stored order).
    share: f32,
    check: bool,
    acts: ActBuf,
    /// Per token row and cluster: the mean logit `c.h`, then the selection score; and `g.h`.
    scores: Vec<f32>,
    reach: Vec<f32>,
    /// Per token row, whether each cluster is scored.
    picked: Vec<bool>,
    ranking: Vec<u32>,
    ranges: Vec<(usize, usize)>,
    stored: Vec<f32>,
    dense: Vec<f32>,
    pub(crate) stats: HeadStats,
    /// During a pass from what is resident: the output rows in memory (the first, in stored
    /// order); only those are scored, the others get -inf.
    pub(crate) resident_rows: Option<usize>,
}

impl<'m> HeadState<'m> {
    pub(crate) fn new(head: Option<HeadRef<'m>>, share: Option<f32>, check: bool) -> Self {
        Self {
            share: share.or(head.as_ref().map(|h| h.share)).unwrap_or(1.0),
            head,
            check,
            acts: ActBuf::new(),
            scores: Vec::new(),
            reach: Vec::new(),
            picked: Vec::new(),
            ranking: Vec::new(),
            ranges: Vec::new(),
            stored: Vec::new(),
            dense: Vec::new(),
            stats: HeadStats::default(),
            resident_rows: None,
        }
    }

    /// Logits of the `n` rows of normalized states `xn` (quantized for the output matrix in
    /// `acts`) into `logits` (`n` rows of the vocabulary, in vocabulary order).
    pub(crate) fn logits(
        &mut self,
        ks: &KernelSet,
        store: &mut dyn Store,
        xn: &[f32],
        acts: &ActBuf,
        n: usize,
        logits: &mut [f32],
    ) -> Result<(), EngineError> {
        let Some(head) = self.head.take() else {
            let v = logits.len() / n;
            let r = self.resident_rows.map_or(v, |r| r.min(v));
            if r < v {
                logits.fill(f32::NEG_INFINITY);
            }
            store.output(ks, acts, n, &[(0, r)], logits)?;
            return Ok(());
        };
        let done = self.run(ks, store, &head, xn, acts, n, logits);
        self.head = Some(head);
        done
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        ks: &KernelSet,
        store: &mut dyn Store,
        h: &ClusteredHead<'_>,
        xn: &[f32],
        acts: &ActBuf,
        n: usize,
        logits: &mut [f32],
    ) -> Result<(), EngineError> {
        let v = h.vocab;
        let stored = crate::scratch::grow(&mut self.stored, n * v);
        if self.share >= 1.0 || self.resident_rows.is_some_and(|r| r < h.cluster) {
            let r = self.resident_rows.map_or(v, |r| r.min(v));
            if r < v {
                stored.fill(f32::NEG_INFINITY);
            }
            store.output(ks, acts, n, &[(0, r)], stored)?;
            for t in 0..n {
                let (src, dst) = (&stored[t * v..(t + 1) * v], &mut logits[t * v..(t + 1) * v]);
                h.order
                    .iter()
                    .zip(src)
                    .for_each(|(&r, &x)| dst[r as usize] = x);
            }
            return Ok(());
        }
        self.score_clusters(ks, h, xn, n);
        self.pick_clusters(h, n);
        let flash = store.output(ks, acts, n, &self.ranges, &mut self.stored[..n * v])?;
        for t in 0..n {
            self.scatter(h, t, &mut logits[t * v..(t + 1) * v]);
        }
        let rows: usize = self.picked.iter().filter(|&&p| p).count() * h.cluster;
        let st = &mut self.stats;
        st.steps += n as u64;
        st.rows += rows as u64;
        let probes = ClusteredHead::rows(&h.centroids).bytes().len()
            + ClusteredHead::rows(&h.directions).bytes().len();
        st.bytes += (rows * store.output_kind().1 + n * probes) as u64;
        st.flash_bytes += flash;
        if self.check {
            self.check_rows(ks, store, h, acts, n)?;
        }
        Ok(())
    }

    /// Every cluster's mean logit `c.h` into `scores` and `g.h` into `reach` (`n x clusters`).
    fn score_clusters(&mut self, ks: &KernelSet, h: &ClusteredHead<'_>, xn: &[f32], n: usize) {
        let (cm, gm) = (
            ClusteredHead::rows(&h.centroids),
            ClusteredHead::rows(&h.directions),
        );
        self.acts.quantize(cm.ty.act_kind(), &xn[..n * h.d], h.d);
        let k = h.clusters();
        let scores = crate::scratch::grow(&mut self.scores, n * k);
        let reach = crate::scratch::grow(&mut self.reach, n * k);
        pi2_kernels::matmul_many(ks, &self.acts, &mut [(cm, scores), (gm, reach)]);
    }

    /// Per token row the best clusters (ties: the lower index), and the union of all rows'
    /// clusters as merged row ranges.
    fn pick_clusters(&mut self, h: &ClusteredHead<'_>, n: usize) {
        let k = h.clusters();
        // From what is resident: the whole clusters among the first rows, best first.
        let usable = self.resident_rows.map_or(k, |r| (r / h.cluster).min(k));
        let m = h.picks(self.share).min(usable);
        self.picked.clear();
        self.picked.resize(n * k, false);
        let mut sc = Vec::with_capacity(k);
        for t in 0..n {
            let (mean, reach) = (
                &self.scores[t * k..(t + 1) * k],
                &self.reach[t * k..(t + 1) * k],
            );
            sc.clear();
            sc.extend((0..k).map(|c| mean[c] + h.ucb * h.spread[c] * reach[c].abs()));
            self.ranking.clear();
            self.ranking.extend(0..usable as u32);
            let by_score =
                |a: &u32, b: &u32| sc[*b as usize].total_cmp(&sc[*a as usize]).then(a.cmp(b));
            if m < usable {
                self.ranking.select_nth_unstable_by(m - 1, by_score);
            }
            for &c in &self.ranking[..m] {
                self.picked[t * k + c as usize] = true;
            }
        }
        self.ranges.clear();
        for c in 0..k {
            if (0..n).any(|t| self.picked[t * k + c]) {
                let (a, b) = (c * h.cluster, ((c + 1) * h.cluster).min(h.vocab));
                match self.ranges.last_mut() {
                    Some(last) if last.1 == a => last.1 = b,
                    _ => self.ranges.push((a, b)),
                }
            }
        }
    }

    /// Token row `t`'s logits in vocabulary order: exact where its clusters were scored,
    /// `c.h + a * g.h` elsewhere, kept below the best exact logit so that the top logit is
    /// always an exact one (greedy decoding never picks an estimate).
    fn scatter(&self, h: &ClusteredHead<'_>, t: usize, out: &mut [f32]) {
        let (k, v) = (h.clusters(), h.vocab);
        let stored = &self.stored[t * v..(t + 1) * v];
        let span = |c: usize| c * h.cluster..((c + 1) * h.cluster).min(v);
        let picked = &self.picked[t * k..(t + 1) * k];
        let best = (0..k)
            .filter(|&c| picked[c])
            .flat_map(|c| stored[span(c)].iter().copied())
            .fold(f32::NEG_INFINITY, f32::max);
        // Just below: an estimate equal to the best would tie with it.
        let cap = best - best.abs().max(1.0) * 1e-6;
        let (mean, reach) = (
            &self.scores[t * k..(t + 1) * k],
            &self.reach[t * k..(t + 1) * k],
        );
        for (c, &chosen) in picked.iter().enumerate() {
            let r = span(c);
            let order = &h.order[r.clone()];
            if chosen {
                order
                    .iter()
                    .zip(&stored[r])
                    .for_each(|(&i, &x)| out[i as usize] = x);
            } else {
                let (mean, reach) = (mean[c], reach[c]);
                order
                    .iter()
                    .zip(&h.coef[r])
                    .for_each(|(&i, &a)| out[i as usize] = (mean + a * reach).min(cap));
            }
        }
    }

    /// The whole matrix too, for the check: was each row's exact top scored, and what mass
    /// did the scored rows hold.
    fn check_rows(
        &mut self,
        ks: &KernelSet,
        store: &mut dyn Store,
        h: &ClusteredHead<'_>,
        acts: &ActBuf,
        n: usize,
    ) -> Result<(), EngineError> {
        let (k, v) = (h.clusters(), h.vocab);
        let dense = crate::scratch::grow(&mut self.dense, n * v);
        store.output(ks, acts, n, &[(0, v)], dense)?;
        for t in 0..n {
            let row = &dense[t * v..(t + 1) * v];
            let top = (0..v)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                .unwrap_or(0);
            let max = row[top] as f64;
            let (mut all, mut on) = (0f64, 0f64);
            for (j, &x) in row.iter().enumerate() {
                let e = (x as f64 - max).exp();
                all += e;
                if self.picked[t * k + j / h.cluster] {
                    on += e;
                }
            }
            let st = &mut self.stats;
            st.checked += 1;
            st.top1 += self.picked[t * k + top / h.cluster] as u64;
            st.mass += on / all;
        }
        Ok(())
    }
}
