//! The hardware profile: per core class and thread count, the throughput of pi2's own kernels
//! (by operation and quantization type) and the fixed cost of a parallel step; memory
//! bandwidth; and the flash profile (time per read against read size and depth).
//!
//! Profiled once per device (`pi2 profile-hw` caches it) and identified by a fingerprint that can
//! be recomputed cheaply at run time, so a plan made on another device is refused.

use crate::PlanError;
use pi2_kernels::{
    axpy_rows_by, gather_matvec_by, matmul, ActBuf, KernelSet, MatRef, QuantType, Tier,
};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::{Duration, Instant};

mod flash;
pub use flash::measure_flash;

/// Bumped whenever the profile's meaning changes; older profiles are refused.
pub const HW_VERSION: u32 = 4;

/// A kernel operation as the engine uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelOp {
    /// Dense matrix x one vector (attention, output, predictor, dense FFN), split by rows.
    Matvec,
    /// Rows picked by index, dotted with one vector (gate and up rows of sparse decode),
    /// computed by clusters of 64 in parallel.
    Gather,
    /// `y += c_k * row_k` over picked rows (down rows of sparse decode), by clusters.
    Axpy,
    /// Dense matrix x a batch of 32 vectors (prefill).
    Matmul,
}

/// Throughput of one operation on one type: a row of `b` bytes costs `row_ns + b / bytes_per_sec`
/// (for [`KernelOp::Matmul`], per token of the batch).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelRate {
    pub op: KernelOp,
    /// Quantization type name as pi2 prints it (`Q4_1`, `Q8_0`, ...).
    pub ty: String,
    pub row_ns: f64,
    pub bytes_per_sec: f64,
}

/// What `threads` threads of one core class achieve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadRates {
    pub threads: usize,
    pub kernels: Vec<KernelRate>,
    /// Fixed cost of one parallel step (fork, join) in nanoseconds.
    pub step_ns: f64,
    /// Streaming read bandwidth from RAM.
    pub mem_bytes_per_sec: f64,
    /// Serial vector work (activation quantization, SiLU, norms, bookkeeping between the
    /// parallel steps), in nanoseconds per element on the thread that drives the steps.
    pub serial_ns_per_elem: f64,
}

/// Cores sharing one maximum frequency.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoreClass {
    pub name: String,
    pub max_freq_khz: Option<u64>,
    pub cpus: Vec<usize>,
    /// One entry per thread count measured (1..=cpus.len()).
    pub rates: Vec<ThreadRates>,
}

/// One measured flash point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlashPoint {
    pub read_size: usize,
    pub depth: usize,
    pub bytes_per_sec: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
}

/// The storage the model lives on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlashProfile {
    /// Read engine used (`pread-direct` unless the file system refused O_DIRECT).
    pub engine: String,
    /// Reads the engine keeps in flight at once (the pread engine issues them one by one).
    pub engine_concurrency: usize,
    /// Device reads are aligned to this (4096 with O_DIRECT).
    pub alignment: usize,
    pub points: Vec<FlashPoint>,
    /// Fitted time of one read of `s` bytes at the engine's concurrency:
    /// `latency_us + s / bytes_per_sec`.
    pub latency_us: f64,
    pub bytes_per_sec: f64,
    /// The I/O thread's own work once a read lands, per byte: copying each request from the
    /// read's buffer to its slot and checking its records' checksums (measured through the
    /// reader, [`pi2_io::measure::measure_handling`]); the next read waits for it.
    pub handling_bytes_per_sec: f64,
    /// The same work's fixed part per request (shaping it into a read, reporting it to the
    /// worker that waits for it).
    pub handling_ns_per_request: f64,
    /// How fast the engine's reads themselves keep a CPU busy: buffered and emulated reads
    /// copy from the page cache (the kernel's copy speed); `None` where the device moves the
    /// data (O_DIRECT).
    pub engine_cpu_bytes_per_sec: Option<f64>,
    /// The same fit measured while `threads` compute threads keep the fastest cores busy (as
    /// decode does): the I/O thread and the device's interrupts then share the CPU.
    pub loaded: Vec<LoadedFit>,
}

/// A flash fit under compute load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadedFit {
    pub threads: usize,
    pub latency_us: f64,
    pub bytes_per_sec: f64,
}

