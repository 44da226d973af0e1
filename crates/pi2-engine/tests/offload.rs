//! Offloaded decode (FFN bundles read from flash into the pinned/LRU cache under a budget)
//! against in-memory sparse decode: the same logits, bit for bit, at every budget; reader
//! faults end in clear errors; budgets below the minimum are refused with the minimum named.

mod common;

use pi2_engine::{Engine, EngineConfig, Logits, Offload, OffloadConfig, SparseFfn};
use pi2_io::FaultPlan;
use pi2_io::IoEngine;
use pi2_kernels::QuantType;
use pi2_model::synth::{build, SynthSpec};
use pi2_model::{GgufFile, Model};
use std::path::{Path, PathBuf};

fn spec() -> SynthSpec {
    common::offload_spec()
}

fn cfg() -> EngineConfig {
    common::offload_cfg(64)
}

const PROMPT: [u32; 4] = [5, 17, 42, 3];
const DECODE: [u32; 10] = [99, 7, 64, 12, 8, 150, 33, 2, 77, 1];

/// A converted (bundled, lowrank-predictor) synthetic model on disk.
fn converted(dir: &Path) -> PathBuf {
    converted_from(dir, &spec(), true)
}

fn converted_from(dir: &Path, spec: &SynthSpec, head: bool) -> PathBuf {
    common::converted_model(dir, spec, &cfg(), head)
}

/// Dense prefill of the prompt, then sparse decode: the logits of every step.
fn run(e: &mut Engine<'_>) -> Result<Vec<Vec<f32>>, pi2_engine::EngineError> {
    e.truncate(0);
    let mut out = vec![e.forward(&PROMPT, Logits::Last)?.to_vec()];
    for &t in &DECODE {
        out.push(e.forward(&[t], Logits::Last)?.to_vec());
    }
    Ok(out)
}

use common::frequencies;

fn offload(
    m: &Model,
    sp: &SparseFfn<'_>,
    path: &Path,
    e: &Engine<'_>,
    oc: OffloadConfig,
) -> Result<Offload, pi2_engine::EngineError> {
    let freq = frequencies(m);
    Offload::new(
        m,
        sp,
        path,
        pi2_engine::kv_bytes_full(e.model(), &cfg(), 8) as u64,
        pi2_engine::scratch_bytes(e.model(), &cfg(), 8) as u64,
        freq.as_deref(),
        &oc,
    )
}

/// In-memory sparse decode's logits, and the least offload budget.
fn reference_and_least_budget(m: &Model, sp: &SparseFfn<'_>) -> (Vec<Vec<f32>>, u64) {
    let mut mem = common::sparse_engine(m, &cfg(), sp, None).unwrap();
    let want = run(&mut mem).unwrap();
    let (kv, scratch) = (
        pi2_engine::kv_bytes_full(mem.model(), &cfg(), 8) as u64,
        pi2_engine::scratch_bytes(mem.model(), &cfg(), 8) as u64,
    );
    (want, pi2_engine::min_budget(m, sp, kv, scratch).unwrap())
}

/// The read engines to test: io_uring too where the kernel has it (native x86-64 Linux must;
/// qemu-user, which runs the aarch64 tests, does not emulate it).
fn io_engines(path: &Path) -> Vec<IoEngine> {
    let mut v = vec![IoEngine::Pread];
    #[cfg(target_os = "linux")]
    match pi2_io::UringEngine::open(path, true, 4) {
        Ok(_) => v.push(IoEngine::Uring),
        Err(e) => {
            if cfg!(target_arch = "x86_64") {
                panic!("io_uring: {e}");
            }
            eprintln!("note: the io_uring engine is not tested here: {e}");
        }
    }
    v
}

