//! One conformance suite run against every read engine, plus the reader's scheduling and the
//! fault engine's errors.

use pi2_io::{
    crc32, device_reads, emulated, AlignedBuf, Checksums, FaultEngine, FaultPlan, IoError,
    PreadEngine, ReadEngine, ReadOp, Reader, ReaderConfig, Request, SumRegion,
};
use proptest::prelude::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn data(size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}

fn file(size: usize) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.bin");
    let bytes = data(size);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&bytes)
        .unwrap();
    (dir, path, bytes)
}

/// Every engine under test, by name.
fn engines(path: &Path) -> Vec<(&'static str, Box<dyn ReadEngine>)> {
    let pread: [(&'static str, Box<dyn ReadEngine>); 4] = [
        ("direct", Box::new(PreadEngine::open(path, true).unwrap())),
        (
            "buffered",
            Box::new(PreadEngine::open(path, false).unwrap()),
        ),
        (
            "fault-free",
            Box::new(FaultEngine::new(
                PreadEngine::open(path, true).unwrap(),
                FaultPlan::default(),
            )),
        ),
        (
            "emulated",
            Box::new(
                emulated(
                    path,
                    FaultPlan {
                        latency: std::time::Duration::from_micros(20),
                        ..Default::default()
                    },
                )
                .unwrap(),
            ),
        ),
    ];
    pread.into_iter().chain(uring_engines(path)).collect()
}

/// The io_uring engines, direct and buffered, with a shallow ring so groups are split. Native
/// x86-64 Linux must have io_uring; elsewhere (qemu-user does not emulate it) their absence is
/// reported and the other engines are still tested.
#[cfg(target_os = "linux")]
fn uring_engines(path: &Path) -> Vec<(&'static str, Box<dyn ReadEngine>)> {
    let open = |direct| pi2_io::UringEngine::open(path, direct, 2);
    match (open(true), open(false)) {
        (Ok(d), Ok(b)) => vec![
            ("uring-direct", Box::new(d)),
            ("uring-buffered", Box::new(b)),
        ],
        (Err(e), _) | (_, Err(e)) => {
            if cfg!(target_arch = "x86_64") {
                panic!("io_uring: {e}");
            }
            eprintln!("note: io_uring engines not tested here: {e}");
            Vec::new()
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn uring_engines(_: &Path) -> Vec<(&'static str, Box<dyn ReadEngine>)> {
    Vec::new()
}

#[test]
fn engines_read_aligned_ranges_and_the_tail() {
    let size = 3 * 4096 + 1000;
    let (_d, path, bytes) = file(size);
    for (name, mut e) in engines(&path) {
        assert_eq!(e.size(), size as u64, "{name}");
        let a = e.alignment();
        let mut buf = AlignedBuf::new(8192, 4096);
        e.read_batch(&mut [ReadOp {
            offset: 4096,
            buf: &mut buf[..8192],
            need: 8192,
        }])
        .unwrap();
        assert_eq!(&buf[..8192], &bytes[4096..12288], "{name}");
        // The last block: only 1000 bytes exist, and that is all that is needed.
        let mut tail = AlignedBuf::new(4096, 4096);
        e.read_batch(&mut [ReadOp {
            offset: 12288,
            buf: &mut tail[..4096],
            need: 1000,
        }])
        .unwrap();
        assert_eq!(&tail[..1000], &bytes[12288..], "{name}");
        // Asking for more than exists is a short read, named as such.
        let err = e
            .read_batch(&mut [ReadOp {
                offset: 12288,
                buf: &mut tail[..4096],
                need: 4096,
            }])
            .unwrap_err();
        assert!(
            matches!(err, IoError::ShortRead { got: 1000, .. }),
            "{name}: {err}"
        );
        if a > 1 {
            let err = e
                .read_batch(&mut [ReadOp {
                    offset: 100,
                    buf: &mut buf[..4096],
                    need: 4096,
                }])
                .unwrap_err();
            assert!(matches!(err, IoError::Misaligned { .. }), "{name}: {err}");
        }
    }
}

#[test]
fn direct_io_is_used_where_the_file_system_allows() {
    let (_d, path, _) = file(8192);
    let e = PreadEngine::open(&path, true).unwrap();
    // The test directory is on a disk file system here; tmpfs would refuse and say why.
    assert!(e.is_direct() || e.fallback_reason().is_some());
    assert!(!PreadEngine::open(&path, false).unwrap().is_direct());
}

#[test]
fn open_errors_name_the_path() {
    let err = PreadEngine::open("/nonexistent/model.gguf", true)
        .err()
        .unwrap();
    assert!(err.to_string().contains("/nonexistent/model.gguf"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let err = PreadEngine::open(dir.path(), true).err().unwrap();
    assert!(err.to_string().contains("directory"), "{err}");
}

fn read_all(reader: &Reader, reqs: &[(u64, usize)]) -> Result<Vec<Vec<u8>>, IoError> {
    let mut out: Vec<Vec<u8>> = reqs.iter().map(|&(_, l)| vec![0u8; l]).collect();
    let list: Vec<Request> = reqs
        .iter()
        .zip(out.iter_mut())
        .enumerate()
        .map(|(i, (&(offset, len), d))| Request {
            offset,
            len,
            dst: d.as_mut_ptr(),
            tag: i as u64,
        })
        .collect();
    // SAFETY: `out` is untouched until every completion is in.
    unsafe { reader.submit(&list)? };
    let mut seen = vec![false; reqs.len()];
    let mut first_err = None;
    while seen.iter().any(|s| !s) {
        let c = reader.recv()?;
        match c.result {
            Ok(()) => {
                assert!(!seen[c.tag as usize], "tag {} completed twice", c.tag);
                seen[c.tag as usize] = true;
            }
            Err(e) => {
                first_err.get_or_insert(e);
                seen[c.tag as usize] = true;
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Any set of (possibly overlapping, unaligned, large) requests comes back byte-exact through
    /// every engine, whatever the merge and split settings.
    #[test]
    fn reader_returns_exact_bytes(
        reqs in prop::collection::vec((0u64..200_000, 1usize..20_000), 1..60),
        max_request in prop::sample::select(vec![4096usize, 16384, 131072]),
        gap in prop::sample::select(vec![0usize, 4096, 65536]),
        depth in 1usize..5,
    ) {
        let size = 220_000usize;
        let (_d, path, bytes) = file(size);
        let reqs: Vec<(u64, usize)> = reqs
            .into_iter()
            .map(|(o, l)| (o, l.min(size - o as usize)))
            .collect();
        for (name, e) in engines(&path) {
            let reader = Reader::new(e, ReaderConfig { max_request, depth, merge_gap: gap }).unwrap();
            let out = read_all(&reader, &reqs).unwrap();
            for (&(o, l), got) in reqs.iter().zip(&out) {
                prop_assert_eq!(&got[..], &bytes[o as usize..o as usize + l], "{}", name);
            }
            let st = reader.stats();
            prop_assert_eq!(st.requests, reqs.len() as u64);
            prop_assert!(st.reads >= 1);
            prop_assert_eq!(reader.outstanding(), 0);
        }
    }
}

#[test]
fn nearby_requests_merge_into_few_reads() {
    let (_d, path, bytes) = file(1 << 20);
    let reader = Reader::new(
        PreadEngine::open(&path, true).unwrap(),
        ReaderConfig {
            max_request: 128 << 10,
            depth: 2,
            merge_gap: 0,
        },
    )
    .unwrap();
    // 64 rows of 360 bytes packed back to back (in reverse order: the reader sorts them).
    let reqs: Vec<(u64, usize)> = (0..64u64).rev().map(|i| (8192 + i * 360, 360)).collect();
    let out = read_all(&reader, &reqs).unwrap();
    for (&(o, l), got) in reqs.iter().zip(&out) {
        assert_eq!(&got[..], &bytes[o as usize..o as usize + l]);
    }
    let st = reader.stats();
    assert_eq!(st.reads, 1, "{st:?}");
    assert_eq!(st.bytes_requested, 64 * 360);
}

#[test]
fn device_reads_predicts_what_the_reader_issues() {
    let (_d, path, _) = file(4 << 20);
    let engine = PreadEngine::open(&path, true).unwrap();
    let align = engine.alignment();
    for (gap, max) in [(0usize, 128usize << 10), (16 << 10, 64 << 10), (0, 8 << 10)] {
        let cfg = ReaderConfig {
            max_request: max,
            depth: 3,
            merge_gap: gap,
        };
        let reader = Reader::new(PreadEngine::open(&path, true).unwrap(), cfg.clone()).unwrap();
        // Scattered rows, some adjacent, one large request that must be split.
        let mut reqs: Vec<(u64, usize)> = (0..200u64)
            .map(|i| ((i * 7919 * 613) % (3 << 20), 360 + (i as usize % 3) * 252))
            .collect();
        reqs.push((100_000, 300_000));
        read_all(&reader, &reqs).unwrap();
        let want = device_reads(&reqs, align, &cfg);
        let st = reader.stats();
        assert_eq!(st.reads, want.len() as u64, "gap {gap} max {max}");
        assert_eq!(
            st.bytes_read,
            want.iter().map(|r| r.1 as u64).sum::<u64>(),
            "gap {gap} max {max}"
        );
    }
}

#[test]
fn out_of_range_requests_are_refused_before_reading() {
    let (_d, path, _) = file(10_000);
    let reader = Reader::new(
        PreadEngine::open(&path, true).unwrap(),
        ReaderConfig::default(),
    )
    .unwrap();
    let err = read_all(&reader, &[(9_000, 2_000)]).unwrap_err();
    assert!(
        matches!(err, IoError::OutOfRange { size: 10_000, .. }),
        "{err}"
    );
}

#[test]
fn faults_end_with_clear_errors() {
    let (_d, path, _) = file(1 << 20);
    let reqs: Vec<(u64, usize)> = (0..8u64).map(|i| (i * 100_000, 500)).collect();
    let eio = FaultEngine::new(
        PreadEngine::open(&path, true).unwrap(),
        FaultPlan {
            eio_from: Some(3),
            ..FaultPlan::default()
        },
    );
    let reader = Reader::new(eio, ReaderConfig::default()).unwrap();
    let err = read_all(&reader, &reqs).unwrap_err();
    assert!(err.to_string().contains("Input/output error"), "{err}");
    let short = FaultEngine::new(
        PreadEngine::open(&path, true).unwrap(),
        FaultPlan {
            short_at: Some(0),
            ..FaultPlan::default()
        },
    );
    let reader = Reader::new(short, ReaderConfig::default()).unwrap();
    let err = read_all(&reader, &reqs).unwrap_err();
    assert!(matches!(err, IoError::ShortRead { .. }), "{err}");
}

/// A verified reader returns checked bytes through every engine, requests split into several
/// device reads included, and reports a record changed on the device after its checksum was
/// taken as that request's error, naming the region; other requests still arrive.
#[test]
fn verified_reads_catch_a_changed_file() {
    let (_d, path, bytes) = file(1 << 20);
    let region = |name: &str, offset: u64, record_len: u64, n: u64| SumRegion {
        name: name.into(),
        offset,
        record_len,
        sums: (0..n)
            .map(|k| {
                let at = (offset + k * record_len) as usize;
                crc32(&bytes[at..at + record_len as usize])
            })
            .collect(),
    };
    let sums = std::sync::Arc::new(
        Checksums::new(vec![
            region("rows", 1000, 600, 500),
            region("whole", 400_000, 300_000, 1),
        ])
        .unwrap(),
    );
    // Single rows, runs of rows, a request split into many reads, ranges partly outside.
    let reqs = [
        (1000 + 600 * 7, 600),
        (1000, 6000),
        (400_000, 300_000),
        (900, 1300),
    ];
    let cfg = ReaderConfig {
        max_request: 16384,
        ..ReaderConfig::default()
    };
    for (name, e) in engines(&path) {
        let reader = Reader::with_checksums(e, cfg.clone(), Some(sums.clone())).unwrap();
        let out = read_all(&reader, &reqs).unwrap();
        for (&(o, l), got) in reqs.iter().zip(&out) {
            assert_eq!(&got[..], &bytes[o as usize..o as usize + l], "{name}");
        }
    }
    for (at, want) in [
        (1000 + 600 * 7 + 13, "`rows` at offset 5200"),
        (650_000, "`whole`"),
    ] {
        let mut changed = bytes.clone();
        changed[at] ^= 1;
        std::fs::write(&path, &changed).unwrap();
        for (name, e) in engines(&path) {
            let reader = Reader::with_checksums(e, cfg.clone(), Some(sums.clone())).unwrap();
            let err = read_all(&reader, &reqs).unwrap_err();
            assert!(matches!(err, IoError::Checksum { .. }), "{name}: {err}");
            assert!(err.to_string().contains(want), "{name}: {err}");
            // Reads that do not hold the changed record are unaffected.
            let fine = read_all(&reader, &[(1000 + 600 * 100, 1200)]).unwrap();
            assert_eq!(fine[0], bytes[61_000..62_200], "{name}");
        }
    }
    std::fs::write(&path, &bytes).unwrap();
}

#[test]
fn latency_injection_slows_reads() {
    let (_d, path, _) = file(1 << 16);
    let mut slow = FaultEngine::new(
        PreadEngine::open(&path, true).unwrap(),
        FaultPlan {
            latency: Duration::from_millis(20),
            ..FaultPlan::default()
        },
    );
    let mut buf = AlignedBuf::new(4096, 4096);
    let t = std::time::Instant::now();
    slow.read_batch(&mut [ReadOp {
        offset: 0,
        buf: &mut buf[..4096],
        need: 4096,
    }])
    .unwrap();
    // A lower bound only: sleeping never returns early.
    assert!(t.elapsed() >= Duration::from_millis(20));
    assert_eq!(slow.reads(), 1);
}

#[test]
fn profile_measures_a_point() {
    let (_d, path, _) = file(1 << 20);
    let p = pi2_io::measure::measure(&path, 4096, 2, 1 << 20, Duration::from_millis(30)).unwrap();
    assert_eq!((p.read_size, p.depth), (4096, 2));
    assert!(p.reads >= 16 && p.bytes_per_sec > 0.0 && p.lat_p99_us >= p.lat_p50_us);
}

#[cfg(target_os = "linux")]
#[test]
fn profile_measures_a_uring_point() {
    let (_d, path, _) = file(1 << 20);
    match pi2_io::measure::measure_uring(&path, 4096, 4, 1 << 20, Duration::from_millis(30)) {
        Ok(p) => {
            assert_eq!((p.read_size, p.depth), (4096, 4));
            assert!(p.engine.starts_with("uring"), "{}", p.engine);
            // Whole groups of four, at least eight reads.
            assert!(p.reads >= 8 && p.reads % 4 == 0, "{p:?}");
            assert!(p.bytes_per_sec > 0.0 && p.lat_p99_us >= p.lat_p50_us);
        }
        Err(e) if cfg!(target_arch = "x86_64") => panic!("io_uring: {e}"),
        Err(e) => eprintln!("note: io_uring not tested here: {e}"),
    }
}
