#!/usr/bin/env python3
"""Small random-weight GGUF files of each model family, as llama.cpp's loader expects them
(written with llama.cpp's own `gguf` Python writer), and llama.cpp's outputs on them.

    target/llama-cpp-venv/bin/python testdata/families/make.py [--out DIR] [--only FAMILY]

For every (family, shape) below this writes a *recipe* (the metadata and each tensor's shape and
seed) into testdata/families/reference.json, writes the GGUF from it with `gguf.GGUFWriter`,
runs llama.cpp on it (llama-cpp-python built from source, `bench/pi2bench.py llama_python()`),
and stores beside the recipe what llama.cpp computed:
- `ppl`: perplexity of a fixed random token sequence (every next-token prediction scored);
- `greedy`: greedy tokens after a prompt, with the gap between the best and second logit of
  each step (a step whose gap is tiny is a tie either engine may break either way);
- `last_logits`: the logits after the prompt.
`crates/pi2-model/tests/families.rs` (through `pi2_model::recipe`) builds the same file from the
recipe with pi2's writer (checking each tensor's CRC-32 against the one recorded here), and
`crates/pi2-engine/tests/families.rs` compares pi2's outputs with llama.cpp's. No weights are
committed: tensor values come from SplitMix64 streams, reproduced bit for bit in Rust.
"""
import argparse, json, sys, zlib
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parents[2]
M64 = (1 << 64) - 1

def splitmix_uniform(seed, n):
    """n values in [-1, 1): SplitMix64 outputs, top 53 bits (as pi2_model::recipe does)."""
    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53) * 2.0 - 1.0

def values(t):
    """A tensor's f32 values: offset + scale * uniform(-1, 1)."""
    n = int(np.prod(t["shape"]))
    if "values" in t:
        return np.array(t["values"], dtype=np.float32)
    v = t["offset"] + t["scale"] * splitmix_uniform(t["seed"], n)
    return v.astype(np.float32)

N_VOCAB = 384