#[test]
fn offloaded_decode_matches_in_memory_at_every_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = converted(dir.path());
    let m = Model::load(&path).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    let mut mem = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
    let want = run(&mut mem).unwrap();

    // The smallest budget that works, from the error of one that does not.
    let probe = Engine::new(&m, &cfg()).unwrap();
    let err = offload(
        &m,
        &sp,
        &path,
        &probe,
        OffloadConfig {
            budget: 1000,
            ..Default::default()
        },
    )
    .err()
    .expect("1000 bytes cannot hold the model");
    let msg = err.to_string();
    assert!(msg.contains("memory budget too small"), "{msg}");
    let minimum: u64 = msg
        .split("at least ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no minimum in: {msg}"));
    // The planner's figure is the same one.
    let (kv, scratch) = (
        pi2_engine::kv_bytes_full(probe.model(), &cfg(), 8) as u64,
        pi2_engine::scratch_bytes(probe.model(), &cfg(), 8) as u64,
    );
    assert_eq!(
        pi2_engine::min_budget(&m, &sp, kv, scratch).unwrap(),
        minimum
    );
    assert!(offload(
        &m,
        &sp,
        &path,
        &probe,
        OffloadConfig {
            budget: minimum - 1,
            ..Default::default()
        }
    )
    .is_err());

    let file = m.file.file_size();
    let cases = [
        (minimum, 0.0),
        (minimum + file / 8, 0.5),
        (minimum + file / 8, 0.0),
        (4 * file, 0.5),
    ];
    for (engine, (budget, hot_share)) in io_engines(&path)
        .into_iter()
        .flat_map(|e| cases.map(|c| (e, c)))
    {
        let e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let o = offload(
            &m,
            &sp,
            &path,
            &e,
            OffloadConfig {
                budget,
                hot_share,
                engine,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(o.budget().total_used() <= budget);
        let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap();
        for pass in 0..2 {
            let got = run(&mut e).unwrap();
            let what = format!("{engine:?} budget {budget} hot {hot_share} pass {pass}");
            common::assert_same_logits(&want, &got, &what);
        }
        let o = e.offload().unwrap();
        let st = o.stats();
        assert_eq!(st.token_layers, 2 * (DECODE.len() as u64) * 2);
        if hot_share == 0.0 {
            assert!(st.gate_reads > 0, "{st:?}");
        }
        if budget > 2 * file {
            // Everything fits: the second pass reads nothing new from flash for decode.
            assert!(st.gate_hits + st.gate_hot > st.gate_reads, "{st:?}");
        }
        assert!(o.reader_stats().bytes_read > 0);
    }
}

#[test]
fn streamed_weights_give_the_same_logits() {
    // Five layers: streaming attention pays off from three layers on (two buffers replace
    // them). A tied f32 embedding/output, a separate q8_0 pair (row groups of four), and a
    // gemma3 model.
    for (what, spec, head) in [
        (
            "tied f32",
            SynthSpec {
                n_layer: 5,
                ..spec()
            },
            false,
        ),
        (
            "tied f32, clustered head",
            SynthSpec {
                n_layer: 5,
                ..spec()
            },
            true,
        ),
        (
            "untied q8_0",
            SynthSpec {
                n_layer: 5,
                tied: false,
                embd_type: QuantType::Q8_0,
                ..spec()
            },
            false,
        ),
        (
            // Scaled embeddings, per-head and post norms, sliding windows.
            "gemma3 tied q8_0",
            SynthSpec {
                arch: "gemma3".into(),
                n_layer: 5,
                embd_type: QuantType::Q8_0,
                ..spec()
            },
            false,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = converted_from(dir.path(), &spec, head);
        streamed_weights_case(what, &path);
    }
}

fn streamed_weights_case(what: &str, path: &Path) {
    let m = Model::load(path).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    let (want, minimum) = reference_and_least_budget(&m, &sp);
    let attn_layer: u64 = ["attn_q", "attn_k", "attn_v", "attn_output"]
        .iter()
        .map(|t| m.file.tensor(&format!("blk.0.{t}.weight")).unwrap().size)
        .sum();
    let vocab = m.config.n_vocab;
    let out_name = match m.weights.tied_output {
        true => "token_embd.weight",
        false => "output.weight",
    };
    let out_row = m.file.tensor(out_name).unwrap().size / vocab as u64;
    let file = m.file.file_size();
    let tokens: Vec<u32> = PROMPT.iter().chain(&DECODE).copied().collect();
    let passes = 2 * (1 + DECODE.len() as u64);
    let (mut last_streamed, mut partial_output) = (u64::MAX, false);
    let budgets = (0..=8).map(|k| minimum + (file - minimum) * k / 8);
    for budget in budgets.chain([4 * file]) {
        let e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let oc = OffloadConfig {
            budget,
            hot_share: 0.5,
            ..Default::default()
        };
        let o = offload(&m, &sp, path, &e, oc).unwrap();
        let ctx = format!("{what}, budget {budget}");
        assert!(o.budget().total_used() <= budget, "{ctx}");
        let (layers, rows) = (o.streamed_layers(), o.streamed_output_rows());
        if budget == minimum {
            assert_eq!((layers, rows), (5, vocab), "{ctx}: everything streams");
        }
        if budget > file {
            assert_eq!((layers, rows), (0, 0), "{ctx}: nothing streams");
        }
        partial_output |= rows > 0 && rows < vocab;
        // More memory never streams more.
        let streamed = layers as u64 * attn_layer + rows as u64 * out_row;
        assert!(
            streamed <= last_streamed,
            "{ctx}: {streamed} > {last_streamed}"
        );
        last_streamed = streamed;
        let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap();
        for pass in 0..2 {
            let got = run(&mut e).unwrap();
            common::assert_same_logits(&want, &got, &format!("{ctx} pass {pass}"));
        }
        // Each streamed layer and output row is read once per forward pass (prefill + decode
        // steps), give or take the read-ahead of the next pass's first layer and chunks.
        let st = e.offload().unwrap().stats();
        let layers = layers as u64;
        let reads = st.attn_layer_reads;
        assert!(
            reads >= passes * layers && reads <= passes * layers + 2,
            "{ctx}: {layers} streamed layers, {reads} reads"
        );
        assert_eq!(st.attn_bytes, reads * attn_layer, "{ctx}");
        let out = passes * rows as u64 * out_row;
        let head = e.head_stats();
        if head.steps > 0 {
            // A clustered head reads only the chosen clusters that are not resident.
            assert!(st.out_bytes <= out, "{ctx}: {} > {out}", st.out_bytes);
            assert_eq!(head.flash_bytes, st.out_bytes, "{ctx}");
            assert_eq!(head.steps, passes, "{ctx}");
        } else {
            assert!(
                st.out_bytes >= out && st.out_bytes <= out + out / passes,
                "{ctx}: {rows} streamed rows, {} bytes read",
                st.out_bytes
            );
        }
        // Lookups read every row that is not resident (a clustered head's output matrix is
        // its own: the tied embedding is read a row per lookup).
        let resident = match m.weights.tied_output {
            true => vocab - rows,
            false => 0,
        };
        let misses = tokens.iter().filter(|&&t| t as usize >= resident).count() as u64;
        assert_eq!(st.embd_rows, 2 * misses, "{ctx}");
    }
    assert!(
        partial_output,
        "{what}: no budget streamed part of the output"
    );
    // A failing device mid-stream ends in a clear error, and the next pass reports it again
    // rather than computing from a half-read buffer.
    for eio_from in [1, 30] {
        let e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let oc = OffloadConfig {
            budget: minimum,
            faults: Some(FaultPlan {
                eio_from: Some(eio_from),
                ..Default::default()
            }),
            ..Default::default()
        };
        let o = offload(&m, &sp, path, &e, oc).unwrap();
        let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap();
        for _ in 0..2 {
            let err = run(&mut e).unwrap_err().to_string();
            assert!(err.contains("Input/output error"), "{what}: {err}");
        }
    }
}

#[test]
fn reader_faults_end_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = converted(dir.path());
    let m = Model::load(&path).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    for (plan, want) in [
        (
            FaultPlan {
                eio_from: Some(10),
                ..Default::default()
            },
            "Input/output error",
        ),
        (
            FaultPlan {
                short_at: Some(12),
                ..Default::default()
            },
            "short read",
        ),
    ] {
        let e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let oc = OffloadConfig {
            budget: u64::MAX,
            hot_share: 0.0,
            faults: Some(plan),
            ..Default::default()
        };
        let o = offload(&m, &sp, &path, &e, oc).unwrap();
        let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap();
        let err = run(&mut e).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn offloading_needs_a_converted_model_and_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.gguf");
    std::fs::write(&plain, build(&spec()).to_bytes()).unwrap();
    let m = Model::load(&plain).unwrap();
    let sp = SparseFfn::from_dense(&m, &[0.1, 0.1], None).unwrap();
    let e = Engine::new(&m, &cfg()).unwrap();
    let err = offload(&m, &sp, &plain, &e, OffloadConfig::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("pi2 convert"), "{err}");
    let path = converted(dir.path());
    let conv = Model::load(&path).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&conv).unwrap().unwrap();
    let e = Engine::new(&conv, &cfg()).unwrap();
    let err = offload(&conv, &sp, &plain, &e, OffloadConfig::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not the file"), "{err}");
}

/// Where `name`'s data lies in the file at `path`: (offset, bytes).
fn tensor_span(path: &Path, name: &str) -> (u64, u64) {
    let f = GgufFile::open(path).unwrap();
    let t = f.tensor(name).unwrap();
    (f.data_offset + t.offset, t.size)
}

/// Flip one bit in every `step`-th byte of `[at, at + len)` of the file.
fn flip(path: &Path, at: u64, len: u64, step: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    for o in (at..at + len).step_by(step as usize) {
        let mut b = [0u8];
        file.read_exact_at(&mut b, o).unwrap();
        file.write_all_at(&[b[0] ^ 0x10], o).unwrap();
    }
}

/// Faults across the offload path, each ending in the in-memory tokens or a clear error,
/// never in other tokens without one: a slow device, neuron rows changed on flash while a run
/// reads them (checksums), resident weights changed before loading, a file truncated under a
/// running offload. (EIO and short reads: `reader_faults_end_with_clear_errors`.)
#[test]
fn faults_across_the_offload_path_end_in_the_right_tokens_or_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = converted(dir.path());
    let pristine = std::fs::read(&path).unwrap();
    let m = Model::load(&path).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    let mut mem = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
    let want = run(&mut mem).unwrap();
    pi2_engine::verify_checksums(&m).unwrap();
    // Every neuron cold: each decode step reads rows from flash.
    let cold = |faults: Option<FaultPlan>| OffloadConfig {
        budget: u64::MAX,
        hot_share: 0.0,
        faults,
        ..Default::default()
    };
    let offloaded = |oc: OffloadConfig| {
        let e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let o = offload(&m, &sp, &path, &e, oc)?;
        common::sparse_engine(&m, &cfg(), &sp, Some(o))
    };

    // A slow device changes nothing but time.
    let slow = FaultPlan {
        latency: std::time::Duration::from_micros(300),
        ..Default::default()
    };
    assert_eq!(
        run(&mut offloaded(cold(Some(slow))).unwrap()).unwrap(),
        want
    );

    // Neuron rows changed on flash after the run started: the reads that land on them fail.
    for part in ["ffn_gate.weight", "ffn_up.weight", "ffn_down_t.weight"] {
        let mut e = offloaded(cold(None)).unwrap();
        let (at, len) = tensor_span(&path, &format!("blk.1.{part}"));
        flip(&path, at, len, 97);
        let err = run(&mut e).unwrap_err().to_string();
        assert!(
            err.contains("changed or is damaged") && err.contains(&format!("blk.1.{part}")),
            "{part}: {err}"
        );
        std::fs::write(&path, &pristine).unwrap();
    }

    // Resident weights changed before a load: refused when the offload (or, in memory, the
    // model) is set up, before any token.
    let (at, len) = tensor_span(&path, "blk.0.attn_q.weight");
    flip(&path, at + len / 2, 1, 1);
    {
        let changed = Model::load(&path).unwrap();
        let err = pi2_engine::verify_checksums(&changed)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`blk.0.attn_q.weight` does not match its checksum"),
            "{err}"
        );
        let (csp, _) = pi2_engine::load_sparse(&changed).unwrap().unwrap();
        let e = Engine::new(&changed, &cfg()).unwrap();
        let err = offload(&changed, &csp, &path, &e, cold(None))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("does not match its checksum"), "{err}");
    }
    std::fs::write(&path, &pristine).unwrap();

    // Truncated under a running offload (the neurons of the last layer, past every resident
    // tensor): a clear read error.
    let mut e = offloaded(cold(None)).unwrap();
    let (at, _) = tensor_span(&path, "blk.1.ffn_gate.weight");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(at)
        .unwrap();
    let err = run(&mut e).unwrap_err().to_string();
    assert!(
        err.contains("short read") || err.contains("past the end"),
        "{err}"
    );
}

