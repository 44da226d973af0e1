//! What an engine did, as JSON: the sparse FFN's fractions, the clustered head's rows and
//! fidelity, the offload's reads and budget, and bytes read per token by part; and a whole
//! generation's report (`run --json`). `run --json`, `bench -o json` and the server's metrics
//! print these.

use pi2_engine::{Engine, HeadStats, Offload, SparseStats};
use serde_json::{json, Value};

/// The sparse FFN's measured fractions.
pub fn sparse_json(st: &SparseStats) -> Value {
    let tokens = st.token_layers.max(1) as f64 / st.layer_tokens.len().max(1) as f64;
    json!({
        "candidates": st.candidate_fraction(),
        "confirmed": st.confirmed_fraction(),
        "ffn_sparsity": 1.0 - st.confirmed_fraction(),
        "ffn_bytes_per_token": st.ffn_bytes as f64 / tokens,
        "ffn_bytes_fraction": st.byte_fraction(),
        "recall": st.total_recall(),
    })
}

/// The clustered head's counts (`null` when it did not run): rows and bytes per token, and
/// with a check, its agreement with the whole matrix.
pub fn head_json(st: &HeadStats, n_vocab: usize) -> Value {
    if st.steps == 0 {
        return Value::Null;
    }
    let per = |x: u64| x as f64 / st.steps as f64;
    json!({
        "steps": st.steps,
        "rows_per_token": per(st.rows),
        "rows_fraction": per(st.rows) / n_vocab as f64,
        "bytes_per_token": per(st.bytes),
        "flash_bytes_per_token": per(st.flash_bytes),
        "top1_agreement": st.top1_agreement(),
        "mass": st.mass(),
    })
}

/// What the offloaded model did over `tokens` tokens decoded in `decode_secs`.
pub fn offload_json(o: &Offload, tokens: usize, decode_secs: f64) -> Value {
    let st = o.stats();
    let rd = o.reader_stats();
    let b = o.budget();
    let per = |x: u64| x as f64 / tokens.max(1) as f64;
    let regions: serde_json::Map<String, Value> = b
        .breakdown()
        .map(|(r, v)| (format!("{r:?}").to_lowercase(), v.into()))
        .collect();
    json!({
        "budget_bytes": b.limit(),
        "regions_bytes": regions,
        "kv_charged_bytes": o.kv_charged(),
        "hot_neurons": o.hot_counts().iter().sum::<usize>(),
        "hot_gate_rows": o.hot_gate_counts().iter().sum::<usize>(),
        "cold_slots": o.cold_slots(),
        "engine": o.engine().0,
        "hit_rate": st.hit_rate(),
        "gate_rows": {"hot": st.gate_hot, "cached": st.gate_hits, "read": st.gate_reads},
        "updown_rows": {"hot": st.updown_hot, "cached": st.updown_hits, "read": st.updown_reads},
        "bytes_read": rd.bytes_read,
        "decode_bytes_requested_per_token": per(st.decode_bytes),
        "streamed_attention_layers": o.streamed_layers(),
        "attention_bytes_per_token": per(st.attn_bytes),
        "streamed_output_rows": o.streamed_output_rows(),
        "output_bytes_per_token": per(st.out_bytes),
        "embedding_rows_read": st.embd_rows,
        "device_reads": rd.reads,
        "device_busy_secs": rd.busy_ns as f64 / 1e9,
        "io_handling_secs": rd.handling_ns as f64 / 1e9,
        "io_wait_share": if decode_secs > 0.0 { st.io_wait_ns as f64 / 1e9 / decode_secs } else { 0.0 },
    })
}

