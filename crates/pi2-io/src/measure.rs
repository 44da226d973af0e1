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
