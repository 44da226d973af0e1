//! A routing kept between runs: how often each expert of a plain mixture was chosen, saved by one
//! run's expert stream and read by the next, so that its cache keeps the popular experts from
//! the first token on (a fresh run's counts take a dozen tokens to form, and meanwhile the cache
//! behaves as LRU). It only steers which experts stay cached: a missing, stale, damaged or
//! foreign file is ignored, never an error, and nothing computed depends on it.

use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"pi2rout1";
/// The largest count a run starts from: about half an aging period of a popular expert's own
/// uses, so that the run's routing overtakes a stale one within some dozens of tokens.
const SEED_MAX: u64 = 32;

/// The routing file of one model: what it held when opened, and where to save.
#[derive(Debug)]
pub(crate) struct RoutingMemory {
    path: PathBuf,
    /// The model file's size, stored with the counts (another file's counts are not used).
    file_size: u64,
    /// Counts read (empty: none usable).
    kept: Vec<u32>,
}

impl RoutingMemory {
    /// Reads `path`'s counts if they are for a file of `file_size` bytes with `keys` experts.
    pub(crate) fn open(path: &Path, file_size: u64, keys: usize) -> Self {
        let kept = std::fs::read(path)
            .ok()
            .and_then(|b| decode(&b, file_size, keys))
            .unwrap_or_default();
        Self {
            path: path.to_path_buf(),
            file_size,
            kept,
        }
    }

    /// Whether an earlier run's counts were read (any expert chosen).
    pub(crate) fn has_counts(&self) -> bool {
        self.kept.iter().any(|&c| c > 0)
    }

    /// The counts a cache starts from, scaled to at most [`SEED_MAX`] (each chosen expert at
    /// least 1), or `None` without usable counts.
    pub(crate) fn seed(&self) -> Option<Vec<u32>> {
        let max = u64::from(*self.kept.iter().max()?);
        (max > 0).then(|| {
            let scale = |c: u32| (u64::from(c) * SEED_MAX).div_ceil(max) as u32;
            self.kept.iter().map(|&c| scale(c)).collect()
        })
    }

    /// Saves half the kept counts plus this run's `chosen` (older runs fade), through a
    /// temporary file renamed into place, so a reader never sees half a file.
    pub(crate) fn save(&self, chosen: &[u32]) -> std::io::Result<()> {
        let merged: Vec<u32> = match self.kept.len() == chosen.len() {
            true => (self.kept.iter().zip(chosen))
                .map(|(&k, &c)| (k / 2).saturating_add(c))
                .collect(),
            false => chosen.to_vec(),
        };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, encode(self.file_size, &merged))?;
        std::fs::rename(&tmp, &self.path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

fn encode(file_size: u64, counts: &[u32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(28 + 4 * counts.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&file_size.to_le_bytes());
    b.extend_from_slice(&(counts.len() as u64).to_le_bytes());
    counts
        .iter()
        .for_each(|c| b.extend_from_slice(&c.to_le_bytes()));
    let crc = pi2_io::crc32(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

fn decode(b: &[u8], file_size: u64, keys: usize) -> Option<Vec<u32>> {
    let body_len = 24usize.checked_add(keys.checked_mul(4)?)?;
    if b.len() != body_len + 4 || &b[..8] != MAGIC {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let crc = u32::from_le_bytes(b[body_len..].try_into().ok()?);
    if word(8) != file_size || word(16) != keys as u64 || pi2_io::crc32(&b[..body_len]) != crc {
        return None;
    }
    let counts = b[24..body_len].chunks_exact(4);
    Some(
        counts
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_come_back_and_fade() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/routing.bin");
        let first = RoutingMemory::open(&path, 1000, 4);
        assert_eq!(first.seed(), None);
        first.save(&[8, 0, 2, 40]).unwrap();
        let second = RoutingMemory::open(&path, 1000, 4);
        // Scaled to at most 32, a chosen expert at least 1, an unchosen one 0.
        assert_eq!(second.seed(), Some(vec![7, 0, 2, 32]));
        second.save(&[0, 6, 0, 0]).unwrap();
        assert_eq!(RoutingMemory::open(&path, 1000, 4).kept, vec![4, 6, 1, 20]);
    }

    #[test]
    fn another_file_or_a_damaged_one_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("routing.bin");
        RoutingMemory::open(&path, 1000, 4)
            .save(&[1, 2, 3, 4])
            .unwrap();
        assert_eq!(RoutingMemory::open(&path, 1001, 4).seed(), None);
        assert_eq!(RoutingMemory::open(&path, 1000, 5).seed(), None);
        let mut b = std::fs::read(&path).unwrap();
        b[30] ^= 1;
        std::fs::write(&path, &b).unwrap();
        assert_eq!(RoutingMemory::open(&path, 1000, 4).seed(), None);
        std::fs::write(&path, b"short").unwrap();
        assert_eq!(RoutingMemory::open(&path, 1000, 4).seed(), None);
    }
}