/// Bytes read from flash per token over `tokens` tokens, by part: FFN neuron rows (and whole
/// layers a batch read), output head rows, attention projections and embedding rows (zeros in
/// memory).
pub fn bytes_read_json(e: &Engine<'_>, tokens: usize) -> Value {
    let per = |x: u64| x as f64 / tokens.max(1) as f64;
    let Some(o) = e.offload() else {
        return json!({"ffn": 0.0, "head": 0.0, "attention": 0.0, "embedding": 0.0, "total": 0.0});
    };
    let st = o.stats();
    let embd_row = o.embedding_row_bytes() as u64;
    let (ffn, head, attn, embd) = (
        st.decode_bytes + st.stage_bytes,
        st.out_bytes,
        st.attn_bytes,
        st.embd_rows * embd_row,
    );
    json!({
        "ffn": per(ffn),
        "head": per(head),
        "attention": per(attn),
        "embedding": per(embd),
        "total": per(ffn + head + attn + embd),
    })
}

/// Everything [`Engine`] counted, as one object: `sparse`, `head`, `offload` (each `null`
/// where it does not apply) and `bytes_read_per_token`.
pub fn engine_json(e: &Engine<'_>, tokens: usize, decode_secs: f64) -> Value {
    let n_vocab = e.model().config.n_vocab;
    json!({
        "sparse": if e.is_sparse() { sparse_json(e.sparse_stats()) } else { Value::Null },
        "head": head_json(&e.head_stats(), n_vocab),
        "offload": e.offload().map(|o| offload_json(o, tokens, decode_secs)),
        "bytes_read_per_token": bytes_read_json(e, tokens),
    })
}

/// This process's peak resident set size (`VmHWM` in /proc/self/status) in bytes; `None` where
/// procfs is unavailable.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `pi2 run --json`'s object: ids, text, llama-server style timings, peak RSS, sparse and offload
/// statistics, the plan.
pub fn run_json(
    prepared: &crate::Prepared<'_>,
    engine: &pi2_engine::Engine<'_>,
    prompt: &[u32],
    g: &pi2_engine::Generation,
) -> serde_json::Value {
    let tok = &prepared.model.tokenizer;
    let prompt_ms = g.prompt_time.as_secs_f64() * 1e3;
    let predicted_ms = g.predicted_time.as_secs_f64() * 1e3;
    let text = String::from_utf8_lossy(&tok.decode(&g.tokens, false)).into_owned();
    let mut report = json!({
        "prompt_ids": prompt,
        "generated_ids": g.tokens,
        "text": text,
        "stop": format!("{:?}", g.stop),
        "timings": {
            "prompt_n": g.prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_second": per_second(g.prompt_n, prompt_ms),
            "predicted_n": g.tokens.len(),
            "predicted_ms": predicted_ms,
            "predicted_per_second": per_second(g.tokens.len(), predicted_ms),
        },
        "peak_rss_bytes": peak_rss_bytes(),
        "draft": (g.drafted > 0).then(|| json!({
            "drafted": g.drafted,
            "accepted": g.accepted,
            "acceptance": g.accepted as f64 / g.drafted as f64,
            "decode_passes": g.decode_passes,
            "tokens_per_pass": g.tokens.len() as f64 / g.decode_passes.max(1) as f64,
        })),
        "threads": engine.threads(),
        "kernel_tier": engine.tier().name(),
        "plan": prepared.applied.as_ref().map(|ap| json!({
            "knobs": ap.plan.knobs,
            "predicted_decode_per_second": ap.plan.predicted.decode_tps,
            "predicted_prefill_per_second": ap.plan.predicted.prefill_tps,
            "predicted_memory_bytes": ap.plan.predicted.memory,
        })),
    });
    // The engine's own counts: sparse, head, offload, bytes read per token by part.
    let counts = engine_json(engine, g.tokens.len(), predicted_ms / 1e3);
    if let (Some(r), serde_json::Value::Object(c)) = (report.as_object_mut(), counts) {
        r.extend(c);
    }
    report
}

/// Tokens per second of `n` tokens in `ms` milliseconds (0 for no time).
pub fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1e3 / ms
    } else {
        0.0
    }
}
