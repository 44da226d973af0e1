//! Drafts for speculative decoding: guesses of the next tokens that one forward pass over
//! them all then checks (see [`crate::generate`]). Under a memory budget a pass reads each
//! needed weight once for every token in it, so each accepted guess saves most of a step.
//!
//! Drafts are deterministic (the same history gives the same guess), which is what makes
//! checking them exact: sampling the target's own distribution at each drafted position and
//! keeping the guess only where the sample equals it gives tokens distributed exactly as plain
//! decode (and, greedy, the same tokens).

use crate::{Decoder, EngineError};
use pi2_model::TokenId;

/// A source of drafts.
pub trait Drafter {
    /// Up to `max` tokens guessed to follow `history` (the prompt and the generated tokens);
    /// fewer or none when it has no guess.
    fn propose(&mut self, history: &[TokenId], max: usize) -> Vec<TokenId>;

    /// [`Drafter::propose`] with the target's engine at hand, whose KV cache holds `history`
    /// but its last token. A drafter that runs the target itself ([`SelfDraft`]) leaves the
    /// engine's cache as it found it.
    fn propose_on(
        &mut self,
        _engine: &mut dyn Decoder<'_>,
        history: &[TokenId],
        max: usize,
    ) -> Result<Vec<TokenId>, EngineError> {
        Ok(self.propose(history, max))
    }
}

/// Drafts from the target model restricted to what a memory budget keeps resident (pinned and
/// cached neurons, resident output clusters; [`crate::Engine::forward_resident`]): greedy tokens from
/// passes that read nothing from flash, checked by the whole model in one pass. Its KV cache
/// is the target's own, cut back after drafting.
#[derive(Clone, Copy, Debug, Default)]
pub struct SelfDraft;

impl Drafter for SelfDraft {
    fn propose(&mut self, _history: &[TokenId], _max: usize) -> Vec<TokenId> {
        Vec::new()
    }

    fn propose_on(
        &mut self,
        engine: &mut dyn Decoder<'_>,
        history: &[TokenId],
        max: usize,
    ) -> Result<Vec<TokenId>, EngineError> {
        let Some(&last) = history.last() else {
            return Ok(Vec::new());
        };
        let recurrent = (0..engine.model().config.n_layer).any(|li| {
            matches!(
                engine.model().config.mixer(li),
                pi2_model::Mixer::DeltaNet(_)
            )
        });
        if recurrent {
            return Err(EngineError::Drafts(
                "self-drafts are cut back one token at a time, which a recurrent layer's state (Qwen3.5's delta nets) cannot be: use --draft lookup or --draft-model".into(),
            ));
        }
        let base = engine.n_past();
        let room = engine.n_ctx().saturating_sub(base + 1);
        let mut out = Vec::with_capacity(max);
        let mut token = last;
        let drafted = (|| {
            for _ in 0..max.min(room) {
                let logits = engine.forward_resident(token)?;
                let best = (0..logits.len())
                    .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)));
                match best.filter(|&t| logits[t].is_finite()) {
                    Some(t) => token = t as TokenId,
                    None => break,
                }
                out.push(token);
            }
            Ok::<_, EngineError>(())
        })();
        if engine.truncate(base) != base {
            return Err(EngineError::Drafts(format!(
                "the cache could not be cut back to position {base} after self-drafting"
            )));
        }
        drafted.map(|()| out)
    }
}

/// Prompt lookup (llama.cpp's `lookup` decoding): the longest recent n-gram ending the history
/// that occurred before, and the tokens that followed it then. Editing answers repeat most of
/// their prompt, so their drafts are often long and right.
#[derive(Clone, Debug)]
pub struct Lookup {
    /// Longest and shortest n-gram matched (longest first).
    pub ngram_max: usize,
    pub ngram_min: usize,
}

impl Default for Lookup {
    fn default() -> Self {
        Self {
            ngram_max: 4,
            ngram_min: 1,
        }
    }
}

