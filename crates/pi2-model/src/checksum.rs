//! Per-record checksums of a converted file: every tensor's rows (a neuron's gate, up or down
//! row; an embedding or output row; an attention projection's row) have a CRC-32 in the last
//! tensor, [`TENSOR`], so a reader can check exactly the records it reads, when it reads them.
//! Written by the GGUF writers when asked (`writer::GgufWriter::with_checksums`,
//! `writer::write_streamed` given a `writer::checksum_layout` entry); read by [`table`].

use crate::{GgufFile, ModelError, Result, TensorInfo};

/// The checksum tensor: one little-endian CRC-32 per record of every tensor before it, in
/// directory order (GGML I32, one dimension).
pub const TENSOR: &str = "pi2.checksums";

/// Metadata key of a checksummed file's header seal: the CRC-32 (U32, the last metadata
/// entry) of the header and tensor directory (bytes up to the tensor data) with the seal's own
/// four bytes zero. A flipped metadata scalar or a tensor's type swapped for another of the
/// same size changes the file's output without touching a tensor's bytes; the seal catches it.
pub const HEADER_KEY: &str = "pi2.header_crc32";

/// Checks the header seal of `f` ([`HEADER_KEY`]); files without one (plain files, files
/// converted before seals) pass.
pub fn check_header(f: &GgufFile) -> Result<()> {
    let Some(want) = f.get(HEADER_KEY) else {
        return Ok(());
    };
    let bad = |why: &str| {
        Err(ModelError::Corrupt(format!(
            "the header (metadata and tensor directory) {why}: the file changed or is damaged (restore it, or convert the model again)"
        )))
    };
    let Some(want) = want.as_u64().map(|w| w as u32) else {
        return bad("has a seal that is not a number");
    };
    let head = f.header_bytes();
    // The seal's value follows its key (length, bytes) and its type (U32: 4).
    let mut pattern = (HEADER_KEY.len() as u64).to_le_bytes().to_vec();
    pattern.extend_from_slice(HEADER_KEY.as_bytes());
    pattern.extend_from_slice(&4u32.to_le_bytes());
    let Some(at) = head
        .windows(pattern.len())
        .rposition(|w| w == pattern.as_slice())
        .map(|p| p + pattern.len())
        .filter(|&at| at + 4 <= head.len())
    else {
        return bad("has a seal that cannot be found");
    };
    let mut unsealed = head.to_vec();
    unsealed[at..at + 4].fill(0);
    match crc32(&unsealed) == want {
        true => Ok(()),
        false => bad("does not match its seal"),
    }
}

/// The records of a tensor of GGML `dims` holding `bytes`: `(record_len, count)`. A record is
/// a row (`dims[0]` elements) when the bytes divide evenly into rows, else the whole tensor.
pub fn records(dims: &[u64], bytes: u64) -> (u64, u64) {
    let rows = dims
        .iter()
        .skip(1)
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .unwrap_or(0);
    match bytes {
        0 => (0, 0),
        _ if rows > 0 && bytes.is_multiple_of(rows) => (bytes / rows, rows),
        _ => (bytes, 1),
    }
}

/// Records of all `tensors` (`(dims, bytes)`): the checksum table's length.
pub fn count<'a>(tensors: impl Iterator<Item = (&'a [u64], u64)>) -> u64 {
    tensors.map(|(d, b)| records(d, b).1).sum()
}

/// The CRC-32 of one record.
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Checksums of one tensor's records, at absolute file offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSums {
    pub name: String,
    pub offset: u64,
    pub record_len: u64,
    pub sums: Vec<u32>,
}

