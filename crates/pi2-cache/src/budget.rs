//! One byte budget shared by the cache regions.

use crate::CacheError;

/// What a reservation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Region {
    /// Always resident: embeddings, attention, norms, output, KV cache, predictors.
    Fixed,
    /// Neurons pinned from the profile.
    Hot,
    /// The LRU slot arena.
    Cold,
    /// Working buffers (activations, staging of a layer read in prefill).
    Scratch,
    /// Held by the process outside the regions above: code, heap (tokenizer, metadata),
    /// allocator slack. Charged so that a budget bounds the whole process.
    Process,
}

const REGIONS: [Region; 5] = [
    Region::Fixed,
    Region::Hot,
    Region::Cold,
    Region::Scratch,
    Region::Process,
];

/// Byte accounting against a limit.
#[derive(Clone, Debug)]
pub struct Budget {
    limit: u64,
    used: [u64; 5],
}

impl Budget {
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            used: [0; 5],
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes reserved in `region`.
    pub fn used(&self, region: Region) -> u64 {
        self.used[region as usize]
    }

    pub fn total_used(&self) -> u64 {
        self.used.iter().sum()
    }

    /// Bytes not yet reserved.
    pub fn left(&self) -> u64 {
        self.limit.saturating_sub(self.total_used())
    }

    /// Reserve `bytes` for `what`; fails (changing nothing) when they do not fit.
    pub fn reserve(&mut self, region: Region, bytes: u64, what: &str) -> Result<(), CacheError> {
        self.reserve_with_minimum(region, bytes, what, 0)
    }

    /// [`Budget::reserve`], where the caller knows the full minimum the run needs beyond what
    /// is reserved so far (`later`): the error then names the smallest budget that works.
    pub fn reserve_with_minimum(
        &mut self,
        region: Region,
        bytes: u64,
        what: &str,
        later: u64,
    ) -> Result<(), CacheError> {
        if bytes > self.left() {
            return Err(CacheError::OverBudget {
                what: what.to_string(),
                need: bytes,
                left: self.left(),
                limit: self.limit,
                minimum: self.total_used() + bytes + later,
            });
        }
        self.used[region as usize] += bytes;
        Ok(())
    }

    /// Give back up to `bytes` of `region`'s reservation (another region may take them);
    /// returns the bytes given back.
    pub fn release(&mut self, region: Region, bytes: u64) -> u64 {
        let got = bytes.min(self.used[region as usize]);
        self.used[region as usize] -= got;
        got
    }

    /// Reserve everything left for `region` (returns the bytes taken).
    pub fn take_rest(&mut self, region: Region) -> u64 {
        let rest = self.left();
        self.used[region as usize] += rest;
        rest
    }

    /// `(region, bytes)` for reports.
    pub fn breakdown(&self) -> impl Iterator<Item = (Region, u64)> + '_ {
        REGIONS.iter().map(|&r| (r, self.used(r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_bytes_can_be_reserved_elsewhere() {
        let mut b = Budget::new(100);
        b.reserve(Region::Cold, 80, "cache").unwrap();
        assert!(b.reserve(Region::Fixed, 30, "kv").is_err());
        assert_eq!(b.release(Region::Cold, 25), 25);
        b.reserve(Region::Fixed, 30, "kv").unwrap();
        assert_eq!(b.release(Region::Hot, 5), 0, "nothing reserved there");
        assert_eq!((b.used(Region::Cold), b.left()), (55, 15));
    }

    #[test]
    fn reservations_are_strict() {
        let mut b = Budget::new(100);
        b.reserve(Region::Fixed, 60, "weights").unwrap();
        b.reserve(Region::Hot, 30, "hot").unwrap();
        let e = b
            .reserve_with_minimum(Region::Cold, 20, "cold", 5)
            .unwrap_err();
        assert_eq!(
            e,
            CacheError::OverBudget {
                what: "cold".into(),
                need: 20,
                left: 10,
                limit: 100,
                minimum: 115
            }
        );
        assert!(e.to_string().contains("at least 115 bytes"));
        assert_eq!(b.total_used(), 90);
        assert_eq!(b.take_rest(Region::Cold), 10);
        assert_eq!((b.left(), b.used(Region::Cold)), (0, 10));
    }
}
