//! pi2-cache: the segmented neuron cache. It knows nothing about tensors or files: keys are dense
//! integers (`layer * n_neurons + neuron` for pi2), slots are fixed-size byte blocks.
//!
//! - [`Budget`]: strict byte accounting of the regions (fixed, hot, cold, scratch) against one
//!   limit; a reservation that does not fit fails and names what asked.
//! - [`SlotCache`]: the cold region, an arena of equal slots (one neuron bundle each) with a
//!   key -> slot table, per-slot part bits (a bundle arrives in parts: gate first, up/down later),
//!   per-group hit statistics, and an [`EvictionPolicy`] ([`Lru`] by default, [`Fifo`] to
//!   compare). Slots used in the current step are never evicted. Nothing allocates after
//!   construction; [`SlotCache::set_limit`] gives slots back (their memory too) when another
//!   region of the same budget grows.
//! - [`release_pages`] hands the whole pages inside a byte range back to the system, and
//!   [`releasable_bytes`] says how many bytes that is.

mod budget;
mod policy;
mod slots;

pub use budget::{Budget, Region};
pub use policy::{EvictionPolicy, Fifo, Frequent, Lru};
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

/// Gives the whole pages inside `len` bytes at `ptr` back to the system (`madvise(DONTNEED)`
/// on Unix; nothing elsewhere): they stop counting as resident, and read as zeros if touched
/// again. Partial pages at either end are kept. Releasing pages already released is harmless.
///
/// # Safety
/// The range must be owned, private, anonymous memory (heap or anonymous mapping) that nothing
/// reads or writes while the call runs, and whose contents nobody needs any more.
pub unsafe fn release_pages(ptr: *mut u8, len: usize) {
    #[cfg(unix)]
    {
        let (start, end) = whole_pages(ptr as usize, len);
        if end > start {
            // SAFETY: whole pages inside the caller's range (see the contract). A failure
            // only leaves the pages resident.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
    #[cfg(not(unix))]
    let _ = (ptr, len);
}

/// Bytes of the whole pages inside `len` bytes at address `at`: what [`release_pages`] gives
/// back (0 where it gives nothing back).
pub fn releasable_bytes(at: usize, len: usize) -> u64 {
    if cfg!(unix) {
        let (start, end) = whole_pages(at, len);
        end.saturating_sub(start) as u64
    } else {
        0
    }
}

/// The page-aligned span inside `[at, at + len)`.
fn whole_pages(at: usize, len: usize) -> (usize, usize) {
    let page = page_size();
    (at.next_multiple_of(page), (at + len) / page * page)
}

fn page_size() -> usize {
    #[cfg(unix)]
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    #[cfg(not(unix))]
    let page = 4096;
    (page as usize).max(4096)
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
