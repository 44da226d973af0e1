//! pi2-runtime: ready sessions from plain options, shared by the CLI and the server.
//!
//! - [`options`]: the engine's, the sparse FFN's and offloading's options, and the strings
//!   users type for sizes and devices;
//! - [`session`]: [`prepare`] a model (plan, sparse weights) and make engines from it, in the
//!   one valid order;
//! - [`plan`], [`device`], [`hardware`]: the engine as the planner sees it (memory accounting,
//!   a recorded model profile, this device's fingerprint and profiles);
//! - [`io_choice`]: the reader's engine and depth, measured once per device;
//! - [`sparse`], [`offload`]: the sparse FFN and the offloaded FFN from options;
//! - [`conversation`]: a chat kept between turns (saved, loaded, fitted to a context);
//! - [`files`]: files written for the user, checked before any work;
//! - [`info`]: what a model file is and what running it needs;
//! - [`text`]: generated text as it streams (whole UTF-8 characters, stop strings);
//! - [`bench`], [`report`]: measurement (llama-bench style tests, one engine per mode) and what
//!   an engine counted, as JSON.
//!
//! No argument parser's types appear here; the CLI maps its arguments onto these options.

pub mod bench;
pub mod conversation;
pub mod convert_cache;
pub mod device;
pub mod draft;
pub mod embed;
mod error;
pub mod files;
pub mod handle;
pub mod hardware;
pub mod info;
pub mod io_choice;
pub mod logprobs;
pub mod memory;
pub mod offload;
pub mod open;
pub mod options;
pub mod plan;
pub mod report;
pub mod session;
pub mod sparse;
pub mod text;

pub use error::{Result, RuntimeError};
pub use options::{EngineOptions, OffloadOptions, SparseOptions};
pub use session::{prepare, Prepared, SessionOptions};

/// Loads the model at `path`.
pub fn load_model(path: &std::path::Path) -> Result<pi2_model::Model> {
    Ok(pi2_model::Model::load(path)?)
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
