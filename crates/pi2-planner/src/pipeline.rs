//! One decode step of the cluster pipeline, simulated: the I/O thread takes every request
//! pending when it becomes free, shapes them into device reads as the reader does (sorted,
//! merged, split) and reads them one after another; a cluster's gate phase starts on the first
//! free worker once its gate rows have landed, and then submits its confirmed neurons' up/down
//! rows (or, with none missing, computes its up/down phase at once); the step ends when the
//! last cluster's up/down phase does.
//!
//! This captures what a closed formula misses: reads of several clusters merging in one batch,
//! and the chain gate rows -> gate phase -> up/down rows -> up/down phase of the last clusters.
//!
//! When the workers take every core, the I/O thread's CPU work (its handling of each request)
//! runs on a core a worker was using: the handling at the end of each read delays the worker
//! that would be free first, unless that worker is idle then (an idle core absorbs it).

use crate::hw::FlashProfile;
use pi2_io::ReaderConfig;

/// A row request of a step: which cluster needs it and for which phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowRequest {
    pub cluster: u32,
    pub updown: bool,
    pub offset: u64,
    pub len: usize,
}

/// What one step costs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCost {
    /// From the step's start to its last cluster's end.
    pub secs: f64,
    /// Time the device spent reading.
    pub io_secs: f64,
    pub bytes: u64,
    pub reads: u64,
}

/// Reusable buffers (a simulation allocates nothing once warm).
#[derive(Default)]
pub struct Scratch {
    pending: Vec<(f64, RowRequest)>,
    batch: Vec<RowRequest>,
    plain: Vec<(u64, usize)>,
    spans: Vec<(u64, usize)>,
    gate_left: Vec<u32>,
    ud_left: Vec<u32>,
    ready: Vec<(f64, u32, bool)>,
    workers: Vec<f64>,
    land: Vec<f64>,
    /// Requests (count, bytes) landing with each read, and the read each request of the
    /// batch lands with.
    per_span: Vec<(usize, usize)>,
    req_span: Vec<usize>,
    ud_start: Vec<usize>,
}