/// The file's checksum table, if it has one; a table that does not match the directory (wrong
/// type, length or place) is an error.
pub fn table(f: &GgufFile) -> Result<Option<Vec<TensorSums>>> {
    let Some(pos) = f.tensors.iter().position(|t| t.name == TENSOR) else {
        return Ok(None);
    };
    check_header(f)?;
    let t = &f.tensors[pos];
    let others = &f.tensors[..pos];
    let n = count(others.iter().map(|t| (&t.dims[..], t.size)));
    if pos + 1 != f.tensors.len() || t.ggml_type != crate::gguf::GGML_I32 || t.size != 4 * n {
        return Err(ModelError::Corrupt(format!(
            "`{TENSOR}` is not the checksum table of this file's tensors (convert the model again)"
        )));
    }
    let mut all = f
        .tensor_data(t)
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let sums = others
        .iter()
        .map(|o| {
            let (record_len, n) = records(&o.dims, o.size);
            TensorSums {
                name: o.name.clone(),
                offset: f.data_offset + o.offset,
                record_len,
                sums: all.by_ref().take(n as usize).collect(),
            }
        })
        .collect();
    // Copied: the mapped pages need not stay in this process's memory.
    f.release(t, 0..t.size as usize);
    Ok(Some(sums))
}

/// Check the first `records(tensor)` records of every tensor (all of them for `usize::MAX`)
/// against `sums` (from [`table`]) in the mapped file: what a loader does before using bytes
/// it will not read again.
pub fn verify_mapped(
    f: &GgufFile,
    sums: &[TensorSums],
    records: impl Fn(&TensorInfo) -> usize,
) -> Result<()> {
    for (t, s) in f.tensors.iter().zip(sums) {
        let data = f.tensor_data(t);
        let bad = data
            .chunks_exact(s.record_len.max(1) as usize)
            .zip(&s.sums)
            .take(records(t))
            .position(|(rec, &sum)| crc32(rec) != sum);
        if let Some(k) = bad {
            return Err(ModelError::Corrupt(format!(
                "record {k} of `{}` does not match its checksum: the file changed or is damaged (restore it, or convert the model again)",
                t.name
            )));
        }
    }
    Ok(())
}

/// Accumulates the CRC-32 of every record of a stream of tensors as they are written.
pub(crate) struct RecordSums {
    record_len: u64,
    filled: u64,
    hasher: crc32fast::Hasher,
    pub(crate) sums: Vec<u32>,
}

impl RecordSums {
    pub(crate) fn new() -> Self {
        Self {
            record_len: 0,
            filled: 0,
            hasher: crc32fast::Hasher::new(),
            sums: Vec::new(),
        }
    }

    /// A new tensor of `record_len`-byte records begins.
    pub(crate) fn start(&mut self, record_len: u64) {
        self.record_len = record_len;
        self.filled = 0;
        self.hasher = crc32fast::Hasher::new();
    }

    pub(crate) fn update(&mut self, mut buf: &[u8]) {
        while !buf.is_empty() && self.record_len > 0 {
            let take = ((self.record_len - self.filled) as usize).min(buf.len());
            self.hasher.update(&buf[..take]);
            self.filled += take as u64;
            buf = &buf[take..];
            if self.filled == self.record_len {
                let done = std::mem::replace(&mut self.hasher, crc32fast::Hasher::new());
                self.sums.push(done.finalize());
                self.filled = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_rows_when_they_divide_evenly() {
        assert_eq!(records(&[64, 10], 640), (64, 10));
        assert_eq!(records(&[64], 256), (256, 1));
        assert_eq!(records(&[3, 3, 2], 90), (15, 6));
        assert_eq!(records(&[64, 7], 100), (100, 1));
        assert_eq!(records(&[64, 0], 0), (0, 0));
        assert_eq!(records(&[2, u64::MAX, 4], 8), (8, 1));
    }

    #[test]
    fn streamed_sums_equal_sums_of_whole_records() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 37 % 251) as u8).collect();
        let mut s = RecordSums::new();
        s.start(100);
        for piece in data.chunks(33) {
            s.update(piece);
        }
        let want: Vec<u32> = data.chunks(100).map(crc32).collect();
        assert_eq!(s.sums, want);
    }
}
