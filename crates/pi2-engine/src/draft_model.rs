//! Drafts from a second, smaller model with the same vocabulary (llama.cpp's `--model-draft`):
//! its own engine and KV cache, greedy continuations. Greedy drafts are deterministic, so the
//! check in [`crate::generate_drafted`] keeps the output exactly as plain decode makes it.

use crate::draft::Drafter;
use crate::engine::{Engine, Logits};
use crate::sampler::argmax;
use crate::EngineError;
use pi2_model::{Model, TokenId};

/// A draft model's engine and the tokens its KV cache holds. Each proposal evaluates only what
/// the history adds to what the cache shares with it (the accepted tokens and the next one).
pub struct ModelDraft<'m> {
    engine: Engine<'m>,
    cached: Vec<TokenId>,
    n_batch: usize,
    /// Proposals the draft engine could not make (each one a plain decode step instead).
    pub failures: usize,
}

impl<'m> ModelDraft<'m> {
    /// Drafts with `engine` (its context at least the target's), evaluating a history in
    /// batches of `n_batch`.
    pub fn new(engine: Engine<'m>, n_batch: usize) -> Self {
        Self {
            engine,
            cached: Vec::new(),
            n_batch: n_batch.max(1),
            failures: 0,
        }
    }

    fn try_propose(
        &mut self,
        history: &[TokenId],
        max: usize,
    ) -> Result<Vec<TokenId>, EngineError> {
        // Room for the history and the drafted tokens fed back (the last one is not).
        let max = max.min((self.engine.n_ctx() + 1).saturating_sub(history.len()));
        if max == 0 || history.is_empty() {
            return Ok(Vec::new());
        }
        let common = self
            .cached
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len() - 1);
        let kept = self.engine.truncate(common);
        self.cached.truncate(kept);
        let mut logits = Vec::new();
        for part in history[kept..].chunks(self.n_batch) {
            logits.clear();
            logits.extend_from_slice(self.engine.forward(part, Logits::Last)?);
            self.cached.extend_from_slice(part);
        }
        let mut out = Vec::with_capacity(max);
        loop {
            let t = argmax(&logits);
            out.push(t);
            if out.len() == max {
                return Ok(out);
            }
            logits.copy_from_slice(self.engine.forward(&[t], Logits::Last)?);
            self.cached.push(t);
        }
    }
}

impl Drafter for ModelDraft<'_> {
    fn propose(&mut self, history: &[TokenId], max: usize) -> Vec<TokenId> {
        match self.try_propose(history, max) {
            Ok(d) => d,
            Err(_) => {
                // The cache may hold half a batch: start afresh next time.
                self.engine.truncate(0);
                self.cached.clear();
                self.failures += 1;
                Vec::new()
            }
        }
    }
}

/// Why `draft` cannot draft for `target` (`None`: it can): a draft is checked token id by token
/// id, so both must give every id the same text.
pub fn vocabulary_mismatch(target: &Model, draft: &Model) -> Option<String> {
    let (t, d) = (&target.tokenizer, &draft.tokenizer);
    if t.vocab_size() != d.vocab_size() || target.config.n_vocab != draft.config.n_vocab {
        return Some(format!(
            "the draft model has {} tokens, the model {}: a draft model needs the same vocabulary",
            d.vocab_size(),
            t.vocab_size()
        ));
    }
    (0..t.vocab_size() as TokenId)
        .find(|&i| t.token_text(i) != d.token_text(i))
        .map(|i| {
            format!(
                "token {i} is {:?} in the model but {:?} in the draft model: a draft model needs the same vocabulary",
                t.token_text(i).unwrap_or(""),
                d.token_text(i).unwrap_or("")
            )
        })
}
