//! Perplexity with llama-perplexity's method: split the tokens into `n_ctx` chunks, evaluate each
//! from an empty cache, score the second half of each chunk (position j predicts token j+1).

use crate::engine::{Engine, Logits};
use crate::EngineError;
use pi2_model::TokenId;

/// Running result after one chunk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerplexityStep {
    /// Chunks done so far.
    pub chunk: usize,
    /// Perplexity over every token scored so far.
    pub ppl: f64,
    /// Its standard error (llama-perplexity's estimate).
    pub stderr: f64,
}

/// Settings for [`perplexity`].
#[derive(Clone, Copy, Debug)]
pub struct PerplexityConfig {
    pub n_ctx: usize,
    /// Tokens evaluated per forward call (<= n_ctx).
    pub n_batch: usize,
    /// Stop after this many chunks (None = all).
    pub max_chunks: Option<usize>,
    /// Replace each chunk's first token by this (llama.cpp does so when the model adds BOS).
    pub bos: Option<TokenId>,
}

#[derive(Default)]
struct Accumulator {
    nll: f64,
    nll2: f64,
    count: usize,
}

impl Accumulator {
    fn add(&mut self, nll: f64) {
        self.nll += nll;
        self.nll2 += nll * nll;
        self.count += 1;
    }

    fn estimate(&self) -> (f64, f64) {
        let mean = self.nll / self.count as f64;
        let ppl = mean.exp();
        let var = self.nll2 / self.count as f64 - mean * mean;
        let stderr = if var > 0.0 && self.count > 1 {
            (var / (self.count - 1) as f64).sqrt() * ppl
        } else {
            0.0
        };
        (ppl, stderr)
    }
}

/// `-log softmax(logits)[target]`, in f64.
pub fn nll(logits: &[f32], target: TokenId) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    sum.ln() + max - logits[target as usize] as f64
}

/// Number of chunks `perplexity` will evaluate.
pub fn n_chunks(n_tokens: usize, cfg: &PerplexityConfig) -> usize {
    let all = n_tokens / cfg.n_ctx;
    cfg.max_chunks.map_or(all, |m| m.min(all))
}

/// Evaluate `tokens`; `on_chunk` sees the running estimate after each chunk.
pub fn perplexity(
    engine: &mut Engine<'_>,
    tokens: &[TokenId],
    cfg: &PerplexityConfig,
    mut on_chunk: impl FnMut(PerplexityStep),
) -> Result<Vec<PerplexityStep>, EngineError> {
    let n_ctx = cfg.n_ctx;
    let n_batch = cfg.n_batch.clamp(1, n_ctx);
    let first = n_ctx / 2;
    let n_vocab = engine.model().config.n_vocab;
    let mut acc = Accumulator::default();
    let mut steps = Vec::new();
    let mut chunk_tokens = vec![0; n_ctx];
    for c in 0..n_chunks(tokens.len(), cfg) {
        chunk_tokens.copy_from_slice(&tokens[c * n_ctx..(c + 1) * n_ctx]);
        if let Some(bos) = cfg.bos {
            chunk_tokens[0] = bos;
        }
        engine.truncate(0);
        let mut start = 0;
        while start < n_ctx {
            let end = (start + n_batch).min(n_ctx);
            let want = if end > first {
                Logits::From(first.saturating_sub(start))
            } else {
                Logits::Last
            };
            let logits = engine.forward(&chunk_tokens[start..end], want)?;
            if end > first {
                let from = first.max(start);
                for (row, j) in (from..end).enumerate() {
                    if j + 1 < n_ctx {
                        let l = &logits[row * n_vocab..(row + 1) * n_vocab];
                        acc.add(nll(l, chunk_tokens[j + 1]));
                    }
                }
            }
            start = end;
        }
        let (ppl, stderr) = acc.estimate();
        let step = PerplexityStep {
            chunk: c + 1,
            ppl,
            stderr,
        };
        on_chunk(step);
        steps.push(step);
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_of_uniform_is_log_n() {
        assert!((nll(&[0.0; 4], 2) - 4f64.ln()).abs() < 1e-12);
        assert!(nll(&[100.0, 0.0], 0) < 1e-12);
    }

    #[test]
    fn estimate_matches_formula() {
        let mut a = Accumulator::default();
        for x in [1.0, 2.0, 3.0] {
            a.add(x);
        }
        let (ppl, se) = a.estimate();
        assert!((ppl - 2f64.exp()).abs() < 1e-12);
        // var = 14/3 - 4 = 2/3; se = sqrt(2/3 / 2) * e^2
        assert!((se - (1.0f64 / 3.0).sqrt() * 2f64.exp()).abs() < 1e-12);
    }
}
