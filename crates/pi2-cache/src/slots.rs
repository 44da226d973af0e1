//! The cold region: equal slots, a key -> slot table and an eviction policy.

use crate::{CacheError, EvictionPolicy, Lru};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicU8, Ordering};

const NONE: u32 = u32::MAX;
/// Slot starts are aligned to a cache line (and to every GGML block type).
const SLOT_ALIGN: usize = 64;

/// A slot id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot(pub u32);

/// Hits and misses of one group of keys (one layer for pi2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

impl GroupStats {
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}

/// Statistics per group and in total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub groups: Vec<GroupStats>,
}

impl CacheStats {
    pub fn total(&self) -> GroupStats {
        self.groups
            .iter()
            .fold(GroupStats::default(), |a, g| GroupStats {
                hits: a.hits + g.hits,
                misses: a.misses + g.misses,
                evictions: a.evictions + g.evictions,
            })
    }
}

/// Fixed-size slots for keys `0..n_keys`, evicted by policy `P`.
pub struct SlotCache<P: EvictionPolicy = Lru> {
    arena: std::ptr::NonNull<u8>,
    layout: Layout,
    stride: usize,
    slot_bytes: usize,
    slot_of: Vec<u32>,
    key_of: Vec<u32>,
    step_of: Vec<u64>,
    parts: Vec<AtomicU8>,
    step: u64,
    free: u32,
    /// Slots in use from now on (`..limit`); the rest were given back.
    limit: u32,
    group_size: usize,
    stats: CacheStats,
    policy: P,
}

// SAFETY: the arena is owned memory; shared access hands out raw pointers whose use is governed
// by `SlotCache::slot`'s contract.
unsafe impl<P: EvictionPolicy> Send for SlotCache<P> {}
unsafe impl<P: EvictionPolicy + Sync> Sync for SlotCache<P> {}

impl<P: EvictionPolicy> SlotCache<P> {
    /// `n_slots` slots of `slot_bytes` for keys `0..n_keys`; statistics per `group_size` keys.
    pub fn new(
        n_keys: usize,
        group_size: usize,
        slot_bytes: usize,
        n_slots: usize,
        mut policy: P,
    ) -> Result<Self, CacheError> {
        if n_slots == 0 || slot_bytes == 0 || n_keys == 0 {
            return Err(CacheError::Empty);
        }
        let stride = Self::stride(slot_bytes);
        let layout =
            Layout::from_size_align(stride * n_slots, SLOT_ALIGN).map_err(|_| CacheError::Empty)?;
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let arena =
            std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        policy.init(n_slots, n_keys);
        let group_size = group_size.max(1);
        Ok(Self {
            arena,
            layout,
            stride,
            slot_bytes,
            slot_of: vec![NONE; n_keys],
            key_of: vec![NONE; n_slots],
            step_of: vec![0; n_slots],
            parts: (0..n_slots).map(|_| AtomicU8::new(0)).collect(),
            step: 1,
            free: 0,
            limit: n_slots as u32,
            group_size,
            stats: CacheStats {
                groups: vec![GroupStats::default(); n_keys.div_ceil(group_size)],
            },
            policy,
        })
    }

    fn stride(slot_bytes: usize) -> usize {
        slot_bytes.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
    }

    /// Bytes a cache of `n_slots` slots of `slot_bytes` holds (arena plus per-slot tables; the
    /// key table adds 4 bytes per key).
    pub fn bytes_for(slot_bytes: usize, n_slots: usize, n_keys: usize) -> u64 {
        (Self::stride(slot_bytes) as u64 + 4 + 4 + 8 + 1 + 16) * n_slots as u64 + 4 * n_keys as u64
    }

    /// How many slots fit in `bytes` (inverse of [`SlotCache::bytes_for`]).
    pub fn slots_in(bytes: u64, slot_bytes: usize, n_keys: usize) -> usize {
        let per = Self::bytes_for(slot_bytes, 1, 0);
        (bytes.saturating_sub(4 * n_keys as u64) / per) as usize
    }

    /// Slots in use (at most those allocated; fewer after [`SlotCache::set_limit`]).
    pub fn n_slots(&self) -> usize {
        self.limit as usize
    }

