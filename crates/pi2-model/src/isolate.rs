//! Running untrusted work (a chat template from a model file) in a forked child under a memory
//! cap and a deadline. A template can build huge strings in few steps (`{% set s = s ~ s %}`
//! forty times is a terabyte) and minijinja has no memory limit, so fuel and an output cap are
//! not enough: the child's address space is capped, and whatever it does (an allocation
//! failure aborts it, a slow filter runs past the deadline) ends in an error here, never in
//! this process.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// How an isolated run ended, when it did not return its result.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Killed or aborted (its memory cap, most likely), or over the deadline.
    Limits,
    /// It panicked: a bug, not the input's fault.
    Panicked,
    /// The child could not be started or read (the system's limits).
    System(String),
}

const EXIT_PANIC: i32 = 101;
const EXIT_NO_LIMIT: i32 = 102;

/// Run `work` in a child whose address space may grow by at most `memory` bytes and which
/// must finish within `deadline`; its result (at most `max_result` bytes, longer is cut) comes
/// back through a pipe, prefixed with its length.
pub(crate) fn run(
    work: impl FnOnce() -> Vec<u8>,
    memory: u64,
    deadline: Duration,
    max_result: usize,
) -> Result<Vec<u8>, Failure> {
    let sys = |what: &str| Failure::System(format!("{what}: {}", std::io::Error::last_os_error()));
    // Read before forking: the child should do as little as possible but the work.
    let cap = address_space()
        .map_err(|e| Failure::System(format!("cannot read /proc/self/statm: {e}")))?
        .saturating_add(memory);
    let mut fds = [0; 2];
    // SAFETY: plain pipe2 into a local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(sys("cannot create a pipe"));
    }
    // SAFETY: fork; the child only runs `work`, writes its result and leaves with `_exit`
    // (no destructors, no atexit handlers of the parent's state).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        // SAFETY: closing the descriptors just made.
        unsafe { libc::close(fds[0]) };
        unsafe { libc::close(fds[1]) };
        return Err(sys("cannot start a process to render in"));
    }
    if pid == 0 {
        // SAFETY: in the child.
        unsafe { child(fds, cap, deadline, max_result, work) }
    }
    // SAFETY: the parent owns both ends; the write end is the child's.
    unsafe { libc::close(fds[1]) };
    let read_end = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    let out = read_until(read_end, pid, Instant::now() + deadline, max_result + 8);
    let status = reap(pid);
    // A result is whole when its length prefix says so (whatever the exit status reads as:
    // a parent that ignores SIGCHLD cannot see it).
    if let Ok(bytes) = &out {
        if let Some((len, rest)) = bytes.split_first_chunk::<8>() {
            if u64::from_le_bytes(*len) == rest.len() as u64 {
                return Ok(rest.to_vec());
            }
        }
    }
    match (out, status) {
        (_, Some(EXIT_PANIC)) => Err(Failure::Panicked),
        (_, Some(EXIT_NO_LIMIT)) => Err(Failure::System("cannot cap its memory".into())),
        (Err(e), _) if !matches!(e, Failure::Limits) => Err(e),
        _ => Err(Failure::Limits),
    }
}

/// The child: cap, work, write, exit. Never returns.
///
/// # Safety
/// Only in the child of a `fork`, with `fds` the pipe made for it.
unsafe fn child(
    fds: [i32; 2],
    cap: u64,
    deadline: Duration,
    max_result: usize,
    work: impl FnOnce() -> Vec<u8>,
) -> ! {
    // SAFETY (whole function): this process is a copy with one thread; nothing here takes a
    // lock another thread of the parent could have held at the fork but the allocator's,
    // which the C library resets in the child.
    unsafe {
        libc::close(fds[0]);
        let lim = libc::rlimit {
            rlim_cur: cap as libc::rlim_t,
            rlim_max: cap as libc::rlim_t,
        };
        if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
            libc::_exit(EXIT_NO_LIMIT);
        }
        // What an allocation failure prints is the parent's to report, in its own words.
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
        if null >= 0 {
            libc::dup2(null, 2);
        }
        // The parent stops waiting at the deadline too; this ends the child's CPU use.
        libc::alarm(deadline.as_secs().max(1) as u32 + 1);
        // A panic must not print from here (the parent reports it).
        std::panic::set_hook(Box::new(|_| {}));
        let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
            Ok(mut bytes) => {
                bytes.truncate(max_result);
                let framed = [&(bytes.len() as u64).to_le_bytes()[..], &bytes].concat();
                let mut rest = &framed[..];
                while !rest.is_empty() {
                    let n = libc::write(fds[1], rest.as_ptr().cast(), rest.len());
                    if n <= 0 {
                        let e = std::io::Error::last_os_error();
                        if n < 0 && e.kind() == std::io::ErrorKind::Interrupted {
                            continue;
                        }
                        break;
                    }
                    rest = &rest[n as usize..];
                }
                0
            }
            Err(_) => EXIT_PANIC,
        };
        libc::_exit(code)
    }
}

/// Everything the child writes, until it closes the pipe, up to `max` bytes; past `deadline`
/// the child is killed.
fn read_until(fd: OwnedFd, pid: i32, deadline: Instant, max: usize) -> Result<Vec<u8>, Failure> {
    let mut file = std::fs::File::from(fd);
    let mut out = Vec::new();
    let mut buf = [0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&file),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready =
            unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if ready == 0 {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return Err(Failure::Limits);
        }
        if ready < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return Err(Failure::System(format!(
                "poll: {}",
                std::io::Error::last_os_error()
            )));
        }
        match file.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => {
                out.extend_from_slice(&buf[..n.min(max.saturating_sub(out.len()))]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return Err(Failure::System(format!("reading the result: {e}")));
            }
        }
    }
}

/// Wait for `pid`; its exit code, or `None` if a signal ended it.
fn reap(pid: i32) -> Option<i32> {
    let mut status = 0;
    loop {
        // SAFETY: our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return None;
        }
    }
    libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
}

/// This process's address space, in bytes.
fn address_space() -> std::io::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| std::io::Error::other("unexpected format"))?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    Ok(pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_limits_and_panics() {
        let d = Duration::from_secs(5);
        assert_eq!(
            run(|| b"hello".to_vec(), 16 << 20, d, 100),
            Ok(b"hello".to_vec())
        );
        // Cut to the maximum.
        assert_eq!(run(|| vec![7; 1000], 16 << 20, d, 10), Ok(vec![7; 10]));
        // More memory than allowed: the child dies, this process does not.
        let hog = || {
            let mut v: Vec<Vec<u8>> = Vec::new();
            for _ in 0..64 {
                v.push(vec![1; 16 << 20]);
            }
            vec![v.len() as u8]
        };
        assert_eq!(run(hog, 64 << 20, d, 10), Err(Failure::Limits));
        // Past the deadline.
        let slow = || {
            std::thread::sleep(Duration::from_secs(30));
            vec![]
        };
        let t0 = Instant::now();
        assert_eq!(
            run(slow, 16 << 20, Duration::from_millis(300), 10),
            Err(Failure::Limits)
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(
            run(|| panic!("bug"), 16 << 20, d, 10),
            Err(Failure::Panicked)
        );
    }
}
