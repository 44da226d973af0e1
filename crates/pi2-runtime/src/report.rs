//! What an engine did, as JSON: the sparse FFN's fractions, the clustered head's rows and
//! fidelity, the offload's reads and budget, and bytes read per token by part; and a whole
//! generation's report (`run --json`). `run --json`, `bench -o json` and the server's metrics
//! print these. The same counts as lines for people: [`sparse_text`], [`head_text`],
//! [`head_check_text`], [`timings_text`].

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
        // Decoded token-layers run dense instead (their whole FFN in memory).
        "dense_token_layers": st.dense_token_layers,
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
        "io_depth": o.io_depth(),
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

/// How a mixture of experts routed (`null` for a dense model or no tokens): per layer, the most
/// chosen expert's share and the share of experts taking 90% of routings (mean, least, most
/// over layers), and the share of a token's experts its predecessor chose too.
pub fn routing_json(r: &pi2_engine::RoutingStats) -> Value {
    if r.routings == 0 {
        return Value::Null;
    }
    let layers = r.popularity(0.9);
    let spread = |f: fn(&(f64, f64)) -> f64| {
        let v: Vec<f64> = layers.iter().map(f).collect();
        json!({
            "mean": v.iter().sum::<f64>() / v.len().max(1) as f64,
            "min": v.iter().copied().fold(f64::INFINITY, f64::min),
            "max": v.iter().copied().fold(0.0, f64::max),
        })
    };
    json!({
        "token_layers": r.routings,
        "top_expert_share": spread(|l| l.0),
        "experts_for_90pct": spread(|l| l.1),
        "reuse_from_previous_token": r.reuse(),
    })
}

/// A plain model's streamed experts: budget split, cache, hit rate, reads.
pub fn experts_json(x: &pi2_engine::ExpertStream, tokens: usize, decode_secs: f64) -> Value {
    let st = x.stats();
    let rd = x.reader_stats();
    let regions: serde_json::Map<String, Value> = (x.budget().breakdown())
        .map(|(r, v)| (format!("{r:?}").to_lowercase(), v.into()))
        .collect();
    json!({
        "budget_bytes": x.budget().limit(),
        "regions_bytes": regions,
        "expert_bytes": x.expert_bytes(),
        "cache_slots": x.slots(),
        "cache_policy": x.cache_policy(),
        "routing_remembered": x.remembers_routing(),
        "engine": x.engine().0,
        "io_depth": x.engine().1,
        "direct": x.direct().0,
        "hit_rate": st.hit_rate(),
        "experts": {"cached": st.hits, "read": st.reads},
        "waves": st.waves,
        "prefetch": {"on": x.prefetches(), "read_ahead": st.prefetched, "used": st.prefetch_used,
                     "accuracy": st.prefetch_accuracy()},
        "bytes_read": rd.bytes_read,
        "expert_bytes_per_token": st.bytes as f64 / tokens.max(1) as f64,
        "device_reads": rd.reads,
        "device_busy_secs": rd.busy_ns as f64 / 1e9,
        "io_wait_share": if decode_secs > 0.0 { st.io_wait_ns as f64 / 1e9 / decode_secs } else { 0.0 },
    })
}

