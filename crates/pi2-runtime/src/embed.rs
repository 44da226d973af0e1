//! Embeddings: a text's final normalized hidden states pooled into one vector (llama.cpp's
//! rules: mean of the tokens by default, or the first or last token's), L2-normalized so a dot
//! product is the cosine similarity.

use crate::error::{Result, RuntimeError};
use pi2_engine::{Engine, Logits};
use pi2_model::TokenId;
use pi2_sparse::FfnObserver;

/// How token states become one vector (llama.cpp's `--pooling`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the tokens.
    #[default]
    Mean,
    /// The first token's state (BERT's `[CLS]`).
    Cls,
    /// The last token's state (what a causal model has read the whole text by).
    Last,
}

impl std::str::FromStr for Pooling {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            other => Err(RuntimeError::option(
                "pooling",
                format!("`{other}` is not one of mean, cls, last"),
            )),
        }
    }
}

/// Sums (or keeps the first or last of) the final states it is shown.
struct Pool {
    pooling: Pooling,
    d: usize,
    acc: Vec<f32>,
    seen: usize,
}

impl FfnObserver for Pool {
    fn observe(&mut self, _layer: usize, _x: &[f32], _gate: &[f32]) {}

    fn observe_head(&mut self, h: &[f32]) {
        for row in h.chunks_exact(self.d) {
            match self.pooling {
                Pooling::Mean => self.acc.iter_mut().zip(row).for_each(|(a, x)| *a += x),
                Pooling::Cls if self.seen == 0 => self.acc.copy_from_slice(row),
                Pooling::Cls => {}
                Pooling::Last => self.acc.copy_from_slice(row),
            }
            self.seen += 1;
        }
    }
}

/// The embedding of `tokens`: evaluated from an empty cache in batches of `n_batch` (the
/// cache is left empty after), pooled, L2-normalized.
pub fn embed(
    engine: &mut Engine<'_>,
    tokens: &[TokenId],
    n_batch: usize,
    pooling: Pooling,
) -> Result<Vec<f32>> {
    if tokens.is_empty() {
        return Err(RuntimeError::option(
            "input",
            "has no tokens: give some text",
        ));
    }
    if tokens.len() > engine.n_ctx() {
        return Err(RuntimeError::option(
            "input",
            format!(
                "is {} tokens, longer than the context of {} (raise the context size or split the text)",
                tokens.len(),
                engine.n_ctx()
            ),
        ));
    }
    let d = engine.model().config.n_embd;
    let mut pool = Pool {
        pooling,
        d,
        acc: vec![0.0; d],
        seen: 0,
    };
    engine.truncate(0);
    let mut result = Ok(());
    for part in tokens.chunks(n_batch.max(1)) {
        if let Err(e) = engine.forward_observed(part, Logits::Last, Some(&mut pool)) {
            result = Err(e);
            break;
        }
    }
    engine.truncate(0);
    result?;
    if pooling == Pooling::Mean {
        let n = pool.seen.max(1) as f32;
        pool.acc.iter_mut().for_each(|a| *a /= n);
    }
    let norm = pool.acc.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        pool.acc.iter_mut().for_each(|a| *a /= norm);
    }
    Ok(pool.acc)
}