    /// Keep only the first `n` slots (at least one, at most those allocated): keys in the
    /// others are evicted and their memory given back to the system (the whole pages from slot
    /// `n` to the arena's end; raised again, slots come back with no parts and undefined
    /// bytes). Returns the bytes of memory newly given back (0 when raising). Call between
    /// steps, with no writer filling a slot.
    pub fn set_limit(&mut self, n: usize) -> u64 {
        let n = n.clamp(1, self.key_of.len()) as u32;
        for s in n..self.limit {
            let key = self.key_of[s as usize];
            if key != NONE {
                self.slot_of[key as usize] = NONE;
                self.key_of[s as usize] = NONE;
                self.stats.groups[key as usize / self.group_size].evictions += 1;
            }
            self.parts[s as usize].store(0, Ordering::Relaxed);
            self.policy.removed(s);
        }
        let base = self.arena.as_ptr() as usize;
        let tail = |k: u32| {
            let at = k as usize * self.stride;
            (at, self.layout.size() - at)
        };
        let mut freed = 0;
        if n < self.limit {
            let ((new, new_len), (old, old_len)) = (tail(n), tail(self.limit));
            freed = crate::releasable_bytes(base + new, new_len)
                - crate::releasable_bytes(base + old, old_len);
            // SAFETY: the range lies inside the arena, and no slot in it is read or written
            // any more (their keys are gone; the caller excludes writers in flight).
            unsafe { crate::release_pages(self.arena.as_ptr().add(new), new_len) };
        }
        self.free = self.free.min(n);
        self.limit = n;
        freed
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Start a step: slots looked up or inserted from now on are protected from eviction until
    /// the next step.
    pub fn begin_step(&mut self) {
        self.step += 1;
    }

    /// The key's slot, counting a hit or a miss.
    pub fn lookup(&mut self, key: u32) -> Option<Slot> {
        let g = key as usize / self.group_size;
        let s = self.slot_of[key as usize];
        if s == NONE {
            self.stats.groups[g].misses += 1;
            return None;
        }
        self.stats.groups[g].hits += 1;
        self.step_of[s as usize] = self.step;
        self.policy.touched(s, key);
        Some(Slot(s))
    }

    /// The key's slot without counting or reordering.
    pub fn peek(&self, key: u32) -> Option<Slot> {
        let s = self.slot_of[key as usize];
        (s != NONE).then_some(Slot(s))
    }

    /// Give `key` (not present) a slot with no parts: a free one, else the policy's victim among
    /// slots not used in this step. `None` when every slot is in use by this step.
    pub fn insert(&mut self, key: u32) -> Option<Slot> {
        debug_assert_eq!(self.slot_of[key as usize], NONE, "key already cached");
        let s = if self.free < self.limit {
            self.free += 1;
            self.free - 1
        } else {
            let (step, step_of, limit) = (self.step, &self.step_of, self.limit);
            let v = self
                .policy
                .victim(&|s| s < limit && step_of[s as usize] != step)?;
            let old = self.key_of[v as usize];
            // A slot emptied by `remove` holds no key.
            if old != NONE {
                self.slot_of[old as usize] = NONE;
                self.stats.groups[old as usize / self.group_size].evictions += 1;
            }
            v
        };
        self.key_of[s as usize] = key;
        self.slot_of[key as usize] = s;
        self.step_of[s as usize] = self.step;
        self.parts[s as usize].store(0, Ordering::Relaxed);
        self.policy.inserted(s, key);
        Some(Slot(s))
    }

    /// Forget `key` (if cached): its slot becomes the policy's first victim, with no parts.
    /// For a slot whose filling failed.
    pub fn remove(&mut self, key: u32) {
        let s = self.slot_of[key as usize];
        if s == NONE {
            return;
        }
        self.slot_of[key as usize] = NONE;
        self.key_of[s as usize] = NONE;
        self.step_of[s as usize] = 0;
        self.parts[s as usize].store(0, Ordering::Relaxed);
        self.policy.emptied(s);
    }

    /// Bit mask of the parts present in a slot (the caller's meaning).
    pub fn parts(&self, s: Slot) -> u8 {
        self.parts[s.0 as usize].load(Ordering::Acquire)
    }

    /// Mark parts present (after they were written).
    pub fn add_parts(&self, s: Slot, mask: u8) {
        self.parts[s.0 as usize].fetch_or(mask, Ordering::Release);
    }

    /// Start of a slot's bytes, for a writer that fills it while the cache is shared (an I/O
    /// thread).
    pub fn slot_ptr(&self, s: Slot) -> *mut u8 {
        assert!(s.0 < self.limit, "slot out of range");
        // SAFETY: within the arena.
        unsafe { self.arena.as_ptr().add(s.0 as usize * self.stride) }
    }

    /// A slot's bytes.
    ///
    /// # Safety
    /// Nothing may write the slot's bytes while the returned slice lives.
    pub unsafe fn slot(&self, s: Slot) -> &[u8] {
        // SAFETY: the slot lies within the arena; the caller excludes writers.
        unsafe { std::slice::from_raw_parts(self.slot_ptr(s), self.slot_bytes) }
    }

    /// A slot's bytes, exclusively.
    pub fn slot_mut(&mut self, s: Slot) -> &mut [u8] {
        // SAFETY: `&mut self` excludes every other access.
        unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(s), self.slot_bytes) }
    }

    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats
            .groups
            .iter_mut()
            .for_each(|g| *g = GroupStats::default());
    }

    /// Keys currently cached.
    pub fn len(&self) -> usize {
        self.free as usize
    }

    pub fn is_empty(&self) -> bool {
        self.free == 0
    }
}

