//! The cost model on hand-computed cases, the solver against exhaustive search over the real
//! cost model, infeasibility answers, and the plan file's versioning and refusals.

use pi2_planner::cost::Mode;
use pi2_planner::model::{Residency, ResidencySplit, StreamedWeights};
use pi2_planner::plan::{PlanDevice, PlanModel, PLAN_VERSION};
use pi2_planner::synthetic::{toy_hardware, toy_model, ToyResidency};
use pi2_planner::{plan, Constraints, CostModel, Knobs, Objective, PlanError, PlanFile, Space};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-6)
}

fn knobs(mode: Mode, budget: u64) -> Knobs {
    Knobs {
        class: 0,
        threads: 1,
        mode,
        budget,
        hot_share: 0.0,
        cluster: 64,
        io_depth: 1,
        max_read: 128 << 10,
        merge_gap: 0,
    }
}

#[test]
fn dense_decode_by_hand() {
    // 2 layers x 64 neurons, 136-byte rows everywhere, kernels at 1 GB/s, 2 us per step.
    let m = toy_model(2, 64, 2);
    let hw = toy_hardware(1, 1.0, 100.0);
    let res = ToyResidency::for_model(&m, 1 << 20);
    let cm = CostModel::new(&hw, &m, &res, 0, 16);
    let p = cm.evaluate(&knobs(Mode::Dense, 0)).unwrap();
    let b = &p.breakdown;
    // Attention: 2 layers x 4 matrices x 128 rows x 136 B at 1 GB/s.
    assert!(close(b.attention, 2.0 * 4.0 * 128.0 * 136e-9), "{b:?}");
    assert!(close(b.output, 1000.0 * 136e-9));
    assert_eq!(b.predictor, 0.0);
    // FFN: gate, up (matvec) and down (axpy) rows, 64 each, per layer.
    assert!(close(b.ffn_compute, 2.0 * 3.0 * 64.0 * 136e-9));
    // Steps: per layer 3 (attention) + 2 (FFN), plus the output head, 2 us each.
    assert!(close(b.steps, 11.0 * 2e-6));
    assert!(
        close(p.decode_tps, 1.0 / 349.488e-6),
        "{}",
        1.0 / p.decode_tps
    );
    assert_eq!(p.memory, res.in_memory_bytes());
    assert_eq!(p.hit_rate, None);
}

#[test]
fn offloaded_decode_by_hand() {
    // One layer of 64 neurons, one token: 39 candidates (i % 5 in {0, 1, 3}), 19 confirmed
    // (the even ones). At the minimum budget nothing is pinned and the cache starts empty.
    let m = toy_model(1, 64, 1);
    assert_eq!(
        (m.steps[0].candidates.len(), m.steps[0].confirmed.len()),
        (39, 19)
    );
    let hw = toy_hardware(1, 1.0, 100.0);
    let res = ToyResidency::for_model(&m, 1 << 20);
    let cm = CostModel::new(&hw, &m, &res, 0, 16);
    let p = cm
        .evaluate(&knobs(Mode::Offload, res.min_budget()))
        .unwrap();
    let b = &p.breakdown;
    // Gate rows lie in [4096, 12800): one merged 4 KiB-aligned read [4096, 16384).
    // Up and down rows lie in [12800, 30208): one read [12288, 32768) for the one cluster.
    let io = (100e-6 + 12288e-9) + (100e-6 + 20480e-9);
    assert!(close(b.io_total, io), "{b:?}");
    assert!(close(p.read_bytes_per_token, 12288.0 + 20480.0));
    assert!(close(p.device_reads_per_token, 2.0));
    // Compute: 39 gate rows + 19 up + 19 down, 136 B each at 1 GB/s.
    let c = (39.0 + 19.0 + 19.0) * 136e-9;
    assert!(close(b.ffn_compute, c));
    // One cluster: its compute follows its reads.
    assert!(close(b.io_exposed, io));
    assert!(close(b.predictor, 16.0 * 136e-9));
    // Steps: 3 attention + 2 predictor + 1 pipeline + output.
    assert!(close(b.steps, 7.0 * 2e-6));
    let total = 4.0 * 128.0 * 136e-9 + 16.0 * 136e-9 + 1000.0 * 136e-9 + 14e-6 + c + io;
    assert!(
        close(1.0 / p.decode_tps, total),
        "{} vs {total}",
        1.0 / p.decode_tps
    );
    assert_eq!(p.hit_rate, Some(0.0));
    assert_eq!(p.memory, res.min_budget());
}