impl Drafter for Lookup {
    fn propose(&mut self, history: &[TokenId], max: usize) -> Vec<TokenId> {
        let n = history.len();
        for g in (self.ngram_min.max(1)..=self.ngram_max).rev() {
            if g >= n {
                continue;
            }
            let tail = &history[n - g..];
            // The most recent earlier occurrence, whose continuation is known.
            let found = (0..n - g).rev().find(|&s| &history[s..s + g] == tail);
            if let Some(s) = found {
                let from = s + g;
                let take = max.min(n - from);
                if take > 0 {
                    return history[from..from + take].to_vec();
                }
            }
        }
        Vec::new()
    }
}

/// How long drafts may be, and how the length follows acceptance.
#[derive(Clone, Copy, Debug)]
pub struct DraftConfig {
    /// Most tokens drafted per step (llama.cpp's `--draft-max`).
    pub max: usize,
    /// A draft shorter than this is not checked; the step decodes one token (`--draft-min`).
    pub min: usize,
}

/// Most tokens a draft may hold.
pub const MAX_DRAFT: usize = 64;

impl DraftConfig {
    /// Drafts of `min..=max` tokens, refused (naming llama.cpp's options) unless
    /// `1 <= min <= max <= MAX_DRAFT`.
    pub fn checked(max: usize, min: usize) -> Result<Self, crate::EngineError> {
        let bad = |msg: String| Err(crate::EngineError::Drafts(msg));
        if !(1..=MAX_DRAFT).contains(&max) {
            return bad(format!("--draft-max {max} is outside 1..{MAX_DRAFT}"));
        }
        if !(1..=max).contains(&min) {
            return bad(format!(
                "--draft-min {min} must be between 1 and --draft-max ({max})"
            ));
        }
        Ok(Self { max, min })
    }
}

impl Default for DraftConfig {
    fn default() -> Self {
        Self { max: 16, min: 1 }
    }
}

/// The draft length as acceptance goes: doubled after a draft accepted whole, halved after a
/// miss (never below one past what was kept), always within `min..=max`. A checked pass costs
/// about the same for any length when reads dominate, so lengths shrink slowly.
#[derive(Clone, Debug)]
pub struct DraftLength {
    cfg: DraftConfig,
    now: usize,
}

impl DraftLength {
    pub fn new(cfg: DraftConfig) -> Self {
        Self {
            cfg,
            now: cfg.max.clamp(1, 4),
        }
    }

    pub fn get(&self) -> usize {
        self.now
    }

    /// After a check of `drafted` tokens of which `accepted` were kept.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        self.now = if accepted == drafted {
            (self.now * 2).min(self.cfg.max)
        } else {
            (self.now / 2)
                .max(accepted + 1)
                .clamp(self.cfg.min.max(1), self.cfg.max.max(1))
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_the_latest_matching_ngram() {
        let mut l = Lookup::default();
        // "a b c d | x a b c" -> after "a b c" came "d x a b c".
        let h = [1, 2, 3, 4, 9, 1, 2, 3];
        assert_eq!(l.propose(&h, 3), vec![4, 9, 1]);
        assert_eq!(l.propose(&h, 10), vec![4, 9, 1, 2, 3]);
        // Nothing repeats: no draft.
        assert!(l.propose(&[1, 2, 3, 4], 4).is_empty());
        // The most recent occurrence wins.
        let h = [7, 1, 7, 2, 7];
        assert_eq!(l.propose(&h, 1), vec![2]);
    }

    #[test]
    fn draft_length_follows_acceptance() {
        let mut d = DraftLength::new(DraftConfig { max: 16, min: 2 });
        assert_eq!(d.get(), 4);
        d.update(4, 4);
        assert_eq!(d.get(), 8);
        d.update(8, 8);
        d.update(16, 16);
        assert_eq!(d.get(), 16);
        d.update(16, 0);
        assert_eq!(d.get(), 8);
        d.update(8, 6);
        assert_eq!(d.get(), 7);
        d.update(7, 0);
        d.update(3, 0);
        d.update(2, 0);
        assert_eq!(d.get(), 2);
    }
}
