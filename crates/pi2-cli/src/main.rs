//! `pi2`: run, chat with, tokenize, measure and inspect GGUF models. Errors end the process with
//! one line on stderr and a non-zero exit code.

mod args;
mod cmd;
mod errors;
mod fetch;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "pi2",
    version,
    about = "LLM inference for devices whose memory is smaller than the model"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt
    Run(cmd::run::RunArgs),
    /// Interactive chat with the model's chat template
    Chat(cmd::chat::ChatArgs),
    /// OpenAI-compatible HTTP server (chat and completions, streamed or whole) with a chat page
    Serve(cmd::serve::ServeArgs),
    /// Print the token ids of a text as JSON
    Tokenize(cmd::tokenize::TokenizeArgs),
    /// Print texts' embeddings (pooled final hidden states, L2-normalized) as JSON
    Embed(cmd::embed::EmbedArgs),
    /// Perplexity of a text file (llama-perplexity's method and output)
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Architecture, sizes, tensor types and memory needed
    Info(cmd::info::InfoArgs),
    /// llama-bench style throughput table (ppN prompt processing, tgN generation)
    Bench(cmd::bench::BenchArgs),
    /// Record how FFN neurons activate over calibration text (thresholds, hotness, cache curves)
    Profile(cmd::profile::ProfileArgs),
    /// Re-lay a model out as hot-first neuron bundles with predictors and thresholds
    Convert(cmd::convert::ConvertArgs),
    /// Random-read throughput and latency of the device holding a file (for the planner)
    ProfileIo(cmd::profile_io::ProfileIoArgs),
    /// Measure this device for the planner: kernel throughput per core class and thread count,
    /// memory bandwidth, flash reads (cached per device)
    ProfileHw(cmd::plan::ProfileHwArgs),
    /// Solve for the fastest plan (threads, memory split, I/O shaping) under a memory limit
    Plan(cmd::plan::PlanArgs),
    /// Write a full-size stand-in model (Llama-2, Mistral, Mixtral, Qwen3-30B-A3B, OLMoE and
    /// gpt-oss-20b shapes; ReLU-family or SiLU FFN) with random weights that fire and route at
    /// planted rates, for speed and memory measurements
    Synth(cmd::synth::SynthArgs),
    /// Download catalogue models (default: smollm2-135m) into the models folder and verify
    /// them; --list shows the catalogue
    FetchModel(cmd::FetchArgs),
}

fn main() {
    // Die quietly when a reader closes the pipe (`pi2 info | head`), as C tools do, instead of
    // panicking on the failed print.
    // SAFETY: restoring a default signal disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    exit_cleanly_when_output_fails();
    exit_cleanly_on_sigbus();
    // Before clap, which would read `-ngl 99` as `-n gl`. `args_os`: an argument that is not
    // UTF-8 (`-p $'\xff'`) is clap's to refuse in one line, not a panic here.
    let serving = std::env::args_os().nth(1).is_some_and(|c| c == "serve");
    if let Some(why) = std::env::args_os()
        .skip(1)
        .filter_map(|a| a.to_str().map(str::to_string))
        .filter(|a| !(serving && SERVE_ACCEPTS.contains(&a.split('=').next().unwrap_or(a))))
        .find_map(|a| llama_cpp_only(&a))
    {
        eprintln!("error: {why}");
        std::process::exit(2);
    }
    let cli = Cli::parse_from(std::env::args_os().map(llama_cpp_alias));
    let result: Result<()> = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Embed(a) => cmd::embed::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Profile(a) => cmd::profile::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::ProfileIo(a) => cmd::profile_io::run(a),
        Command::ProfileHw(a) => cmd::plan::profile_hw(a),
        Command::Plan(a) => cmd::plan::plan(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::FetchModel(a) => cmd::fetch(a),
    };
    if let Err(e) = result {
        match errors::forget_damaged_conversion(&e, &pi2_runtime::device::cache_dir()) {
            Some(done) => eprintln!("error: {} ({done})", errors::one_line(&e)),
            None => eprintln!("error: {}", errors::one_line(&e)),
        }
        std::process::exit(1);
    }
}

