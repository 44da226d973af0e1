//! Checksums of fixed-size records of a file, verified as requests land: a file changed or
//! damaged under a running engine becomes an error naming where, never silently different
//! bytes. The reader knows only byte ranges; what a record is (a neuron row, a tensor) is the
//! caller's choice when it builds the table.

use crate::IoError;

/// `count` records of `record_len` bytes from `offset`, each with its CRC-32 (IEEE).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SumRegion {
    /// What the region is, for error messages (a tensor's name).
    pub name: String,
    pub offset: u64,
    pub record_len: u64,
    pub sums: Vec<u32>,
}

impl SumRegion {
    fn end(&self) -> u64 {
        self.offset + self.record_len * self.sums.len() as u64
    }
}

/// The CRC-32 of `bytes` (the checksum [`Checksums`] verifies).
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Sorted, non-overlapping regions of checksummed records.
#[derive(Clone, Debug, Default)]
pub struct Checksums {
    regions: Vec<SumRegion>,
    /// The file the records are in, named by a mismatch.
    file: Option<std::path::PathBuf>,
}

impl Checksums {
    /// A table of `regions` (any order). Overlapping regions or empty records are refused:
    /// a table that cannot be trusted is an error, not a weaker check.
    pub fn new(mut regions: Vec<SumRegion>) -> Result<Self, IoError> {
        regions.retain(|r| !r.sums.is_empty());
        regions.sort_unstable_by_key(|r| r.offset);
        let bad = |why: String| Err(IoError::BadChecksums(why));
        for r in &regions {
            let len = r.record_len.checked_mul(r.sums.len() as u64);
            if r.record_len == 0 || len.and_then(|l| r.offset.checked_add(l)).is_none() {
                return bad(format!("region `{}` has an impossible extent", r.name));
            }
        }
        if let Some(w) = regions.windows(2).find(|w| w[0].end() > w[1].offset) {
            return bad(format!(
                "regions `{}` and `{}` overlap",
                w[0].name, w[1].name
            ));
        }
        Ok(Self {
            regions,
            file: None,
        })
    }

    /// Records in the table.
    pub fn records(&self) -> usize {
        self.regions.iter().map(|r| r.sums.len()).sum()
    }

    /// The same table, its mismatches naming `file`.
    pub fn for_file(mut self, file: impl Into<std::path::PathBuf>) -> Self {
        self.file = Some(file.into());
        self
    }

    /// Memory the table holds, in bytes.
    pub fn heap_bytes(&self) -> usize {
        self.regions
            .iter()
            .map(|r| r.sums.len() * 4 + r.name.len() + std::mem::size_of::<SumRegion>())
            .sum()
    }

    /// Check every record that lies wholly inside `data`, read from `offset`. Records only
    /// partly inside are left to the request that reads them whole.
    pub fn verify(&self, offset: u64, data: &[u8]) -> Result<(), IoError> {
        let end = offset.saturating_add(data.len() as u64);
        // The first region that ends after `offset`.
        let first = self.regions.partition_point(|r| r.end() <= offset);
        for r in self.regions[first..].iter().take_while(|r| r.offset < end) {
            let lo = offset.max(r.offset);
            let first_rec = (lo - r.offset).div_ceil(r.record_len);
            let last_rec = ((end.min(r.end()) - r.offset) / r.record_len).min(r.sums.len() as u64);
            for k in first_rec..last_rec {
                let at = (r.offset + k * r.record_len - offset) as usize;
                let rec = &data[at..at + r.record_len as usize];
                if crc32(rec) != r.sums[k as usize] {
                    return Err(IoError::Checksum {
                        file: self.file.clone(),
                        region: r.name.clone(),
                        offset: r.offset + k * r.record_len,
                        len: r.record_len as usize,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table(file: &[u8], regions: &[(u64, u64, usize)]) -> Checksums {
        let regions = regions
            .iter()
            .enumerate()
            .map(|(i, &(offset, record_len, n))| SumRegion {
                name: format!("r{i}"),
                offset,
                record_len,
                sums: (0..n as u64)
                    .map(|k| {
                        let at = (offset + k * record_len) as usize;
                        crc32(&file[at..at + record_len as usize])
                    })
                    .collect(),
            })
            .collect();
        Checksums::new(regions).unwrap()
    }

    #[test]
    fn overlapping_or_impossible_regions_are_refused() {
        let r = |name: &str, offset, record_len, n| SumRegion {
            name: name.into(),
            offset,
            record_len,
            sums: vec![0; n],
        };
        let err = Checksums::new(vec![r("a", 0, 10, 3), r("b", 25, 5, 1)]).unwrap_err();
        assert!(err.to_string().contains("`a` and `b` overlap"), "{err}");
        assert!(Checksums::new(vec![r("z", 0, 0, 2)]).is_err());
        assert!(Checksums::new(vec![r("big", u64::MAX - 4, 8, 2)]).is_err());
        assert!(Checksums::new(vec![r("a", 0, 10, 3), r("b", 30, 5, 1)]).is_ok());
    }

    proptest! {
        /// Any read verifies every record it holds whole: a flipped byte inside such a record
        /// is found and named, one outside every whole record is not reported.
        #[test]
        fn reads_check_exactly_the_records_they_hold(
            seed in any::<u64>(),
            start in 0u64..600,
            len in 0usize..600,
            flip in 0usize..600,
        ) {
            let file: Vec<u8> = (0..1200u64)
                .map(|i| (i.wrapping_mul(seed | 1) >> 3) as u8)
                .collect();
            let regions = [(16u64, 24u64, 10usize), (300, 7, 30), (520, 100, 4)];
            let sums = table(&file, &regions);
            let len = len.min(file.len() - start as usize);
            let mut data = file[start as usize..start as usize + len].to_vec();
            prop_assert!(sums.verify(start, &data).is_ok());
            if len == 0 {
                return Ok(());
            }
            let flip = flip % len;
            data[flip] ^= 0x5a;
            let at = start + flip as u64;
            let whole = regions.iter().find_map(|&(o, rl, n)| {
                let k = at.checked_sub(o)? / rl;
                let rec = o + k * rl;
                (k < n as u64 && rec >= start && rec + rl <= start + len as u64).then_some(rec)
            });
            match (whole, sums.verify(start, &data)) {
                (Some(rec), Err(IoError::Checksum { offset, .. })) => prop_assert_eq!(offset, rec),
                (None, Ok(())) => {}
                (w, r) => prop_assert!(false, "flip at {at}: whole record {w:?}, got {r:?}"),
            }
        }
    }
}
