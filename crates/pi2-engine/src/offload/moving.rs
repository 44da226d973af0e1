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
        let per_slot = SlotCache::<Lru>::bytes_for(self.cache.slot_bytes(), 1, 0);
        let spare = self.cache.n_slots().saturating_sub(self.least_slots) as u64;
        let give = need.div_ceil(per_slot).min(spare);
        if give > 0 {
            self.cache.set_limit(self.cache.n_slots() - give as usize);
            self.budget.release(Region::Cold, give * per_slot);
            need -= self.take_slack(need);
        }
        if need > 0 {
            let freed = self.unpin(need);
            self.budget.release(Region::Hot, freed);
            need -= self.take_slack(need);
        }
        if need > 0 {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            return Err(EngineError::Offload(format!(
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

    /// Unpins rows worth at least `need` bytes (or all of them), least valuable first, and
    /// releases their memory; returns the bytes given back.
    fn unpin(&mut self, need: u64) -> u64 {
        let old: Vec<(usize, usize)> = self.hot.iter().map(|h| (h.n_gate, h.n)).collect();
        let mut freed = 0u64;
        while freed < need {
            // Up and down rows of the least frequently firing pinned neuron.
            let pair = (0..self.hot.len())
                .filter(|&u| self.hot[u].n > 0)
                .min_by(|&a, &b| self.pinned_value(a).total_cmp(&self.pinned_value(b)));
            if let Some(u) = pair {
                self.hot[u].n -= 1;
                let l = &self.layers[u];
                freed += (l.up.row_bytes + l.down.row_bytes) as u64;
                continue;
            }
            // Then gate rows, from the unit with the most.
            let Some(u) = (0..self.hot.len())
                .filter(|&u| self.hot[u].n_gate > 0)
                .max_by_key(|&u| self.hot[u].n_gate)
            else {
                break;
            };
            self.hot[u].n_gate -= 1;
            freed += self.layers[u].gate.row_bytes as u64;
        }
        for (u, &(g0, h0)) in old.iter().enumerate() {
            let (l, h) = (&self.layers[u], &mut self.hot[u]);
            let base = h.buf.as_mut_ptr();
            let ranges = [
                (h.n_gate * l.gate.row_bytes, g0 * l.gate.row_bytes),
                (
                    h.up_at + h.n * l.up.row_bytes,
                    h.up_at + h0 * l.up.row_bytes,
                ),
                (
                    h.down_at + h.n * l.down.row_bytes,
                    h.down_at + h0 * l.down.row_bytes,
                ),
            ];
            for (a, b) in ranges {
                if b > a {
                    // SAFETY: inside this unit's pinned block, rows no longer pinned: nothing
                    // reads them (residency now sends those neurons to the cache) and no read
                    // is in flight (the caller waited).
                    unsafe { pi2_cache::release_pages(base.add(a), b - a) };
                }
            }
        }
        freed
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