impl FlashProfile {
    /// Fits `latency + size / bandwidth` to the mean time per read of the points at `depth`
    /// (least squares; the mean includes the device's slow outliers, as decode pays them).
    pub fn fit(points: &[FlashPoint], depth: usize) -> Option<(f64, f64)> {
        let pts: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.depth == depth && p.bytes_per_sec > 0.0)
            .map(|p| (p.read_size as f64, p.read_size as f64 / p.bytes_per_sec))
            .collect();
        let n = pts.len() as f64;
        if pts.len() < 2 {
            return None;
        }
        let (sx, sy) = pts.iter().fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
        let (mx, my) = (sx / n, sy / n);
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
        let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        if sxx <= 0.0 || sxy <= 0.0 {
            return None;
        }
        let slope = sxy / sxx;
        let lat = (my - slope * mx).max(0.0);
        Some((lat * 1e6, 1.0 / slope))
    }

    /// The profile as seen while `threads` compute threads run (the idle fit where the load
    /// was not measured).
    pub fn with_load(&self, threads: usize) -> FlashProfile {
        let mut f = self.clone();
        if let Some(l) = self.loaded.iter().find(|l| l.threads == threads) {
            f.latency_us = l.latency_us;
            f.bytes_per_sec = l.bytes_per_sec;
        }
        f
    }

    /// How many times faster reads of about `bytes` complete with `depth` of them in flight
    /// than one at a time: measured throughput at the deepest profiled depth up to `depth` over
    /// depth 1, at the profiled read size nearest `bytes` (`None`: the best over sizes). 1 for
    /// an engine that issues reads one by one.
    pub fn speedup(&self, depth: usize, bytes: Option<usize>) -> f64 {
        let depth = depth.min(self.engine_concurrency);
        let Some(d) = self
            .points
            .iter()
            .map(|p| p.depth)
            .filter(|&d| d > 1 && d <= depth)
            .max()
        else {
            return 1.0;
        };
        let at = |depth: usize, size: usize| {
            self.points
                .iter()
                .find(|p| p.depth == depth && p.read_size == size)
                .map(|p| p.bytes_per_sec)
        };
        let ratio = |size: usize| match (at(d, size), at(1, size)) {
            (Some(deep), Some(one)) if one > 0.0 => (deep / one).max(1.0),
            _ => 1.0,
        };
        let sizes = self
            .points
            .iter()
            .filter(|p| p.depth == d)
            .map(|p| p.read_size);
        match bytes {
            None => sizes.map(ratio).fold(1.0, f64::max),
            Some(b) => {
                let distance = |s: usize| ((s.max(1) as f64) / (b.max(1) as f64)).ln().abs();
                sizes
                    .min_by(|&x, &y| distance(x).total_cmp(&distance(y)))
                    .map_or(1.0, ratio)
            }
        }
    }

    /// Seconds the I/O thread needs for one read of `bytes` that is one whole request, its
    /// handling included.
    pub fn read_secs(&self, bytes: usize) -> f64 {
        self.device_secs(bytes) + self.handling_secs(1, bytes)
    }

    /// Seconds the device takes for one read of `bytes`.
    pub fn device_secs(&self, bytes: usize) -> f64 {
        self.latency_us * 1e-6 + bytes as f64 / self.bytes_per_sec
    }

    /// The I/O thread's handling of `requests` requests of `bytes` in all, once their read
    /// has landed (only requested bytes are copied and checked, not a merged read's gaps).
    pub fn handling_secs(&self, requests: usize, bytes: usize) -> f64 {
        requests as f64 * self.handling_ns_per_request * 1e-9
            + bytes as f64 / self.handling_bytes_per_sec
    }

    /// The seconds a read of `read_bytes` holding `requests` requests of `bytes` keeps a CPU
    /// busy (the handling, and the engine's own copy where the page cache serves the read):
    /// time a compute thread loses when no core is left free for the I/O thread.
    pub fn read_cpu_secs(&self, read_bytes: usize, requests: usize, bytes: usize) -> f64 {
        let engine = self.engine_cpu_bytes_per_sec.map_or(0.0, |r| 1.0 / r);
        read_bytes as f64 * engine + self.handling_secs(requests, bytes)
    }
}

/// Everything the cost model needs to know about a device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HardwareProfile {
    pub version: u32,
    /// See [`fingerprint`].
    pub fingerprint: String,
    pub cpu: String,
    /// Kernel tier the kernels were measured with (`avx512`, `avx2`, `neon-dotprod`, ...).
    pub tier: String,
    /// Fastest class first.
    pub classes: Vec<CoreClass>,
    pub flash: FlashProfile,
}

