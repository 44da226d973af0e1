//! Device measurement: throughput and latency of random reads against read size, queue depth
//! (concurrent submitters) and the span of the file they fall in. The planner reads these.

use crate::{AlignedBuf, IoError, PreadEngine, ReadEngine, ReadOp};
use std::path::Path;
use std::time::{Duration, Instant};

/// One measured point.
#[derive(Clone, Debug, PartialEq)]
pub struct IoPoint {
    /// Bytes per read.
    pub read_size: usize,
    /// Threads submitting at once.
    pub depth: usize,
    /// Reads fall at random aligned offsets in the first `span` bytes of the file.
    pub span: u64,
    pub reads: u64,
    /// Bytes per second over all threads.
    pub bytes_per_sec: f64,
    /// Per-read latency percentiles in microseconds.
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    /// Engine used (`pread-direct` unless the file system refused it).
    pub engine: &'static str,
}

impl IoPoint {
    /// The header of the markdown table whose rows `Display` writes.
    pub const MARKDOWN_HEADER: &'static str = "| read size | depth | span | MB/s | p50 us | p99 us | engine |\n| --------: | ----: | ---: | ---: | -----: | -----: | ------ |";
}

/// A markdown row: read size, depth, span, throughput, latencies, engine.
impl std::fmt::Display for IoPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "| {} | {} | {:.1} MiB | {:.1} | {:.0} | {:.0} | {} |",
            self.read_size,
            self.depth,
            self.span as f64 / (1 << 20) as f64,
            self.bytes_per_sec / 1e6,
            self.lat_p50_us,
            self.lat_p99_us,
            self.engine
        )
    }
}

/// Small, fast, seedable generator for offsets (no dependency needed for this).
struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Random reads of `read_size` bytes from `depth` threads for about `time`.
pub fn measure(
    path: &Path,
    read_size: usize,
    depth: usize,
    span: u64,
    time: Duration,
) -> Result<IoPoint, IoError> {
    measure_with(path, read_size, depth, span, time, None)
}

/// [`measure`], on the device [`crate::emulated`] builds from `emulate` when given.
pub fn measure_with(
    path: &Path,
    read_size: usize,
    depth: usize,
    span: u64,
    time: Duration,
    emulate: Option<&crate::FaultPlan>,
) -> Result<IoPoint, IoError> {
    let depth = depth.max(1);
    let open = || -> Result<Box<dyn ReadEngine>, IoError> {
        Ok(match emulate {
            Some(plan) => Box::new(crate::emulated(path, plan.clone())?),
            None => Box::new(PreadEngine::open(path, true)?),
        })
    };
    let probe = open()?;
    let (size, align, engine) = (probe.size(), probe.alignment().max(512), probe.name());
    drop(probe);
    let (read_size, span, slots) = geometry(size, align, read_size, span)?;
    let results: Vec<Result<Vec<u64>, IoError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..depth)
            .map(|t| {
                s.spawn(move || {
                    let mut eng = open()?;
                    let mut buf = AlignedBuf::new(read_size, align);
                    let mut rng = SplitMix(0x5eed + t as u64);
                    let mut lat = Vec::new();
                    let start = Instant::now();
                    while start.elapsed() < time || lat.len() < 8 {
                        let offset = rng.next() % slots * align as u64;
                        let t0 = Instant::now();
                        eng.read_batch(&mut [ReadOp {
                            offset,
                            buf: &mut buf[..read_size],
                            need: read_size,
                        }])?;
                        lat.push(t0.elapsed().as_nanos() as u64);
                    }
                    Ok(lat)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("profiling thread"))
            .collect()
    });
    let mut all = Vec::new();
    let mut busiest = 0u64;
    for r in results {
        let lat = r?;
        busiest = busiest.max(lat.iter().sum());
        all.extend(lat);
    }
    Ok(point(read_size, depth, span, all, busiest, engine))
}

/// Reads rounded up to the engine's alignment, the aligned span of a `size`-byte file they fall
/// in, and how many aligned offsets a read can start at.
fn geometry(
    size: u64,
    align: usize,
    read_size: usize,
    span: u64,
) -> Result<(usize, u64, u64), IoError> {
    let read_size = read_size.div_ceil(align) * align;
    let span = span.min(size) / align as u64 * align as u64;
    if span < read_size as u64 {
        return Err(IoError::OutOfRange {
            offset: 0,
            len: read_size,
            size,
        });
    }
    Ok((
        read_size,
        span,
        (span - read_size as u64) / align as u64 + 1,
    ))
}

/// A point from every read's latency (ns) and the busiest submitter's total time (ns).
fn point(
    read_size: usize,
    depth: usize,
    span: u64,
    mut lat: Vec<u64>,
    busy_ns: u64,
    engine: &'static str,
) -> IoPoint {
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1e3;
    IoPoint {
        read_size,
        depth,
        span,
        reads: lat.len() as u64,
        bytes_per_sec: (lat.len() * read_size) as f64 / (busy_ns.max(1) as f64 / 1e9),
        lat_p50_us: pct(0.5),
        lat_p99_us: pct(0.99),
        engine,
    }
}

