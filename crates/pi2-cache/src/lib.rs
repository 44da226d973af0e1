//! pi2-cache: the segmented neuron cache. It knows nothing about tensors or files: keys are dense
//! integers (`layer * n_neurons + neuron` for pi2), slots are fixed-size byte blocks.
//!
//! - [`Budget`]: strict byte accounting of the regions (fixed, hot, cold, scratch) against one
//!   limit; a reservation that does not fit fails and names what asked.
//! - [`SlotCache`]: the cold region, an arena of equal slots (one neuron bundle each) with a
//!   key -> slot table, per-slot part bits (a bundle arrives in parts: gate first, up/down later),
//!   per-group hit statistics, and an [`EvictionPolicy`] ([`Lru`] by default, [`Fifo`] to
//!   compare). Slots used in the current step are never evicted. Nothing allocates after
//!   construction.

mod budget;
mod policy;
mod slots;

pub use budget::{Budget, Region};
pub use policy::{EvictionPolicy, Fifo, Lru};
pub use slots::{CacheStats, GroupStats, Slot, SlotCache};

/// Cache errors.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheError {
    #[error(
        "memory budget too small: {what} needs {need} bytes but only {left} of {limit} are left \
         (at least {minimum} bytes are needed)"
    )]
    OverBudget {
        what: String,
        need: u64,
        left: u64,
        limit: u64,
        minimum: u64,
    },
    #[error("a slot cache needs at least one slot of at least one byte")]
    Empty,
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
