//! The pi2 planner: given what the hardware measured ([`hw::HardwareProfile`]), what the model
//! does ([`model::ModelProfile`]) and what the user allows ([`Constraints`]), find the plan
//! (threads, cluster size, memory split, I/O shaping) that a documented cost model
//! ([`cost`]) predicts fastest, with an exact branch-and-bound search ([`solve`]).
//!
//! The crate knows nothing of the engine's types: the engine-specific pieces come in as plain
//! data (tensor shapes, recorded neuron sets) and one trait ([`model::Residency`]: how a memory
//! budget splits into pinned neurons and cache slots). The result is a versioned, fingerprinted
//! [`plan::PlanFile`] that the engine takes as plain configuration.

pub mod cost;
pub mod describe;
pub mod hw;
pub mod model;
pub mod pipeline;
pub mod plan;
pub mod solve;
pub mod synthetic;

pub use cost::{Breakdown, CostModel, Knobs, Mode, Prediction};
pub use hw::HardwareProfile;
pub use model::{ModelProfile, Residency, ResidencySplit, StreamedWeights};
pub use plan::{plan, speed_curve, Constraints, Objective, PlanFile, Solution, Space};

/// Planner errors.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    Infeasible(String),
    #[error("{path}: {msg}")]
    File { path: String, msg: String },
    #[error(
        "this plan was made for {what} `{planned}`, not for this one (`{actual}`): plan again"
    )]
    Foreign {
        what: &'static str,
        planned: String,
        actual: String,
    },
    #[error("hardware profile: {0}")]
    Hardware(String),
    #[error("model profile: {0}")]
    Model(String),
    #[error("this plan cannot run: {0}")]
    Unrunnable(String),
    #[error(transparent)]
    Io(#[from] pi2_io::IoError),
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
