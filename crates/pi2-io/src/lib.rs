//! pi2-io: the flash reader. It knows nothing about tensors: it reads byte ranges of one file into
//! caller memory, fast, the way phone flash wants to be read.
//!
//! - [`ReadEngine`]: how bytes leave the device. [`PreadEngine`] is the portable default
//!   (`pread`, with `O_DIRECT` and aligned buffers where the file system allows it, else buffered
//!   reads whose pages are dropped again so the page cache cannot act as a hidden cache).
//!   `UringEngine` (Linux) submits a whole group of reads to an io_uring at once, so the device
//!   works on `depth` of them together while one thread still does all the submitting.
//!   [`FaultEngine`] wraps any engine to inject latency, short reads and `EIO` in tests.
//! - [`Reader`]: one I/O thread owns submission (UFS has a single command queue and loses
//!   throughput when several cores submit). It sorts what is pending by offset, merges nearby
//!   requests into reads of at most `max_request` bytes, keeps at most `depth` reads in flight
//!   per engine call and reports each request as soon as its read lands.
//! - [`Checksums`]: CRC-32s of fixed-size records of the file; a reader given a table checks
//!   every record a request holds whole before reporting it, so bytes changed on the device
//!   become an error instead of different data.
//! - [`choice`]: the engine and reads in flight a device rewards, measured (the default).
//! - [`measure`]: throughput and latency against read size, queue depth and file span
//!   (`pi2 profile-io`), for the planner.

mod buf;
mod checksum;
pub mod choice;
mod engine;
pub mod measure;
mod reader;
#[cfg(target_os = "linux")]
mod uring;

pub use buf::AlignedBuf;
pub use checksum::{crc32, Checksums, SumRegion};
pub use choice::{measure_choice, ReaderChoice};
pub use engine::{
    emulated, FaultEngine, FaultPlan, IoEngine, OpenedEngine, PreadEngine, ReadEngine, ReadOp,
};
pub use reader::{
    device_reads, for_each_device_read, Completion, Reader, ReaderConfig, ReaderStats, Request,
};
#[cfg(target_os = "linux")]
pub use uring::UringEngine;

use std::path::PathBuf;

/// I/O errors, each naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("read of {len} bytes at offset {offset} failed: {source}")]
    Read {
        offset: u64,
        len: usize,
        source: std::io::Error,
    },
    #[error("short read at offset {offset}: {got} of {want} bytes (file truncated?)")]
    ShortRead {
        offset: u64,
        want: usize,
        got: usize,
    },
    #[error(
        "read of {len} bytes at offset {offset} is misaligned for this engine (alignment {align})"
    )]
    Misaligned {
        offset: u64,
        len: usize,
        align: usize,
    },
    #[error(
        "request of {len} bytes at offset {offset} ends past the end of the file ({size} bytes)"
    )]
    OutOfRange { offset: u64, len: usize, size: u64 },
    #[error("the I/O thread has stopped")]
    Closed,
    #[error("cannot start the I/O thread: {source} (the process is out of threads or memory)")]
    Thread { source: std::io::Error },
    #[error(
        "{} changed or is damaged: {len} bytes of `{region}` at offset {offset} do not match their checksum (restore the file, or delete it and make it again)",
        file.as_ref().map_or("the file".into(), |f| f.display().to_string())
    )]
    Checksum {
        /// The file, where the table was told it ([`Checksums::for_file`]).
        file: Option<PathBuf>,
        region: String,
        offset: u64,
        len: usize,
    },
    #[error("the file's checksum table is unusable: {0}")]
    BadChecksums(String),
}

impl IoError {
    /// A copy for reporting to several waiters (the source error is kept by kind and text).
    pub fn duplicate(&self) -> IoError {
        let dup = |e: &std::io::Error| std::io::Error::new(e.kind(), e.to_string());
        match self {
            IoError::Thread { source } => IoError::Thread {
                source: dup(source),
            },
            IoError::Open { path, source } => IoError::Open {
                path: path.clone(),
                source: dup(source),
            },
            IoError::Read {
                offset,
                len,
                source,
            } => IoError::Read {
                offset: *offset,
                len: *len,
                source: dup(source),
            },
            IoError::ShortRead { offset, want, got } => IoError::ShortRead {
                offset: *offset,
                want: *want,
                got: *got,
            },
            IoError::Misaligned { offset, len, align } => IoError::Misaligned {
                offset: *offset,
                len: *len,
                align: *align,
            },
            IoError::OutOfRange { offset, len, size } => IoError::OutOfRange {
                offset: *offset,
                len: *len,
                size: *size,
            },
            IoError::Closed => IoError::Closed,
            IoError::Checksum {
                file,
                region,
                offset,
                len,
            } => IoError::Checksum {
                file: file.clone(),
                region: region.clone(),
                offset: *offset,
                len: *len,
            },
            IoError::BadChecksums(why) => IoError::BadChecksums(why.clone()),
        }
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
