//! The single-queue reader: one I/O thread owns every submission to the device.

use crate::{AlignedBuf, Checksums, IoError, ReadEngine, ReadOp};
use crossbeam::channel::{bounded, Receiver, Sender, TryRecvError};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// How the I/O thread shapes reads.
#[derive(Clone, Debug)]
pub struct ReaderConfig {
    /// Largest single read in bytes: nearby requests merge up to this; larger requests are split.
    pub max_request: usize,
    /// Reads handed to the engine at once (the device queue depth the planner chose).
    pub depth: usize,
    /// Two requests whose aligned ranges are at most this many bytes apart are read as one
    /// (reading a small gap costs less than another command on UFS).
    pub merge_gap: usize,
}

/// Alignment the reader's buffers are sized for: the largest an `O_DIRECT` file asks.
const MAX_ALIGN: usize = 4096;

impl ReaderConfig {
    /// Bytes of the buffers the I/O thread holds: one largest request (and its alignment
    /// slack) per read in flight. A budget charges them.
    pub fn buffer_bytes(&self) -> u64 {
        let request = self.max_request.max(MAX_ALIGN).div_ceil(MAX_ALIGN) * MAX_ALIGN;
        (self.depth.max(1) * (request + 2 * MAX_ALIGN)) as u64
    }
}

impl Default for ReaderConfig {
    fn default() -> Self {
        Self {
            max_request: 128 << 10,
            depth: 4,
            merge_gap: 0,
        }
    }
}

/// Read `len` bytes at `offset` into `dst`; `tag` comes back in the [`Completion`].
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub offset: u64,
    pub len: usize,
    pub dst: *mut u8,
    pub tag: u64,
}

// SAFETY: `dst` is only written by the I/O thread, under the contract of `Reader::submit`.
unsafe impl Send for Request {}

/// One finished request. After an `Err` the caller should stop: a request split into several
/// reads may also report later pieces.
#[derive(Debug)]
pub struct Completion {
    pub tag: u64,
    pub result: Result<(), IoError>,
}

/// Counters since the reader started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderStats {
    /// Requests submitted.
    pub requests: u64,
    /// Bytes the requests asked for.
    pub bytes_requested: u64,
    /// Reads sent to the device after merging.
    pub reads: u64,
    /// Bytes the device delivered (aligned, merged ranges).
    pub bytes_read: u64,
    /// Time spent inside the engine, in nanoseconds.
    pub busy_ns: u64,
    /// The I/O thread's own work outside the engine, in nanoseconds: shaping batches into
    /// reads, then copying each request to its destination, checking it and reporting it.
    pub handling_ns: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    bytes_requested: AtomicU64,
    reads: AtomicU64,
    bytes_read: AtomicU64,
    busy_ns: AtomicU64,
    handling_ns: AtomicU64,
    completed: AtomicU64,
}

struct Shared {
    pending: Mutex<Vec<Request>>,
    wake: Condvar,
    stop: AtomicBool,
    counters: Counters,
}

/// The I/O thread and its queues.
pub struct Reader {
    shared: Arc<Shared>,
    done: Receiver<Completion>,
    thread: Option<std::thread::JoinHandle<()>>,
    engine_name: &'static str,
    depth: usize,
    size: u64,
}

/// Completions the I/O thread may have ready before the consumer takes them (preallocated).
const COMPLETION_CAPACITY: usize = 1 << 15;

impl Reader {
    /// Start the I/O thread over `engine`.
    pub fn new(engine: impl ReadEngine + 'static, cfg: ReaderConfig) -> Result<Self, IoError> {
        Self::with_checksums(engine, cfg, None)
    }

