//! Eviction policies over slot ids.

/// Decides which slot to evict. Callbacks tell it what the cache did; `victim` is asked for the
/// slot to reuse among those `evictable` allows (slots in use by the current step are not).
pub trait EvictionPolicy: Send {
    fn name(&self) -> &'static str;
    /// Prepare for `n_slots` slots holding keys `0..n_keys` (called once by the cache).
    fn init(&mut self, n_slots: usize, n_keys: usize);
    /// A slot received key `key`.
    fn inserted(&mut self, slot: u32, key: u32);
    /// A slot's key (`key`) was looked up and hit.
    fn touched(&mut self, slot: u32, key: u32);
    /// The slot to evict, if any slot is evictable.
    fn victim(&mut self, evictable: &dyn Fn(u32) -> bool) -> Option<u32>;
    /// A slot left the cache for good ([`crate::SlotCache::set_limit`]): forget it. The cache
    /// never offers it again either way.
    fn removed(&mut self, _slot: u32) {}
    /// A slot lost its key but stays in use ([`crate::SlotCache::remove`]): offer it first.
    fn emptied(&mut self, slot: u32);
}

const NIL: u32 = u32::MAX;

/// An intrusive doubly linked list over slot ids (no allocation after `init`).
#[derive(Clone, Debug, Default)]
struct List {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32, // most recent
    tail: u32, // least recent
    linked: Vec<bool>,
}

impl List {
    fn init(&mut self, n: usize) {
        self.prev = vec![NIL; n];
        self.next = vec![NIL; n];
        self.linked = vec![false; n];
        self.head = NIL;
        self.tail = NIL;
    }
    fn unlink(&mut self, s: u32) {
        if !self.linked[s as usize] {
            return;
        }
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.linked[s as usize] = false;
    }
    fn push_front(&mut self, s: u32) {
        self.unlink(s);
        self.prev[s as usize] = NIL;
        self.next[s as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = s;
        }
        self.head = s;
        if self.tail == NIL {
            self.tail = s;
        }
        self.linked[s as usize] = true;
    }
    fn push_back(&mut self, s: u32) {
        self.unlink(s);
        self.next[s as usize] = NIL;
        self.prev[s as usize] = self.tail;
        if self.tail != NIL {
            self.next[self.tail as usize] = s;
        }
        self.tail = s;
        if self.head == NIL {
            self.head = s;
        }
        self.linked[s as usize] = true;
    }
    /// From the least recent end, the first slot `ok` accepts.
    fn oldest(&self, ok: &dyn Fn(u32) -> bool) -> Option<u32> {
        let mut s = self.tail;
        while s != NIL {
            if ok(s) {
                return Some(s);
            }
            s = self.prev[s as usize];
        }
        None
    }
}

/// Least recently used: a hit moves the slot to the front.
#[derive(Clone, Debug, Default)]
pub struct Lru(List);

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }
    fn init(&mut self, n_slots: usize, _: usize) {
        self.0.init(n_slots)
    }
    fn inserted(&mut self, slot: u32, _: u32) {
        self.0.push_front(slot)
    }
    fn touched(&mut self, slot: u32, _: u32) {
        self.0.push_front(slot)
    }
    fn victim(&mut self, evictable: &dyn Fn(u32) -> bool) -> Option<u32> {
        self.0.oldest(evictable)
    }
    fn removed(&mut self, slot: u32) {
        self.0.unlink(slot)
    }
    fn emptied(&mut self, slot: u32) {
        self.0.push_back(slot)
    }
}

/// First in, first out: hits do not reorder (the baseline LRU must beat).
#[derive(Clone, Debug, Default)]
pub struct Fifo(List);

impl EvictionPolicy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }
    fn init(&mut self, n_slots: usize, _: usize) {
        self.0.init(n_slots)
    }
    fn inserted(&mut self, slot: u32, _: u32) {
        self.0.push_front(slot)
    }
    fn touched(&mut self, _: u32, _: u32) {}
    fn victim(&mut self, evictable: &dyn Fn(u32) -> bool) -> Option<u32> {
        self.0.oldest(evictable)
    }
    fn removed(&mut self, slot: u32) {
        self.0.unlink(slot)
    }
    fn emptied(&mut self, slot: u32) {
        self.0.push_back(slot)
    }
}

