//! Read engines: how bytes leave the device.

use crate::IoError;
use std::fs::File;
use std::path::Path;
use std::time::Duration;

/// One read: fill `buf` from `offset`. At least `need` bytes must arrive (the rest of `buf` may
/// lie past the end of the file: direct reads are whole aligned blocks).
pub struct ReadOp<'a> {
    pub offset: u64,
    pub buf: &'a mut [u8],
    pub need: usize,
}

/// Something that reads byte ranges of one file. Engines are driven by one thread (the
/// [`crate::Reader`]'s), so they need not be `Sync`.
pub trait ReadEngine: Send {
    /// Short name for reports (`pread-direct`, `pread-buffered`, ...).
    fn name(&self) -> &'static str;
    /// Offsets, lengths and buffer addresses must be multiples of this.
    fn alignment(&self) -> usize;
    /// File size in bytes.
    fn size(&self) -> u64;
    /// Perform every op (an engine with a deeper queue may overlap them). Stops at the first
    /// failure and reports it.
    fn read_batch(&mut self, ops: &mut [ReadOp<'_>]) -> Result<(), IoError>;
}

impl ReadEngine for Box<dyn ReadEngine> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn alignment(&self) -> usize {
        (**self).alignment()
    }
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn read_batch(&mut self, ops: &mut [ReadOp<'_>]) -> Result<(), IoError> {
        (**self).read_batch(ops)
    }
}

/// `pread(2)` with `O_DIRECT` where the file system accepts it, else buffered reads whose pages
/// are dropped after each read (`POSIX_FADV_DONTNEED`), so repeated reads really go to the device.
pub struct PreadEngine {
    pub(crate) file: File,
    size: u64,
    direct: bool,
    fallback: Option<String>,
    keep_pages: bool,
}

/// Direct-I/O alignment: the largest logical block size in use (4 KiB covers UFS, eMMC and NVMe).
const DIRECT_ALIGN: usize = 4096;

impl PreadEngine {
    /// Open `path` for reading; `direct` asks for `O_DIRECT` (falls back, see
    /// [`PreadEngine::fallback_reason`]).
    pub fn open(path: impl AsRef<Path>, direct: bool) -> Result<Self, IoError> {
        let path = path.as_ref();
        let open_err = |source| IoError::Open {
            path: path.to_path_buf(),
            source,
        };
        let plain = File::open(path).map_err(open_err)?;
        let meta = plain.metadata().map_err(open_err)?;
        if meta.is_dir() {
            return Err(open_err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a directory",
            )));
        }
        let size = meta.len();
        let mut engine = Self {
            file: plain,
            size,
            direct: false,
            fallback: None,
            keep_pages: false,
        };
        if direct {
            match open_direct(path, size) {
                Ok(f) => {
                    engine.file = f;
                    engine.direct = true;
                }
                Err(why) => engine.fallback = Some(why),
            }
        }
        Ok(engine)
    }

    /// Buffered reads that keep their pages: after the first read the file is served from the
    /// page cache (the base of an emulated device, see [`emulated`]).
    pub fn open_cached(path: impl AsRef<Path>) -> Result<Self, IoError> {
        let mut e = Self::open(path, false)?;
        e.keep_pages = true;
        Ok(e)
    }

    /// Whether reads bypass the page cache with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Why `O_DIRECT` was asked for but is not used (e.g. tmpfs refuses it).
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    pub(crate) fn check_aligned(&self, op: &ReadOp<'_>) -> Result<(), IoError> {
        let align = self.alignment() as u64;
        if !op.offset.is_multiple_of(align)
            || !(op.buf.len() as u64).is_multiple_of(align)
            || !(op.buf.as_ptr() as u64).is_multiple_of(align)
        {
            return Err(IoError::Misaligned {
                offset: op.offset,
                len: op.buf.len(),
                align: align as usize,
            });
        }
        Ok(())
    }

    /// Finish `op` whose first `got` bytes have arrived (by another engine's submission, or
    /// none yet): read the rest, drop buffered pages, and check that `need` bytes arrived.
    pub(crate) fn read_rest(&self, op: &mut ReadOp<'_>, mut got: usize) -> Result<(), IoError> {
        // A direct read ends short of a block only at the end of the file.
        while got < op.buf.len() && (!self.direct || got.is_multiple_of(DIRECT_ALIGN)) {
            match pread(&self.file, &mut op.buf[got..], op.offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(IoError::Read {
                        offset: op.offset,
                        len: op.buf.len(),
                        source,
                    })
                }
            }
        }
        if !self.direct && !self.keep_pages {
            drop_pages(&self.file, op.offset, got);
        }
        if got < op.need {
            return Err(IoError::ShortRead {
                offset: op.offset,
                want: op.need,
                got,
            });
        }
        Ok(())
    }
}

