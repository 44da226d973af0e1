//! What sampling through the sparse head changes: for each token of held-out text, the
//! total-variation distance between the distribution a sampler draws from over the dense
//! logits and over the sparse head's candidates (the rows it left out at `-inf`), plus how many
//! rows it would compute and how often it could not separate (`pi2 perplexity --head-tv`).
//!
//! For greedy and top-k sampling the distance is zero by the bound's guarantee (measured here
//! all the same); min-p keeps exactly the rows within its margin; temperature alone, and top-p
//! without top-k (its cut depends on the mass of every row), are where candidates can differ.

use crate::head::{candidates, HeadNeed, HeadScratch, SparseHead};
use crate::sampler::{Sampler, SamplerConfig};
use pi2_kernels::{ActBuf, ActKind, KernelSet};
use pi2_model::TokenId;

/// Sums over the tokens checked.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HeadTvStats {
    /// Tokens checked.
    pub tokens: u64,
    /// Sum and largest of the total-variation distances.
    pub tv_sum: f64,
    pub tv_max: f64,
    /// Rows the head would compute, summed (a token that cannot separate counts every row).
    pub rows: u64,
    /// Tokens whose candidates are more than the fallback share (decode computes the whole
    /// matrix for them, and its distribution is the dense one).
    pub fallbacks: u64,
}

impl HeadTvStats {
    /// Mean total-variation distance per token (of the candidates, fallbacks included).
    pub fn mean_tv(&self) -> f64 {
        self.tv_sum / self.tokens.max(1) as f64
    }
}

/// The check's state: the head, the sampler's settings, and buffers reused per token.
pub struct HeadTv<'h> {
    head: &'h SparseHead<'h>,
    need: HeadNeed,
    sampler: Sampler,
    act_kind: ActKind,
    scratch: HeadScratch,
    acts: ActBuf,
    masked: Vec<f32>,
    dense: Vec<f32>,
    p: Vec<(TokenId, f64)>,
    q: Vec<(TokenId, f64)>,
    diff: Vec<f64>,
    stats: HeadTvStats,
}

impl<'h> HeadTv<'h> {
    /// A check of `head` for sampler settings `cfg`, whose output matrix takes activations of
    /// `act_kind`; `None` when those settings make decode use the dense head (a repetition
    /// penalty).
    pub fn new(head: &'h SparseHead<'h>, cfg: &SamplerConfig, act_kind: ActKind) -> Option<Self> {
        let need = HeadNeed::for_sampler(cfg)?;
        Some(Self {
            head,
            need,
            sampler: Sampler::new(cfg.clone()),
            act_kind,
            scratch: HeadScratch::default(),
            acts: ActBuf::new(),
            masked: Vec::new(),
            dense: Vec::new(),
            p: Vec::new(),
            q: Vec::new(),
            diff: Vec::new(),
            stats: HeadTvStats::default(),
        })
    }

    /// One token: `h` its final normalized hidden state, `logits` the dense head's logits.
    pub fn add(&mut self, ks: &KernelSet, h: &[f32], logits: &[f32]) {
        let vocab = logits.len();
        self.acts.quantize(self.act_kind, h, h.len());
        let ranges = candidates(
            ks,
            self.head,
            &self.need,
            &self.acts,
            &mut self.scratch,
            logits,
        );
        let rows = ranges.map_or(vocab, |r| r.iter().map(|(a, b)| b - a).sum());
        let st = &mut self.stats;
        st.tokens += 1;
        st.rows += rows as u64;
        let Some(ranges) = ranges else {
            st.fallbacks += 1;
            return;
        };
        if rows as f32 > self.need.fallback_share * vocab as f32 {
            st.fallbacks += 1;
        }
        self.masked.clear();
        self.masked.resize(vocab, f32::NEG_INFINITY);
        for &(a, b) in ranges {
            self.masked[a..b].copy_from_slice(&logits[a..b]);
        }
        self.dense.clear();
        self.dense.extend_from_slice(logits);
        self.sampler.distribution(&mut self.dense, &mut self.p);
        self.sampler.distribution(&mut self.masked, &mut self.q);
        let tv = total_variation(&self.p, &self.q, &mut self.diff);
        st.tv_sum += tv;
        st.tv_max = st.tv_max.max(tv);
    }

    pub fn stats(&self) -> HeadTvStats {
        self.stats
    }
}

/// Half the L1 distance of two distributions given as `(token, probability)` pairs; `diff` is
/// a buffer (left zeroed).
fn total_variation(p: &[(TokenId, f64)], q: &[(TokenId, f64)], diff: &mut Vec<f64>) -> f64 {
    let top = p.iter().chain(q).map(|&(t, _)| t as usize + 1).max();
    diff.resize(top.unwrap_or(0).max(diff.len()), 0.0);
    p.iter().for_each(|&(t, v)| diff[t as usize] += v);
    q.iter().for_each(|&(t, v)| diff[t as usize] -= v);
    let mut sum = 0.0;
    for &(t, _) in p.iter().chain(q) {
        sum += diff[t as usize].abs();
        diff[t as usize] = 0.0;
    }
    sum / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_variation_of_disjoint_same_and_shifted() {
        let mut buf = Vec::new();
        let a = [(0, 0.5), (3, 0.5)];
        assert_eq!(total_variation(&a, &a, &mut buf), 0.0);
        assert_eq!(total_variation(&a, &[(1, 1.0)], &mut buf), 1.0);
        let b = [(3, 0.75), (0, 0.25)];
        assert!((total_variation(&a, &b, &mut buf) - 0.25).abs() < 1e-12);
        assert!(buf.iter().all(|&v| v == 0.0));
    }
}
