//! One budget whose regions move: the KV cache is charged as positions are written, and the
//! neuron memory gives room back as it grows. Growth comes from the budget's slack first, then
//! from the LRU cache above its least (slots given back, their pages released), then from
//! pinned rows, the least valuable first (up and down rows of the least frequently firing
//! pinned neurons, then gate rows, which save a read every token). When nothing is left to
//! give, the step fails with an error that says how far the context got and what to change.

use super::Offload;
use crate::EngineError;
use pi2_cache::{Lru, Region, SlotCache};

impl Offload {
    /// Bytes of the KV cache charged so far.
    pub fn kv_charged(&self) -> u64 {
        self.kv_charged
    }

    /// Charge the engine's KV cache at `kv` bytes before positions up to `positions` are
    /// written (it only grows; a smaller figure changes nothing).
    pub(crate) fn charge_kv(&mut self, kv: u64, positions: usize) -> Result<(), EngineError> {
        if kv <= self.kv_charged {
            return Ok(());
        }
        let mut need = kv - self.kv_charged;
        need -= self.take_slack(need);
        if need == 0 {
            return Ok(());
        }
        // Nothing may be landing in a slot or a pinned block given back.
        self.wait_until(|o| o.reader.outstanding() == 0)?;
        // LRU slots above the least, a few at a time until whole pages come free.
        let per_slot = SlotCache::<Lru>::bytes_for(self.cache.slot_bytes(), 1, 0);
        while need > 0 && self.cache.n_slots() > self.least_slots {
            let spare = (self.cache.n_slots() - self.least_slots) as u64;
            let give = need.div_ceil(per_slot).clamp(1, spare) as usize;
            let freed = self.cache.set_limit(self.cache.n_slots() - give);
            self.budget.release(Region::Cold, freed);
            need -= self.take_slack(need);
        }
        if need > 0 {
            let freed = self.unpin(need);
            self.budget.release(Region::Hot, freed);
            need -= self.take_slack(need);
        }
        if need > 0 {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            return Err(EngineError::MemoryFull(format!(
                "the context has reached {positions} tokens, whose KV cache ({:.1} MiB) no longer \
                 fits the memory budget of {:.1} MiB beside the least neuron cache: raise \
                 --mem-budget (by about {:.1} MiB per 1000 tokens more) or start a new conversation",
                mib(kv),
                mib(self.budget.limit()),
                mib(kv) * 1000.0 / positions.max(1) as f64,
            )));
        }
        Ok(())
    }

    /// Reserves up to `need` bytes of the budget's slack for the KV cache; returns them.
    fn take_slack(&mut self, need: u64) -> u64 {
        let got = need.min(self.budget.left());
        self.budget
            .reserve(Region::Fixed, got, "the KV cache")
            .expect("within what is left");
        self.kv_charged += got;
        got
    }

    /// Unpins rows, least valuable first, until their pages give back at least `need` bytes
    /// (or nothing is pinned); returns the bytes of memory given back.
    fn unpin(&mut self, need: u64) -> u64 {
        let before: Vec<u64> = (0..self.hot.len())
            .map(|u| self.unpinned_pages(u))
            .collect();
        let mut now = before.clone();
        let mut freed = 0;
        while freed < need {
            // Up and down rows of the least frequently firing pinned neuron; then gate rows,
            // from the unit with the most.
            let pair = (0..self.hot.len())
                .filter(|&u| self.hot[u].n > 0)
                .min_by(|&a, &b| self.pinned_value(a).total_cmp(&self.pinned_value(b)));
            let gate = || {
                (0..self.hot.len())
                    .filter(|&u| self.hot[u].n_gate > 0)
                    .max_by_key(|&u| self.hot[u].n_gate)
            };
            let u = match (pair, gate()) {
                (Some(u), _) => {
                    self.hot[u].n -= 1;
                    u
                }
                (None, Some(u)) => {
                    self.hot[u].n_gate -= 1;
                    u
                }
                (None, None) => break,
            };
            let pages = self.unpinned_pages(u);
            freed += pages - now[u];
            now[u] = pages;
        }
        for u in 0..self.hot.len() {
            if now[u] == before[u] {
                continue;
            }
            for (at, len) in self.unpinned_spans(u) {
                // SAFETY: inside this unit's pinned block, past the rows still pinned: nothing
                // reads them (residency now sends those neurons to the cache) and no read is
                // in flight (the caller waited).
                unsafe { pi2_cache::release_pages(self.hot[u].buf.as_mut_ptr().add(at), len) };
            }
        }
        freed
    }

    /// Unit `u`'s pinned block past the rows still pinned, per section (gate, up, down): the
    /// spans from the last pinned row to the section's end, as (offset, length).
    fn unpinned_spans(&self, u: usize) -> [(usize, usize); 3] {
        let (l, h) = (&self.layers[u], &self.hot[u]);
        let ends = [h.up_at, h.down_at, h.buf.len()];
        let kept = [
            h.n_gate * l.gate.row_bytes,
            h.up_at + h.n * l.up.row_bytes,
            h.down_at + h.n * l.down.row_bytes,
        ];
        std::array::from_fn(|k| (kept[k], ends[k].saturating_sub(kept[k])))
    }

    /// Bytes of whole pages in unit `u`'s unpinned spans (given back by [`Offload::unpin`]).
    fn unpinned_pages(&self, u: usize) -> u64 {
        let base = self.hot[u].buf.as_ptr() as usize;
        self.unpinned_spans(u)
            .iter()
            .map(|&(at, len)| pi2_cache::releasable_bytes(base + at, len))
            .sum()
    }

    /// How often unit `u`'s last pinned whole neuron fires (lower: unpinned sooner).
    fn pinned_value(&self, u: usize) -> f32 {
        let n = self.hot[u].n;
        match &self.frequency {
            Some(f) => f[u].get(n - 1).copied().unwrap_or(0.0),
            // Without a profile, the file's hot-first position stands for frequency.
            None => -(n as f32),
        }
    }
}