/// Random reads of `read_size` bytes for about `time`, `depth` at a time from one thread
/// through an io_uring ([`crate::UringEngine`], `O_DIRECT` where allowed): the way the
/// [`crate::Reader`] drives that engine, one group of `depth` reads per submission. Each read's
/// latency is its group's.
#[cfg(target_os = "linux")]
pub fn measure_uring(
    path: &Path,
    read_size: usize,
    depth: usize,
    span: u64,
    time: Duration,
) -> Result<IoPoint, IoError> {
    let depth = depth.max(1);
    let mut eng = crate::UringEngine::open(path, true, depth)?;
    let (size, align, engine) = (eng.size(), eng.alignment().max(512), eng.name());
    let (read_size, span, slots) = geometry(size, align, read_size, span)?;
    let mut bufs: Vec<AlignedBuf> = (0..depth)
        .map(|_| AlignedBuf::new(read_size, align))
        .collect();
    let mut rng = SplitMix(0x5eed);
    let (mut lat, mut busy) = (Vec::new(), 0u64);
    let start = Instant::now();
    while start.elapsed() < time || lat.len() < 8 {
        let mut ops: Vec<ReadOp<'_>> = bufs
            .iter_mut()
            .map(|b| ReadOp {
                offset: rng.next() % slots * align as u64,
                buf: &mut b[..read_size],
                need: read_size,
            })
            .collect();
        let t0 = Instant::now();
        eng.read_batch(&mut ops)?;
        let dt = t0.elapsed().as_nanos() as u64;
        busy += dt;
        lat.extend(std::iter::repeat_n(dt, depth));
    }
    Ok(point(read_size, depth, span, lat, busy, engine))
}

/// The I/O thread's own cost of landing requests of one size, measured through the real
/// [`crate::Reader`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HandlingPoint {
    /// Bytes per request (one checksummed record each).
    pub request_len: usize,
    pub requests: u64,
    /// Nanoseconds of [`crate::ReaderStats::handling_ns`] per request.
    pub ns_per_request: f64,
}

/// A device that is memory: what is left of a read's time is the reader's own work.
struct MemoryEngine(Vec<u8>);

impl ReadEngine for MemoryEngine {
    fn name(&self) -> &'static str {
        "memory"
    }
    fn alignment(&self) -> usize {
        1
    }
    fn size(&self) -> u64 {
        self.0.len() as u64
    }
    fn read_batch(&mut self, ops: &mut [ReadOp<'_>]) -> Result<(), IoError> {
        for op in ops {
            let at = op.offset as usize;
            op.buf.copy_from_slice(&self.0[at..at + op.buf.len()]);
        }
        Ok(())
    }
}

/// Bytes of records the handling measurement reads from, and of the slots they land in:
/// beyond the last-level cache, as a neuron cache is.
const HANDLING_BYTES: usize = 32 << 20;

/// The I/O thread's work per request of `request_len` bytes, as decode asks for neuron rows:
/// every other record of a layer-sized run submitted at once (so reads merge as `cfg` says),
/// each landing in its slot, checked against its CRC-32 and reported to a consumer
/// that blocks in [`crate::Reader::recv`]. For about `time`.
pub fn measure_handling(
    request_len: usize,
    cfg: &crate::ReaderConfig,
    time: Duration,
) -> Result<HandlingPoint, IoError> {
    let request_len = request_len.max(1);
    let records = (HANDLING_BYTES / request_len).max(2);
    let mut rng = SplitMix(0x1a2d);
    let file: Vec<u8> = (0..records * request_len)
        .map(|_| rng.next() as u8)
        .collect();
    let sums = crate::Checksums::new(vec![crate::SumRegion {
        name: "records".into(),
        offset: 0,
        record_len: request_len as u64,
        sums: file.chunks(request_len).map(crate::crc32).collect(),
    }])?;
    // Slots in order: a cache that streams (every row read, the least recently used slot
    // given to the next) hands them out in the order it filled them.
    // Declared before the reader, so the reader (and its thread) is dropped first even on an
    // early return with requests in flight.
    let n_slots = records / 2;
    let mut dst = vec![0u8; n_slots * request_len];
    let reader = crate::Reader::with_checksums(
        MemoryEngine(file),
        cfg.clone(),
        Some(std::sync::Arc::new(sums)),
    )?;
    let per_batch = 4096.min(n_slots);
    let start = Instant::now();
    let mut first = 0;
    while start.elapsed() < time || reader.stats().requests < 8 {
        let base = dst.as_mut_ptr();
        let reqs: Vec<crate::Request> = (first..first + per_batch)
            .map(|k| k % n_slots)
            .map(|k| crate::Request {
                offset: (2 * k * request_len) as u64,
                len: request_len,
                // SAFETY: slot `k` lies inside `dst`.
                dst: unsafe { base.add(k * request_len) },
                tag: k as u64,
            })
            .collect();
        // SAFETY: `dst` outlives the requests, which are all received before the next batch
        // (distinct slots within a batch: `per_batch` <= the number of slots).
        unsafe { reader.submit(&reqs)? };
        for _ in 0..reqs.len() {
            reader.recv()?.result?;
        }
        first = (first + per_batch) % n_slots;
    }
    let s = reader.stats();
    Ok(HandlingPoint {
        request_len,
        requests: s.requests,
        ns_per_request: s.handling_ns as f64 / s.requests.max(1) as f64,
    })
}

/// Bytes an unprivileged writer may still put on the file system holding `dir` (`None` where
/// the system does not say).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: a zeroed plain C struct for the kernel to fill.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid C string and `st` a writable statvfs.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0 {
            return Some(st.f_bavail as u64 * st.f_frsize as u64);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handling_is_measured_for_every_request() {
        let cfg = crate::ReaderConfig {
            max_request: 512 << 10,
            depth: 1,
            merge_gap: 64 << 10,
        };
        let p = measure_handling(1000, &cfg, Duration::from_millis(20)).unwrap();
        assert_eq!(p.request_len, 1000);
        assert!(p.requests >= 4096, "{p:?}");
        // Copying and checking 1000 bytes takes some time, and far less than a millisecond.
        assert!(p.ns_per_request > 0.0 && p.ns_per_request < 1e6, "{p:?}");
    }
}
