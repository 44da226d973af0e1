//! The flash part of the hardware profile: reads by size and depth, idle and under compute
//! load, and the CPU work around them (the I/O thread's handling, the page cache's copy).

use super::{spin, FlashPoint, FlashProfile, HwOptions, LoadedFit};
use crate::PlanError;
use pi2_io::ReaderConfig;
use std::time::Duration;

/// Flash points at every read size and depth: each the median of three rounds spread over the
/// measurement (flash devices and shared virtual disks vary from second to second).
fn flash_points(
    o: &HwOptions<'_>,
    load: &str,
    depths: &[usize],
) -> Result<(Vec<FlashPoint>, String), PlanError> {
    const ROUNDS: usize = 3;
    let size_of = std::fs::metadata(o.flash_file)
        .map(|m| m.len())
        .unwrap_or(0);
    let mut engine = String::new();
    let mut samples: Vec<Vec<pi2_io::measure::IoPoint>> = Vec::new();
    for round in 0..ROUNDS {
        let mut k = 0;
        for &depth in depths {
            for &size in &o.read_sizes {
                (o.progress)(&format!(
                    "flash ({load}): {size} B reads at depth {depth}, round {}",
                    round + 1
                ));
                let time = o.read_time / ROUNDS as u32;
                let p = match (o.uring, &o.emulate) {
                    (true, None) => measure_uring(o.flash_file, size, depth, size_of, time)?,
                    _ => pi2_io::measure::measure_with(
                        o.flash_file,
                        size,
                        depth,
                        size_of,
                        time,
                        o.emulate.as_ref(),
                    )?,
                };
                engine = match o.emulate {
                    Some(_) => "emulated".to_string(),
                    None => p.engine.to_string(),
                };
                if round == 0 {
                    samples.push(Vec::new());
                }
                samples[k].push(p);
                k += 1;
            }
        }
    }
    let points = samples
        .into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.bytes_per_sec.total_cmp(&b.bytes_per_sec));
            let p = &v[v.len() / 2];
            FlashPoint {
                read_size: p.read_size,
                depth: p.depth,
                bytes_per_sec: p.bytes_per_sec,
                lat_p50_us: p.lat_p50_us,
                lat_p99_us: p.lat_p99_us,
            }
        })
        .collect();
    Ok((points, engine))
}

#[cfg(target_os = "linux")]
fn measure_uring(
    path: &std::path::Path,
    size: usize,
    depth: usize,
    span: u64,
    time: Duration,
) -> Result<pi2_io::measure::IoPoint, PlanError> {
    Ok(pi2_io::measure::measure_uring(
        path, size, depth, span, time,
    )?)
}

#[cfg(not(target_os = "linux"))]
fn measure_uring(
    _: &std::path::Path,
    _: usize,
    _: usize,
    _: u64,
    _: Duration,
) -> Result<pi2_io::measure::IoPoint, PlanError> {
    Err(PlanError::Hardware(
        "the io_uring engine needs Linux".into(),
    ))
}

/// The I/O thread's handling per request and per byte (`(ns, bytes/s)`), fitted from
/// requests of two sizes through the reader with checksums, shaped as decode's reads are.
fn handling_rate(time: Duration) -> Result<(f64, f64), PlanError> {
    let cfg = ReaderConfig {
        max_request: 512 << 10,
        depth: 1,
        merge_gap: 64 << 10,
    };
    let point = |len: usize| -> Result<f64, PlanError> {
        pi2_io::measure::measure_handling(len, &cfg, time)
            .map(|p| p.ns_per_request)
            .map_err(|e| PlanError::Hardware(format!("measuring the reader's handling: {e}")))
    };
    // The median of three passes per size: a burst of outside load spoils a pass, not the fit.
    let median = |len: usize| -> Result<f64, PlanError> {
        let mut t = [point(len)?, point(len)?, point(len)?];
        t.sort_by(f64::total_cmp);
        Ok(t[1])
    };
    let (small, large) = (512usize, 4096usize);
    let (t_small, t_large) = (median(small)?, median(large)?);
    // Noise can make the larger request look no dearer: then every nanosecond is per byte.
    let ns_per_byte =
        ((t_large - t_small) / (large - small) as f64).max(t_large / large as f64 / 2.0);
    let fixed = (t_small - ns_per_byte * small as f64).max(0.0);
    Ok((fixed, 1e9 / ns_per_byte))
}

/// Buffered 1 MiB reads of `o.flash_file` served from the page cache: the CPU cost per byte
/// of a read that does not bypass the cache.
fn page_cache_rate(o: &HwOptions<'_>) -> Result<f64, PlanError> {
    let size = std::fs::metadata(o.flash_file).map_or(0, |m| m.len());
    let span = size.min(64 << 20);
    let no_delay = pi2_io::FaultPlan::default();
    let pass = || {
        pi2_io::measure::measure_with(
            o.flash_file,
            1 << 20,
            1,
            span,
            o.read_time / 8,
            Some(&no_delay),
        )
    };
    pass()?; // fills the page cache
    Ok(pass()?.bytes_per_sec)
}

/// The flash part of [`super::measure`] alone (idle and under load, and the I/O thread's
/// handling): quick to repeat when the device's speed drifts (`pi2 bench --plan` does before
/// timing a plan).
pub fn measure_flash(o: &HwOptions<'_>) -> Result<FlashProfile, PlanError> {
    let (points, engine) = flash_points(o, "idle", &o.depths)?;
    // Under load: spinning threads on the fastest class's cores, as many as decode may use.
    let mut loaded = Vec::new();
    if let Some(class) = o.classes.first() {
        for t in 1..=class.cpus.len() {
            let stop = std::sync::atomic::AtomicBool::new(false);
            let pts = std::thread::scope(|sc| {
                for &cpu in class.cpus.iter().take(t) {
                    let (stop, pin) = (&stop, o.pin);
                    sc.spawn(move || {
                        if let Some(pin) = pin {
                            pin(cpu);
                        }
                        // Busy like decode's workers: compute, and yield when idle.
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            spin(Duration::from_micros(50));
                            std::thread::yield_now();
                        }
                    });
                }
                // The fits under load use depth 1 only.
                let r = flash_points(o, &format!("{t} busy thread(s)"), &[1]);
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                r
            })?;
            if let Some((latency_us, bytes_per_sec)) = FlashProfile::fit(&pts.0, 1) {
                loaded.push(LoadedFit {
                    threads: t,
                    latency_us,
                    bytes_per_sec,
                });
            }
        }
    }
    let (latency_us, bytes_per_sec) = FlashProfile::fit(&points, 1).ok_or_else(|| {
        PlanError::Hardware("the flash profile needs at least two read sizes at depth 1".into())
    })?;
    let direct = engine.ends_with("direct");
    let engine_cpu_bytes_per_sec = match direct {
        true => None,
        false => Some(page_cache_rate(o)?),
    };
    let (handling_ns_per_request, handling_bytes_per_sec) = handling_rate(o.kernel_time)?;
    Ok(FlashProfile {
        alignment: if direct { 4096 } else { 1 },
        // pread issues one read per submitter; io_uring keeps up to the deepest profiled depth
        // in flight (the speedup per depth is measured, see `speedup`).
        engine_concurrency: match o.uring && o.emulate.is_none() {
            true => o.depths.iter().copied().max().unwrap_or(1),
            false => 1,
        },
        engine,
        points,
        latency_us,
        bytes_per_sec,
        handling_bytes_per_sec,
        handling_ns_per_request,
        engine_cpu_bytes_per_sec,
        loaded,
    })
}
