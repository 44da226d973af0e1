//! What a model file is and what running it densely needs: architecture, sizes by tensor
//! type, the memory of weights, KV cache and buffers, and this device's kernels and cores. As
//! JSON ([`ModelInfo::json`]) or as the text `pi2 info` prints (`Display`).

use pi2_kernels::Tier;
use pi2_model::{Mixer, Model};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// A model and this device, described.
pub struct ModelInfo<'m> {
    model: &'m Model,
    path: &'m Path,
    n_ctx: usize,
    /// A plain dense model's least budget and the memory converting it takes.
    converting: Option<(u64, u64)>,
    /// Tensors and bytes per tensor type.
    by_type: BTreeMap<&'m str, (usize, u64)>,
    weights: u64,
    ffn: u64,
    kv: usize,
    scratch: usize,
}

/// Human-readable size (bytes, MiB with one decimal, or GiB).
pub fn human_bytes(bytes: u64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    match bytes {
        b if b < 1 << 20 => format!("{b} bytes"),
        _ if mib >= 1024.0 => format!("{:.2} GiB", mib / 1024.0),
        _ => format!("{mib:.1} MiB"),
    }
}

/// For a plain dense model: the least `--mem-budget` its one-command conversion runs under (a
/// lower bound known before converting) and the memory converting takes.
fn conversion_figures(model: &Model, n_ctx: usize) -> Option<(u64, u64)> {
    // Mixtures stream their experts from the file; layers of different FFN sizes are not
    // converted yet.
    let c = &model.config;
    if c.n_expert > 0 || !c.ffn_sizes.is_empty() || crate::convert_cache::is_converted(model) {
        return None;
    }
    let engine = pi2_engine::EngineConfig {
        n_ctx,
        ..Default::default()
    };
    let process = crate::offload::process_bytes(model);
    let floor = crate::offload::converted_floor(model, &engine, process).ok()?;
    let bytes = crate::convert_cache::conversion_bytes(model, &engine, process);
    Some((floor, bytes))
}

impl<'m> ModelInfo<'m> {
    /// `model` (read from `path`) run densely with a context of `n_ctx` tokens (0: its training
    /// context).
    pub fn new(model: &'m Model, path: &'m Path, n_ctx: usize) -> Self {
        let c = &model.config;
        let n_ctx = if n_ctx == 0 { c.n_ctx_train } else { n_ctx };
        let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
        for t in &model.file.tensors {
            let e = by_type.entry(t.type_name()).or_default();
            e.0 += 1;
            e.1 += t.size;
        }
        // Largest per-token activations: logits and FFN rows dominate; batch of 512 for prefill.
        let (qd, kvd) = c.widest_qkv();
        let scratch = 512 * (c.n_vocab.min(512) + 4 * c.n_embd + 2 * c.n_ff + qd + 2 * kvd) * 4
            + c.n_vocab * 4;
        let f = &model.file;
        let ffn = model.weights.layers.iter();
        let ffn = ffn.map(|l| l.gate.bytes(f) + l.up.bytes(f) + l.down.bytes(f));
        let converting = conversion_figures(model, n_ctx);
        Self {
            model,
            path,
            n_ctx,
            converting,
            by_type,
            weights: f.tensor_bytes(),
            ffn: ffn.sum(),
            kv: pi2_engine::kv_bytes(c, n_ctx, 512),
            scratch,
        }
    }

    fn total(&self) -> u64 {
        self.weights + self.kv as u64 + self.scratch as u64
    }