/// Bytes read from flash per token over `tokens` tokens, by part: FFN neuron rows (and whole
/// layers a batch read), output head rows, attention projections and embedding rows (zeros in
/// memory).
pub fn bytes_read_json(e: &Engine<'_>, tokens: usize) -> Value {
    let per = |x: u64| x as f64 / tokens.max(1) as f64;
    if let Some(x) = e.experts() {
        let ffn = per(x.stats().bytes);
        return json!({"ffn": ffn, "head": 0.0, "attention": 0.0, "embedding": 0.0, "total": ffn});
    }
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
        "experts": e.experts().map(|x| experts_json(x, tokens, decode_secs)),
        "routing": routing_json(e.routing_stats()),
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

/// A perplexity run's result (`pi2 perplexity --json`): the last running estimate `last` over
/// chunks of `n_ctx` with `scored` tokens scored in `secs`, the clustered head's agreement with
/// the whole matrix, peak memory and what the engine counted.
pub fn perplexity_json(
    e: &Engine<'_>,
    last: &pi2_engine::perplexity::PerplexityStep,
    n_ctx: usize,
    scored: usize,
    secs: f64,
) -> Value {
    let head = e.head_stats();
    let mut report = json!({
        "ppl": last.ppl,
        "stderr": last.stderr,
        "chunks": last.chunk,
        "n_ctx": n_ctx,
        "tokens_scored": scored,
        "seconds": secs,
        "head_top1_agreement": head.top1_agreement(),
        "head_mass": head.mass(),
        "peak_rss_bytes": peak_rss_bytes(),
    });
    if let (Some(r), Value::Object(c)) = (report.as_object_mut(), engine_json(e, scored, secs)) {
        r.extend(c);
    }
    report
}

/// The sparse FFN's fractions and the predictor's recall per layer, as lines.
pub fn sparse_text(st: &SparseStats) -> String {
    let mut out = format!(
        "sparse: candidates {:.3}, confirmed {:.3} (FFN sparsity {:.3}), FFN bytes {:.3} of dense",
        st.candidate_fraction(),
        st.confirmed_fraction(),
        1.0 - st.confirmed_fraction(),
        st.byte_fraction()
    );
    if st.dense_token_layers > 0 {
        let all = st.dense_token_layers + st.token_layers;
        out += &format!(
            "; {} of {all} token-layers ran dense, wholly in memory",
            st.dense_token_layers
        );
    }
    if let Some(r) = st.total_recall() {
        let per: Vec<String> = st
            .recall()
            .iter()
            .map(|r| r.map_or("-".into(), |r| format!("{r:.3}")))
            .collect();
        out += &format!(
            "\nsparse: predictor recall {r:.4}; per layer {}",
            per.join(" ")
        );
    }
    out
}

/// The clustered head's rows and bytes per token (`None` when it did not run).
pub fn head_text(st: &HeadStats, n_vocab: usize) -> Option<String> {
    let per = |x: u64| x as f64 / st.steps as f64;
    (st.steps > 0).then(|| {
        format!(
            "head: {:.0} rows ({:.2}% of the vocabulary) and {:.0} KB per token ({:.0} KB from flash)",
            per(st.rows),
            100.0 * per(st.rows) / n_vocab as f64,
            per(st.bytes) / 1e3,
            per(st.flash_bytes) / 1e3,
        )
    })
}

/// The clustered head checked against the whole output matrix (`None` without checks).
pub fn head_check_text(st: &HeadStats) -> Option<String> {
    let (top1, mass) = (st.top1_agreement()?, st.mass()?);
    Some(format!(
        "head: top-1 agreement with the whole output matrix {:.2}%, mass on the scored rows {mass:.4}, over {} tokens ({:.0} rows per token)",
        100.0 * top1,
        st.checked,
        st.rows as f64 / st.steps.max(1) as f64
    ))
}

/// llama.cpp's timing lines for a generation on `e` (prompt, decode, drafts when there were
/// any), this process's peak memory and the clustered head's counts.
pub fn timings_text(e: &Engine<'_>, g: &pi2_engine::Generation) -> String {
    let prompt_ms = g.prompt_time.as_secs_f64() * 1e3;
    let predicted_ms = g.predicted_time.as_secs_f64() * 1e3;
    let (np, ng) = (g.prompt_n, g.tokens.len());
    let mut out = format!(
        "prompt eval: {prompt_ms:>8.2} ms / {np:>4} tokens ({:>8.2} tokens per second)\n       eval: {predicted_ms:>8.2} ms / {ng:>4} tokens ({:>8.2} tokens per second)",
        per_second(np, prompt_ms),
        per_second(ng, predicted_ms)
    );
    if g.drafted > 0 {
        out += &format!(
            "\n      draft: {} drafted, {} accepted ({:.0}%), {:.2} tokens per forward pass",
            g.drafted,
            g.accepted,
            100.0 * g.accepted as f64 / g.drafted as f64,
            ng as f64 / g.decode_passes.max(1) as f64
        );
    }
    if let Some(p) = peak_rss_bytes() {
        out += &format!("\n   peak RSS: {}", crate::info::human_bytes(p));
    }
    if let Some(head) = head_text(&e.head_stats(), e.model().config.n_vocab) {
        out += &format!("\n{head}");
    }
    out
}
