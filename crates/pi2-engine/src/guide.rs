//! What the sampler can be asked besides drawing: to keep to a grammar (a [`TokenConstraint`]
//! masks the tokens it forbids before each draw) and to report each drawn token's log
//! probability with the most likely alternatives ([`TokenLogprob`], OpenAI's `logprobs`).

use pi2_model::TokenId;

/// Restricts which tokens may come next, such as a JSON schema or a grammar. The sampler asks it
/// before every draw of a generated token and tells it every token taken; prompt tokens never
/// reach it.
pub trait TokenConstraint: Send {
    /// Sets the logits of the tokens that may not come next to negative infinity. An error
    /// (the grammar is broken or allows nothing here) ends the generation with it.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// Takes `token` as the next generated token.
    fn commit(&mut self, token: TokenId) -> Result<(), String>;
    /// Nothing may follow what was taken: the generation is complete.
    fn finished(&self) -> bool;
}

/// A drawn token's log probability under the model (the raw logits' softmax, before biases,
/// penalties, masks and temperature: what the model thinks, not what the sampler kept), and
/// the most likely tokens with theirs, most likely first.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: TokenId,
    pub logprob: f32,
    pub top: Vec<(TokenId, f32)>,
}

/// The log-sum-exp of `logits` and its `n` largest entries (lowest id first on ties).
pub(crate) fn top_logprobs(logits: &[f32], n: usize) -> (f32, Vec<(TokenId, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    let mut top: Vec<(TokenId, f32)> = Vec::with_capacity(n + 1);
    for (i, &l) in logits.iter().enumerate() {
        if top.len() == n && top.last().is_some_and(|&(_, worst)| l <= worst) {
            continue;
        }
        let at = top.partition_point(|&(_, v)| v >= l);
        top.insert(at, (i as TokenId, l));
        top.truncate(n);
    }
    for e in &mut top {
        e.1 -= lse;
    }
    (lse, top)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_logprobs_are_the_softmax_logs_of_the_largest() {
        let logits = [1.0f32, 3.0, 3.0, -2.0, 0.5];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let (lse, top) = top_logprobs(&logits, 3);
        assert!((lse as f64 - z.ln()).abs() < 1e-5);
        let ids: Vec<_> = top.iter().map(|e| e.0).collect();
        assert_eq!(ids, [1, 2, 0]);
        for (id, lp) in top {
            let want = (logits[id as usize] as f64).exp() / z;
            assert!((lp as f64 - want.ln()).abs() < 1e-5);
        }
        assert!(top_logprobs(&logits, 0).1.is_empty());
        assert_eq!(top_logprobs(&logits, 9).1.len(), 5);
    }
}
