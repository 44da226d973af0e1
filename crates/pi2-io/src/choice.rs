//! Choosing how the reader reaches a device: which engine and how many reads in flight.
//!
//! One read at a time leaves most devices idle: NVMe and UFS both want several commands queued,
//! and on some disks a single `pread` stream is slower than the kernel's read-ahead behind a
//! memory mapping. The right depth is a property of the device, so it is measured (random
//! reads of a typical merged-request size at each depth) and the shallowest depth within a few
//! percent of the best throughput is taken: deeper queues cost buffer memory and make a group
//! of reads land later as a whole, so depth beyond what the device rewards is waste.

use crate::measure::IoPoint;
use crate::{IoEngine, IoError};
use std::path::Path;
use std::time::Duration;

/// Bytes per read when measuring: between one neuron row (1-4 KiB) and the reader's largest
/// merged request (128 KiB), about what decode's merged requests are on a converted model.
pub const CHOICE_READ_BYTES: usize = 16 << 10;

/// io_uring depths tried. 32 is the deepest: the reader holds a largest request's buffer per
/// read in flight (4.3 MiB at 32 with 128 KiB requests), and 32 reached the disk's rate on the
/// devices measured (`docs/offload.md`).
pub const CHOICE_DEPTHS: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// A depth within this share of the best throughput counts as the best.
pub const CHOICE_TOLERANCE: f64 = 0.05;

/// The engine and depth to read a device with, and the measurements they were chosen from.
#[derive(Clone, Debug, PartialEq)]
pub struct ReaderChoice {
    pub engine: IoEngine,
    /// Reads handed to the engine at once.
    pub depth: usize,
    /// The best io_uring depth even where `pread` won (`None`: no io_uring here), for a user
    /// who asks for io_uring without a depth.
    pub uring_depth: Option<usize>,
    pub points: Vec<IoPoint>,
}

/// Measures the device holding `path` (`O_DIRECT` where allowed) for about `time` per point:
/// `pread` one read at a time, then io_uring at each of [`CHOICE_DEPTHS`] where the kernel
/// allows io_uring, and chooses with [`choose`].
pub fn measure_choice(path: &Path, time: Duration) -> Result<ReaderChoice, IoError> {
    let mut points = vec![crate::measure::measure(
        path,
        CHOICE_READ_BYTES,
        1,
        u64::MAX,
        time,
    )?];
    #[cfg(target_os = "linux")]
    for depth in CHOICE_DEPTHS {
        match crate::measure::measure_uring(path, CHOICE_READ_BYTES, depth, u64::MAX, time) {
            Ok(p) => points.push(p),
            // No io_uring in this kernel or sandbox (seccomp, `io_uring_disabled`): pread it is.
            Err(IoError::Open { .. }) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(choose(points))
}

/// The choice from measured points: the fastest configuration, or the shallowest one within
/// [`CHOICE_TOLERANCE`] of it (`pread` counts as depth 1 and wins ties: it is portable).
/// Points whose engine is not io_uring are `pread`'s.
pub fn choose(points: Vec<IoPoint>) -> ReaderChoice {
    let is_uring = |p: &IoPoint| p.engine.starts_with("uring");
    let shallowest_near_best = |pts: &mut dyn Iterator<Item = &IoPoint>| -> Option<(bool, usize)> {
        let pts: Vec<&IoPoint> = pts.collect();
        let best = pts.iter().map(|p| p.bytes_per_sec).fold(0.0, f64::max);
        pts.iter()
            .filter(|p| p.bytes_per_sec >= best * (1.0 - CHOICE_TOLERANCE))
            .map(|p| (is_uring(p), p.depth))
            .min_by_key(|&(uring, depth)| (depth, uring))
    };
    let uring_depth =
        shallowest_near_best(&mut points.iter().filter(|p| is_uring(p))).map(|(_, depth)| depth);
    let (engine, depth) = match shallowest_near_best(&mut points.iter()) {
        Some((true, depth)) => (IoEngine::Uring, depth),
        // pread reads its group one read at a time; 4 is the reader's long-standing default.
        _ => (IoEngine::Pread, 4),
    };
    ReaderChoice {
        engine,
        depth,
        uring_depth,
        points,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(engine: &'static str, depth: usize, mb_s: f64) -> IoPoint {
        IoPoint {
            read_size: CHOICE_READ_BYTES,
            depth,
            span: 1 << 30,
            reads: 100,
            bytes_per_sec: mb_s * 1e6,
            lat_p50_us: 0.0,
            lat_p99_us: 0.0,
            engine,
        }
    }

    #[test]
    fn the_shallowest_depth_near_the_best_is_chosen() {
        let c = choose(vec![
            point("pread-direct", 1, 200.0),
            point("uring-direct", 1, 195.0),
            point("uring-direct", 8, 700.0),
            point("uring-direct", 16, 960.0),
            point("uring-direct", 32, 1010.0),
        ]);
        assert_eq!(
            (c.engine, c.depth, c.uring_depth),
            (IoEngine::Uring, 16, Some(16))
        );
    }

    #[test]
    fn pread_wins_when_depth_does_not_pay() {
        let c = choose(vec![
            point("pread-direct", 1, 1000.0),
            point("uring-direct", 1, 990.0),
            point("uring-direct", 4, 1020.0),
        ]);
        assert_eq!(
            (c.engine, c.depth, c.uring_depth),
            (IoEngine::Pread, 4, Some(1))
        );
    }

    #[test]
    fn without_io_uring_pread_is_chosen() {
        let c = choose(vec![point("pread-buffered", 1, 300.0)]);
        assert_eq!(
            (c.engine, c.depth, c.uring_depth),
            (IoEngine::Pread, 4, None)
        );
    }

    #[test]
    fn a_real_file_gives_a_choice() {
        let dir = std::env::temp_dir().join(format!("pi2-io-choice-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let c = measure_choice(&path, Duration::from_millis(5)).unwrap();
        assert!(c.depth >= 1 && !c.points.is_empty());
        assert!(CHOICE_DEPTHS.contains(&c.depth) || c.engine == IoEngine::Pread);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