/// Simulates one step. `gate_secs[c]` and `updown_secs[c]` are cluster `c`'s phases on one
/// worker; `gate` and `updown` the rows to read (`updown` in cluster order); `threads` workers,
/// which leave no core to the I/O thread if `cores_shared`.
#[allow(clippy::too_many_arguments)]
pub fn simulate(
    gate_secs: &[f64],
    updown_secs: &[f64],
    gate: &[RowRequest],
    updown: &[RowRequest],
    threads: usize,
    cores_shared: bool,
    flash: &FlashProfile,
    cfg: &ReaderConfig,
    sc: &mut Scratch,
) -> StepCost {
    let n = gate_secs.len();
    let mut out = StepCost::default();
    sc.gate_left.clear();
    sc.gate_left.resize(n, 0);
    sc.ud_left.clear();
    sc.ud_left.resize(n, 0);
    for r in gate {
        sc.gate_left[r.cluster as usize] += 1;
    }
    for r in updown {
        sc.ud_left[r.cluster as usize] += 1;
    }
    sc.workers.clear();
    sc.workers.resize(threads.max(1), 0.0);
    sc.ready.clear();
    sc.ready.extend(
        (0..n as u32)
            .filter(|&c| sc.gate_left[c as usize] == 0)
            .map(|c| (0.0, c, false)),
    );
    sc.pending.clear();
    sc.pending.extend(gate.iter().map(|&r| (0.0, r)));
    let mut io_free = 0.0f64;
    // Where each cluster's up/down requests start in `updown`.
    let ud_start = &mut sc.ud_start;
    ud_start.clear();
    ud_start.resize(n + 1, 0);
    for r in updown {
        ud_start[r.cluster as usize + 1] += 1;
    }
    for c in 0..n {
        ud_start[c + 1] += ud_start[c];
    }
    loop {
        // Tasks whose rows are in, earliest first, each on the first free worker.
        if sc.ready.len() > 1 {
            sc.ready
                .sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        }
        while let Some((t, c, is_ud)) = sc.ready.pop() {
            let (w, &free) = sc
                .workers
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(b.1))
                .expect("one worker");
            let start = t.max(free);
            let c = c as usize;
            let end = if is_ud {
                start + updown_secs[c]
            } else if sc.ud_left[c] == 0 {
                start + gate_secs[c] + updown_secs[c]
            } else {
                let end = start + gate_secs[c];
                sc.pending.extend(
                    updown[ud_start[c]..ud_start[c + 1]]
                        .iter()
                        .map(|&r| (end, r)),
                );
                end
            };
            sc.workers[w] = end;
        }
        let Some(first) = sc.pending.iter().map(|p| p.0).min_by(f64::total_cmp) else {
            break;
        };
        // The I/O thread takes everything submitted by the time it is free.
        let start = io_free.max(first);
        sc.batch.clear();
        // Taken in submission order: the batch is a few sorted runs, which a stable sort merges.
        let mut keep = 0;
        for k in 0..sc.pending.len() {
            let p = sc.pending[k];
            if p.0 <= start {
                sc.batch.push(p.1);
            } else {
                sc.pending[keep] = p;
                keep += 1;
            }
        }
        sc.pending.truncate(keep);
        if !sc.batch.is_sorted_by_key(|r| r.offset) {
            sc.batch.sort_by_key(|r| r.offset);
        }
        sc.plain.clear();
        sc.plain.extend(sc.batch.iter().map(|r| (r.offset, r.len)));
        sc.spans.clear();
        let spans = &mut sc.spans;
        pi2_io::for_each_device_read(&mut sc.plain, flash.alignment, cfg, |o, l| {
            spans.push((o, l))
        });
        // Each request lands with the read holding its last byte (spans and requests are
        // sorted); the I/O thread handles the requests of a read once it is in.
        requests_per_read(&sc.batch, &sc.spans, &mut sc.per_span, &mut sc.req_span);
        let mut t = start;
        let land = &mut sc.land;
        land.clear();
        for (&(_, len), &(n_req, req_bytes)) in sc.spans.iter().zip(sc.per_span.iter()) {
            // With several reads in flight each one's share of the queue's time shrinks by the
            // measured speedup at this depth and size; the handling is the I/O thread's alone.
            let d = flash.device_secs(len) / flash.speedup(cfg.depth, Some(len))
                + flash.handling_secs(n_req, req_bytes);
            t += d;
            out.io_secs += d;
            out.bytes += len as u64;
            out.reads += 1;
            land.push(t);
            if cores_shared {
                let cpu = flash.read_cpu_secs(len, n_req, req_bytes);
                let w = sc
                    .workers
                    .iter_mut()
                    .min_by(|a, b| a.total_cmp(b))
                    .expect("one worker");
                if *w > t - cpu {
                    *w += cpu;
                }
            }
        }
        for (r, &s) in sc.batch.iter().zip(sc.req_span.iter()) {
            let at = land[s];
            let c = r.cluster as usize;
            let left = if r.updown {
                &mut sc.ud_left[c]
            } else {
                &mut sc.gate_left[c]
            };
            *left -= 1;
            if *left == 0 {
                sc.ready.push((at, c as u32, r.updown));
            }
        }
        io_free = t;
    }
    out.secs = sc.workers.iter().copied().fold(io_free, f64::max);
    out
}

