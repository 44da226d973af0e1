//! The shapes `pi2 synth` knows: hyper-parameters of real models.

use super::ROUTER_BIAS;
use pi2_kernels::QuantType;
/// A model shape: hyper-parameters of a real model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ctx: usize,
    pub rope_base: f32,
    /// `llama`, or `qwen3moe` (per-head Q/K norms, the experts' size under its own key).
    pub arch: &'static str,
    /// Width of an attention head (`n_embd / n_head` when 0).
    pub head_dim: usize,
    /// Standard deviation of an expert's router bias, in units of its logit's random part: how
    /// unevenly a mixture routes.
    pub router_bias: f32,
    /// The experts' type where the model ships them in one of their own (gpt-oss: MXFP4).
    pub expert_quant: Option<QuantType>,
}

/// The shapes `pi2 synth` knows. `tiny` and `tiny-moe` are for tests.
pub const SHAPES: [Shape; 10] = [
    // Qwen2.5-1.5B's shape (without its attention biases and tied output): a 1.5B-class model
    // for timing profiling and conversion.
    Shape {
        name: "qwen2.5-1.5b",
        n_layer: 28,
        n_embd: 1536,
        n_ff: 8960,
        n_head: 12,
        n_head_kv: 2,
        n_expert: 0,
        n_expert_used: 0,
        n_ctx: 32768,
        rope_base: 1_000_000.0,
        arch: "llama",
        head_dim: 0,
        router_bias: ROUTER_BIAS,
        expert_quant: None,
    },
    Shape {
        name: "llama2-7b",
        n_layer: 32,
        n_embd: 4096,
        n_ff: 11008,
        n_head: 32,
        n_head_kv: 32,
        n_expert: 0,
        n_expert_used: 0,
        n_ctx: 4096,
        rope_base: 10000.0,
        arch: "llama",
        head_dim: 0,
        router_bias: ROUTER_BIAS,
        expert_quant: None,
    },
    Shape {
        name: "llama2-13b",
        n_layer: 40,
        n_embd: 5120,
        n_ff: 13824,
        n_head: 40,
        n_head_kv: 40,
        n_expert: 0,
        n_expert_used: 0,
        n_ctx: 4096,
        rope_base: 10000.0,
        arch: "llama",
        head_dim: 0,
        router_bias: ROUTER_BIAS,
        expert_quant: None,
    },
    Shape {
        name: "mistral-7b",
        n_layer: 32,
        n_embd: 4096,
        n_ff: 14336,
        n_head: 32,
        n_head_kv: 8,
        n_expert: 0,
        n_expert_used: 0,
        n_ctx: 32768,
        rope_base: 10000.0,
        arch: "llama",
        head_dim: 0,
        router_bias: ROUTER_BIAS,
        expert_quant: None,
    },
    Shape {
        name: "mixtral-8x7b",
        n_layer: 32,
        n_embd: 4096,
        n_ff: 14336,
        n_head: 32,
        n_head_kv: 8,
        n_expert: 8,
        n_expert_used: 2,
        n_ctx: 32768,
        rope_base: 1_000_000.0,
        arch: "llama",
        head_dim: 0,
        router_bias: ROUTER_BIAS,
        expert_quant: None,
    },
    // Qwen3-30B-A3B's shape: 48 layers of 128 experts (768 neurons), 8 chosen per token;
    // routing skewed as the real model's (about half the experts take 90% of routings).
    Shape {
        name: "qwen3-30b-a3b",
        n_layer: 48,
        n_embd: 2048,
        n_ff: 768,
        n_head: 32,
        n_head_kv: 4,
        n_expert: 128,
        n_expert_used: 8,
        n_ctx: 40960,
        rope_base: 1_000_000.0,
        arch: "qwen3moe",
        head_dim: 128,
        router_bias: 1.0,
        expert_quant: None,
    },
    // OLMoE-1B-7B's shape (Q/K norms per head here: the stand-in's arch is qwen3moe's).
    Shape {
        name: "olmoe-1b-7b",
        n_layer: 16,
        n_embd: 2048,
        n_ff: 1024,
        n_head: 16,
        n_head_kv: 16,
        n_expert: 64,
        n_expert_used: 8,
        n_ctx: 4096,
        rope_base: 10000.0,
        arch: "qwen3moe",
        head_dim: 128,
        router_bias: 1.0,
        expert_quant: None,
    },
    // gpt-oss-20b's shape: 24 layers of 32 experts (2880 neurons), 4 chosen per token, 64
    // heads of 64, 8 KV heads, sinks, YaRN; experts in MXFP4 (the rest in the stand-in's type:
    // its widths are not multiples of 256, so q8_0).
    Shape {
        name: "gpt-oss-20b",
        n_layer: 24,
        n_embd: 2880,
        n_ff: 2880,
        n_head: 64,
        n_head_kv: 8,
        n_expert: 32,
        n_expert_used: 4,
        n_ctx: 131072,
        rope_base: 150000.0,
        arch: "gpt-oss",
        head_dim: 64,
        router_bias: 1.0,
        expert_quant: Some(QuantType::MXFP4),
    },
    Shape {
        name: "tiny",
        n_layer: 4,
        n_embd: 256,
        n_ff: 1024,
        n_head: 4,
        n_head_kv: 2,
        n_expert: 0,
        n_expert_used: 0,
        n_ctx: 2048,
        rope_base: 10000.0,
        arch: "llama",
        head_dim: 0,
        router_bias: ROUTER_BIAS,
        expert_quant: None,
    },
    Shape {
        name: "tiny-moe",
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        n_expert: 4,
        n_expert_used: 2,
        n_ctx: 2048,
        rope_base: 1_000_000.0,
        arch: "llama",
        head_dim: 0,
        router_bias: ROUTER_BIAS,
        expert_quant: None,
    },
];

impl Shape {
    pub fn by_name(name: &str) -> Option<Shape> {
        SHAPES.iter().find(|s| s.name == name).copied()
    }

    /// Width of an attention head.
    pub fn head_dim(&self) -> usize {
        match self.head_dim {
            0 => self.n_embd / self.n_head,
            h => h,
        }
    }
}