    pub fn json(&self) -> serde_json::Value {
        let (m, c) = (self.model, &self.model.config);
        let topo = pi2_engine::topology::Topology::detect();
        let types: serde_json::Map<_, _> = self
            .by_type
            .iter()
            .map(|(k, (n, b))| (k.to_string(), serde_json::json!({"count": n, "bytes": b})))
            .collect();
        serde_json::json!({
            "path": self.path,
            "name": m.name,
            "architecture": c.arch.name(),
            "features": c.arch.family().features,
            "file_bytes": m.file.file_size(),
            "gguf_version": m.file.version,
            "n_params": m.n_params(),
            "n_vocab": c.n_vocab, "n_ctx_train": c.n_ctx_train, "n_embd": c.n_embd, "n_layer": c.n_layer,
            "n_ff": c.n_ff, "n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim,
            "rope": {"kind": format!("{:?}", c.rope_kind), "base": c.rope_base, "dims": c.n_rot, "freq_scale": c.rope_freq_scale},
            "rms_eps": c.rms_eps,
            "sliding_window": c.sliding_window.map(|w| serde_json::json!({"tokens": w.len, "global_every": w.global.map(|g| g.period), "first_global": w.global.map(|g| g.first), "rope_base": w.rope_base})),
            "mixers": (0..c.n_layer).map(|li| mixer_name(c.mixer(li))).collect::<Vec<_>>(),
            "ffn_activation": c.ffn_act.name(), "n_expert": c.n_expert, "n_expert_used": c.n_expert_used,
            "tied_output": m.weights.tied_output,
            "tensor_types": types,
            "conversion": self.converting.map(|(floor, bytes)| serde_json::json!({"least_budget_bytes": floor, "converting_bytes": bytes})),
            "memory": {"weights_bytes": self.weights, "ffn_bytes": self.ffn, "kv_cache_bytes": self.kv, "n_ctx": self.n_ctx, "scratch_bytes": self.scratch, "total_bytes": self.total()},
            "chat_template": m.chat_template.is_some(),
            "kernel_tier": Tier::detect().name(),
            "cpu": {
                "features": pi2_kernels::cpu_features(),
                "clusters": topo.clusters.iter().map(|c| serde_json::json!({"kind": c.kind.name(), "max_freq_khz": c.max_freq_khz, "cpus": c.cpus})).collect::<Vec<_>>(),
            },
        })
    }

    /// The model's shape, lines of `name: value`.
    fn shape(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, c) = (self.model, &self.model.config);
        writeln!(f, "model:         {}", self.path.display())?;
        if let Some(name) = &m.name {
            writeln!(f, "name:          {name}")?;
        }
        writeln!(
            f,
            "architecture:  {} (GGUF v{}): {}",
            c.arch.name(),
            m.file.version,
            c.arch.family().features
        )?;
        let size = m.file.file_size();
        writeln!(f, "file size:     {} ({size} bytes)", human_bytes(size))?;
        writeln!(f, "parameters:    {:.1} M", m.n_params() as f64 / 1e6)?;
        let per = if c.n_expert > 0 { "expert" } else { "layer" };
        let neurons = match c.ffn_sizes.iter().min() {
            Some(least) => format!("{least}-{}", c.n_ff),
            None => c.n_ff.to_string(),
        };
        writeln!(
            f,
            "layers:        {}   embedding: {}   FFN: {neurons} neurons/{per}, {}",
            c.n_layer,
            c.n_embd,
            c.ffn_act.name()
        )?;
        if c.n_expert > 0 {
            let (n, used) = (c.n_expert, c.n_expert_used);
            let g = c.gating;
            let norm = if g.renormalize { ", renormalised" } else { "" };
            let route = match c.route_before_attention {
                true => ", routed from the layer's input before attention",
                false => "",
            };
            let beside = m.weights.layers.iter().any(|l| l.expert_norms.is_some());
            let shared = match m.weights.layers.iter().any(|l| l.shared.is_some()) {
                true if beside => format!(
                    ", beside a dense FFN of {} neurons (each normed apart; router on the scaled, normed stream)",
                    c.n_ff_shared
                ),
                true => format!(", and a shared expert of {} neurons", c.n_ff_shared),
                false => String::new(),
            };
            let lead = match c.dense_lead {
                0 => String::new(),
                k => format!(" (after {k} dense layers of {} neurons)", c.n_ff_dense),
            };
            writeln!(
                f,
                "experts:       {n} per layer{lead}, {used} per token, gated by {:?}{norm}{route}{shared}",
                g.func
            )?;
        }
        let (h, kv, d) = (c.n_head, c.n_head_kv, c.head_dim);
        writeln!(f, "attention:     {h} heads, {kv} KV heads, head size {d}")?;
        if let Some(summary) = mixer_summary(c) {
            writeln!(f, "mixers:        {summary}")?;
        }
        if let Some(w) = c.sliding_window {
            let (n, b) = (w.len, w.rope_base);
            let global = match w.global {
                None => "no layer global".to_string(),
                Some(g) => format!("every {}th layer global from layer {}", g.period, g.first),
            };
            writeln!(
                f,
                "sliding window: {n} tokens, {global}, local RoPE base {b}"
            )?;
            if let Some(h) = w.heads {
                let (kv, d, r) = (h.n_head_kv, h.head_dim, h.n_rot);
                writeln!(
                    f,
                    "sliding heads: {kv} KV heads, head size {d}, {r} rotated dims"
                )?;
            }
        }
        if c.kv_shared_from < c.n_layer {
            let from = c.kv_shared_from;
            writeln!(
                f,
                "shared KV:     layers {from}-{} attend to earlier layers' keys and values",
                c.n_layer - 1
            )?;
        }
        if c.n_embd_per_layer > 0 {
            let w = c.n_embd_per_layer;
            writeln!(f, "per-layer input: {w} per layer from a per-token table")?;
        }
        let scale = 1.0 / c.rope_freq_scale;
        let (kind, base, n_rot) = (c.rope_kind, c.rope_base, c.n_rot);
        writeln!(
            f,
            "RoPE:          {kind:?}, base {base}, {n_rot} dims, scale {scale}"
        )?;
        let (v, t) = (c.n_vocab, c.n_ctx_train);
        writeln!(f, "vocabulary:    {v} tokens, training context {t}")?;
        let output = match m.weights.tied_output {
            true => "tied to the token embedding",
            false => "separate matrix",
        };
        writeln!(f, "output:        {output}")?;
        let template = match (&m.chat_template, m.default_chat_template()) {
            (Some(_), _) => "yes",
            (None, pi2_model::chat::GEMMA) => "no (Gemma's turns are used)",
            (None, _) => "no (ChatML is used)",
        };
        writeln!(f, "chat template: {template}")
    }
}