impl<P: EvictionPolicy> Drop for SlotCache<P> {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.arena.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fifo;

    #[test]
    fn a_lower_limit_evicts_the_slots_given_back_and_never_uses_them() {
        // Slots of two pages, so giving them back releases whole pages.
        let mut c = SlotCache::new(100, 10, 8192, 8, Lru::default()).unwrap();
        for k in 0..8 {
            let s = c.insert(k).unwrap();
            c.slot_mut(s).fill(k as u8 + 1);
        }
        c.begin_step();
        // Five slots of two pages: at least four whole pages go back.
        assert!(c.set_limit(3) >= 4 * 4096);
        assert_eq!(c.n_slots(), 3);
        let kept: Vec<u32> = (0..8).filter(|&k| c.peek(k).is_some()).collect();
        assert_eq!(kept.len(), 3, "{kept:?}");
        for &k in &kept {
            let s = c.peek(k).unwrap();
            assert!(s.0 < 3);
            // SAFETY: no writer.
            assert!(unsafe { c.slot(s) }.iter().all(|&b| b == k as u8 + 1));
        }
        // New keys take only the slots left, evicting the least recent.
        for k in 20..30 {
            c.begin_step();
            assert!(c.insert(k).unwrap().0 < 3);
        }
        assert_eq!((20..30).filter(|&k| c.peek(k).is_some()).count(), 3);
        let evicted: u64 = c.stats().groups.iter().map(|g| g.evictions).sum();
        assert_eq!(evicted, 5 + 10);
        // Raised again: the slots come back (no parts; their memory usable again).
        assert_eq!(c.set_limit(8), 0);
        c.begin_step();
        for k in 40..45 {
            let s = c.insert(k).unwrap();
            assert!(s.0 >= 3 && c.parts(s) == 0, "a free slot first");
            c.slot_mut(s).fill(7);
            // SAFETY: no writer.
            assert!(unsafe { c.slot(s) }.iter().all(|&b| b == 7));
        }
        c.set_limit(0);
        assert_eq!(c.n_slots(), 1, "at least one slot");
    }

    #[test]
    fn lru_evicts_least_recent_and_spares_the_current_step() {
        let mut c = SlotCache::new(10, 5, 100, 2, Lru::default()).unwrap();
        assert_eq!(c.lookup(1), None);
        let a = c.insert(1).unwrap();
        c.begin_step();
        let b = c.insert(2).unwrap();
        assert_ne!(a, b);
        // Both slots are full; slot of key 1 is older and not used in this step.
        assert_eq!(c.insert(3), Some(a));
        assert_eq!(c.peek(1), None);
        // Every slot is now used by this step: nothing can be evicted.
        assert_eq!(c.insert(4), None);
        c.begin_step();
        assert_eq!(c.lookup(2), Some(b)); // 2 becomes most recent
        assert_eq!(c.insert(4), Some(a)); // so 3 goes
        let st = c.stats();
        assert_eq!(st.groups[0].misses, 1);
        assert_eq!(st.groups[0].hits, 1);
        assert_eq!(st.total().evictions, 2);
    }

