//! A recurrent layer's state after each of its last positions (Qwen3.5's delta nets), kept so
//! that a checked draft's rejected tokens can be taken back as a KV cache's are: the state
//! after position `p` is at slot `p % ring`. A checked draft's batch keeps the state after each
//! of its tokens ([`Keep::Each`]); any other batch (a prompt) its last only, so going back
//! into it re-evaluates from the start (the KV cache's answer for positions it no longer
//! holds).

use std::ops::Range;

/// Which of a batch's states are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keep {
    Last,
    /// Every one: a checked draft, whose rejected tokens are taken back.
    Each,
}

pub(crate) struct Snapshots {
    /// f32 values of one state.
    len: usize,
    states: Vec<f32>,
    ring: usize,
    /// Positions whose state is held.
    held: Range<usize>,
}

/// Most states a saved cache may hold per layer (a checked draft's batch keeps one per token).
const MAX_STATE_SLOTS: usize = 4096;

/// Slots a batch of `n` tokens keeps.
pub(crate) fn slots_for(n: usize, keep: Keep) -> usize {
    match keep {
        Keep::Each => n.max(1),
        Keep::Last => 1,
    }
}

impl Snapshots {
    pub fn new(len: usize) -> Self {
        Snapshots {
            len,
            states: Vec::new(),
            ring: 0,
            held: 0..0,
        }
    }

    /// Loads the state after position `pos0 - 1` into `work` (zeros at position 0) and makes
    /// room for a batch of `n` positions from `pos0`. The caller keeps the cache's promise:
    /// `pos0 - 1` is held (truncating checks it).
    pub fn begin(&mut self, pos0: usize, n: usize, keep: Keep, work: &mut Vec<f32>) {
        work.clear();
        work.resize(self.len, 0.0);
        if pos0 > 0 {
            debug_assert!(
                self.held.contains(&(pos0 - 1)),
                "state of {} held",
                pos0 - 1
            );
            let at = (pos0 - 1) % self.ring * self.len;
            work.copy_from_slice(&self.states[at..at + self.len]);
        }
        let need = slots_for(n, keep);
        if need > self.ring {
            // Wider: what is kept is the state just loaded.
            self.states = vec![0.0; need * self.len];
            self.ring = need;
            self.held = pos0..pos0;
            if pos0 > 0 {
                self.held.start = pos0 - 1;
                let at = (pos0 - 1) % self.ring * self.len;
                self.states[at..at + self.len].copy_from_slice(work);
            }
        }
        self.held.end = pos0;
    }

    /// Whether the state after token `t` of a batch of `n` is kept.
    pub fn keeps(&self, t: usize, n: usize) -> bool {
        t + self.ring >= n
    }

    /// Keeps `state` as the state after position `p`.
    pub fn keep(&mut self, p: usize, state: &[f32]) {
        let at = p % self.ring * self.len;
        self.states[at..at + self.len].copy_from_slice(state);
    }

    /// After a batch of `n` from `pos0`: its last states are held, with what the ring still
    /// holds before it.
    pub fn end(&mut self, pos0: usize, n: usize) {
        self.held = self.held.start.max((pos0 + n).saturating_sub(self.ring))..pos0 + n;
    }

    /// Whether the first `n` positions can be kept (the state after `n - 1` is held).
    pub fn can_keep(&self, n: usize) -> bool {
        n == 0 || self.held.contains(&(n - 1))
    }

    /// Keeps the first `n` positions (checked with [`Snapshots::can_keep`]; 0 empties).
    pub fn truncate(&mut self, n: usize) {
        match n {
            0 => self.held = 0..0,
            _ => self.held.end = self.held.end.min(n),
        }
    }

    pub fn bytes(&self) -> usize {
        self.states.capacity() * 4
    }

    /// f32 values of one state.
    pub fn state_len(&self) -> usize {
        self.len
    }

    /// Writes the states held and which positions they are.
    pub fn write(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        use crate::kv::put;
        for v in [self.ring, self.held.start, self.held.end] {
            put(w, v)?;
        }
        w.write_all(bytemuck::cast_slice(&self.states[..self.ring * self.len]))
    }

    /// States of `len` values each, as [`Snapshots::write`] wrote them.
    pub fn read(len: usize, r: &mut dyn std::io::Read) -> Result<Snapshots, String> {
        use crate::kv::{get, get_bytes};
        let (ring, start, end) = (get(r)?, get(r)?, get(r)?);
        // A batch keeps at most one state per token of its largest batch.
        if ring > MAX_STATE_SLOTS || start > end || end - start > ring {
            return Err(format!("{ring} states holding positions {start}..{end}"));
        }
        let bytes = get_bytes(r, 4 * ring * len, 4 * MAX_STATE_SLOTS * len, "states")?;
        let states = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Snapshots {
            len,
            states,
            ring,
            held: start..end,
        })
    }

    /// Bytes held once a batch of `n` ran.
    pub fn bytes_after(&self, n: usize, keep: Keep) -> usize {
        self.ring.max(slots_for(n, keep)) * self.len * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state that is just its position's number, run through batches.
    fn run(s: &mut Snapshots, pos0: usize, n: usize) -> Vec<f32> {
        let mut work = Vec::new();
        let keep = if n <= 8 { Keep::Each } else { Keep::Last };
        s.begin(pos0, n, keep, &mut work);
        let first = work.clone();
        for t in 0..n {
            work.iter_mut().for_each(|v| *v = (pos0 + t) as f32);
            if s.keeps(t, n) {
                s.keep(pos0 + t, &work);
            }
        }
        s.end(pos0, n);
        first
    }

    #[test]
    fn a_draft_batch_can_be_taken_back_to_any_of_its_positions() {
        let mut s = Snapshots::new(2);
        assert_eq!(run(&mut s, 0, 40), [0.0, 0.0], "starts from zeros");
        assert!(!s.can_keep(20), "a prompt keeps its last state only");
        assert!(s.can_keep(40));
        assert_eq!(run(&mut s, 40, 1), [39.0, 39.0]);
        assert_eq!(run(&mut s, 41, 5), [40.0, 40.0]);
        // A checked draft keeps at least its first token (the sampled one): its five states
        // are held, the one before it is not.
        for keep in 42..=46 {
            assert!(s.can_keep(keep), "{keep}");
        }
        assert!(!s.can_keep(41));
        s.truncate(43);
        assert_eq!(
            run(&mut s, 43, 1),
            [42.0, 42.0],
            "resumes after the kept tokens"
        );
        assert_eq!(s.bytes(), 5 * 2 * 4);
        assert!(!s.can_keep(38));
    }
}
