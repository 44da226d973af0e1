//! The offloaded FFN for an engine: the budget's regions sized with the engine's own KV cache
//! and batch buffers, hot neurons pinned by the converted model's frequencies.

use crate::error::{Result, RuntimeError};
use pi2_engine::{EngineConfig, Offload, OffloadConfig, SparseFfn};
use pi2_model::Model;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The offloaded FFN under `cfg`, for an engine built with `engine` (its buffers for batches of
/// `n_batch` tokens and the KV cache of a first batch count against the budget, later positions
/// as they come, and so does this process's own memory:
/// `cfg.process`, or when it is 0 [`process_bytes`] measured now; a program that builds
/// several offloads measures once, before the first). Direct I/O that the file system refuses falls
/// back to buffered reads; [`Offload::engine`] says why.
pub fn build(
    cfg: &OffloadConfig,
    model: &Model,
    path: &Path,
    sparse: &SparseFfn<'_>,
    engine: &EngineConfig,
    n_batch: usize,
) -> Result<Offload> {
    let freq = pi2_engine::unit_frequencies(model)?;
    let mut cfg = cfg.clone();
    if cfg.process == 0 {
        cfg.process = process_bytes(model);
    }
    // The KV cache is charged for a first batch, and grows into room kept for it.
    let kv = pi2_engine::kv_bytes_start(model, engine, n_batch) as u64;
    cfg.kv_growth = (pi2_engine::kv_bytes_full(model, engine, n_batch) as u64).saturating_sub(kv);
    let cfg = &cfg;
    // The reader's buffers at the deepest automatic depth are in the process region; a deeper
    // queue or larger reads asked for by hand are charged here.
    let scratch = pi2_engine::scratch_bytes(model, engine, n_batch) as u64
        + cfg
            .reader
            .buffer_bytes()
            .saturating_sub(auto_reader_bytes());
    match Offload::new(model, sparse, path, kv, scratch, freq.as_deref(), cfg) {
        Err(pi2_engine::EngineError::Budget(pi2_cache::CacheError::OverBudget {
            minimum, ..
        })) => Err(too_small(
            cfg.budget,
            minimum,
            cfg.process,
            kv,
            scratch,
            n_batch,
        )),
        other => Ok(other?),
    }
}

/// Whether a budget runs `model` by streaming its experts from the file as it is (a plain
/// mixture-of-experts GGUF: an expert's slice of each stacked tensor is one contiguous read),
/// with no conversion.
pub fn streams_experts(model: &Model) -> bool {
    model.config.n_expert > 0 && !crate::convert_cache::is_converted(model)
}

/// The streamed experts of a plain mixture-of-experts `model` under `cfg` (see [`build`] for
/// what counts against the budget).
pub fn build_experts(
    cfg: &OffloadConfig,
    model: &Model,
    path: &Path,
    engine: &EngineConfig,
    n_batch: usize,
) -> Result<pi2_engine::ExpertStream> {
    let process = match cfg.process {
        0 => process_bytes(model),
        p => p,
    };
    let mut cfg = cfg.clone();
    cfg.process = process;
    let kv = pi2_engine::kv_bytes_start(model, engine, n_batch) as u64;
    let scratch = pi2_engine::scratch_bytes(model, engine, n_batch) as u64
        + cfg
            .reader
            .buffer_bytes()
            .saturating_sub(auto_reader_bytes());
    match pi2_engine::ExpertStream::new(model, path, kv, scratch, &cfg) {
        Err(pi2_engine::EngineError::Budget(pi2_cache::CacheError::OverBudget {
            minimum, ..
        })) => Err(experts_too_small(cfg.budget, minimum, model, n_batch)),
        other => Ok(other?),
    }
}

/// A budget below what streaming a model's experts needs: the parts, and the budget to pass.
fn experts_too_small(budget: u64, minimum: u64, model: &Model, n_batch: usize) -> RuntimeError {
    let need = pi2_engine::expert_budget(model, 0);
    let mib = |b: u64| (b as f64 / (1u64 << 20) as f64).ceil() as u64;
    RuntimeError::option(
        "--mem-budget",
        format!(
            "{} MiB is too small for this model: streaming its experts needs at least {} MiB, of \
             which its tensors other than the experts take {} MiB and one token's {} experts {} \
             MiB (the rest: the KV cache of a first {n_batch}-token batch, buffers and this \
             process); pass --mem-budget {}M or more",
            mib(budget),
            mib(minimum),
            mib(need.resident),
            model.config.n_expert_used,
            mib(need.expert * model.config.n_expert_used as u64),
            mib(minimum) + 1,
        ),
    )
}

/// Refuses `budget` when it cannot hold even what no conversion changes: this process's own
/// memory, and the KV cache and buffers of a one-token batch. Checked before a plain model is
/// converted for the budget, so an absurd budget costs no conversion.
pub fn check_floor(model: &Model, engine: &EngineConfig, budget: u64) -> Result<()> {
    let process = process_bytes(model);
    let kv = pi2_engine::kv_bytes_start(model, engine, 1) as u64;
    let scratch = pi2_engine::scratch_bytes(model, engine, 1) as u64;
    let floor = process + kv + scratch;
    if budget < floor {
        return Err(too_small(budget, floor, process, kv, scratch, 1));
    }
    Ok(())
}

/// Refuses `budget` when it cannot hold the least the one-command conversion of the dense plain
/// `model` needs to run (its converted floor, known before converting: see
/// [`pi2_convert::pipeline::planned`]), so that a budget too small costs no conversion.
pub fn check_converted_floor(model: &Model, engine: &EngineConfig, budget: u64) -> Result<()> {
    let process = process_bytes(model);
    let floor = converted_floor(model, engine, process)?;
    if budget < floor {
        let kv = pi2_engine::kv_bytes_start(model, engine, 1) as u64;
        let scratch = pi2_engine::scratch_bytes(model, engine, 1) as u64;
        return Err(too_small(budget, floor, process, kv, scratch, 1));
    }
    Ok(())
}

/// The least budget the one-command conversion of the dense plain `model` runs under, known
/// before converting (a lower bound: predictors counted at their smallest rank, and the
/// converted file's larger metadata not counted), with `process` this process's own memory.
pub fn converted_floor(model: &Model, engine: &EngineConfig, process: u64) -> Result<u64> {
    let plan = pi2_convert::pipeline::planned(model, &Default::default())?;
    let kv = pi2_engine::kv_bytes_start(model, engine, 1) as u64;
    let scratch = pi2_engine::scratch_bytes(model, engine, 1) as u64;
    Ok(pi2_engine::planned_min_budget(model, &plan, kv, scratch)? + process)
}

/// Bytes a plain model needs to run whole in memory: its file, this process's own memory, and
/// the KV cache and buffers of its full context (batches of `n_batch`). A budget at least this
/// large needs no conversion; a smaller one (even 100% of the file) runs offloaded.
pub fn whole_model_bytes(model: &Model, engine: &EngineConfig, n_batch: usize) -> u64 {
    model.file.file_size()
        + process_bytes(model)
        + pi2_engine::kv_bytes_full(model, engine, n_batch) as u64
        + pi2_engine::scratch_bytes(model, engine, n_batch) as u64
}

/// A budget below the least: what it needs, what its parts are, and the budget to pass. The
/// KV cache counts only its first batch here: later positions take room from the neuron
/// memory as the context grows (`pi2_engine::Offload`), so no `-c` is needed to fit.
fn too_small(
    budget: u64,
    minimum: u64,
    process: u64,
    kv: u64,
    scratch: u64,
    n_batch: usize,
) -> RuntimeError {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let human = |b: u64| match b {
        b if b < 1 << 10 => format!("{b} bytes"),
        b if b < 1 << 20 => format!("{:.1} KiB", b as f64 / 1024.0),
        b if b < 1 << 30 => format!("{:.1} MiB", mib(b)),
        b => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
    };
    RuntimeError::option(
        "--mem-budget",
        format!(
            "{} is too small for this model: it needs at least {}, of which the KV cache of a \
             first {n_batch}-token batch takes {}, the buffers for such batches {} and this \
             process's own memory (code, tokenizer, metadata) {}; pass --mem-budget {}M or \
             more (the KV cache of later tokens takes room from the neuron cache as the \
             context grows)",
            human(budget),
            human(minimum),
            human(kv),
            human(scratch),
            human(process),
            // One MiB over the least: the process's own memory moves a little between runs.
            mib(minimum + (1 << 20)).ceil() as u64,
        ),
    )
}

/// The smallest budget under which an engine built with `engine` runs its whole context
/// offloaded (batches of
/// `n_batch`; the KV cache of every position, this process's own memory `process` (see
/// [`process_bytes`]) included). A budget down to the KV cache of a first batch starts; the
/// context then stops where the budget can give its KV cache no more room.
pub fn min_budget(
    model: &Model,
    sparse: &SparseFfn<'_>,
    engine: &EngineConfig,
    n_batch: usize,
    process: u64,
) -> Result<u64> {
    Ok(pi2_engine::min_budget(
        model,
        sparse,
        pi2_engine::kv_bytes_full(model, engine, n_batch) as u64,
        pi2_engine::scratch_bytes(model, engine, n_batch) as u64,
    )? + process)
}

/// Allocator slack and small buffers made after the offload is sized (with 8 MiB, runs on
/// Qwen2.5-Coder-0.5B peaked 1.3-4.5 MiB above their budgets). The reader's buffers come on top
/// ([`auto_reader_bytes`]: at io_uring depth 32 they left 46 KB of a 50% budget inside 16 MiB).
const LATER_BYTES: u64 = 16 << 20;

/// The reader's buffers at the deepest depth [`crate::io_choice`] chooses, with the default
/// largest request: charged with this process's own memory ([`process_bytes`]).
fn auto_reader_bytes() -> u64 {
    let deepest = pi2_io::choice::CHOICE_DEPTHS
        .iter()
        .max()
        .copied()
        .unwrap_or(1);
    pi2_io::ReaderConfig {
        depth: deepest,
        ..Default::default()
    }
    .buffer_bytes()
}

/// What this process holds outside the offload's regions, charged to the budget first so that
/// `--mem-budget` bounds the whole process: its anonymous memory now (heap: tokenizer,
/// metadata, parsed profile) less a host's baseline ([`exclude_host_memory`]), the resident
/// pages of the object holding pi2's code (the `pi2` executable, or the shared library an app
/// loaded), and room for what decode allocates later (a token's logits and the sampler's
/// candidates, allocator slack). Where `/proc/self` cannot be read (not Linux or Android) only
/// the later room is counted.
pub fn process_bytes(model: &Model) -> u64 {
    let later = LATER_BYTES + auto_reader_bytes() + 16 * model.config.n_vocab as u64;
    let anon = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| status_kib(&s, "RssAnon:"))
        .unwrap_or(0);
    let anon = anon.saturating_sub(HOST_BASELINE_KIB.load(Ordering::Relaxed));
    let code = std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|maps| object_path(&maps, process_bytes as *const () as usize))
        .and_then(|object| {
            let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
            Some(mapping_rss_kib(&smaps, &object))
        })
        .unwrap_or(0);
    (anon + code) * 1024 + later
}