impl fmt::Display for ModelInfo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shape(f)?;
        writeln!(f, "tensor types:")?;
        for (ty, (n, b)) in &self.by_type {
            writeln!(f, "  {ty:<6} {n:>4} tensors  {}", human_bytes(*b))?;
        }
        writeln!(f, "memory needed (dense, context {}):", self.n_ctx)?;
        let share = 100.0 * self.ffn as f64 / self.weights as f64;
        let (w, ffn) = (human_bytes(self.weights), human_bytes(self.ffn));
        writeln!(f, "  weights      {w}  (FFN {ffn}, {share:.0}%)")?;
        let sliding = match self.model.config.sliding_window {
            Some(_) => "; sliding layers hold their window and a 512-token batch",
            None => "",
        };
        writeln!(
            f,
            "  KV cache     {}  (f16{sliding})",
            human_bytes(self.kv as u64)
        )?;
        writeln!(f, "  buffers      {}", human_bytes(self.scratch as u64))?;
        writeln!(f, "  total        {}", human_bytes(self.total()))?;
        if let Some((floor, bytes)) = self.converting {
            writeln!(
                f,
                "under a budget: converted once (about {} while converting), then --mem-budget {} or more",
                human_bytes(bytes),
                human_bytes(floor)
            )?;
        }
        writeln!(f, "kernel tier:   {} (detected)", Tier::detect().name())?;
        writeln!(
            f,
            "cpu features:  {}",
            pi2_kernels::cpu_features().join(" ")
        )?;
        write!(
            f,
            "cpu cores:     {}",
            pi2_engine::topology::Topology::detect()
        )
    }
}

fn mixer_name(m: Mixer) -> &'static str {
    match m {
        Mixer::Attention => "attention",
        Mixer::ShortConv { .. } => "short convolution",
        Mixer::DeltaNet(_) => "gated delta net",
    }
}

/// How many layers mix tokens each way, when not all attend.
fn mixer_summary(c: &pi2_model::ModelConfig) -> Option<String> {
    let mixers: Vec<Mixer> = (0..c.n_layer).map(|li| c.mixer(li)).collect();
    if mixers.iter().all(|&m| m == Mixer::Attention) {
        return None;
    }
    let mut parts = Vec::new();
    for name in ["attention", "short convolution", "gated delta net"] {
        let of: Vec<Mixer> = mixers
            .iter()
            .copied()
            .filter(|&m| mixer_name(m) == name)
            .collect();
        let detail = match of.first() {
            None => continue,
            Some(Mixer::ShortConv { taps }) => format!(" ({taps} positions)"),
            Some(Mixer::DeltaNet(d)) => format!(
                " ({} key and {} value heads of {}, {}-position convolution)",
                d.k_heads, d.v_heads, d.head_dim, d.taps
            ),
            Some(Mixer::Attention) => String::new(),
        };
        parts.push(format!("{} {name}{detail}", of.len()));
    }
    Some(format!("{} of {} layers", parts.join(", "), c.n_layer))
}