#[test]
fn a_wholly_pinned_layer_runs_dense_where_that_is_faster() {
    // One layer of 64 neurons without a predictor: every neuron a candidate, 19 confirmed.
    let mut m = toy_model(1, 64, 1);
    m.predictor = vec![vec![]];
    m.steps[0].candidates = (0..64).collect();
    let res = ToyResidency::for_model(&m, 1 << 20);
    let whole = res.min_budget() + 64 * res.neuron_bytes;
    let row = 136e-9;
    let offload = |hot_share| Knobs {
        hot_share,
        ..knobs(Mode::Offload, whole)
    };
    // Gathered rows at a quarter of the streaming speed: the sparse step (64 gate and 19 up
    // rows gathered, 19 down rows added) costs 351 rows' time, the dense FFN 192.
    let mut slow_gather = toy_hardware(1, 1.0, 100.0);
    for rate in &mut slow_gather.classes[0].rates[0].kernels {
        if rate.op == pi2_planner::hw::KernelOp::Gather {
            rate.bytes_per_sec /= 4.0;
        }
    }
    let cm = CostModel::new(&slow_gather, &m, &res, 0, 16);
    assert_eq!(cm.dense_layers(&offload(1.0)).unwrap(), vec![true]);
    let b = cm.evaluate(&offload(1.0)).unwrap().breakdown;
    assert!(close(b.ffn_compute, 192.0 * row), "{b:?}");
    // Not wholly pinned: the sparse step.
    let b = cm.evaluate(&offload(0.5)).unwrap().breakdown;
    assert!(close(b.ffn_compute, 351.0 * row), "{b:?}");

    // Every kernel at one speed: the sparse step (102 rows) is faster, so it stays.
    let even = toy_hardware(1, 1.0, 100.0);
    let cm = CostModel::new(&even, &m, &res, 0, 16);
    assert_eq!(cm.dense_layers(&offload(1.0)).unwrap(), vec![false]);
    let b = cm.evaluate(&offload(1.0)).unwrap().breakdown;
    assert!(close(b.ffn_compute, 102.0 * row), "{b:?}");

    // With a predictor the layer keeps the sparse step.
    let with_predictor = toy_model(1, 64, 1);
    let cm = CostModel::new(&slow_gather, &with_predictor, &res, 0, 16);
    assert_eq!(cm.dense_layers(&offload(1.0)).unwrap(), vec![false]);
}

/// The toy split with these weights read from flash every token.
struct Streaming(ToyResidency, StreamedWeights);

impl Residency for Streaming {
    fn split(&self, budget: u64, hot_share: f64) -> Result<ResidencySplit, pi2_planner::PlanError> {
        let mut s = self.0.split(budget, hot_share)?;
        s.streamed = self.1;
        Ok(s)
    }
    fn min_budget(&self) -> u64 {
        self.0.min_budget()
    }
    fn in_memory_bytes(&self) -> u64 {
        self.0.in_memory_bytes()
    }
}

#[test]
fn streamed_weights_add_their_reads() {
    // Two layers; streaming the last one's attention reads its four 128 x 136 B matrices, one
    // read each; 800 output rows of 136 B in chunks of 300 rows are three reads (300, 300 and
    // 200 rows), the embedding row one more; all on the queue the neuron reads use.
    let m = toy_model(2, 64, 2);
    let hw = toy_hardware(1, 1.0, 100.0);
    let base = ToyResidency::for_model(&m, 1 << 20);
    let budget = base.min_budget();
    let plain = CostModel::new(&hw, &m, &base, 0, 16)
        .evaluate(&knobs(Mode::Offload, budget))
        .unwrap();
    let mat = 128.0 * 136.0;
    let read = |bytes: f64| 100e-6 + bytes * 1e-9;
    for (streamed, secs, bytes, reads) in [
        (
            StreamedWeights {
                attn_layers: 1,
                ..Default::default()
            },
            4.0 * read(mat),
            4.0 * mat,
            4.0,
        ),
        (
            StreamedWeights {
                attn_layers: 1,
                output_rows: 800,
                output_chunk_rows: 300,
                embedding_row_bytes: 136,
            },
            4.0 * read(mat) + 2.0 * read(300.0 * 136.0) + read(200.0 * 136.0) + read(136.0),
            4.0 * mat + 800.0 * 136.0 + 136.0,
            8.0,
        ),
    ] {
        let res = Streaming(ToyResidency::for_model(&m, 1 << 20), streamed);
        let p = CostModel::new(&hw, &m, &res, 0, 16)
            .evaluate(&knobs(Mode::Offload, budget))
            .unwrap();
        let (a, b) = (&plain.breakdown, &p.breakdown);
        assert!(close(b.io_total - a.io_total, secs), "{a:?} {b:?}");
        assert!(close(b.io_exposed - a.io_exposed, secs));
        assert!(close(
            p.read_bytes_per_token - plain.read_bytes_per_token,
            bytes
        ));
        assert!(close(
            p.device_reads_per_token - plain.device_reads_per_token,
            reads
        ));
        assert!(close(1.0 / p.decode_tps - 1.0 / plain.decode_tps, secs));
        // Prefill reads them too, once per batch (the attention hidden here behind the previous
        // layer's compute).
        assert!(p.prefill_tps <= plain.prefill_tps);
    }
}