impl HardwareProfile {
    pub fn load(path: &Path) -> Result<Self, PlanError> {
        let file_err = |msg: String| PlanError::File {
            path: path.display().to_string(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| file_err(e.to_string()))?;
        let version = v.get("version").and_then(|v| v.as_u64());
        if version != Some(HW_VERSION as u64) {
            return Err(file_err(format!(
                "hardware profile version {}, this pi2 reads version {HW_VERSION}: run `pi2 profile-hw` again",
                version.map_or("missing".to_string(), |v| v.to_string())
            )));
        }
        serde_json::from_value(v).map_err(|e| file_err(e.to_string()))
    }

    pub fn save(&self, path: &Path) -> Result<(), PlanError> {
        let text = serde_json::to_string_pretty(self).expect("serialisable");
        std::fs::write(path, text + "\n").map_err(|e| PlanError::File {
            path: path.display().to_string(),
            msg: e.to_string(),
        })
    }

    /// The rates of `threads` threads on class `class`.
    pub fn rates(&self, class: usize, threads: usize) -> Option<&ThreadRates> {
        self.classes
            .get(class)?
            .rates
            .iter()
            .find(|r| r.threads == threads)
    }
}

impl ThreadRates {
    /// Seconds for `rows` rows of `row_bytes` bytes with `op` on `ty`. Types the profile lacks
    /// cost as the slowest measured type of that operation (never optimistic).
    pub fn secs(&self, op: KernelOp, ty: &str, rows: usize, row_bytes: usize) -> f64 {
        let per_row = |k: &KernelRate| k.row_ns * 1e-9 + row_bytes as f64 / k.bytes_per_sec;
        let of_op = self.kernels.iter().filter(|k| k.op == op);
        let per = match of_op.clone().find(|k| k.ty.eq_ignore_ascii_case(ty)) {
            Some(k) => per_row(k),
            None => of_op.map(per_row).fold(0.0, f64::max),
        };
        rows as f64 * per
    }
}

/// The kernel tier this CPU runs (part of the fingerprint: kernels differ by tier).
pub fn tier_name() -> String {
    Tier::detect().name().to_string()
}

/// A stable identity for a device: CPU, core layout, kernel tier and the storage device.
pub fn fingerprint(
    cpu: &str,
    classes: &[(Option<u64>, Vec<usize>)],
    tier: &str,
    storage: &str,
) -> String {
    let mut h = Sha256::new();
    h.update(cpu.as_bytes());
    for (f, cpus) in classes {
        h.update(format!("|{f:?}:{cpus:?}").as_bytes());
    }
    h.update(format!("|{tier}|{storage}").as_bytes());
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A core class to measure.
#[derive(Clone, Debug)]
pub struct CoreSpec {
    pub name: String,
    pub max_freq_khz: Option<u64>,
    pub cpus: Vec<usize>,
}

/// How to profile.
pub struct HwOptions<'a> {
    pub cpu: String,
    /// Identity of the storage device (e.g. its major:minor), part of the fingerprint.
    pub storage: String,
    pub classes: Vec<CoreSpec>,
    /// Types to measure kernels for.
    pub types: Vec<QuantType>,
    /// Time per kernel point.
    pub kernel_time: Duration,
    /// A file on the storage to profile (e.g. the model) and the read sizes and depths.
    pub flash_file: &'a Path,
    pub read_sizes: Vec<usize>,
    pub depths: Vec<usize>,
    pub read_time: Duration,
    /// Profile the io_uring engine (one thread, `depths` reads in flight) instead of `pread`
    /// (`depths` threads, one read each).
    pub uring: bool,
    /// Profile an emulated device over the file instead of the real one (see
    /// [`pi2_io::emulated`]).
    pub emulate: Option<pi2_io::FaultPlan>,
    /// Pins the calling thread to a CPU (thread `i` of a class runs on `cpus[i]`).
    pub pin: Option<fn(usize)>,
    /// Progress lines.
    pub progress: &'a dyn Fn(&str),
}

/// Bytes of rows per pool: beyond the last-level cache, so kernels stream from RAM as they do
/// on a model.
const POOL_BYTES: usize = 64 << 20;
/// Row lengths measured; two points fit the per-row cost.
const COLS: [usize; 2] = [512, 4096];
const CLUSTER: usize = 64;

struct Pool {
    ty: QuantType,
    cols: usize,
    rows: usize,
    data: Vec<u8>,
}

impl Pool {
    fn new(ty: QuantType, cols: usize) -> Option<Pool> {
        let row_bytes = ty.row_bytes(cols)?;
        let rows = POOL_BYTES / row_bytes;
        // 64 distinct random rows tiled over the pool: values do not change kernel speed.
        let mut seed = 0x9e37_79b9u64;
        let mut distinct = Vec::with_capacity(64 * row_bytes);
        for _ in 0..64 {
            let x: Vec<f32> = (0..cols)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
                })
                .collect();
            distinct.extend(ty.quantize_row(&x)?);
        }
        let mut data = Vec::with_capacity(rows * row_bytes);
        while data.len() < rows * row_bytes {
            let n = (rows * row_bytes - data.len()).min(distinct.len());
            data.extend_from_slice(&distinct[..n]);
        }
        Some(Pool {
            ty,
            cols,
            rows,
            data,
        })
    }

    fn row_bytes(&self) -> usize {
        self.data.len() / self.rows
    }

    /// The pool as matrices of at most `rows_per` rows (matrix data must be aligned: the
    /// pool's allocation is, and every row length here keeps it).
    fn mats(&self, rows_per: usize) -> Vec<MatRef<'_>> {
        let rb = self.row_bytes();
        self.data
            .chunks(rows_per * rb)
            .filter_map(|c| MatRef::new(self.ty, c.len() / rb, self.cols, c).ok())
            .collect()
    }
}