impl ReadEngine for PreadEngine {
    fn name(&self) -> &'static str {
        if self.direct {
            "pread-direct"
        } else {
            "pread-buffered"
        }
    }

    fn alignment(&self) -> usize {
        if self.direct {
            DIRECT_ALIGN
        } else {
            1
        }
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_batch(&mut self, ops: &mut [ReadOp<'_>]) -> Result<(), IoError> {
        for op in ops.iter_mut() {
            self.check_aligned(op)?;
            self.read_rest(op, 0)?;
        }
        Ok(())
    }
}

#[cfg(unix)]
fn pread(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(f, buf, offset)
}

#[cfg(not(unix))]
fn pread(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(f, buf, offset)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn open_direct(path: &Path, size: u64) -> Result<File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("O_DIRECT open refused ({e})"))?;
    // Some file systems accept the flag and refuse the reads: probe one block.
    if size > 0 {
        let mut probe = crate::AlignedBuf::new(DIRECT_ALIGN, DIRECT_ALIGN);
        pread(&f, &mut probe, 0).map_err(|e| format!("O_DIRECT read refused ({e})"))?;
    }
    Ok(f)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn open_direct(_: &Path, _: u64) -> Result<File, String> {
    Err("O_DIRECT is not available on this OS".into())
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn drop_pages(f: &File, offset: u64, len: usize) {
    use std::os::fd::AsRawFd;
    // Advisory: failing only leaves pages cached.
    // SAFETY: plain syscall on an open descriptor.
    unsafe {
        libc::posix_fadvise(
            f.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn drop_pages(_: &File, _: u64, _: usize) {}

/// What a [`FaultEngine`] does wrong.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    /// Time every read takes at least (a slow device).
    pub latency: Duration,
    /// Time per byte read, in nanoseconds, added to `latency` (a device of limited bandwidth).
    /// A read takes `latency + ns_per_byte * len` in all, or the inner read's own time if
    /// that is longer.
    pub ns_per_byte: f64,
    /// Reads from this index on (0-based, counting reads) fail with `EIO`.
    pub eio_from: Option<u64>,
    /// This read returns half of what it should.
    pub short_at: Option<u64>,
}

/// An emulated flash device over `path`: reads served from the page cache, each taking
/// `plan`'s latency plus its per-byte time (the copy from the page cache counts towards it).
/// Where the real device's speed drifts (a shared virtual disk), this gives a device of known,
/// steady speed to check a planner's predictions against.
pub fn emulated(
    path: impl AsRef<Path>,
    plan: FaultPlan,
) -> Result<FaultEngine<PreadEngine>, IoError> {
    Ok(FaultEngine::new(PreadEngine::open_cached(path)?, plan))
}

/// Lets this thread's sleeps end within about a microsecond of their deadline instead of the
/// default 50 us timer slack, which would add 50 us to every emulated read.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn precise_sleep_slack() {
    thread_local!(static SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    SET.with(|set| {
        if !set.get() {
            // SAFETY: plain prctl on the calling thread; failing only keeps the default slack.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
            set.set(true);
        }
    });
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn precise_sleep_slack() {}

/// Wraps an engine and injects the faults of a [`FaultPlan`].
pub struct FaultEngine<E> {
    inner: E,
    plan: FaultPlan,
    reads: u64,
}

impl<E: ReadEngine> FaultEngine<E> {
    pub fn new(inner: E, plan: FaultPlan) -> Self {
        Self {
            inner,
            plan,
            reads: 0,
        }
    }

    /// Reads performed (or attempted) so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }
}

impl<E: ReadEngine> ReadEngine for FaultEngine<E> {
    fn name(&self) -> &'static str {
        "fault"
    }

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_batch(&mut self, ops: &mut [ReadOp<'_>]) -> Result<(), IoError> {
        for op in ops.iter_mut() {
            let i = self.reads;
            self.reads += 1;
            let delay = self.plan.latency
                + Duration::from_nanos((self.plan.ns_per_byte * op.buf.len() as f64) as u64);
            let start = std::time::Instant::now();
            if self.plan.eio_from.is_some_and(|k| i >= k) {
                return Err(IoError::Read {
                    offset: op.offset,
                    len: op.buf.len(),
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                });
            }
            self.inner.read_batch(std::slice::from_mut(op))?;
            // The read takes `delay` in all, not the inner read plus `delay`: an emulated
            // device faster than the page-cache copy under it runs at the copy's speed
            // instead of at the sum of both.
            if let Some(rest) = delay.checked_sub(start.elapsed()) {
                if !rest.is_zero() {
                    precise_sleep_slack();
                    std::thread::sleep(rest);
                }
            }
            if self.plan.short_at == Some(i) {
                return Err(IoError::ShortRead {
                    offset: op.offset,
                    want: op.need,
                    got: op.need / 2,
                });
            }
        }
        Ok(())
    }
}

/// Which read engine to open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoEngine {
    /// `pread`, one read at a time: portable (Android apps cannot count on io_uring).
    #[default]
    Pread,
    /// io_uring (Linux): the reader's `depth` reads in flight together.
    Uring,
}

/// An opened read engine, whether it reads with `O_DIRECT`, and why not if that was refused.
pub struct OpenedEngine {
    pub engine: Box<dyn ReadEngine>,
    pub direct: bool,
    pub fallback: Option<String>,
}

impl IoEngine {
    /// Opens `path` with this engine (`direct`: try `O_DIRECT`; `depth`: reads in flight, for
    /// io_uring's queue).
    pub fn open(self, path: &Path, direct: bool, depth: usize) -> Result<OpenedEngine, IoError> {
        match self {
            IoEngine::Pread => Ok(OpenedEngine::from_pread(PreadEngine::open(path, direct)?)),
            #[cfg(target_os = "linux")]
            IoEngine::Uring => {
                let e = crate::UringEngine::open(path, direct, depth)?;
                let (direct, fallback) = (e.is_direct(), e.fallback_reason().map(String::from));
                Ok(OpenedEngine {
                    engine: Box::new(e),
                    direct,
                    fallback,
                })
            }
            #[cfg(not(target_os = "linux"))]
            IoEngine::Uring => {
                let _ = depth;
                Err(IoError::Open {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::Unsupported,
                        "the io_uring engine needs Linux; use the pread engine",
                    ),
                })
            }
        }
    }
}

impl OpenedEngine {
    /// A `pread` engine, as opened.
    pub fn from_pread(e: PreadEngine) -> Self {
        let (direct, fallback) = (e.is_direct(), e.fallback_reason().map(String::from));
        OpenedEngine {
            engine: Box::new(e),
            direct,
            fallback,
        }
    }
}