/// Without a predictor every gate row is read every token, so pinning prefers gate rows (a
/// byte of them saves a byte per token) to up and down rows (a byte saves a byte per firing):
/// some budgets pin more gate rows than whole neurons, and decode gives the in-memory logits.
#[test]
fn gate_rows_pinned_first_without_a_predictor_give_the_same_logits() {
    let dir = tempfile::tempdir().unwrap();
    let path = converted(dir.path());
    let m = Model::load(&path).unwrap();
    let (mut sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    sp.use_predictor = false;
    let (want, minimum) = reference_and_least_budget(&m, &sp);
    let file = m.file.file_size();
    let mut gate_only = 0;
    for budget in [minimum + file / 16, minimum + file / 8, minimum + file / 4] {
        let e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let oc = OffloadConfig {
            budget,
            hot_share: 1.0,
            ..Default::default()
        };
        let o = offload(&m, &sp, &path, &e, oc).unwrap();
        let (gates, whole) = (o.hot_gate_counts(), o.hot_counts());
        assert!(gates.iter().zip(&whole).all(|(g, h)| g >= h));
        gate_only += gates.iter().sum::<usize>() - whole.iter().sum::<usize>();
        let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap();
        let got = run(&mut e).unwrap();
        common::assert_same_logits(&want, &got, &format!("budget {budget}"));
        assert!(e.offload().unwrap().stats().gate_hot > 0);
    }
    assert!(gate_only > 0, "no budget pinned gate rows alone");
}

/// One budget whose regions move: an offload charged for one batch of KV cache gives cold
/// slots back (all room in the LRU cache) or pinned rows (all room pinned) as decode writes
/// positions, with in-memory decode's logits bit for bit and the budget never exceeded; at the
/// least budget there is nothing to give, and the step that needs more fails saying how far
/// the context got and what to do.
#[test]
fn the_kv_cache_grows_inside_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    // Wide enough that pinned blocks and the slot arena span many pages: memory goes back to
    // the system in whole pages only.
    let path = converted_from(
        dir.path(),
        &SynthSpec {
            n_ff: 2048,
            ..spec()
        },
        true,
    );
    let m = Model::load(&path).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    let tokens: Vec<u32> = (0..60u32).map(|i| (i * 37 + 11) % 200).collect();
    let decode = |e: &mut Engine<'_>| -> Result<Vec<Vec<f32>>, pi2_engine::EngineError> {
        e.truncate(0);
        let mut out = vec![e.forward(&tokens[..4], Logits::Last)?.to_vec()];
        for &t in &tokens[4..] {
            out.push(e.forward(&[t], Logits::Last)?.to_vec());
        }
        Ok(out)
    };
    let mut mem = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
    let want = decode(&mut mem).unwrap();
    let freq = frequencies(&m);
    let probe = Engine::new(&m, &cfg()).unwrap();
    let (start, full, scratch) = (
        pi2_engine::kv_bytes_start(probe.model(), &cfg(), 8) as u64,
        pi2_engine::kv_bytes_full(probe.model(), &cfg(), 8) as u64,
        pi2_engine::scratch_bytes(probe.model(), &cfg(), 8) as u64,
    );
    assert!(
        full > 4 * start,
        "the test needs the KV cache to grow: {start} of {full}"
    );
    let least = pi2_engine::min_budget(&m, &sp, start, scratch).unwrap();
    let make = |budget: u64, hot_share: f64| {
        let oc = OffloadConfig {
            budget,
            hot_share,
            ..Default::default()
        };
        Offload::new(&m, &sp, &path, start, scratch, freq.as_deref(), &oc).unwrap()
    };
    // Beyond the least: room to keep all attention and output rows resident, then neurons.
    let budget = least + full + (256 << 10);
    for hot_share in [0.0, 1.0] {
        let o = make(budget, hot_share);
        let pinned = |o: &Offload| {
            o.hot_counts().iter().sum::<usize>() + o.hot_gate_counts().iter().sum::<usize>()
        };
        let (slots0, pinned0) = (o.cold_slots(), pinned(&o));
        let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap();
        let got = decode(&mut e).unwrap();
        assert_eq!(got, want, "hot share {hot_share}");
        let o = e.offload().unwrap();
        let b = o.budget();
        assert!(b.total_used() <= b.limit(), "hot share {hot_share}");
        assert!(o.kv_charged() >= e.kv_bytes() as u64 && o.kv_charged() > start);
        match hot_share {
            0.0 => assert!(
                o.cold_slots() < slots0,
                "{} of {slots0} slots",
                o.cold_slots()
            ),
            _ => assert!(
                pinned(o) < pinned0,
                "{} of {pinned0} rows pinned",
                pinned(o)
            ),
        }
    }
    // The least budget: no room to give once the first batch's positions are used.
    let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(make(least, 1.0))).unwrap();
    let msg = decode(&mut e).unwrap_err().to_string();
    assert!(
        msg.contains("the context has reached") && msg.contains("raise --mem-budget"),
        "{msg}"
    );
}

