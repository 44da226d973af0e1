//! `pi2 info`: what a model file is and what running it needs.

use super::model_path;
use crate::args::ModelArgs;
use crate::rss::human;
use anyhow::{Context, Result};
use clap::Args;
use pi2_kernels::Tier;
use pi2_model::Model;
use std::collections::BTreeMap;

#[derive(Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// What the model's parts take: bytes by tensor type, weights, KV cache, buffers, FFN.
struct Sizes<'m> {
    by_type: BTreeMap<&'m str, (usize, u64)>,
    weights: u64,
    kv: usize,
    scratch: usize,
    ffn: u64,
}

fn sizes(m: &Model, n_ctx: usize) -> Sizes<'_> {
    let c = &m.config;
    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for t in &m.file.tensors {
        let e = by_type.entry(t.type_name()).or_default();
        e.0 += 1;
        e.1 += t.size;
    }
    let weights = m.file.tensor_bytes();
    let kv = pi2_engine::kv_bytes(c, n_ctx, 512);
    // Largest per-token activations: logits and FFN rows dominate; batch of 512 for prefill.
    let scratch =
        512 * (c.n_vocab.min(512) + 4 * c.n_embd + 2 * c.n_ff + c.q_dim() + 2 * c.kv_dim()) * 4
            + c.n_vocab * 4;
    let ffn: u64 = m
        .weights
        .layers
        .iter()
        .map(|l| l.gate.bytes(&m.file) + l.up.bytes(&m.file) + l.down.bytes(&m.file))
        .sum();
    Sizes {
        by_type,
        weights,
        kv,
        scratch,
        ffn,
    }
}

pub fn run(a: InfoArgs) -> Result<()> {
    let path = model_path(&a.model)?;
    let m = Model::load(&path).with_context(|| format!("cannot load model {}", path.display()))?;
    let c = &m.config;
    let topo = pi2_engine::topology::Topology::detect();
    let n_ctx = if a.model.ctx_size == 0 {
        c.n_ctx_train
    } else {
        a.model.ctx_size
    };
    let Sizes {
        by_type,
        weights,
        kv,
        scratch,
        ffn,
    } = sizes(&m, n_ctx);
    if a.json {
        let v = serde_json::json!({
            "path": path,
            "name": m.name,
            "architecture": c.arch.name(),
            "file_bytes": m.file.file_size(),
            "gguf_version": m.file.version,
            "n_params": m.n_params(),
            "n_vocab": c.n_vocab, "n_ctx_train": c.n_ctx_train, "n_embd": c.n_embd, "n_layer": c.n_layer,
            "n_ff": c.n_ff, "n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim,
            "rope": {"kind": format!("{:?}", c.rope_kind), "base": c.rope_base, "dims": c.n_rot, "freq_scale": c.rope_freq_scale},
            "rms_eps": c.rms_eps,
            "sliding_window": c.sliding_window.map(|w| serde_json::json!({"tokens": w.len, "period": w.period, "rope_base": w.rope_base})),
            "ffn_activation": c.ffn_act.name(), "n_expert": c.n_expert, "n_expert_used": c.n_expert_used,
            "tied_output": m.weights.tied_output,
            "tensor_types": by_type.iter().map(|(k, (n, b))| (k.to_string(), serde_json::json!({"count": n, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
            "memory": {"weights_bytes": weights, "ffn_bytes": ffn, "kv_cache_bytes": kv, "n_ctx": n_ctx, "scratch_bytes": scratch, "total_bytes": weights + kv as u64 + scratch as u64},
            "chat_template": m.chat_template.is_some(),
            "kernel_tier": Tier::detect().name(),
            "cpu": {
                "features": pi2_kernels::cpu_features(),
                "clusters": topo.clusters.iter().map(|c| serde_json::json!({"kind": c.kind.name(), "max_freq_khz": c.max_freq_khz, "cpus": c.cpus})).collect::<Vec<_>>(),
            },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("model:         {}", path.display());
    if let Some(name) = &m.name {
        println!("name:          {name}");
    }
    println!(
        "architecture:  {} (GGUF v{})",
        c.arch.name(),
        m.file.version
    );
    println!(
        "file size:     {} ({} bytes)",
        human(m.file.file_size()),
        m.file.file_size()
    );
    println!("parameters:    {:.1} M", m.n_params() as f64 / 1e6);
    println!(
        "layers:        {}   embedding: {}   FFN: {} neurons/{}, {}",
        c.n_layer,
        c.n_embd,
        c.n_ff,
        if c.n_expert > 0 { "expert" } else { "layer" },
        c.ffn_act.name()
    );
    if c.n_expert > 0 {
        println!(
            "experts:       {} per layer, {} per token",
            c.n_expert, c.n_expert_used
        );
    }
    println!(
        "attention:     {} heads, {} KV heads, head size {}",
        c.n_head, c.n_head_kv, c.head_dim
    );
    if let Some(w) = c.sliding_window {
        println!(
            "sliding window: {} tokens, every {}th layer global, local RoPE base {}",
            w.len, w.period, w.rope_base
        );
    }
    println!(
        "RoPE:          {:?}, base {}, {} dims, scale {}",
        c.rope_kind,
        c.rope_base,
        c.n_rot,
        1.0 / c.rope_freq_scale
    );
    println!(
        "vocabulary:    {} tokens, training context {}",
        c.n_vocab, c.n_ctx_train
    );
    println!(
        "output:        {}",
        if m.weights.tied_output {
            "tied to the token embedding"
        } else {
            "separate matrix"
        }
    );
    println!(
        "chat template: {}",
        match (&m.chat_template, m.default_chat_template()) {
            (Some(_), _) => "yes",
            (None, pi2_model::chat::GEMMA) => "no (Gemma's turns are used)",
            (None, _) => "no (ChatML is used)",
        }
    );
    println!("tensor types:");
    for (ty, (n, b)) in &by_type {
        println!("  {ty:<6} {n:>4} tensors  {}", human(*b));
    }
    println!("memory needed (dense, context {n_ctx}):");
    println!(
        "  weights      {}  (FFN {}, {:.0}%)",
        human(weights),
        human(ffn),
        100.0 * ffn as f64 / weights as f64
    );
    println!(
        "  KV cache     {}  (f16{})",
        human(kv as u64),
        if c.sliding_window.is_some() {
            "; sliding layers hold their window and a 512-token batch"
        } else {
            ""
        }
    );
    println!("  buffers      {}", human(scratch as u64));
    println!(
        "  total        {}",
        human(weights + kv as u64 + scratch as u64)
    );
    println!("kernel tier:   {} (detected)", Tier::detect().name());
    println!("cpu features:  {}", pi2_kernels::cpu_features().join(" "));
    println!("cpu cores:     {topo}");
    Ok(())
}