/// Most often used stays: each key counts how often it was asked for over the cache's whole
/// life, cached or not, and the victim is the slot whose key has the lowest count (the least
/// recent among equals). For keys whose popularity is steady and uneven, such as a mixture's
/// experts (a few take most routings in every layer), this keeps the hot set resident where
/// LRU lets a stream of one-off keys push it out. Counts halve every few passes over the keys,
/// so a popularity that drifts is followed.
#[derive(Clone, Debug, Default)]
pub struct Frequent {
    counts: Vec<u32>,
    /// Each slot's key (`NIL`: empty or gone) and when it was last used.
    key: Vec<u32>,
    last: Vec<u64>,
    tick: u64,
    /// Uses since counts last halved.
    since_aging: u64,
    /// Counts to start from instead of zeros (taken by `init` when their length fits).
    prior: Vec<u32>,
}

impl Frequent {
    /// A policy that starts from the counts of an earlier run (`prior[key]`: a routing kept
    /// between runs), so what was popular then is kept from the first use on rather than after
    /// the counts form. Counts of another length than the cache's keys are ignored.
    pub fn with_prior(prior: Vec<u32>) -> Self {
        Self {
            prior,
            ..Self::default()
        }
    }

    fn count(&mut self, key: u32) {
        self.counts[key as usize] = self.counts[key as usize].saturating_add(1);
        self.since_aging += 1;
        if self.since_aging >= 8 * self.counts.len() as u64 {
            self.since_aging = 0;
            self.counts.iter_mut().for_each(|c| *c /= 2);
        }
    }
}

impl EvictionPolicy for Frequent {
    fn name(&self) -> &'static str {
        "frequent"
    }
    fn init(&mut self, n_slots: usize, n_keys: usize) {
        self.counts = match std::mem::take(&mut self.prior) {
            prior if prior.len() == n_keys => prior,
            _ => vec![0; n_keys],
        };
        self.key = vec![NIL; n_slots];
        self.last = vec![0; n_slots];
    }
    fn inserted(&mut self, slot: u32, key: u32) {
        self.tick += 1;
        self.key[slot as usize] = key;
        self.last[slot as usize] = self.tick;
        self.count(key);
    }
    fn touched(&mut self, slot: u32, key: u32) {
        self.tick += 1;
        self.last[slot as usize] = self.tick;
        self.count(key);
    }
    fn victim(&mut self, evictable: &dyn Fn(u32) -> bool) -> Option<u32> {
        // An emptied slot first, then the lowest count, then the least recent.
        (0..self.key.len() as u32)
            .filter(|&s| evictable(s))
            .min_by_key(|&s| match self.key[s as usize] {
                NIL => (0, 0, 0),
                k => (1, self.counts[k as usize], self.last[s as usize]),
            })
    }
    fn removed(&mut self, slot: u32) {
        self.key[slot as usize] = NIL;
        self.last[slot as usize] = u64::MAX;
    }
    fn emptied(&mut self, slot: u32) {
        self.key[slot as usize] = NIL;
    }
}

/// A policy chosen at run time.
impl EvictionPolicy for Box<dyn EvictionPolicy> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn init(&mut self, n_slots: usize, n_keys: usize) {
        (**self).init(n_slots, n_keys)
    }
    fn inserted(&mut self, slot: u32, key: u32) {
        (**self).inserted(slot, key)
    }
    fn touched(&mut self, slot: u32, key: u32) {
        (**self).touched(slot, key)
    }
    fn victim(&mut self, evictable: &dyn Fn(u32) -> bool) -> Option<u32> {
        (**self).victim(evictable)
    }
    fn removed(&mut self, slot: u32) {
        (**self).removed(slot)
    }
    fn emptied(&mut self, slot: u32) {
        (**self).emptied(slot)
    }
}
