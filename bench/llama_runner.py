"""llama.cpp's side of the benchmarks, run inside the llama-cpp-python venv (bench/pi2bench.py).

    python llama_runner.py bench  MODEL THREADS N_PROMPT N_GEN REPS
        prompt processing (one batch) and generation (one token per call), REPS times each
        after a warm-up, llama.cpp's defaults (repacked weights where it has them):
        {"ppN": [t/s...], "tgN": [t/s...]}
    python llama_runner.py decode MODEL THREADS N_GEN N_PROMPT
        the mmap baseline under a memory cap: weights left in the file mapping (no repacked
        copies in anonymous memory, `--no-repack` in llama.cpp's tools), then N_GEN tokens
        decoded one at a time after a 1-token prompt, or with N_PROMPT > 0 one prompt batch:
        {"load_s": s, "token_s": [s per token...]}
    python llama_runner.py complete MODEL THREADS N_GEN PROMPT_FILE LOOKUP
        a greedy completion of the prompt in the file (mmap, no repacked copies), with
        llama.cpp's prompt lookup decoding drafting LOOKUP tokens (0: none):
        {"text": ..., "n": tokens, "prompt_s": s, "gen_s": s}
"""
import json, sys, time
import llama_cpp
import llama_cpp.llama_cpp as C


def tokens(llm, k):
    return [(i * 2654435761 + 12345) % llm.n_vocab() for i in range(k)]


def bench(model, threads, n_prompt, n_gen, reps):
    llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=1024,
                          n_batch=512, verbose=False, logits_all=False)
    toks = tokens(llm, max(n_prompt, n_gen))

    def reset():
        llm.reset()
        if hasattr(llm._ctx, "kv_cache_clear"):
            llm._ctx.kv_cache_clear()

    def pp():
        reset()
        t = time.perf_counter()
        llm.eval(toks[:n_prompt])
        return n_prompt / (time.perf_counter() - t)

    def tg():
        reset()
        t = time.perf_counter()
        for i in range(n_gen):
            llm.eval([toks[i]])
        return n_gen / (time.perf_counter() - t)

    out = {}
    for name, f in ((f"pp{n_prompt}", pp), (f"tg{n_gen}", tg)):
        f()  # warm-up
        out[name] = [f() for _ in range(reps)]
    return out


def no_repack():
    """Weights stay in the file mapping (the mmap baseline fits under a cap)."""
    defaults = C.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = False
        return p

    C.llama_model_default_params = params


def complete(model, threads, n_gen, prompt_file, lookup, repack=0):
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    if not repack:
        no_repack()
    draft = LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=lookup) if lookup else None
    llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=4096,
                          n_batch=512, use_mmap=True, verbose=False, draft_model=draft)
    prompt = open(prompt_file).read()
    t = time.perf_counter()
    out = llm.create_completion(prompt, max_tokens=n_gen, temperature=0.0, top_k=1)
    total = time.perf_counter() - t
    perf = C.llama_perf_context(llm._ctx.ctx)
    prompt_s = perf.t_p_eval_ms / 1e3
    return {"text": out["choices"][0]["text"], "n": out["usage"]["completion_tokens"],
            "prompt_s": prompt_s, "gen_s": total - prompt_s}


def decode(model, threads, n_gen, n_prompt):
    no_repack()
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=256,
                          n_batch=32, use_mmap=True, verbose=False)
    load = time.perf_counter() - t0
    if n_prompt > 0:
        t = time.perf_counter()
        llm.eval(tokens(llm, n_prompt))
        return {"load_s": load, "token_s": [(time.perf_counter() - t) / n_prompt] * n_prompt}
    llm.eval([1])
    times = []
    for tok in tokens(llm, n_gen):
        t = time.perf_counter()
        llm.eval([tok])
        times.append(time.perf_counter() - t)
    return {"load_s": load, "token_s": times}


if __name__ == "__main__":
    mode, model = sys.argv[1], sys.argv[2]
    if mode == "complete":
        threads, n_gen, prompt_file, lookup = sys.argv[3:7]
        repack = int(sys.argv[7]) if len(sys.argv) > 7 else 0
        print(json.dumps(complete(model, int(threads), int(n_gen), prompt_file, int(lookup), repack)))
    else:
        rest = [int(x) for x in sys.argv[3:]]
        print(json.dumps(bench(model, *rest) if mode == "bench" else decode(model, *rest)))
