//! One layer's activation codes as the profiler records them (a byte per token and neuron, in
//! token order): in memory, or appended to an unnamed temporary file so that profiling a long
//! calibration text holds one batch of codes instead of all of them (4,096 tokens of a
//! 24-layer model with 4,864 neurons a layer are 478 MB of codes).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

pub(crate) struct Codes {
    store: Store,
    len: u64,
}

enum Store {
    Memory(Vec<u8>),
    /// Unnamed: the system removes it when it is closed, even if the process is killed.
    File(File),
}

impl Codes {
    pub(crate) fn in_memory() -> Self {
        Self {
            store: Store::Memory(Vec::new()),
            len: 0,
        }
    }

    /// Codes kept in a temporary file in `dir`.
    pub(crate) fn in_file(dir: &Path) -> io::Result<Self> {
        Ok(Self {
            store: Store::File(tempfile::tempfile_in(dir)?),
            len: 0,
        })
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Bytes held in memory.
    pub(crate) fn memory_bytes(&self) -> usize {
        match &self.store {
            Store::Memory(v) => v.capacity(),
            Store::File(_) => 0,
        }
    }

    pub(crate) fn append(&mut self, codes: &[u8]) -> io::Result<()> {
        match &mut self.store {
            Store::Memory(v) => v.extend_from_slice(codes),
            Store::File(f) => f.write_all(codes)?,
        }
        self.len += codes.len() as u64;
        Ok(())
    }

    /// Calls `f` on the codes from the first in order, in pieces of whole rows of `row` bytes.
    pub(crate) fn for_each_rows(&mut self, row: usize, mut f: impl FnMut(&[u8])) -> io::Result<()> {
        match &mut self.store {
            Store::Memory(v) => {
                f(v);
                Ok(())
            }
            Store::File(file) => {
                file.seek(SeekFrom::Start(0))?;
                let rows_per_read = ((4 << 20) / row.max(1)).max(1);
                let mut buf = vec![0u8; rows_per_read * row];
                let mut left = self.len;
                while left > 0 {
                    let n = (buf.len() as u64).min(left) as usize;
                    file.read_exact(&mut buf[..n])?;
                    f(&buf[..n]);
                    left -= n as u64;
                }
                file.seek(SeekFrom::End(0))?;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_gives_back_what_memory_does_in_whole_rows() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..5_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (mut mem, mut file) = (Codes::in_memory(), Codes::in_file(dir.path()).unwrap());
        for piece in data.chunks(333_333) {
            mem.append(piece).unwrap();
            file.append(piece).unwrap();
        }
        assert_eq!(
            (mem.len(), file.len()),
            (data.len() as u64, data.len() as u64)
        );
        assert_eq!(file.memory_bytes(), 0);
        let row = 1000;
        for codes in [&mut mem, &mut file] {
            let mut back = Vec::new();
            codes
                .for_each_rows(row, |p| {
                    assert_eq!(p.len() % row, 0);
                    back.extend_from_slice(p)
                })
                .unwrap();
            assert_eq!(back, data);
        }
        // Appending after a read goes on at the end.
        file.append(&[9]).unwrap();
        let mut last = 0;
        file.for_each_rows(1, |p| last = *p.last().unwrap())
            .unwrap();
        assert_eq!(last, 9);
        // Nothing is left in the folder.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