/// Returns memory freed since to the system where the allocator keeps it (glibc keeps freed
/// heap memory for reuse, which a later budget would count as this process's own).
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Anonymous memory (KiB) a host program held before it used pi2, left out of every budget.
static HOST_BASELINE_KIB: AtomicU64 = AtomicU64::new(0);

/// Leaves the anonymous memory this process holds now out of every later budget: for a host
/// that loads pi2 into a program of its own (the Python interpreter), so that a budget bounds
/// pi2's memory over the host's baseline. Called once, before any model is opened; later calls
/// keep the first baseline. Returns the bytes left out.
pub fn exclude_host_memory() -> u64 {
    let now = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| status_kib(&s, "RssAnon:"))
        .unwrap_or(0);
    let _ = HOST_BASELINE_KIB.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    HOST_BASELINE_KIB.load(Ordering::Relaxed) * 1024
}

/// The file mapped at `address` in `/proc/self/maps` (the object holding that code).
fn object_path(maps: &str, address: usize) -> Option<String> {
    maps.lines().find_map(|line| {
        let mut fields = line.splitn(6, char::is_whitespace);
        let (start, end) = fields.next()?.split_once('-')?;
        let start = usize::from_str_radix(start, 16).ok()?;
        let end = usize::from_str_radix(end, 16).ok()?;
        let path = fields.nth(4)?.trim_start();
        (start <= address && address < end && path.starts_with('/')).then(|| path.to_string())
    })
}