fn acts(ty: QuantType, cols: usize, n: usize) -> ActBuf {
    let x: Vec<f32> = (0..cols * n)
        .map(|i| ((i % 17) as f32 - 8.0) / 9.0)
        .collect();
    let mut a = ActBuf::new();
    a.quantize(ty.act_kind(), &x, cols);
    a
}

/// Runs `f` repeatedly for about `time` in five slices; returns the median slice's seconds per
/// call: on a shared machine a burst of outside load spoils a slice, not the figure.
fn timed(time: Duration, mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    let slice = time / 5;
    let mut per_call: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            let mut calls = 0u64;
            while start.elapsed() < slice || calls < 2 {
                f();
                calls += 1;
            }
            start.elapsed().as_secs_f64() / calls as f64
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[2]
}

/// Seconds per row of `pool` for `op` with the current rayon pool.
fn per_row(ks: &KernelSet, pool: &Pool, op: KernelOp, time: Duration, step_secs: f64) -> f64 {
    let (ty, cols, rb) = (pool.ty, pool.cols, pool.row_bytes());
    match op {
        KernelOp::Matvec | KernelOp::Matmul => {
            let n = if op == KernelOp::Matmul { 32 } else { 1 };
            let a = acts(ty, cols, n);
            // Matrices of about 2 MiB, like a large layer tensor.
            let mats = pool.mats(((2 << 20) / rb).max(1));
            let mut out = vec![0f32; mats[0].rows * n];
            let per_pass = timed(time, || {
                for m in &mats {
                    matmul(ks, m, &a, &mut out[..m.rows * n]);
                }
            });
            let secs = (per_pass - mats.len() as f64 * step_secs).max(per_pass * 0.05);
            secs / (pool.rows * n) as f64
        }
        KernelOp::Gather | KernelOp::Axpy => {
            // Half of each window of 128 rows, in clusters of 64 (as decode's candidates).
            let picked: Vec<u32> = (0..pool.rows as u32)
                .filter(|i| (i * 7 + i / 3) % 2 == 0)
                .collect();
            let a = acts(ty, cols, 1);
            let mats = pool.mats(pool.rows);
            let m = mats[0];
            let clusters: Vec<&[u32]> = picked.chunks(CLUSTER).collect();
            let mut outs = vec![0f32; clusters.len() * cols.max(CLUSTER)];
            let coeff = vec![0.5f32; CLUSTER];
            let w = cols.max(CLUSTER);
            let per_pass = timed(time, || {
                outs.par_chunks_mut(w)
                    .zip(clusters.par_iter())
                    .for_each(|(o, rows)| {
                        let row = |k: usize| m.row(rows[k] as usize);
                        if op == KernelOp::Gather {
                            gather_matvec_by(ks, ty, cols, row, &a, &mut o[..rows.len()]);
                        } else {
                            axpy_rows_by(ks, ty, row, &coeff[..rows.len()], &mut o[..cols]);
                        }
                    });
            });
            (per_pass - step_secs).max(per_pass * 0.05) / picked.len() as f64
        }
    }
}

