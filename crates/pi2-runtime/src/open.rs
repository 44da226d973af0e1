//! From what a user names to the file a session runs: a path or a catalogue name (fetched and
//! verified on first use), and under a memory budget a plain GGUF's cached conversion (made
//! once, in a child process, if there is none). The CLI, the C API and the Python package all
//! open models here.

use crate::error::{Result, RuntimeError};
use crate::options::parse_size;
use crate::SessionOptions;
use std::path::{Path, PathBuf};

/// What [`model_file`] tells the user about while it works.
#[derive(Debug)]
pub enum Notice<'a> {
    /// The catalogue fetched or verified a file.
    Catalog(pi2_catalog::Event<'a>),
    /// The whole model (`whole` bytes with the process and its KV cache) fits in the budget
    /// (`budget` bytes): it runs in memory and the budget is dropped.
    FitsInMemory { whole: u64, budget: u64 },
    /// A conversion from `from` into `to` starts (once; later runs reuse it).
    Converting { from: &'a Path, to: &'a Path },
    /// A phase of the conversion: `done` of `total`.
    Progress {
        phase: &'a str,
        done: usize,
        total: usize,
    },
    /// The conversion finished after `seconds`. Where the system tells: `own`, the most
    /// anonymous memory the converting process held (sampled; what no cap can take back), and
    /// `resident`, its peak resident memory with the pages of the model files it mapped (page
    /// cache a cap takes back by reading them again).
    Converted {
        seconds: f64,
        own: Option<u64>,
        resident: Option<u64>,
    },
}

impl Notice<'_> {
    /// The one-line notice for people, for notices that have one (progress has none).
    pub fn line(&self) -> Option<String> {
        use crate::info::human_bytes;
        match self {
            Notice::Catalog(e) => e.line(),
            Notice::FitsInMemory { whole, budget } => Some(format!(
                "pi2: the whole model ({} with this process and its KV cache) fits in the memory budget ({}): it runs in memory, no budget applies",
                human_bytes(*whole),
                human_bytes(*budget)
            )),
            Notice::Converting { from, to } => Some(format!(
                "pi2: converting {} for the memory budget (once: profile and convert on the built-in calibration text; minutes for a small model, up to half an hour on a small or busy CPU; the bars show each phase) into {}",
                from.display(),
                to.display()
            )),
            Notice::Progress { .. } => None,
            Notice::Converted {
                seconds,
                own,
                resident,
            } => Some(format!(
                "pi2: converted in {seconds:.0} s{}; later runs reuse it",
                peak_words(*own, *resident)
            )),
        }
    }
}

/// ", peak memory N MiB of its own (M MiB with the model files' pages)" where known.
pub fn peak_words(own: Option<u64>, resident: Option<u64>) -> String {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    match (own, resident) {
        (Some(o), Some(r)) => format!(
            ", peak memory {:.0} MiB of its own ({:.0} MiB with the model files' pages)",
            mib(o),
            mib(r)
        ),
        (Some(o), None) => format!(", peak memory {:.0} MiB of its own", mib(o)),
        (None, Some(r)) => format!(", peak memory {:.0} MiB", mib(r)),
        (None, None) => String::new(),
    }
}

/// The model file `spec` names: an existing path, or a catalogue name fetched into the models
/// folder on first use and verified (the default model when `None`).
pub fn resolve(spec: Option<&Path>, notice: &mut dyn FnMut(Notice)) -> Result<PathBuf> {
    let stamps = crate::convert_cache::stamps_path();
    Ok(pi2_catalog::resolve(spec, &stamps, &mut |e| {
        notice(Notice::Catalog(e))
    })?)
}

