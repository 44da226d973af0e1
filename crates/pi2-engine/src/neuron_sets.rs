//! Neuron sets per sequence (GRIFFIN, arXiv 2404.01365): the prompt, whose FFN computes every
//! neuron anyway, says which neurons this text uses; decode then computes (and reads) only
//! neurons of the set, the per-token threshold still applying inside it.
//!
//! A neuron's score is GRIFFIN's: over the prompt's tokens, the root of the summed squares of
//! its coefficient normalised by the token's coefficient norm (so every token weighs the same);
//! each layer's set is its `share` of neurons with the highest scores.

/// One sequence's scores and sets, layer by layer.
#[derive(Clone, Debug)]
pub struct NeuronSets {
    share: f32,
    /// Per layer and neuron (the file's order), the summed squared normalised coefficient.
    score: Vec<Vec<f32>>,
    /// Per layer and neuron: in the set. Empty until a prompt was scored.
    member: Vec<Vec<bool>>,
    /// Prompt tokens scored since the sets were last chosen.
    pending: usize,
    scratch: Vec<u32>,
}

impl NeuronSets {
    /// Sets of `share` (0..=1) of each layer's `n_ff` neurons.
    pub fn new(share: f32, n_layer: usize, n_ff: usize) -> Self {
        Self {
            share: share.clamp(0.0, 1.0),
            score: vec![vec![0.0; n_ff]; n_layer],
            member: Vec::new(),
            pending: 0,
            scratch: Vec::new(),
        }
    }

    /// Share of each layer's neurons a set holds.
    pub fn share(&self) -> f32 {
        self.share
    }

    /// Forgets the sequence: no set until the next prompt.
    pub fn clear(&mut self) {
        self.score.iter_mut().for_each(|s| s.fill(0.0));
        self.member.clear();
        self.pending = 0;
    }

    /// Adds the coefficients of `n` prompt tokens of layer `li` (`n` rows of `n_ff`).
    pub fn observe(&mut self, li: usize, coeff: &[f32], n: usize) {
        let Some(score) = self.score.get_mut(li) else {
            return;
        };
        let ff = score.len();
        for row in coeff.chunks_exact(ff).take(n) {
            let norm2: f32 = row.iter().map(|c| c * c).sum();
            if norm2 > 0.0 && norm2.is_finite() {
                let inv = 1.0 / norm2;
                score
                    .iter_mut()
                    .zip(row)
                    .for_each(|(s, c)| *s += c * c * inv);
            }
        }
        if li == 0 {
            self.pending += n;
        }
    }

    /// Chooses each layer's set from the scores so far (after a prompt pass).
    pub fn choose(&mut self) {
        if self.pending == 0 {
            return;
        }
        self.pending = 0;
        let n_layer = self.score.len();
        self.member.resize_with(n_layer, Vec::new);
        for (score, member) in self.score.iter().zip(&mut self.member) {
            let ff = score.len();
            let keep = ((self.share * ff as f32).round() as usize).min(ff);
            let order = &mut self.scratch;
            order.clear();
            order.extend(0..ff as u32);
            // Highest score first; ties by index so the set does not depend on the sort.
            order.sort_unstable_by(|&a, &b| {
                score[b as usize]
                    .total_cmp(&score[a as usize])
                    .then(a.cmp(&b))
            });
            member.clear();
            member.resize(ff, false);
            order[..keep]
                .iter()
                .for_each(|&i| member[i as usize] = true);
            if std::env::var_os("PI2_SETS_STATIC").is_some() {
                member
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, m)| *m = i < keep);
            }
        }
    }

    /// Layer `li`'s set, once chosen.
    pub fn layer(&self, li: usize) -> Option<&[bool]> {
        self.member.get(li).map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_holds_the_neurons_the_prompt_used_most() {
        let mut s = NeuronSets::new(0.5, 1, 4);
        assert!(s.layer(0).is_none());
        // Neuron 2 and 0 carry the tokens' coefficients; 1 and 3 almost nothing.
        s.observe(0, &[1.0, 0.01, 3.0, 0.0, 2.0, 0.0, 1.0, 0.02], 2);
        s.choose();
        assert_eq!(s.layer(0).unwrap(), &[true, false, true, false]);
        s.clear();
        assert!(s.layer(0).is_none());
    }

    #[test]
    fn every_token_weighs_the_same() {
        let mut s = NeuronSets::new(0.25, 1, 4);
        // A loud token on neuron 0, three quiet ones on neuron 1.
        s.observe(0, &[100.0, 0.0, 0.0, 0.0], 1);
        s.observe(0, &[0.0, 0.1, 0.0, 0.0].repeat(3), 3);
        s.choose();
        assert_eq!(s.layer(0).unwrap(), &[false, true, false, false]);
    }
}