/// Spins for `d` (stands in for work without touching memory).
fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// The fixed cost of one parallel step as decode pays it: a stretch of serial work (so the
/// other threads go idle, as between the engine's steps), then `threads` short tasks; the
/// time beyond the work itself is the step's cost (waking threads, splitting, joining).
fn step_cost(threads: usize, time: Duration) -> f64 {
    let (serial, task) = (Duration::from_micros(20), Duration::from_micros(5));
    let per = timed(time, || {
        spin(serial);
        (0..threads)
            .into_par_iter()
            .with_max_len(1)
            .for_each(|_| spin(task));
    });
    (per - (serial + task).as_secs_f64()).max(0.0)
}

/// Nanoseconds per element of the serial vector work decode does between parallel steps: half
/// quantizing activations to Q8 blocks, half SiLU (the mix of one token-layer's serial work).
fn serial_cost(time: Duration) -> f64 {
    const N: usize = 4096;
    let x: Vec<f32> = (0..N).map(|i| ((i % 29) as f32 - 14.0) / 7.0).collect();
    let mut y = vec![0f32; N];
    let mut a = ActBuf::new();
    let secs = timed(time, || {
        a.quantize(pi2_kernels::ActKind::Q8, std::hint::black_box(&x), N);
        for (o, &v) in y.iter_mut().zip(&x) {
            *o = v / (1.0 + (-v).exp());
        }
        std::hint::black_box(&y);
    });
    secs * 1e9 / (2 * N) as f64
}

/// Fits `row_ns + bytes / rate` through the two row lengths.
fn fit_rows(points: [(usize, f64); 2]) -> (f64, f64) {
    let [(b0, t0), (b1, t1)] = points;
    let slope = ((t1 - t0) / (b1 as f64 - b0 as f64)).max(1e-13);
    let row_ns = ((t0 - slope * b0 as f64) * 1e9).max(0.0);
    (row_ns, 1.0 / slope)
}

fn mem_bandwidth(time: Duration) -> f64 {
    let buf: Vec<u64> = (0..(POOL_BYTES * 2 / 8) as u64).collect();
    let secs = timed(time, || {
        let s: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
            .sum();
        std::hint::black_box(s);
    });
    (buf.len() * 8) as f64 / secs
}