def vocab_meta():
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    letters = "abcdefghijklmnopqrstuvwxyz"
    while len(toks) < N_VOCAB:
        i = len(toks)
        toks.append("\u2581" + letters[i % 26] + letters[(i // 26) % 26] + letters[(i // 676) % 26])
    types = [2, 3, 3] + [6] * 256 + [1] * (N_VOCAB - 259)
    scores = [0.0] * 259 + [-float(i) for i in range(N_VOCAB - 259)]
    return [
        ["tokenizer.ggml.model", "str", "llama"],
        ["tokenizer.ggml.tokens", "arr_str", toks],
        ["tokenizer.ggml.scores", "arr_f32", scores],
        ["tokenizer.ggml.token_type", "arr_i32", types],
        ["tokenizer.ggml.unknown_token_id", "u32", 0],
        ["tokenizer.ggml.bos_token_id", "u32", 1],
        ["tokenizer.ggml.eos_token_id", "u32", 2],
        ["tokenizer.ggml.add_bos_token", "bool", False],
    ]

class Recipe:
    def __init__(self, name, arch, seed):
        self.name, self.arch, self.seed = name, arch, seed
        self.meta = [["general.architecture", "str", arch], ["general.name", "str", name]]
        self.tensors = []

    def kv(self, key, ty, value):
        self.meta.append([f"{self.arch}.{key}" if not key.startswith(("general.", "tokenizer.")) else key, ty, value])

    def t(self, name, shape, scale, offset=0.0, ty=None):
        """A tensor of numpy `shape` (rows first; GGML dims are reversed), F32 unless `ty`."""
        self.tensors.append({"name": name, "shape": list(shape), "seed": (self.seed * 1000003 + len(self.tensors)) & M64,
                             "scale": scale, "offset": offset, **({"type": ty} if ty else {})})

def norm(r, name, n):
    r.t(name, [n], 0.2, 1.0)

def mat(r, name, rows, cols, gain=1.0):
    # uniform(-a, a) has variance a^2 / 3: a = gain * sqrt(3 / cols) keeps unit variance.
    r.t(name, [rows, cols], gain * (3.0 / cols) ** 0.5)

def common(r, s, head_dim=None):
    e, L = s["n_embd"], s["n_layer"]
    r.kv("context_length", "u32", 1024)
    r.kv("embedding_length", "u32", e)
    r.kv("block_count", "u32", L)
    r.kv("feed_forward_length", "u32", s["n_ff"])
    r.kv("attention.head_count", "u32", s["n_head"])
    r.kv("attention.head_count_kv", "u32", s["n_head_kv"])
    r.kv("attention.layer_norm_rms_epsilon", "f32", 1e-6)
    r.kv("rope.freq_base", "f32", s.get("rope_base", 10000.0))
    if head_dim:
        r.kv("attention.key_length", "u32", head_dim)
        r.kv("attention.value_length", "u32", head_dim)
    r.meta += vocab_meta()
    # Tied outputs reuse it: a logit spread of a few units either way.
    mat(r, "token_embd.weight", N_VOCAB, e, 2.5)
    norm(r, "output_norm.weight", e)
    if not s.get("tied"):
        mat(r, "output.weight", N_VOCAB, e, 2.5)

def layer_attn(r, s, i, hd, bias=False, qk_norm=False):
    e = s["n_embd"]
    q, kv = s["n_head"] * hd, s["n_head_kv"] * hd
    norm(r, f"blk.{i}.attn_norm.weight", e)
    mat(r, f"blk.{i}.attn_q.weight", q, e)
    mat(r, f"blk.{i}.attn_k.weight", kv, e)
    mat(r, f"blk.{i}.attn_v.weight", kv, e)
    if bias:
        for n, d in (("q", q), ("k", kv), ("v", kv)):
            r.t(f"blk.{i}.attn_{n}.bias", [d], 0.5)
    if qk_norm:
        norm(r, f"blk.{i}.attn_q_norm.weight", hd)
        norm(r, f"blk.{i}.attn_k_norm.weight", hd)
    mat(r, f"blk.{i}.attn_output.weight", e, q, 0.5)

def layer_ffn(r, s, i):
    e, f = s["n_embd"], s["n_ff"]
    norm(r, f"blk.{i}.ffn_norm.weight", e)
    mat(r, f"blk.{i}.ffn_gate.weight", f, e)
    mat(r, f"blk.{i}.ffn_up.weight", f, e)
    mat(r, f"blk.{i}.ffn_down.weight", e, f, 0.5)

def layer_moe(r, s, i, router_gain=2.0):
    e, f, n = s["n_embd"], s["n_ff_exp"], s["n_expert"]
    norm(r, f"blk.{i}.ffn_norm.weight", e)
    mat(r, f"blk.{i}.ffn_gate_inp.weight", n, e, router_gain)
    r.t(f"blk.{i}.ffn_gate_exps.weight", [n, f, e], (3.0 / e) ** 0.5)
    r.t(f"blk.{i}.ffn_up_exps.weight", [n, f, e], (3.0 / e) ** 0.5)
    r.t(f"blk.{i}.ffn_down_exps.weight", [n, e, f], 0.5 * (3.0 / f) ** 0.5)

def moe_meta(r, s, expert_size_key):
    r.kv("expert_count", "u32", s["n_expert"])
    r.kv("expert_used_count", "u32", s["n_expert_used"])
    if expert_size_key:
        r.kv("expert_feed_forward_length", "u32", s["n_ff_exp"])

def qwen3moe(r, s):
    hd = s["head_dim"]
    common(r, s, head_dim=hd)
    moe_meta(r, s, True)
    for i in range(s["n_layer"]):
        layer_attn(r, s, i, hd, qk_norm=True)
        layer_moe(r, s, i)

def olmoe(r, s):
    # OLMoE's FFN size is the experts' (feed_forward_length); Q/K norms span the whole vector.
    s = dict(s, n_ff=s["n_ff_exp"])
    common(r, s)
    moe_meta(r, s, False)
    e = s["n_embd"]
    for i in range(s["n_layer"]):
        layer_attn(r, s, i, e // s["n_head"])
        norm(r, f"blk.{i}.attn_q_norm.weight", e)
        norm(r, f"blk.{i}.attn_k_norm.weight", e)
        layer_moe(r, s, i)

def smollm3(r, s):
    llama(r, s)  # every fourth layer without RoPE: llama.cpp's rule, no key

def granite(r, s):
    r.kv("logit_scale", "f32", s["logit_scale"])
    r.kv("residual_scale", "f32", s["residual_scale"])
    r.kv("embedding_scale", "f32", s["embedding_scale"])
    r.kv("attention.scale", "f32", s["attention_scale"])
    llama(r, s)

def gemma2(r, s):
    common(r, s)
    r.kv("attention.sliding_window", "u32", s["window"])
    r.kv("attn_logit_softcapping", "f32", s["attn_cap"])
    r.kv("final_logit_softcapping", "f32", s["final_cap"])
    hd = s["n_embd"] // s["n_head"]
    for i in range(s["n_layer"]):
        layer_attn(r, s, i, hd)
        norm(r, f"blk.{i}.post_attention_norm.weight", s["n_embd"])
        layer_ffn(r, s, i)
        norm(r, f"blk.{i}.post_ffw_norm.weight", s["n_embd"])

def llama(r, s):
    common(r, s)
    hd = s["n_embd"] // s["n_head"]
    for i in range(s["n_layer"]):
        layer_attn(r, s, i, hd)
        layer_ffn(r, s, i)

def qwen2(r, s):
    common(r, s)
    hd = s["n_embd"] // s["n_head"]
    for i in range(s["n_layer"]):
        layer_attn(r, s, i, hd, bias=True)
        layer_ffn(r, s, i)

def qwen3(r, s):
    hd = s["head_dim"]
    common(r, s, head_dim=hd)
    for i in range(s["n_layer"]):
        layer_attn(r, s, i, hd, qk_norm=True)
        layer_ffn(r, s, i)

def gemma3(r, s):
    hd = s["head_dim"]
    common(r, s, head_dim=hd)
    r.kv("attention.sliding_window", "u32", s["window"])
    for i in range(s["n_layer"]):
        layer_attn(r, s, i, hd, qk_norm=True)
        norm(r, f"blk.{i}.post_attention_norm.weight", s["n_embd"])
        layer_ffn(r, s, i)
        norm(r, f"blk.{i}.post_ffw_norm.weight", s["n_embd"])

def gpt_oss(r, s):
    # gpt-oss: biased Q/K/V/O, attention sinks, every other layer in a sliding window, YaRN,
    # the FFN's norm named post_attention_norm, a biased router and biased experts.
    hd, e, f, n = s["head_dim"], s["n_embd"], s["n_ff_exp"], s["n_expert"]
    common(r, s, head_dim=hd)
    moe_meta(r, s, True)
    r.kv("attention.sliding_window", "u32", s["window"])
    r.kv("rope.scaling.type", "str", "yarn")
    r.kv("rope.scaling.factor", "f32", s["yarn_factor"])
    r.kv("rope.scaling.original_context_length", "u32", s["yarn_orig"])
    for i in range(s["n_layer"]):
        layer_attn(r, s, i, hd, bias=True)
        r.t(f"blk.{i}.attn_output.bias", [e], 0.5)
        r.t(f"blk.{i}.attn_sinks.weight", [s["n_head"]], 2.0)
        norm(r, f"blk.{i}.post_attention_norm.weight", e)
        mat(r, f"blk.{i}.ffn_gate_inp.weight", n, e, 2.0)
        r.t(f"blk.{i}.ffn_gate_inp.bias", [n], 1.0)
        ty = s.get("experts")  # gpt-oss ships its experts in MXFP4
        r.t(f"blk.{i}.ffn_gate_exps.weight", [n, f, e], (3.0 / e) ** 0.5, ty=ty)
        r.t(f"blk.{i}.ffn_gate_exps.bias", [n, f], 0.5)
        r.t(f"blk.{i}.ffn_up_exps.weight", [n, f, e], (3.0 / e) ** 0.5, ty=ty)
        r.t(f"blk.{i}.ffn_up_exps.bias", [n, f], 0.5)
        r.t(f"blk.{i}.ffn_down_exps.weight", [n, e, f], 0.5 * (3.0 / f) ** 0.5, ty=ty)
        r.t(f"blk.{i}.ffn_down_exps.bias", [n, e], 0.2)

def mistral3(r, s):
    # Ministral 3: Llama's layers, YaRN with a log multiplier, and Llama 4's attention
    # temperature (the query scaled by 1 + beta * ln(floor(pos / orig) + 1)).
    r.kv("rope.scaling.type", "str", "yarn")
    r.kv("rope.scaling.factor", "f32", s["yarn_factor"])
    r.kv("rope.scaling.original_context_length", "u32", s["yarn_orig"])
    r.kv("rope.scaling.yarn_log_multiplier", "f32", s["log_mul"])
    r.kv("rope.scaling.yarn_beta_fast", "f32", 32.0)
    r.kv("rope.scaling.yarn_beta_slow", "f32", 1.0)
    if s.get("temperature"):
        r.kv("attention.temperature_scale", "f32", s["temperature"])
    llama(r, s)

def phi3(r, s):
    # Phi-3 / Phi-4-mini: fused QKV (or not), gate and up fused in one ffn_up of 2 * n_ff rows,
    # NeoX RoPE over part of each head with short/long divisors and an attention factor.
    e, f, hd = s["n_embd"], s["n_ff"], s["n_embd"] // s["n_head"]
    # llama.cpp looks up Phi-3's chat tokens in a vocabulary whose model is named "phi3".
    r.meta[1] = ["general.name", "str", f"tiny random {r.seed}"]
    common(r, s)
    r.kv("rope.dimension_count", "u32", s["n_rot"])
    r.kv("rope.scaling.attn_factor", "f32", s["attn_factor"])
    r.kv("rope.scaling.original_context_length", "u32", s["orig_ctx"])
    r.t("rope_factors_short.weight", [s["n_rot"] // 2], 0.4, 1.2)
    r.t("rope_factors_long.weight", [s["n_rot"] // 2], 3.0, 5.0)
    q, kv = s["n_head"] * hd, s["n_head_kv"] * hd
    for i in range(s["n_layer"]):
        norm(r, f"blk.{i}.attn_norm.weight", e)
        if s.get("fused_qkv"):
            mat(r, f"blk.{i}.attn_qkv.weight", q + 2 * kv, e)
        else:
            mat(r, f"blk.{i}.attn_q.weight", q, e)
            mat(r, f"blk.{i}.attn_k.weight", kv, e)
            mat(r, f"blk.{i}.attn_v.weight", kv, e)
        mat(r, f"blk.{i}.attn_output.weight", e, q, 0.5)
        norm(r, f"blk.{i}.ffn_norm.weight", e)
        mat(r, f"blk.{i}.ffn_up.weight", 2 * f, e)
        mat(r, f"blk.{i}.ffn_down.weight", e, f, 0.5)

def lfm2(r, s):
    # LFM2: convolution layers (head_count_kv 0) between attention layers with per-head Q/K
    # norms; the final norm is named token_embd_norm; attention layers may slide.
    e, L, hd = s["n_embd"], s["n_layer"], s["n_embd"] // s["n_head"]
    common(r, s)
    attends = s["attention_layers"]
    r.meta = [m for m in r.meta if m[0] != f"{r.arch}.attention.head_count_kv"]
    r.kv("attention.head_count_kv", "arr_i32", [s["n_head_kv"] if i in attends else 0 for i in range(L)])
    r.kv("shortconv.l_cache", "u32", s["taps"])
    if s.get("window"):
        r.kv("attention.sliding_window", "u32", s["window"])
    next(t for t in r.tensors if t["name"] == "output_norm.weight")["name"] = "token_embd_norm.weight"
    for i in range(L):
        if i in attends:
            layer_attn(r, s, i, hd, qk_norm=True)
        else:
            norm(r, f"blk.{i}.attn_norm.weight", e)
            r.t(f"blk.{i}.shortconv.conv.weight", [e, s["taps"]], 0.6)
            mat(r, f"blk.{i}.shortconv.in_proj.weight", 3 * e, e)
            mat(r, f"blk.{i}.shortconv.out_proj.weight", e, e, 0.5)
        if s.get("n_expert") and i >= s["dense_lead"]:
            layer_moe(r, s, i)
            r.t(f"blk.{i}.exp_probs_b.bias", [s["n_expert"]], 0.3)
        else:
            layer_ffn(r, s, i)

def lfm2moe(r, s):
    # LFM2-MoE: LFM2's layers, dense FFNs in the first `dense_lead` layers, then experts with
    # sigmoid gates and a selection bias.
    moe_meta(r, s, True)
    r.kv("leading_dense_block_count", "u32", s["dense_lead"])
    r.kv("expert_gating_func", "u32", 2)
    lfm2(r, s)

def smallthinker(r, s):
    # SmallThinker: the router reads the layer's un-normed input before attention (a small gain
    # keeps sigmoid gates off their flat ends), ReGLU experts, gating from the file; with a
    # sliding window, every 4th layer from the first is global and runs without RoPE.
    common(r, s)
    moe_meta(r, s, True)
    r.kv("expert_gating_func", "u32", s["gating"])
    if s.get("window"):
        r.kv("attention.sliding_window", "u32", s["window"])
        r.kv("rope.freq_base_swa", "f32", s["swa_base"])
    hd = s["n_embd"] // s["n_head"]
    for i in range(s["n_layer"]):
        layer_attn(r, s, i, hd)
        layer_moe(r, s, i, router_gain=0.4)

def qwen35(r, s):
    # Qwen3.5: gated delta nets in all but every `interval`-th layer; the others attend with
    # an output gate (each head's Q rows then its gate rows), per-head Q/K norms and
    # interleaved M-RoPE over n_rot dims; the FFN's norm is post_attention_norm.
    e, L, hd, ds = s["n_embd"], s["n_layer"], s["head_dim"], s["d_state"]
    kh, vh = s["k_heads"], s["v_heads"]
    common(r, s, head_dim=hd)
    r.kv("rope.dimension_count", "u32", s["n_rot"])
    r.kv("rope.dimension_sections", "arr_i32", s["sections"])
    r.kv("ssm.conv_kernel", "u32", s["taps"])
    r.kv("ssm.inner_size", "u32", vh * ds)
    r.kv("ssm.state_size", "u32", ds)
    r.kv("ssm.time_step_rank", "u32", vh)
    r.kv("ssm.group_count", "u32", kh)
    r.kv("full_attention_interval", "u32", s["interval"])
    conv = 2 * kh * ds + vh * ds
    for i in range(L):
        norm(r, f"blk.{i}.attn_norm.weight", e)
        norm(r, f"blk.{i}.post_attention_norm.weight", e)
        if (i + 1) % s["interval"] != 0:
            mat(r, f"blk.{i}.attn_qkv.weight", conv, e)
            mat(r, f"blk.{i}.attn_gate.weight", vh * ds, e)
            r.t(f"blk.{i}.ssm_conv1d.weight", [conv, s["taps"]], 0.5)
            r.t(f"blk.{i}.ssm_dt.bias", [vh], 0.5)
            r.t(f"blk.{i}.ssm_a", [vh], 0.5, -1.0)
            mat(r, f"blk.{i}.ssm_beta.weight", vh, e)
            mat(r, f"blk.{i}.ssm_alpha.weight", vh, e)
            norm(r, f"blk.{i}.ssm_norm.weight", ds)
            mat(r, f"blk.{i}.ssm_out.weight", e, vh * ds, 0.5)
        else:
            q, kv = s["n_head"] * hd, s["n_head_kv"] * hd
            mat(r, f"blk.{i}.attn_q.weight", 2 * q, e)
            mat(r, f"blk.{i}.attn_k.weight", kv, e)
            mat(r, f"blk.{i}.attn_v.weight", kv, e)
            norm(r, f"blk.{i}.attn_q_norm.weight", hd)
            norm(r, f"blk.{i}.attn_k_norm.weight", hd)
            mat(r, f"blk.{i}.attn_output.weight", e, q, 0.5)
        if s.get("n_expert"):
            layer_moe_shared(r, s, i)
        else:
            mat(r, f"blk.{i}.ffn_gate.weight", s["n_ff"], e)
            mat(r, f"blk.{i}.ffn_up.weight", s["n_ff"], e)
            mat(r, f"blk.{i}.ffn_down.weight", e, s["n_ff"], 0.5)

def layer_moe_shared(r, s, i):
    # Routed experts (no ffn_norm: the caller's post_attention_norm is the FFN's norm) and a
    # shared expert scaled by the sigmoid of its own gate.
    e, f, n, sh = s["n_embd"], s["n_ff_exp"], s["n_expert"], s["n_ff_shexp"]
    mat(r, f"blk.{i}.ffn_gate_inp.weight", n, e, 2.0)
    r.t(f"blk.{i}.ffn_gate_exps.weight", [n, f, e], (3.0 / e) ** 0.5)
    r.t(f"blk.{i}.ffn_up_exps.weight", [n, f, e], (3.0 / e) ** 0.5)
    r.t(f"blk.{i}.ffn_down_exps.weight", [n, e, f], 0.5 * (3.0 / f) ** 0.5)
    mat(r, f"blk.{i}.ffn_gate_shexp.weight", sh, e)
    mat(r, f"blk.{i}.ffn_up_shexp.weight", sh, e)
    mat(r, f"blk.{i}.ffn_down_shexp.weight", e, sh, 0.5)
    r.t(f"blk.{i}.ffn_gate_inp_shexp.weight", [e], 0.5)

def qwen35moe(r, s):
    moe_meta(r, s, True)
    r.kv("expert_shared_feed_forward_length", "u32", s["n_ff_shexp"])
    qwen35(r, s)

def gemma4(r, s):
    # Gemma 4 (E2B/E4B layout): sliding layers with their own head size and rotation, global
    # layers with wider heads and proportional RoPE (rope_freqs leaves pairs at rest), V normed,
    # the last layers sharing earlier layers' KV, per-layer token embeddings, layer scales.
    e, L, w = s["n_embd"], s["n_layer"], s["per_layer"]
    hd, hd_swa, period, shared = s["head_dim"], s["head_dim_swa"], s["period"], s["shared"]
    common(r, s, head_dim=hd)
    swa = [(i + 1) % period != 0 for i in range(L)]
    kv_from = L - shared
    r.kv("rope.freq_base_swa", "f32", 10000.0)
    r.kv("attention.sliding_window", "u32", s["window"])
    r.kv("attention.sliding_window_pattern", "arr_bool", swa)
    r.kv("attention.key_length_swa", "u32", hd_swa)
    r.kv("attention.value_length_swa", "u32", hd_swa)
    r.kv("rope.dimension_count", "u32", hd)
    r.kv("rope.dimension_count_swa", "u32", s["n_rot_swa"])
    r.kv("attention.shared_kv_layers", "u32", shared)
    r.kv("embedding_length_per_layer_input", "u32", w)
    if s.get("n_expert"):
        r.kv("expert_count", "u32", s["n_expert"])
        r.kv("expert_used_count", "u32", s["n_expert_used"])
        r.kv("expert_feed_forward_length", "u32", s["n_ff_exp"])
    if "final_cap" in s:
        r.kv("final_logit_softcapping", "f32", s["final_cap"])
    kv_heads = [s["n_head_kv"] if swa[i] else s.get("n_head_kv_full", s["n_head_kv"]) for i in range(L)]
    if s.get("n_head_kv_full"):
        r.meta = [m for m in r.meta if m[0] != f"{r.arch}.attention.head_count_kv"]
        r.kv("attention.head_count_kv", "arr_i32", kv_heads)
    ffs = [s["n_ff"] * (2 if s.get("double_ff") and i >= kv_from else 1) for i in range(L)]
    if s.get("double_ff"):
        r.meta = [m for m in r.meta if m[0] != f"{r.arch}.feed_forward_length"]
        r.kv("feed_forward_length", "arr_i32", ffs)
    rotated = int(hd * 0.25 / 2)
    r.t("rope_freqs.weight", [hd // 2], 0.0, 1.0)
    r.tensors[-1]["values"] = [1.0] * rotated + [1e30] * (hd // 2 - rotated)
    if w:
        r.t("per_layer_token_embd.weight", [N_VOCAB, w * L], 1.0)
        mat(r, "per_layer_model_proj.weight", w * L, e)
        norm(r, "per_layer_proj_norm.weight", w)
    for i in range(L):
        h = hd_swa if swa[i] else hd
        q, kv = s["n_head"] * h, kv_heads[i] * h
        norm(r, f"blk.{i}.attn_norm.weight", e)
        mat(r, f"blk.{i}.attn_q.weight", q, e)
        if i < kv_from or s.get("shared_kv_tensors"):
            mat(r, f"blk.{i}.attn_k.weight", kv, e)
            if swa[i] or not s.get("k_eq_v"):
                mat(r, f"blk.{i}.attn_v.weight", kv, e)
            norm(r, f"blk.{i}.attn_k_norm.weight", h)
        norm(r, f"blk.{i}.attn_q_norm.weight", h)
        mat(r, f"blk.{i}.attn_output.weight", e, q, 0.5)
        norm(r, f"blk.{i}.post_attention_norm.weight", e)
        f = ffs[i]
        norm(r, f"blk.{i}.ffn_norm.weight", e)
        mat(r, f"blk.{i}.ffn_gate.weight", f, e)
        mat(r, f"blk.{i}.ffn_up.weight", f, e)
        mat(r, f"blk.{i}.ffn_down.weight", e, f, 0.5)
        norm(r, f"blk.{i}.post_ffw_norm.weight", e)
        if s.get("n_expert"):
            # The mixture: experts beside the dense FFN, each with its own norms; the router
            # on the scaled normed stream; a scale per expert.
            n, fe = s["n_expert"], s["n_ff_exp"]
            norm(r, f"blk.{i}.pre_ffw_norm_2.weight", e)
            norm(r, f"blk.{i}.post_ffw_norm_1.weight", e)
            norm(r, f"blk.{i}.post_ffw_norm_2.weight", e)
            mat(r, f"blk.{i}.ffn_gate_inp.weight", n, e, 2.0 * e ** 0.5)
            norm(r, f"blk.{i}.ffn_gate_inp.scale", e)
            r.t(f"blk.{i}.ffn_gate_exps.weight", [n, fe, e], (3.0 / e) ** 0.5)
            r.t(f"blk.{i}.ffn_up_exps.weight", [n, fe, e], (3.0 / e) ** 0.5)
            r.t(f"blk.{i}.ffn_down_exps.weight", [n, e, fe], 0.5 * (3.0 / fe) ** 0.5)
            r.t(f"blk.{i}.ffn_down_exps.scale", [n], 0.3, 1.0)
        if s.get("out_scale"):
            norm(r, f"blk.{i}.layer_output_scale.weight", 1)
        if w:
            mat(r, f"blk.{i}.inp_gate.weight", w, e)
            mat(r, f"blk.{i}.proj.weight", e, w, 0.5)
            norm(r, f"blk.{i}.post_norm.weight", e)

FAMILIES = {
    "llama": (llama, [
        dict(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2),
        dict(n_embd=96, n_layer=3, n_ff=160, n_head=6, n_head_kv=6, tied=True),
    ]),
    "qwen2": (qwen2, [
        dict(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=1, rope_base=1e6),
        dict(n_embd=128, n_layer=3, n_ff=192, n_head=8, n_head_kv=2, tied=True),
    ]),
    "qwen3": (qwen3, [
        dict(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, head_dim=32, rope_base=1e6),
        dict(n_embd=96, n_layer=3, n_ff=192, n_head=3, n_head_kv=1, head_dim=48, tied=True),
        dict(n_embd=128, n_layer=4, n_ff=256, n_head=8, n_head_kv=4, head_dim=16),
    ]),
    "qwen3moe": (qwen3moe, [
        dict(n_embd=64, n_layer=2, n_ff=256, n_head=4, n_head_kv=2, head_dim=32, rope_base=1e6,
             n_expert=8, n_expert_used=2, n_ff_exp=48),
        dict(n_embd=96, n_layer=3, n_ff=512, n_head=6, n_head_kv=2, head_dim=16, tied=True,
             n_expert=16, n_expert_used=4, n_ff_exp=32),
    ]),
    "gpt-oss": (gpt_oss, [
        dict(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, head_dim=16, rope_base=150000.0,
             n_expert=8, n_expert_used=2, n_ff_exp=48, window=8, yarn_factor=32.0, yarn_orig=64),
        dict(n_embd=96, n_layer=4, n_ff=128, n_head=6, n_head_kv=2, head_dim=32, rope_base=10000.0,
             n_expert=16, n_expert_used=4, n_ff_exp=32, window=16, yarn_factor=4.0, yarn_orig=256),
        dict(n_embd=64, n_layer=3, n_ff=128, n_head=4, n_head_kv=1, head_dim=16, rope_base=150000.0,
             n_expert=8, n_expert_used=4, n_ff_exp=64, window=8, yarn_factor=32.0, yarn_orig=64,
             experts="mxfp4"),
    ]),
    "olmoe": (olmoe, [
        dict(n_embd=64, n_layer=2, n_ff=0, n_head=4, n_head_kv=4, n_expert=8, n_expert_used=2, n_ff_exp=48),
        dict(n_embd=128, n_layer=3, n_ff=0, n_head=8, n_head_kv=8, n_expert=16, n_expert_used=4, n_ff_exp=32),
    ]),
    "smollm3": (smollm3, [
        dict(n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2),
        dict(n_embd=96, n_layer=8, n_ff=160, n_head=6, n_head_kv=3, tied=True),
    ]),
    "granite": (granite, [
        dict(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, logit_scale=4.0, residual_scale=0.22,
             embedding_scale=12.0, attention_scale=0.0078125),
        dict(n_embd=96, n_layer=3, n_ff=160, n_head=6, n_head_kv=2, tied=True, logit_scale=0.5,
             residual_scale=0.5, embedding_scale=2.0, attention_scale=0.2),
    ]),
    "gemma2": (gemma2, [
        dict(n_embd=64, n_layer=3, n_ff=128, n_head=4, n_head_kv=2, window=12, tied=True, attn_cap=2.0, final_cap=3.0),
        dict(n_embd=96, n_layer=4, n_ff=192, n_head=3, n_head_kv=1, window=20, tied=True, attn_cap=50.0, final_cap=30.0,
             rope_base=10000.0),
    ]),
    "mistral3": (mistral3, [
        dict(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, rope_base=1e6, yarn_factor=16.0,
             yarn_orig=16, log_mul=1.0, temperature=0.5),
        dict(n_embd=96, n_layer=3, n_ff=160, n_head=6, n_head_kv=2, tied=True, yarn_factor=4.0,
             yarn_orig=32, log_mul=0.5),
    ]),
    "phi3": (phi3, [
        dict(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=4, n_rot=8, attn_factor=1.19,
             orig_ctx=4096, fused_qkv=True),
        dict(n_embd=96, n_layer=3, n_ff=160, n_head=6, n_head_kv=2, n_rot=12, attn_factor=1.1,
             orig_ctx=32, tied=True, fused_qkv=True),
        dict(n_embd=64, n_layer=2, n_ff=96, n_head=4, n_head_kv=2, n_rot=16, attn_factor=1.0,
             orig_ctx=4096),
    ]),
    "lfm2": (lfm2, [
        dict(n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, taps=3, attention_layers=[1, 3],
             rope_base=1e6),
        dict(n_embd=96, n_layer=5, n_ff=160, n_head=6, n_head_kv=2, taps=3, attention_layers=[2, 4],
             tied=True, window=8),
        dict(n_embd=64, n_layer=3, n_ff=96, n_head=4, n_head_kv=4, taps=4, attention_layers=[0]),
    ]),
    "smallthinker": (smallthinker, [
        dict(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=2, n_expert=8, n_expert_used=2, n_ff_exp=48,
             gating=2, rope_base=1e6),
        dict(n_embd=96, n_layer=6, n_ff=128, n_head=6, n_head_kv=2, n_expert=16, n_expert_used=4, n_ff_exp=32,
             gating=1, window=64, swa_base=1e5, tied=True),
    ]),
    "qwen35": (qwen35, [
        dict(n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, head_dim=32, n_rot=16, sections=[2, 2, 1, 3],
             taps=4, k_heads=2, v_heads=4, d_state=16, interval=4, rope_base=1e7),
        dict(n_embd=96, n_layer=3, n_ff=160, n_head=4, n_head_kv=1, head_dim=24, n_rot=8, sections=[0, 2, 2, 0],
             taps=3, k_heads=3, v_heads=3, d_state=32, interval=2, tied=True),
    ]),
    "qwen35moe": (qwen35moe, [
        dict(n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, head_dim=32, n_rot=16, sections=[2, 2, 1, 3],
             taps=4, k_heads=2, v_heads=4, d_state=16, interval=4, n_expert=8, n_expert_used=2, n_ff_exp=32,
             n_ff_shexp=48),
        dict(n_embd=96, n_layer=3, n_ff=160, n_head=4, n_head_kv=1, head_dim=24, n_rot=8, sections=[0, 2, 2, 0],
             taps=3, k_heads=3, v_heads=3, d_state=32, interval=2, tied=True, n_expert=16, n_expert_used=4,
             n_ff_exp=24, n_ff_shexp=24),
    ]),
    "lfm2moe": (lfm2moe, [
        dict(n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, taps=3, attention_layers=[1, 3],
             n_expert=8, n_expert_used=2, n_ff_exp=32, dense_lead=1),
        dict(n_embd=96, n_layer=5, n_ff=160, n_head=6, n_head_kv=2, taps=3, attention_layers=[2],
             tied=True, n_expert=16, n_expert_used=4, n_ff_exp=24, dense_lead=2),
    ]),
    "gemma4": (gemma4, [
        dict(n_embd=64, n_layer=6, n_ff=96, n_head=2, n_head_kv=1, head_dim=64, head_dim_swa=32, n_rot_swa=32,
             period=3, shared=3, per_layer=16, window=8, tied=True, final_cap=30.0, double_ff=True,
             out_scale=True, rope_base=1e6, shared_kv_tensors=True),
        dict(n_embd=96, n_layer=4, n_ff=128, n_head=4, n_head_kv=2, n_head_kv_full=1, head_dim=48, head_dim_swa=24,
             n_rot_swa=16, period=2, shared=0, per_layer=0, window=16, k_eq_v=True, rope_base=1e6, final_cap=0.0),
        dict(n_embd=64, n_layer=8, n_ff=128, n_head=4, n_head_kv=2, head_dim=32, head_dim_swa=16, n_rot_swa=16,
             period=4, shared=4, per_layer=8, window=12, tied=True, final_cap=15.0, out_scale=True, rope_base=1e6),
        # The mixture (26B-A4B layout: no per-layer inputs, no shared KV, V = K in global layers).
        dict(n_embd=64, n_layer=4, n_ff=96, n_head=4, n_head_kv=2, n_head_kv_full=1, head_dim=32, head_dim_swa=16,
             n_rot_swa=16, period=2, shared=0, per_layer=0, window=8, k_eq_v=True, rope_base=1e6, tied=True,
             n_expert=8, n_expert_used=2, n_ff_exp=32, out_scale=True),
        dict(n_embd=96, n_layer=3, n_ff=128, n_head=3, n_head_kv=1, head_dim=32, head_dim_swa=32,
             n_rot_swa=32, period=3, shared=0, per_layer=0, window=16, rope_base=1e6,
             n_expert=16, n_expert_used=4, n_ff_exp=24),
    ]),
    "gemma3": (gemma3, [
        dict(n_embd=64, n_layer=2, n_ff=128, n_head=4, n_head_kv=1, head_dim=32, window=16, tied=True),
    ]),
}

def recipes(only=None):
    out = []
    for fam, (build, shapes) in FAMILIES.items():
        if only and fam != only:
            continue
        for k, s in enumerate(shapes):
            r = Recipe(f"{fam}-{k}", fam, zlib.crc32(f"{fam}-{k}".encode()))
            build(r, s)
            out.append(r)
    return out

def write_gguf(r, path):
    w = gguf.GGUFWriter(str(path), r.arch)
    for key, ty, v in r.meta:
        if key == "general.architecture":
            continue  # the writer adds it
        if ty == "str":
            w.add_string(key, v)
        elif ty == "u32":
            w.add_uint32(key, v)
        elif ty == "f32":
            w.add_float32(key, v)
        elif ty == "bool":
            w.add_bool(key, v)
        elif ty == "arr_str":
            w.add_array(key, v)
        elif ty == "arr_f32":
            w.add_array(key, [float(x) for x in v])
        elif ty == "arr_i32":
            w.add_array(key, [int(x) for x in v])
        elif ty == "arr_bool":
            w.add_array(key, [bool(x) for x in v])
        else:
            raise ValueError(ty)
    crcs = {}
    for t in r.tensors:
        v = values(t).reshape(t["shape"])
        if t.get("type") == "mxfp4":
            q = gguf.quants.quantize(v, gguf.GGMLQuantizationType.MXFP4)
            crcs[t["name"]] = zlib.crc32(q.tobytes())
            w.add_tensor(t["name"], q, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
            continue
        crcs[t["name"]] = zlib.crc32(v.tobytes())
        w.add_tensor(t["name"], v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return crcs

def llama_outputs(path, seed):
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True, verbose=False,
                n_threads=2, seed=0)
    rng = np.random.default_rng(seed)
    text = [int(x) for x in rng.integers(3, N_VOCAB, 128)]
    llm.reset()
    llm.eval(text)
    logits = np.array(llm.scores[: len(text)], dtype=np.float64)
    m = logits.max(axis=1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    nll = -logp[np.arange(len(text) - 1), text[1:]]
    ppl = float(np.exp(nll.mean()))
    prompt = text[:8]
    llm.reset()
    llm.eval(prompt)
    last = [float(x) for x in llm.scores[len(prompt) - 1]]
    greedy, gaps = [], []
    for _ in range(24):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        order = np.argsort(-row)
        nxt = int(order[0])
        greedy.append(nxt)
        gaps.append(float(row[order[0]] - row[order[1]]))
        llm.eval([nxt])
    return {"text": text, "ppl": ppl, "logit_std": float(logits.std()), "prompt": prompt, "greedy": greedy,
            "gaps": gaps, "last_logits": last}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/pi2-families", help="where the GGUF files go (not committed)")
    ap.add_argument("--only")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ref_path = ROOT / "testdata/families/reference.json"
    refs = json.loads(ref_path.read_text()) if ref_path.exists() and a.only else {"files": []}
    keep = [f for f in refs["files"] if not (a.only and f["arch"] == a.only)]
    made = []
    for r in recipes(a.only):
        path = out / f"{r.name}.gguf"
        crcs = write_gguf(r, path)
        o = llama_outputs(path, r.seed)
        print(f"{r.name}: ppl {o['ppl']:.4f}, logit std {o['logit_std']:.2f}, min gap {min(o['gaps']):.3f}",
              file=sys.stderr)
        made.append({"name": r.name, "arch": r.arch, "meta": r.meta,
                     "tensors": [dict(t, crc32=crcs[t["name"]]) for t in r.tensors], "llama_cpp": o})
    refs = {"what": "random-weight GGUF recipes per family and llama.cpp's outputs on them (testdata/families/make.py)",
            "llama_cpp": "llama-cpp-python 0.3.36 built from source", "files": keep + made}
    ref_path.write_text(json.dumps(refs, separators=(",", ":")) + "\n")
    print(f"wrote {ref_path}", file=sys.stderr)

if __name__ == "__main__":
    main()