/// For each read of `spans`, the requests of `batch` that land with it (count, bytes), and for
/// each request the read it lands with: the one holding its last byte (both sorted by offset).
fn requests_per_read(
    batch: &[RowRequest],
    spans: &[(u64, usize)],
    per_span: &mut Vec<(usize, usize)>,
    req_span: &mut Vec<usize>,
) {
    per_span.clear();
    per_span.resize(spans.len(), (0, 0));
    req_span.clear();
    let mut s = 0;
    for r in batch {
        let last = r.offset + r.len as u64 - 1;
        while s + 1 < spans.len() && spans[s].0 + spans[s].1 as u64 <= last {
            s += 1;
        }
        per_span[s].0 += 1;
        per_span[s].1 += r.len;
        req_span.push(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flash(lat_us: f64) -> FlashProfile {
        FlashProfile {
            engine: "pread-direct".into(),
            engine_concurrency: 1,
            alignment: 4096,
            points: vec![],
            latency_us: lat_us,
            bytes_per_sec: 1e9,
            handling_bytes_per_sec: f64::INFINITY,
            handling_ns_per_request: 0.0,
            engine_cpu_bytes_per_sec: None,
            loaded: vec![],
        }
    }

    fn req(cluster: u32, updown: bool, page: u64) -> RowRequest {
        RowRequest {
            cluster,
            updown,
            offset: page * 65536,
            len: 100,
        }
    }

    #[test]
    fn no_reads_is_list_scheduling() {
        let cfg = ReaderConfig::default();
        let mut sc = Scratch::default();
        // Four clusters of 1 s + 1 s on two workers: 4 s.
        let c = simulate(
            &[1.0; 4],
            &[1.0; 4],
            &[],
            &[],
            2,
            false,
            &flash(0.0),
            &cfg,
            &mut sc,
        );
        assert_eq!(
            c,
            StepCost {
                secs: 4.0,
                ..Default::default()
            }
        );
    }

    #[test]
    fn the_chain_of_one_cluster_by_hand() {
        // One cluster: a gate read (100 us + 4096 B at 1 GB/s), its gate phase (1 ms), then
        // its up/down read, then its up/down phase (2 ms).
        let cfg = ReaderConfig::default();
        let mut sc = Scratch::default();
        let read = 100e-6 + 4096e-9;
        let c = simulate(
            &[1e-3],
            &[2e-3],
            &[req(0, false, 0)],
            &[req(0, true, 1)],
            4,
            false,
            &flash(100.0),
            &cfg,
            &mut sc,
        );
        assert!(
            (c.secs - (read + 1e-3 + read + 2e-3)).abs() < 1e-12,
            "{c:?}"
        );
        assert_eq!((c.reads, c.bytes), (2, 8192));
    }

    #[test]
    fn handling_delays_a_busy_worker_when_cores_are_shared() {
        // One worker: cluster 0 is resident (10 ms of gate phase), cluster 1 waits for a gate
        // read whose handling keeps the CPU busy 100 B / 100 MB/s + 1 us. That handling runs
        // while the worker computes cluster 0, so with no core to spare it delays the worker.
        let cfg = ReaderConfig::default();
        let mut sc = Scratch::default();
        let mut f = flash(100.0);
        f.handling_bytes_per_sec = 1e8;
        f.handling_ns_per_request = 1000.0;
        let handling = 100.0 / 1e8 + 1e-6;
        let run = |gate_secs: &[f64], shared: bool, sc: &mut Scratch| {
            simulate(
                gate_secs,
                &[0.0; 2],
                &[req(1, false, 0)],
                &[],
                1,
                shared,
                &f,
                &cfg,
                sc,
            )
        };
        let own = run(&[10e-3, 1e-3], false, &mut sc);
        let shared = run(&[10e-3, 1e-3], true, &mut sc);
        assert!((own.secs - 11e-3).abs() < 1e-12, "{own:?}");
        assert!(
            (shared.secs - (11e-3 + handling)).abs() < 1e-12,
            "{shared:?}"
        );
        // With nothing resident the worker is idle during the read: the handling costs nothing
        // extra. The device reads a whole aligned block; only the requested bytes are handled.
        let idle = run(&[0.0, 1e-3], true, &mut sc);
        let read = 100e-6 + 4096.0 * 1e-9 + handling;
        assert!((idle.secs - (read + 1e-3)).abs() < 1e-12, "{idle:?}");
    }

    #[test]
    fn every_request_of_a_merged_read_is_handled() {
        // Ten rows in one merged read: one device read, ten requests' handling (1 us each).
        let cfg = ReaderConfig {
            merge_gap: 1 << 20,
            max_request: 1 << 20,
            depth: 1,
        };
        let mut sc = Scratch::default();
        let mut f = flash(100.0);
        f.handling_ns_per_request = 1000.0;
        let gate: Vec<RowRequest> = (0..10).map(|k| req(0, false, k)).collect();
        let c = simulate(&[0.0], &[0.0], &gate, &[], 1, false, &f, &cfg, &mut sc);
        let device = 100e-6 + (9 * 65536 + 4096) as f64 * 1e-9;
        assert_eq!(c.reads, 1, "{c:?}");
        assert!((c.secs - (device + 10e-6)).abs() < 1e-12, "{c:?}");
    }

    #[test]
    fn requests_pending_together_merge() {
        // Both clusters' gate rows come in one merged read, so their up/down requests are
        // pending together and merge too.
        let cfg = ReaderConfig {
            merge_gap: 1 << 20,
            max_request: 1 << 20,
            depth: 1,
        };
        let mut sc = Scratch::default();
        let gate = [req(0, false, 0), req(1, false, 8)];
        let updown = [req(0, true, 2), req(1, true, 3)];
        let c = simulate(
            &[0.0; 2],
            &[0.0; 2],
            &gate,
            &updown,
            2,
            false,
            &flash(100.0),
            &cfg,
            &mut sc,
        );
        // The gate rows merge into one read; the two up/down requests into one more.
        assert_eq!(c.reads, 2, "{c:?}");
    }
}