/// Measures this device. Takes about `kernel_time` x (types x 4 ops x 2 lengths + 3) x thread
/// counts, plus `read_time` x read points.
pub fn measure(o: HwOptions<'_>) -> Result<HardwareProfile, PlanError> {
    let ks = KernelSet::best();
    let tier = tier_name();
    let mut pools = Vec::new();
    for &ty in &o.types {
        for cols in COLS {
            if let Some(p) = Pool::new(ty, cols) {
                pools.push(p);
            }
        }
    }
    let mut classes = Vec::new();
    for spec in &o.classes {
        let mut rates = Vec::new();
        for threads in 1..=spec.cpus.len() {
            (o.progress)(&format!("{}: {threads} thread(s): kernels", spec.name));
            let cpus = spec.cpus.clone();
            let pin = o.pin;
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .start_handler(move |i| {
                    if let Some(pin) = pin {
                        pin(cpus[i % cpus.len()]);
                    }
                })
                .build()
                .map_err(|e| PlanError::Hardware(e.to_string()))?;
            let r = pool.install(|| {
                let step_secs = step_cost(threads, o.kernel_time);
                let mut kernels = Vec::new();
                for &ty in &o.types {
                    for op in [
                        KernelOp::Matvec,
                        KernelOp::Gather,
                        KernelOp::Axpy,
                        KernelOp::Matmul,
                    ] {
                        let pts: Vec<(usize, f64)> = pools
                            .iter()
                            .filter(|p| p.ty == ty)
                            .map(|p| (p.row_bytes(), per_row(ks, p, op, o.kernel_time, step_secs)))
                            .collect();
                        if let [a, b] = pts[..] {
                            let (row_ns, bytes_per_sec) = fit_rows([a, b]);
                            kernels.push(KernelRate {
                                op,
                                ty: ty.to_string(),
                                row_ns,
                                bytes_per_sec,
                            });
                        }
                    }
                }
                ThreadRates {
                    threads,
                    kernels,
                    step_ns: step_secs * 1e9,
                    mem_bytes_per_sec: mem_bandwidth(o.kernel_time),
                    serial_ns_per_elem: serial_cost(o.kernel_time),
                }
            });
            rates.push(r);
        }
        classes.push(CoreClass {
            name: spec.name.clone(),
            max_freq_khz: spec.max_freq_khz,
            cpus: spec.cpus.clone(),
            rates,
        });
    }
    let flash = measure_flash(&o)?;
    let fp_classes: Vec<(Option<u64>, Vec<usize>)> = o
        .classes
        .iter()
        .map(|c| (c.max_freq_khz, c.cpus.clone()))
        .collect();
    Ok(HardwareProfile {
        version: HW_VERSION,
        fingerprint: fingerprint(&o.cpu, &fp_classes, &tier, &o.storage),
        cpu: o.cpu.clone(),
        tier,
        classes,
        flash,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_fit_recovers_latency_and_bandwidth() {
        // 80 us + s / 500 MB/s.
        let points: Vec<FlashPoint> = [4096usize, 16384, 65536, 1 << 20]
            .iter()
            .map(|&s| FlashPoint {
                read_size: s,
                depth: 1,
                bytes_per_sec: s as f64 / (80e-6 + s as f64 / 500e6),
                lat_p50_us: 0.0,
                lat_p99_us: 0.0,
            })
            .collect();
        let (lat, bw) = FlashProfile::fit(&points, 1).unwrap();
        assert!((lat - 80.0).abs() < 0.01, "{lat}");
        assert!((bw / 500e6 - 1.0).abs() < 1e-6, "{bw}");
        assert!(FlashProfile::fit(&points, 2).is_none());
    }

    #[test]
    fn speedup_comes_from_the_measured_depths() {
        // Depth 1: 4 KiB at 100 MB/s, 1 MiB at 500 MB/s; depth 4: 3x and 1.2x those.
        let pt = |read_size, depth, mbps: f64| FlashPoint {
            read_size,
            depth,
            bytes_per_sec: mbps * 1e6,
            lat_p50_us: 0.0,
            lat_p99_us: 0.0,
        };
        let mut f = crate::synthetic::toy_hardware(1, 1.0, 100.0).flash;
        f.points = vec![
            pt(4096, 1, 100.0),
            pt(1 << 20, 1, 500.0),
            pt(4096, 4, 300.0),
            pt(1 << 20, 4, 600.0),
        ];
        f.engine_concurrency = 4;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(f.speedup(4, Some(4096)), 3.0));
        assert!(close(f.speedup(4, Some(8192)), 3.0)); // nearest profiled size
        assert!(close(f.speedup(4, Some(512 << 10)), 1.2));
        assert!(close(f.speedup(8, Some(1 << 20)), 1.2)); // no deeper point measured
        assert!(close(f.speedup(4, None), 3.0));
        // Below the first deeper depth, and for an engine that reads one at a time: none.
        assert!(close(f.speedup(2, Some(4096)), 1.0));
        f.engine_concurrency = 1;
        assert!(close(f.speedup(4, Some(4096)), 1.0));
    }

    #[test]
    fn row_fit_is_exact_on_two_points() {
        let t = |b: usize| 20e-9 + b as f64 / 4e9;
        let (row_ns, rate) = fit_rows([(288, t(288)), (2304, t(2304))]);
        assert!((row_ns - 20.0).abs() < 1e-6 && (rate / 4e9 - 1.0).abs() < 1e-9);
    }

    #[test]
    fn unknown_types_cost_as_the_slowest() {
        let r = ThreadRates {
            threads: 1,
            kernels: vec![
                KernelRate {
                    op: KernelOp::Matvec,
                    ty: "Q4_1".into(),
                    row_ns: 0.0,
                    bytes_per_sec: 4e9,
                },
                KernelRate {
                    op: KernelOp::Matvec,
                    ty: "F32".into(),
                    row_ns: 0.0,
                    bytes_per_sec: 2e9,
                },
            ],
            step_ns: 0.0,
            mem_bytes_per_sec: 1e10,
            serial_ns_per_elem: 0.0,
        };
        assert_eq!(r.secs(KernelOp::Matvec, "q4_1", 1000, 4000), 1e-3);
        assert_eq!(r.secs(KernelOp::Matvec, "Q6_K", 1000, 4000), 2e-3);
    }

    #[test]
    fn fingerprints_differ_by_device() {
        let c = vec![(Some(2_000_000), vec![0, 1])];
        let a = fingerprint("cpu", &c, "avx2", "8:1");
        assert_eq!(a, fingerprint("cpu", &c, "avx2", "8:1"));
        assert_ne!(a, fingerprint("cpu", &c, "avx2", "8:2"));
        assert_ne!(a, fingerprint("cpu", &c, "avx512", "8:1"));
    }
}