/// A pass from what is resident (the self-draft's) reads nothing from flash (but a streamed
/// embedding's row) and leaves the
/// engine as it was: after drafting and cutting the cache back, every step's logits are the
/// plain run's, bit for bit; its counts are not the run's. Greedy decoding with self-drafts
/// keeps plain decode's tokens.
#[test]
fn resident_passes_read_nothing_and_leave_decode_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = converted(dir.path());
    let m = Model::load(&path).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    let file = m.file.file_size();
    let (want, minimum) = reference_and_least_budget(&m, &sp);
    for (budget, hot_share) in [(minimum, 0.0), (minimum + file / 8, 0.5), (4 * file, 0.5)] {
        let e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
        let oc = OffloadConfig {
            budget,
            hot_share,
            ..Default::default()
        };
        let o = offload(&m, &sp, &path, &e, oc).unwrap();
        let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap();
        e.truncate(0);
        let mut got = vec![e.forward(&PROMPT, Logits::Last).unwrap().to_vec()];
        for &t in &DECODE {
            let base = e.n_past();
            let (read, stats) = (
                e.offload().unwrap().reader_stats().bytes_read,
                e.sparse_stats().clone(),
            );
            let mut token = t;
            for _ in 0..3 {
                let l = e.forward_resident(token).unwrap();
                assert_eq!(l.len(), m.config.n_vocab);
                token = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
            }
            // Only the drafted tokens' embedding rows, where the embedding streams (a page each).
            let o = e.offload().unwrap();
            let rows = if o.streams_embedding() { 3 * 4096 } else { 0 };
            assert!(
                o.reader_stats().bytes_read - read <= rows,
                "budget {budget}"
            );
            assert_eq!(e.sparse_stats().token_layers, stats.token_layers);
            assert_eq!(e.truncate(base), base);
            got.push(e.forward(&[t], Logits::Last).unwrap().to_vec());
        }
        common::assert_same_logits(&want, &got, &format!("budget {budget} hot {hot_share}"));

        // Greedy generation with self-drafts: plain decode's tokens.
        let gen = |e: &mut Engine<'_>, drafts: bool| {
            let mut sampler = pi2_engine::Sampler::new(pi2_engine::SamplerConfig {
                temperature: 0.0,
                ..Default::default()
            });
            let cfg = pi2_engine::GenerateConfig {
                max_tokens: Some(24),
                ignore_eos: true,
                n_batch: 8,
                draft: pi2_engine::DraftConfig { max: 4, min: 1 },
            };
            let mut d = pi2_engine::SelfDraft;
            let drafter = drafts.then_some(&mut d as &mut dyn pi2_engine::Drafter);
            e.truncate(0);
            let g = pi2_engine::generate_drafted(
                e,
                &mut sampler,
                &mut Vec::new(),
                &PROMPT,
                &cfg,
                drafter,
                |_| true,
            )
            .unwrap();
            (g.tokens, g.drafted)
        };
        let (plain, _) = gen(&mut e, false);
        let (drafted, n) = gen(&mut e, true);
        // Small budgets may hold no output cluster: nothing to draft from.
        assert!(n > 0 || budget < 4 * file, "no drafts at budget {budget}");
        assert_eq!(plain, drafted, "budget {budget}");
    }
}