/// A clustered head computes its share of the output rows (plus its probes) and reads only the
/// chosen clusters that are not resident, as often as calibration chose them.
#[test]
fn a_clustered_head_costs_its_share_and_its_chosen_clusters() {
    let mut m = toy_model(2, 64, 2);
    let hw = toy_hardware(1, 1.0, 100.0);
    let base = ToyResidency::for_model(&m, 1 << 20);
    let budget = base.min_budget();
    let streamed = StreamedWeights {
        output_rows: 800,
        output_chunk_rows: 300,
        ..Default::default()
    };
    let res = Streaming(ToyResidency::for_model(&m, 1 << 20), streamed);
    let whole = CostModel::new(&hw, &m, &res, 0, 16)
        .evaluate(&knobs(Mode::Offload, budget))
        .unwrap();
    // 1000 rows in 125 clusters of 8; the last 100 clusters (800 rows) are not resident; 64 of
    // them are each chosen by 1/64 of tokens: one cluster read per token.
    let mut frequency = vec![0.5f32; 25];
    frequency.extend(vec![0.0f32; 36]);
    frequency.extend(vec![1.0f32 / 64.0; 64]);
    let probe = pi2_planner::model::MatShape {
        ty: m.output.ty.clone(),
        rows: 125,
        row_bytes: m.output.row_bytes,
    };
    m.head = Some(pi2_planner::model::HeadShape {
        share: 0.25,
        cluster: 8,
        frequency,
        probes: vec![probe.clone(), probe],
    });
    let res = Streaming(ToyResidency::for_model(&m, 1 << 20), streamed);
    let head = CostModel::new(&hw, &m, &res, 0, 16)
        .evaluate(&knobs(Mode::Offload, budget))
        .unwrap();
    let read = |bytes: f64| 100e-6 + bytes * 1e-9;
    let (w, h) = (&whole.breakdown, &head.breakdown);
    // Reads: three output chunks against one 8-row cluster.
    let saved = 2.0 * read(300.0 * 136.0) + read(200.0 * 136.0) - read(8.0 * 136.0);
    assert!(close(w.io_total - h.io_total, saved), "{w:?} {h:?}");
    assert!(close(
        whole.read_bytes_per_token - head.read_bytes_per_token,
        (800.0 - 8.0) * 136.0
    ));
    // Compute: a quarter of the rows and two 125-row probes, against 1000 rows.
    assert!(
        close(h.output / w.output, (250.0 + 250.0) / 1000.0),
        "{w:?} {h:?}"
    );
}

#[test]
fn merge_gap_trades_reads_for_bytes() {
    let m = toy_model(2, 512, 8);
    let hw = toy_hardware(1, 1.0, 100.0);
    let res = ToyResidency::for_model(&m, 1 << 20);
    let cm = CostModel::new(&hw, &m, &res, 0, 16);
    let k = knobs(Mode::Offload, res.min_budget());
    let near = cm.evaluate(&k).unwrap();
    let far = cm
        .evaluate(&Knobs {
            merge_gap: 64 << 10,
            ..k
        })
        .unwrap();
    assert!(far.device_reads_per_token <= near.device_reads_per_token);
    assert!(far.read_bytes_per_token >= near.read_bytes_per_token);
}