/// The model file a session on `path` runs, and its options: under a memory budget a plain
/// GGUF runs from its cached conversion (made now if there is none), and a budget the whole
/// plain model fits in is dropped. A budget given as a share of the file stays a share of the
/// file the user named.
pub fn model_file(
    path: &Path,
    opts: &SessionOptions,
    notice: &mut dyn FnMut(Notice),
) -> Result<(PathBuf, SessionOptions)> {
    let mut opts = opts.clone();
    let Some(budget) = opts.mem_budget.clone() else {
        return Ok((path.to_path_buf(), opts));
    };
    let model = crate::load_model(path)?;
    if crate::convert_cache::is_converted(&model) {
        return Ok((path.to_path_buf(), opts));
    }
    let bytes = parse_size("--mem-budget", &budget, model.file.file_size())?;
    let engine = opts.engine.config()?;
    let whole = crate::offload::whole_model_bytes(&model, &engine, 512);
    if bytes >= whole {
        notice(Notice::FitsInMemory {
            whole,
            budget: bytes,
        });
        opts.mem_budget = None;
        return Ok((path.to_path_buf(), opts));
    }
    crate::offload::check_floor(&model, &engine, bytes)?;
    if crate::offload::streams_experts(&model) {
        // Experts stream from the file as it is: nothing to convert.
        if budget.trim_end().ends_with('%') {
            opts.mem_budget = Some(bytes.to_string());
        }
        return Ok((path.to_path_buf(), opts));
    }
    crate::offload::check_converted_floor(&model, &engine, bytes)?;
    if !crate::convert_cache::cached_path(path, &crate::convert_cache::file_sha256(path)?).exists()
    {
        crate::convert_cache::check_room(&model, path, &engine)?;
    }
    drop(model);
    // Converted in a child process: what the conversion allocated never counts against the
    // budget this process then runs under.
    in_child(|| {
        let t0 = std::time::Instant::now();
        let watch = crate::memory::AnonPeak::start();
        // The notice before the conversion and its progress share one callback.
        let shared = std::cell::RefCell::new(&mut *notice);
        let conv = crate::convert_cache::converted(
            path,
            &engine,
            |to| {
                (shared.borrow_mut())(Notice::Converting { from: path, to });
            },
            &mut |phase, done, total| {
                (shared.borrow_mut())(Notice::Progress { phase, done, total })
            },
        );
        if conv.as_ref().is_ok_and(|c| c.made) {
            (shared.borrow_mut())(Notice::Converted {
                seconds: t0.elapsed().as_secs_f64(),
                own: watch.finish(),
                resident: crate::offload::peak_resident_bytes(),
            });
        }
        conv.map(|_| ())
    })?;
    let conv = crate::convert_cache::converted(path, &engine, |_| {}, &mut |_, _, _| {})?;
    if budget.trim_end().ends_with('%') {
        opts.mem_budget = Some(bytes.to_string());
    }
    Ok((conv.path, opts))
}

/// Threads of this process (Linux; `None` where unknown).
fn threads_now() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

/// Runs `f` in a child process (Unix: fork, when this process runs a single thread, so the
/// child is a whole copy of it) and waits for it; in this process otherwise (a host program
/// with threads of its own: Python, an app), where the conversion's memory then counts against
/// this process's peak. The child's error comes back through a pipe, as this process's own.
fn in_child(f: impl FnOnce() -> Result<()>) -> Result<()> {
    #[cfg(unix)]
    if threads_now() == Some(1) {
        return fork_and_wait(f);
    }
    f()
}

#[cfg(unix)]
fn fork_and_wait(f: impl FnOnce() -> Result<()>) -> Result<()> {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    let lost = |what: &str| {
        RuntimeError::Unsupported(format!("{what}: {}", std::io::Error::last_os_error()))
    };
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two descriptors for pipe to fill.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(lost("cannot start the conversion"));
    }
    // SAFETY: both descriptors were just opened by pipe and are owned here alone.
    let (mut rx, mut tx) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    #[cfg(any(target_os = "linux", target_os = "android"))]
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the caller checked that this process runs one thread, so the child is a whole
    // copy of it.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // The conversion dies with the process that waits for it (a `pi2 run` killed with
        // SIGKILL must not leave it running under init); and if that process is already gone
        // before the signal was asked for, it stops at once.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        // SAFETY: prctl and getppid with plain integer arguments; _exit ends the child.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
        }
        drop(rx);
        let code = match f() {
            Ok(()) => 0,
            Err(e) => {
                let _ = tx.write_all(e.to_string().as_bytes());
                1
            }
        };
        drop(tx);
        // SAFETY: ends the child without running the parent's exit handlers twice.
        unsafe { libc::_exit(code) };
    }
    drop(tx);
    if pid < 0 {
        return Err(lost("cannot start the conversion"));
    }
    let mut why = String::new();
    let _ = rx.read_to_string(&mut why);
    let mut status = 0;
    // SAFETY: waits for the child just forked; `status` is a valid place to write.
    if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        return Err(lost("the conversion's process was lost"));
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        return Ok(());
    }
    Err(RuntimeError::Unsupported(if !why.is_empty() {
        why
    } else if libc::WIFSIGNALED(status) {
        format!(
            "the conversion was killed by signal {} (out of memory?); nothing was cached",
            libc::WTERMSIG(status)
        )
    } else {
        "the conversion did not complete; nothing was cached".into()
    }))
}
