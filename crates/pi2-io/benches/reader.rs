//! Reader throughput: a decode-like batch of small scattered requests (neuron rows) through the
//! single-queue reader, with and without merging of nearby requests, and with every row checked
//! against a checksum table (`-checked`).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pi2_io::{crc32, Checksums, PreadEngine, Reader, ReaderConfig, Request, SumRegion};
use std::io::Write;
use std::sync::Arc;

fn bench_reader(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.bin");
    let size = 32usize << 20;
    let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    // 512 rows of 360 bytes, about half the rows of a 1536-neuron layer region.
    let row = 360usize;
    let offsets: Vec<u64> = (0..512u64)
        .map(|i| 1 << 20 | (i * 3 * row as u64))
        .collect();
    let mut dst = vec![0u8; offsets.len() * row];
    // Every row of the region checksummed, as in a converted model.
    let sums = Arc::new(
        Checksums::new(vec![SumRegion {
            name: "rows".into(),
            offset: 1 << 20,
            record_len: row as u64,
            sums: data[1 << 20..][..3 * 512 * row]
                .chunks(row)
                .map(crc32)
                .collect(),
        }])
        .unwrap(),
    );
    let mut g = c.benchmark_group("reader");
    g.throughput(Throughput::Bytes(dst.len() as u64));
    // The `-cached` cases read through the page cache: they measure the reader's own CPU cost
    // (merging, copies, completions) without the disk's speed, which drifts on shared hosts.
    for (name, gap, cached, checked) in [
        ("rows-merged", 4096usize, false, false),
        ("rows-unmerged", 0, false, false),
        ("rows-merged-checked", 4096, false, true),
        ("rows-merged-cached", 4096, true, false),
        ("rows-unmerged-cached", 0, true, false),
        ("rows-merged-cached-checked", 4096, true, true),
        ("rows-unmerged-cached-checked", 0, true, true),
    ] {
        let cfg = ReaderConfig {
            merge_gap: gap,
            max_request: if gap == 0 { 4096 } else { 128 << 10 },
            ..ReaderConfig::default()
        };
        let engine = if cached {
            PreadEngine::open_cached(&path).unwrap()
        } else {
            PreadEngine::open(&path, true).unwrap()
        };
        let reader = Reader::with_checksums(engine, cfg, checked.then(|| sums.clone())).unwrap();
        g.bench_function(name, |b| {
            b.iter(|| {
                let reqs: Vec<Request> = offsets
                    .iter()
                    .enumerate()
                    .map(|(i, &o)| Request {
                        offset: o,
                        len: row,
                        dst: dst[i * row..].as_mut_ptr(),
                        tag: i as u64,
                    })
                    .collect();
                // SAFETY: `dst` is not touched until every completion is received.
                unsafe { reader.submit(&reqs).unwrap() };
                for _ in 0..reqs.len() {
                    reader.recv().unwrap().result.unwrap();
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_reader);
criterion_main!(benches);
