//! The io_uring engine (Linux): one thread submits a whole batch of reads to the kernel at once
//! and the device works on up to `depth` of them together. Still one submitter, as the
//! single-queue flash of phones wants, but with a queue depth the `pread` engine cannot give.

use crate::engine::{PreadEngine, ReadEngine, ReadOp};
use crate::IoError;
use io_uring::{opcode, types, IoUring};
use std::os::fd::AsRawFd;
use std::path::Path;

/// Reads through an io_uring of `depth` entries, on a file opened as [`PreadEngine::open`]
/// opens it (`O_DIRECT` where allowed; else buffered with the pages dropped after each read).
pub struct UringEngine {
    file: PreadEngine,
    ring: IoUring,
    depth: usize,
    /// Bytes that arrived per op of the current group.
    got: Vec<Result<usize, std::io::Error>>,
}

impl UringEngine {
    /// Open `path` with a ring of `depth` entries. Fails with [`IoError::Open`] when the kernel
    /// has no io_uring (older than 5.6, disabled by `kernel.io_uring_disabled`, or filtered by
    /// a seccomp policy as on Android).
    pub fn open(path: impl AsRef<Path>, direct: bool, depth: usize) -> Result<Self, IoError> {
        let path = path.as_ref();
        let file = PreadEngine::open(path, direct)?;
        let depth = depth.clamp(1, 4096);
        let ring = IoUring::new(depth as u32).map_err(|e| IoError::Open {
            path: path.to_path_buf(),
            source: std::io::Error::new(e.kind(), format!("io_uring unavailable ({e})")),
        })?;
        Ok(Self {
            file,
            ring,
            depth,
            got: Vec::with_capacity(depth),
        })
    }

    pub fn is_direct(&self) -> bool {
        self.file.is_direct()
    }

    /// Why `O_DIRECT` was asked for but is not used.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.file.fallback_reason()
    }

    /// Reads kept in flight at once.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Submit `ops` (at most `depth`) and wait for all of them; each op's bytes or error lands
    /// in `self.got`.
    fn submit_group(&mut self, ops: &mut [ReadOp<'_>]) -> Result<(), std::io::Error> {
        let fd = types::Fd(self.file.file.as_raw_fd());
        self.got.clear();
        self.got.extend(ops.iter().map(|_| Ok(0)));
        {
            let mut sq = self.ring.submission();
            for (i, op) in ops.iter_mut().enumerate() {
                let len = u32::try_from(op.buf.len()).unwrap_or(u32::MAX);
                let entry = opcode::Read::new(fd, op.buf.as_mut_ptr(), len)
                    .offset(op.offset)
                    .build()
                    .user_data(i as u64);
                // SAFETY: the buffer stays borrowed (and unread) until this function has
                // reaped every completion below; the queue has room for `depth` entries.
                unsafe { sq.push(&entry).expect("the group fits the ring") };
            }
        }
        let mut left = ops.len();
        while left > 0 {
            match self.ring.submit_and_wait(left) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Entries may already be in flight into the buffers: wait them out.
                    while left > 0 && self.ring.submit_and_wait(left).is_ok() {
                        left -= self.ring.completion().count();
                    }
                    return Err(e);
                }
            }
            for cqe in self.ring.completion() {
                let res = cqe.result();
                self.got[cqe.user_data() as usize] = if res >= 0 {
                    Ok(res as usize)
                } else {
                    Err(std::io::Error::from_raw_os_error(-res))
                };
                left -= 1;
            }
        }
        Ok(())
    }
}

impl ReadEngine for UringEngine {
    fn name(&self) -> &'static str {
        if self.file.is_direct() {
            "uring-direct"
        } else {
            "uring-buffered"
        }
    }

    fn alignment(&self) -> usize {
        self.file.alignment()
    }

    fn size(&self) -> u64 {
        self.file.size()
    }

    fn read_batch(&mut self, ops: &mut [ReadOp<'_>]) -> Result<(), IoError> {
        for op in ops.iter() {
            self.file.check_aligned(op)?;
        }
        for group in ops.chunks_mut(self.depth) {
            if let Err(source) = self.submit_group(group) {
                let op = &group[0];
                return Err(IoError::Read {
                    offset: op.offset,
                    len: op.buf.len(),
                    source,
                });
            }
            for (i, op) in group.iter_mut().enumerate() {
                match std::mem::replace(&mut self.got[i], Ok(0)) {
                    // Short (end of file, or a signal) or complete: the synchronous path
                    // finishes it, drops buffered pages and checks `need`.
                    Ok(n) => self.file.read_rest(op, n)?,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                        self.file.read_rest(op, 0)?
                    }
                    Err(source) => {
                        return Err(IoError::Read {
                            offset: op.offset,
                            len: op.buf.len(),
                            source,
                        })
                    }
                }
            }
        }
        Ok(())
    }
}