/// llama.cpp flags pi2 has no use for, with why: one clear line instead of clap's suggestion.
const LLAMA_CPP_ONLY: &[(&[&str], &str)] = &[
    (
        &["-ngl", "--n-gpu-layers", "--gpu-layers"],
        "pi2 runs on the CPU: there are no GPU layers to offload (--mem-budget offloads to flash)",
    ),
    (
        &["-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"],
        "pi2 downloads nothing from Hugging Face at run time: pass a local GGUF file to -m, or a catalogue name (`pi2 fetch-model --list`)",
    ),
    (
        &["-fa", "--flash-attn"],
        "pi2 has no flash-attention switch: its CPU attention is one kernel",
    ),
    (
        &["-sm", "--split-mode", "-ts", "--tensor-split", "-mg", "--main-gpu"],
        "pi2 runs on the CPU: there are no GPUs to split the model over",
    ),
    (
        &["-ctk", "--cache-type-k", "-ctv", "--cache-type-v"],
        "pi2 keeps the KV cache in f16 (a quantized cache would change the answers)",
    ),
    (
        &["--reranking", "--rerank"],
        "pi2 serves no rerank route (/v1/embeddings is served)",
    ),
    (
        &["--lora", "--lora-scaled", "--lora-init-without-apply"],
        "pi2 applies no LoRA adapters: merge the adapter into the GGUF first",
    ),
    (
        &["-mm", "--mmproj", "-mmu", "--mmproj-url"],
        "pi2 reads text models: it has no image or audio projector",
    ),
    (
        &["-gan", "--grp-attn-n", "-gaw", "--grp-attn-w"],
        "pi2 has no self-extend: `pi2 serve --context-shift` drops the oldest messages of a chat too long",
    ),
    (
        &["-cnv", "--conversation"],
        "use `pi2 chat` for a conversation (or `pi2 run --chat` for one turn)",
    ),
];

/// llama.cpp flags of the list above that `pi2 serve` accepts as they are (it runs
/// llama-server's command lines; see its `LlamaServerSwitches`).
const SERVE_ACCEPTS: &[&str] = &["-fa", "--flash-attn"];

/// llama.cpp's multi-letter short flags that pi2 has under another name: clap would read `-np 2`
/// as `-n p` and `-sys` as `-s ys`.
const LLAMA_CPP_ALIASES: &[(&str, &str)] = &[
    ("-np", "--parallel"),
    ("-sys", "--system"),
    ("-cb", "--cont-batching"),
    ("-ub", "--ubatch-size"),
    ("-fa", "--flash-attn"),
    ("-rea", "--reasoning"),
];

/// `arg` with a llama.cpp multi-letter short flag (alone or as `-flag=value`) renamed to pi2's.
fn llama_cpp_alias(arg: std::ffi::OsString) -> std::ffi::OsString {
    let Some(text) = arg.to_str() else {
        return arg;
    };
    let (flag, value) = match text.split_once('=') {
        Some((f, v)) => (f, Some(v)),
        None => (text, None),
    };
    match LLAMA_CPP_ALIASES.iter().find(|(short, _)| *short == flag) {
        Some((_, long)) => match value {
            Some(v) => format!("{long}={v}").into(),
            None => (*long).into(),
        },
        None => arg,
    }
}

/// The one-line reason when `arg` is a llama.cpp-only flag (alone or as `--flag=value`).
fn llama_cpp_only(arg: &str) -> Option<String> {
    let flag = arg.split('=').next().unwrap_or(arg);
    LLAMA_CPP_ONLY
        .iter()
        .find(|(flags, _)| flags.contains(&flag))
        .map(|(_, why)| format!("{flag} is a llama.cpp option that pi2 does not support: {why}"))
}

/// `println!` and `eprintln!` panic when their stream cannot be written (a full disk,
/// `> /dev/full`, a closed descriptor): end with one error line (on stderr, if it still works)
/// and exit code 1 instead of a panic, wherever the print was.
fn exit_cleanly_when_output_fails() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(rest) = msg.strip_prefix("failed printing to ") {
            if let Some(why) = rest.strip_prefix("stdout: ") {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "error: cannot write the output: {why}");
            }
            std::process::exit(1);
        }
        default(info);
    }));
}

/// A mapped model file truncated (or its storage gone) while pi2 reads it raises SIGBUS on the
/// next access: end with one error line and exit code 1 instead of dying by the signal.
fn exit_cleanly_on_sigbus() {
    extern "C" fn on_sigbus(_: libc::c_int) {
        const MSG: &[u8] = b"error: the model file was truncated or changed while pi2 was reading it (SIGBUS); run again on an unchanged file\n";
        // SAFETY: write(2) and _exit(2) are async-signal-safe; MSG is static.
        unsafe {
            libc::write(2, MSG.as_ptr().cast(), MSG.len());
            libc::_exit(1);
        }
    }
    // SAFETY: installing a handler that only calls async-signal-safe functions, before any
    // thread starts.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}