fn all_plans(
    cm: &CostModel<'_>,
    c: &Constraints,
    s: &Space,
    res: &ToyResidency,
) -> Option<(f64, Knobs)> {
    let top = c.mem_limit.min(res.in_memory_bytes().max(res.min_budget()));
    let n = s.memory_points as u64;
    let mut best: Option<(f64, Knobs)> = None;
    for th in 1..=cm.hw.classes[0].rates.len() {
        for &mode in &s.modes {
            let budgets: Vec<u64> = match mode {
                Mode::Offload => (0..n)
                    .map(|k| top - (top - res.min_budget()) * k / (n - 1))
                    .collect(),
                _ => vec![0],
            };
            for b in budgets {
                for &hot_share in &s.hot_shares {
                    for &cluster in &s.clusters {
                        for &merge_gap in &s.merge_gaps {
                            for &max_read in &s.max_reads {
                                for &io_depth in &s.io_depths {
                                    let k = Knobs {
                                        class: 0,
                                        threads: th,
                                        mode,
                                        budget: b,
                                        hot_share,
                                        cluster,
                                        io_depth,
                                        max_read,
                                        merge_gap,
                                    };
                                    let Ok(p) = cm.evaluate(&k) else { continue };
                                    if p.memory > c.mem_limit || p.decode_tps < c.min_decode_tps {
                                        continue;
                                    }
                                    let v = match c.objective {
                                        Objective::Fastest => 1.0 / p.decode_tps,
                                        Objective::LeastMemory => {
                                            p.memory as f64 + 1e-3 / p.decode_tps
                                        }
                                    };
                                    if best.as_ref().is_none_or(|(bv, _)| v < *bv) {
                                        best = Some((v, k));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    best
}

fn small_space() -> Space {
    Space {
        threads: vec![],
        modes: vec![Mode::Sparse, Mode::Dense, Mode::Offload],
        memory_points: 4,
        hot_shares: vec![1.0, 0.5, 0.0],
        clusters: vec![16, 64],
        merge_gaps: vec![0, 16 << 10],
        max_reads: vec![128 << 10],
        io_depths: vec![1, 4],
    }
}

#[test]
fn the_solver_finds_the_best_plan_exhaustive_search_finds() {
    let m = toy_model(3, 256, 6);
    let res = ToyResidency::for_model(&m, 1 << 18);
    let s = small_space();
    for (gbps, lat, stride) in [
        (0.5, 20.0, 1),
        (2.0, 100.0, 3),
        (8.0, 400.0, 1),
        (1.0, 50.0, 4),
    ] {
        let hw = toy_hardware(2, gbps, lat);
        let mut cm = CostModel::new(&hw, &m, &res, 32, 16);
        cm.io_stride = stride;
        for frac in [1.2, 0.9, 0.6, 0.45] {
            for (objective, min_tps) in [(Objective::Fastest, 0.0), (Objective::LeastMemory, 0.0)] {
                let c = Constraints {
                    mem_limit: (res.in_memory_bytes() as f64 * frac) as u64,
                    classes: vec![],
                    max_threads: 0,
                    min_decode_tps: min_tps,
                    objective,
                };
                let want = all_plans(&cm, &c, &s, &res);
                let got = plan(&cm, &c, &s);
                match (want, got) {
                    (Some((v, k)), Ok(sol)) => {
                        let gv = match objective {
                            Objective::Fastest => 1.0 / sol.predicted.decode_tps,
                            Objective::LeastMemory => {
                                sol.predicted.memory as f64 + 1e-3 / sol.predicted.decode_tps
                            }
                        };
                        assert!(
                            close(gv, v),
                            "{gbps} {lat} {frac} {objective:?}: {:?} vs {k:?}",
                            sol.knobs
                        );
                        assert!(sol.evaluated <= sol.space_size);
                    }
                    (None, Err(_)) => {}
                    (w, g) => panic!("{gbps} {lat} {frac} {objective:?}: {w:?} vs {g:?}"),
                }
            }
        }
    }
}

#[test]
fn least_memory_meets_the_minimum_speed_with_less_memory() {
    let m = toy_model(3, 256, 6);
    let res = ToyResidency::for_model(&m, 1 << 18);
    let hw = toy_hardware(2, 2.0, 100.0);
    let cm = CostModel::new(&hw, &m, &res, 32, 16);
    let s = small_space();
    let mut c = Constraints {
        mem_limit: res.in_memory_bytes() * 2,
        classes: vec![],
        max_threads: 0,
        min_decode_tps: 0.0,
        objective: Objective::Fastest,
    };
    let fastest = plan(&cm, &c, &s).unwrap();
    c.objective = Objective::LeastMemory;
    c.min_decode_tps = fastest.predicted.decode_tps * 0.5;
    let lean = plan(&cm, &c, &s).unwrap();
    assert!(lean.predicted.decode_tps >= c.min_decode_tps);
    assert!(lean.predicted.memory <= fastest.predicted.memory);
    let want = all_plans(&cm, &c, &s, &res).unwrap();
    assert!(close(
        lean.predicted.memory as f64 + 1e-3 / lean.predicted.decode_tps,
        want.0
    ));
}

#[test]
fn infeasible_constraints_name_what_binds() {
    let m = toy_model(2, 128, 4);
    let res = ToyResidency::for_model(&m, 1 << 18);
    let hw = toy_hardware(2, 2.0, 100.0);
    let cm = CostModel::new(&hw, &m, &res, 32, 16);
    let mut c = Constraints {
        mem_limit: res.min_budget() - 1,
        classes: vec![],
        max_threads: 0,
        min_decode_tps: 0.0,
        objective: Objective::Fastest,
    };
    let e = plan(&cm, &c, &Space::default()).unwrap_err().to_string();
    assert!(e.contains("needs at least"), "{e}");
    c.mem_limit = res.in_memory_bytes();
    c.min_decode_tps = 1e12;
    let e = plan(&cm, &c, &Space::default()).unwrap_err().to_string();
    assert!(
        e.contains("no plan decodes at") && e.contains("fastest predicted"),
        "{e}"
    );
    c.min_decode_tps = 0.0;
    c.classes = vec![3];
    let e = plan(&cm, &c, &Space::default()).unwrap_err().to_string();
    assert!(e.contains("no allowed cores"), "{e}");
}

fn a_plan() -> PlanFile {
    let m = toy_model(2, 128, 4);
    let res = ToyResidency::for_model(&m, 1 << 18);
    let hw = toy_hardware(2, 2.0, 100.0);
    let cm = CostModel::new(&hw, &m, &res, 32, 16);
    let c = Constraints {
        mem_limit: res.in_memory_bytes(),
        classes: vec![],
        max_threads: 0,
        min_decode_tps: 0.0,
        objective: Objective::Fastest,
    };
    let sol = plan(&cm, &c, &Space::default()).unwrap();
    PlanFile {
        version: PLAN_VERSION,
        model: PlanModel {
            name: m.name.clone(),
            digest: m.digest.clone(),
            file_bytes: m.file_bytes,
        },
        device: PlanDevice {
            fingerprint: hw.fingerprint.clone(),
            cpu: hw.cpu.clone(),
            emulated: None,
            engine: hw.flash.engine.clone(),
        },
        constraints: c,
        knobs: sol.knobs,
        dense_layers: vec![true; m.n_layer],
        cpus: vec![0, 1],
        n_ctx: 256,
        n_batch: 16,
        predicted: sol.predicted,
        evaluated: sol.evaluated,
        space_size: sol.space_size,
    }
}

#[test]
fn plan_files_round_trip_and_refuse_foreign_or_old_plans() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    let p = a_plan();
    p.save(&path, false).unwrap();
    assert_eq!(PlanFile::load(&path).unwrap(), p);
    // Never replaced without asking.
    let e = p.save(&path, false).unwrap_err().to_string();
    assert!(e.contains("exists"), "{e}");
    p.save(&path, true).unwrap();

    p.check("toy-digest", "toy-device").unwrap();
    let e = p.check("other-model", "toy-device").unwrap_err();
    assert!(matches!(e, PlanError::Foreign { what: "model", .. }), "{e}");
    let e = p.check("toy-digest", "other-device").unwrap_err();
    assert!(
        matches!(e, PlanError::Foreign { what: "device", .. }),
        "{e}"
    );

    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["version"] = (PLAN_VERSION + 1).into();
    std::fs::write(&path, v.to_string()).unwrap();
    let e = PlanFile::load(&path).unwrap_err().to_string();
    assert!(e.contains("plan again"), "{e}");
    std::fs::write(&path, "{\"version\": 1, \"model\": 3}").unwrap();
    assert!(PlanFile::load(&path).is_err());
    std::fs::write(&path, "not json").unwrap();
    assert!(PlanFile::load(&path)
        .unwrap_err()
        .to_string()
        .contains("not JSON"));
}