    /// Start the I/O thread over `engine`, checking every record of `sums` (when given) that a
    /// request holds whole before reporting the request: a mismatch is the request's error.
    pub fn with_checksums(
        engine: impl ReadEngine + 'static,
        cfg: ReaderConfig,
        sums: Option<Arc<Checksums>>,
    ) -> Result<Self, IoError> {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let (tx, done) = bounded(COMPLETION_CAPACITY);
        let (engine_name, size, depth) = (engine.name(), engine.size(), cfg.depth.max(1));
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pi2-io".into())
            .spawn(move || io_thread(engine, cfg, sh, tx, sums))
            .map_err(|source| IoError::Thread { source })?;
        Ok(Self {
            shared,
            done,
            thread: Some(thread),
            engine_name,
            depth,
            size,
        })
    }

    /// The engine's name (`pread-direct`, ...).
    pub fn engine_name(&self) -> &'static str {
        self.engine_name
    }

    /// Reads handed to the engine at once.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Size of the file being read.
    pub fn file_size(&self) -> u64 {
        self.size
    }

    /// Queue requests. Each gets exactly one successful [`Completion`] (or an error one).
    ///
    /// # Safety
    /// Every `dst` must point to `len` writable bytes that nothing reads or writes until the
    /// request's completion has been received, and that outlive it.
    pub unsafe fn submit(&self, reqs: &[Request]) -> Result<(), IoError> {
        if let Some(r) = reqs.iter().find(|r| {
            r.offset
                .checked_add(r.len as u64)
                .is_none_or(|e| e > self.size)
        }) {
            return Err(IoError::OutOfRange {
                offset: r.offset,
                len: r.len,
                size: self.size,
            });
        }
        if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
            return Err(IoError::Closed);
        }
        let c = &self.shared.counters;
        c.requests.fetch_add(reqs.len() as u64, Relaxed);
        c.bytes_requested
            .fetch_add(reqs.iter().map(|r| r.len as u64).sum(), Relaxed);
        self.shared.pending.lock().extend_from_slice(reqs);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// The next completion (blocks).
    pub fn recv(&self) -> Result<Completion, IoError> {
        let c = self.done.recv().map_err(|_| IoError::Closed)?;
        self.shared.counters.completed.fetch_add(1, Relaxed);
        Ok(c)
    }

    /// A completion if one is ready.
    pub fn try_recv(&self) -> Result<Option<Completion>, IoError> {
        match self.done.try_recv() {
            Ok(c) => {
                self.shared.counters.completed.fetch_add(1, Relaxed);
                Ok(Some(c))
            }
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(IoError::Closed),
        }
    }

    /// Read `dst.len()` bytes at `offset` and wait. Only while no other request is outstanding
    /// (it would consume their completions).
    pub fn read_exact_at(&self, offset: u64, dst: &mut [u8]) -> Result<(), IoError> {
        assert_eq!(
            self.outstanding(),
            0,
            "read_exact_at with requests in flight"
        );
        let req = Request {
            offset,
            len: dst.len(),
            dst: dst.as_mut_ptr(),
            tag: u64::MAX,
        };
        // SAFETY: `dst` is borrowed mutably until the completion is received below.
        unsafe { self.submit(&[req])? };
        self.recv()?.result
    }

    /// Requests submitted and not yet received as completions (counting split pieces once).
    pub fn outstanding(&self) -> u64 {
        let c = &self.shared.counters;
        c.requests
            .load(Relaxed)
            .saturating_sub(c.completed.load(Relaxed))
    }

    pub fn stats(&self) -> ReaderStats {
        let c = &self.shared.counters;
        ReaderStats {
            requests: c.requests.load(Relaxed),
            bytes_requested: c.bytes_requested.load(Relaxed),
            reads: c.reads.load(Relaxed),
            bytes_read: c.bytes_read.load(Relaxed),
            busy_ns: c.busy_ns.load(Relaxed),
            handling_ns: c.handling_ns.load(Relaxed),
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        // Take the lock so the I/O thread is either waiting (and gets the notification) or will
        // see `stop` before it waits.
        drop(self.shared.pending.lock());
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A piece of a request (requests larger than `max_request` are split).
#[derive(Clone, Copy)]
struct Piece {
    offset: u64,
    len: usize,
    dst: *mut u8,
    tag: u64,
    /// The whole request, on its last piece (checked once all of it has landed).
    last: Option<Request>,
    /// Where the request starts.
    first: u64,
}

/// A device read covering consecutive pieces.
struct Span {
    start: u64,
    end: u64,
    need_end: u64,
    pieces: std::ops::Range<usize>,
}

/// Merges sorted pieces `(offset, len)` into aligned device reads of at most `max_request`,
/// handing each finished read to `emit`.
fn merge_spans(
    pieces: impl Iterator<Item = (u64, usize)>,
    align: u64,
    max_request: u64,
    merge_gap: u64,
    mut emit: impl FnMut(Span),
) {
    let mut open: Option<Span> = None;
    // Alignments are powers of two in practice: masks instead of divisions (planners call
    // this for millions of rows).
    let mask = align.is_power_of_two().then_some(align - 1);
    for (i, (offset, len)) in pieces.enumerate() {
        let (start, end) = match mask {
            Some(m) => (offset & !m, (offset + len as u64 + m) & !m),
            None => (
                offset / align * align,
                (offset + len as u64).div_ceil(align) * align,
            ),
        };
        let need_end = offset + len as u64;
        if let Some(s) = open.as_mut() {
            let new_end = s.end.max(end);
            if start <= s.end + merge_gap && new_end - s.start <= max_request {
                s.end = new_end;
                s.need_end = s.need_end.max(need_end);
                s.pieces.end = i + 1;
                continue;
            }
        }
        if let Some(s) = open.replace(Span {
            start,
            end,
            need_end,
            pieces: i..i + 1,
        }) {
            emit(s);
        }
    }
    if let Some(s) = open {
        emit(s);
    }
}

/// The device reads (aligned `(offset, len)`) the reader issues for one batch of requests
/// `(offset, len)` submitted together, with `align` the engine's alignment: what a planner
/// needs to predict I/O time exactly as the reader will shape it.
pub fn device_reads(
    requests: &[(u64, usize)],
    align: usize,
    cfg: &ReaderConfig,
) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    let mut scratch = requests.to_vec();
    for_each_device_read(&mut scratch, align, cfg, |o, l| out.push((o, l)));
    out
}

/// [`device_reads`] without allocating: `requests` is reordered (and large ones split) in
/// place, and each device read goes to `read`.
pub fn for_each_device_read(
    requests: &mut Vec<(u64, usize)>,
    align: usize,
    cfg: &ReaderConfig,
    mut read: impl FnMut(u64, usize),
) {
    let align = align.max(1) as u64;
    let max_request = (cfg.max_request as u64).max(align).div_ceil(align) * align;
    let max = max_request as usize;
    if requests.iter().any(|r| r.1 > max) {
        let whole = std::mem::take(requests);
        for (offset, len) in whole {
            let mut off = 0usize;
            loop {
                let l = (len - off).min(max);
                requests.push((offset + off as u64, l));
                off += l;
                if off >= len {
                    break;
                }
            }
        }
    }
    if !requests.is_sorted_by_key(|p| p.0) {
        requests.sort_unstable_by_key(|p| p.0);
    }
    merge_spans(
        requests.iter().copied(),
        align,
        max_request,
        cfg.merge_gap as u64,
        |s| read(s.start, (s.end - s.start) as usize),
    );
}

fn io_thread<E: ReadEngine>(
    mut engine: E,
    cfg: ReaderConfig,
    shared: Arc<Shared>,
    done: Sender<Completion>,
    sums: Option<Arc<Checksums>>,
) {
    let align = engine.alignment().max(1) as u64;
    let max_request = (cfg.max_request as u64).max(align).div_ceil(align) * align;
    let depth = cfg.depth.max(1);
    let cap = (max_request + 2 * align) as usize;
    let mut bufs: Vec<AlignedBuf> = (0..depth)
        .map(|_| AlignedBuf::new(cap, align as usize))
        .collect();
    let (mut batch, mut pieces, mut spans) = (Vec::new(), Vec::<Piece>::new(), Vec::<Span>::new());
    // Requests of this batch a piece of which failed (their error is already reported).
    let mut failed = Vec::<u64>::new();
    let c = &shared.counters;
    loop {
        {
            let mut pending = shared.pending.lock();
            while pending.is_empty() {
                if shared.stop.load(Relaxed) {
                    return;
                }
                shared.wake.wait(&mut pending);
            }
            std::mem::swap(&mut *pending, &mut batch);
        }
        let (batch_start, mut batch_busy) = (Instant::now(), 0u64);
        pieces.clear();
        failed.clear();
        for r in batch.drain(..) {
            let mut off = 0usize;
            loop {
                let len = (r.len - off).min(max_request as usize);
                pieces.push(Piece {
                    offset: r.offset + off as u64,
                    len,
                    // SAFETY: within the request's destination (contract of `submit`).
                    dst: unsafe { r.dst.add(off) },
                    tag: r.tag,
                    last: (off + len == r.len).then_some(r),
                    first: r.offset,
                });
                off += len;
                if off >= r.len {
                    break;
                }
            }
        }
        // Device order: ascending offsets, so merged reads and the flash's locality both help.
        pieces.sort_unstable_by_key(|p| p.offset);
        spans.clear();
        merge_spans(
            pieces.iter().map(|p| (p.offset, p.len)),
            align,
            max_request,
            cfg.merge_gap as u64,
            |s| spans.push(s),
        );
        for group in spans.chunks(depth) {
            let t0 = Instant::now();
            let mut ops: Vec<ReadOp<'_>> = group
                .iter()
                .zip(bufs.iter_mut())
                .map(|(s, b)| ReadOp {
                    offset: s.start,
                    buf: &mut b[..(s.end - s.start) as usize],
                    need: (s.need_end - s.start) as usize,
                })
                .collect();
            let result = engine.read_batch(&mut ops);
            drop(ops);
            let busy = t0.elapsed().as_nanos() as u64;
            batch_busy += busy;
            c.busy_ns.fetch_add(busy, Relaxed);
            c.reads.fetch_add(group.len() as u64, Relaxed);
            c.bytes_read
                .fetch_add(group.iter().map(|s| s.end - s.start).sum(), Relaxed);
            for (s, b) in group.iter().zip(&bufs) {
                for p in &pieces[s.pieces.clone()] {
                    let sent = match &result {
                        Ok(()) => {
                            let at = (p.offset - s.start) as usize;
                            // SAFETY: `dst` has `len` bytes reserved for this request.
                            unsafe {
                                std::ptr::copy_nonoverlapping(b[at..].as_ptr(), p.dst, p.len)
                            };
                            let Some(whole) = p.last else {
                                continue;
                            };
                            match &sums {
                                // SAFETY: the request's pieces are copied in offset order and
                                // none failed, so all of its `len` (> 0) bytes have landed.
                                Some(sums) if whole.len > 0 && !failed.contains(&p.first) => sums
                                    .verify(whole.offset, unsafe {
                                        std::slice::from_raw_parts(whole.dst, whole.len)
                                    }),
                                _ => Ok(()),
                            }
                        }
                        Err(e) => {
                            failed.push(p.first);
                            Err(e.duplicate())
                        }
                    };
                    if done
                        .send(Completion {
                            tag: p.tag,
                            result: sent,
                        })
                        .is_err()
                    {
                        return; // the reader is gone
                    }
                }
            }
        }
        let batch_ns = batch_start.elapsed().as_nanos() as u64;
        c.handling_ns
            .fetch_add(batch_ns.saturating_sub(batch_busy), Relaxed);
    }
}