    #[test]
    fn a_removed_key_is_gone_and_its_slot_is_reused_first() {
        let mut c = SlotCache::new(10, 5, 100, 3, Lru::default()).unwrap();
        let a = c.insert(1).unwrap();
        let b = c.insert(2).unwrap();
        c.insert(3).unwrap();
        c.add_parts(b, 3);
        c.begin_step();
        c.remove(2);
        c.remove(7); // not cached: nothing happens
        assert_eq!(c.peek(2), None);
        assert_eq!(c.parts(b), 0);
        // The emptied slot goes before the least recent key's (1, in slot `a`).
        assert_eq!(c.insert(4), Some(b));
        assert_eq!(c.insert(5), Some(a));
        assert_eq!(c.peek(1), None);
        assert_eq!(c.peek(4), Some(b));
    }

    #[test]
    fn fifo_ignores_hits() {
        let mut c = SlotCache::new(10, 10, 8, 2, Fifo::default()).unwrap();
        let a = c.insert(1).unwrap();
        c.insert(2).unwrap();
        c.begin_step();
        c.lookup(1);
        c.begin_step();
        assert_eq!(c.insert(3), Some(a));
    }

    #[test]
    fn slots_are_aligned_and_hold_parts() {
        let mut c = SlotCache::new(4, 4, 100, 3, Lru::default()).unwrap();
        for k in 0..3 {
            let s = c.insert(k).unwrap();
            assert_eq!(c.slot_ptr(s) as usize % SLOT_ALIGN, 0);
            c.slot_mut(s).fill(k as u8);
            c.add_parts(s, 1);
        }
        let s = c.peek(2).unwrap();
        assert_eq!(c.parts(s), 1);
        c.add_parts(s, 2);
        assert_eq!(c.parts(s), 3);
        // SAFETY: no writer.
        assert!(unsafe { c.slot(s) }.iter().all(|&b| b == 2));
        assert!(SlotCache::<Lru>::new(4, 4, 100, 0, Lru::default()).is_err());
    }

    #[test]
    fn sizes_round_trip() {
        let b = SlotCache::<Lru>::bytes_for(1100, 37, 5000);
        assert_eq!(SlotCache::<Lru>::slots_in(b, 1100, 5000), 37);
    }

    /// A key asked for often stays where LRU lets a stream of one-off keys push it out.
    #[test]
    fn frequent_keeps_the_hot_key_through_a_scan() {
        fn hits<P: EvictionPolicy>(policy: P) -> u64 {
            let mut c = SlotCache::new(1000, 1000, 8, 4, policy).unwrap();
            let ask = |c: &mut SlotCache<P>, k: u32| {
                c.begin_step();
                if c.lookup(k).is_none() {
                    c.insert(k).unwrap();
                }
            };
            for round in 0..100u32 {
                ask(&mut c, 0); // the hot key
                for k in 0..4 {
                    ask(&mut c, 1 + round * 4 + k); // four one-off keys
                }
            }
            c.stats().total().hits
        }
        assert_eq!(hits(Lru::default()), 0);
        // Once its count leads (after its first return), it is never evicted.
        assert_eq!(hits(crate::Frequent::default()), 98);
        // Chosen at run time, through a box.
        let boxed: Box<dyn EvictionPolicy> = Box::new(crate::Frequent::default());
        assert_eq!(boxed.name(), "frequent");
        assert_eq!(hits(boxed), 98);
    }

    /// Counts kept from an earlier run keep its hot key from the first pass on; a prior of
    /// another length is ignored.
    #[test]
    fn frequent_starts_from_a_prior() {
        fn hits(policy: crate::Frequent) -> u64 {
            let mut c = SlotCache::new(1000, 1000, 8, 4, policy).unwrap();
            for round in 0..3u32 {
                for k in [
                    0,
                    1 + round * 4,
                    2 + round * 4,
                    3 + round * 4,
                    4 + round * 4,
                ] {
                    c.begin_step();
                    if c.lookup(k).is_none() {
                        c.insert(k).unwrap();
                    }
                }
            }
            c.stats().total().hits
        }
        // Fresh, key 0 ties the one-off keys at first and is evicted as the least recent; it
        // stays only once its count has formed (the third pass).
        assert_eq!(hits(crate::Frequent::default()), 1);
        let mut prior = vec![0; 1000];
        prior[0] = 5;
        assert_eq!(hits(crate::Frequent::with_prior(prior)), 2);
        assert_eq!(hits(crate::Frequent::with_prior(vec![5; 10])), 1);
    }
}