/// A `Key:   123 kB` line of `/proc/self/status`.
/// The most memory this process has held resident at once (`VmHWM`), where the system tells.
pub fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status_kib(&status, "VmHWM:").map(|kib| kib * 1024)
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// Resident KiB of the mappings of `path` in `/proc/self/smaps`.
fn mapping_rss_kib(smaps: &str, path: &str) -> u64 {
    let mut inside = false;
    let mut total = 0;
    for line in smaps.lines() {
        // A mapping's header: `start-end perms offset dev inode [path]`.
        let header = line.split_whitespace().next().is_some_and(|f| {
            f.contains('-') && f.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        });
        if header {
            // The path is the rest of the line (it may hold spaces, or end in " (deleted)"
            // when the executable was replaced; `/proc/self/exe` then reads the same).
            inside = line
                .trim_end()
                .strip_suffix(path)
                .is_some_and(|head| head.ends_with(char::is_whitespace));
        } else if inside {
            if let Some(kib) = status_kib(line, "Rss:") {
                total += kib;
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_formats() {
        let status = "Name:\tpi2\nRssAnon:\t   52340 kB\nRssFile:\t 100 kB\n";
        assert_eq!(status_kib(status, "RssAnon:"), Some(52340));
        assert_eq!(status_kib(status, "VmSwap:"), None);
        let smaps =
            "00400000-00500000 r-xp 00000000 08:01 123 /usr/bin/pi2\nSize: 1024 kB\nRss: 600 kB\n\
                     00600000-00700000 rw-p 00000000 00:00 0 \nRss: 50 kB\n\
                     00800000-00900000 r--p 00100000 08:01 123 /usr/bin/pi2\nRss: 40 kB\n";
        assert_eq!(mapping_rss_kib(smaps, "/usr/bin/pi2"), 640);
        assert_eq!(mapping_rss_kib(smaps, "/other"), 0);
        let maps = "00400000-00500000 r-xp 00000000 08:01 123 /usr/lib/libpi2 x.so\n\
                    00600000-00700000 rw-p 00000000 00:00 0 \n";
        assert_eq!(
            object_path(maps, 0x0040_1000).as_deref(),
            Some("/usr/lib/libpi2 x.so")
        );
        assert_eq!(object_path(maps, 0x0060_0000), None);
        assert_eq!(object_path(maps, 0x0090_0000), None);
        let spaced = "00400000-00500000 r-xp 00000000 08:01 9 /opt/my apps/pi2\nRss: 12 kB\n";
        assert_eq!(mapping_rss_kib(spaced, "/opt/my apps/pi2"), 12);
    }

    #[test]
    fn this_process_holds_something() {
        if std::path::Path::new("/proc/self/status").exists() {
            let m = std::fs::read_to_string("/proc/self/status").unwrap();
            assert!(status_kib(&m, "RssAnon:").unwrap() > 0);
        }
    }
}
