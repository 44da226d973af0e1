//! pi2-kernels: quantized neuron kernels for LLM inference on CPUs.
//!
//! The unit of work is a weight *row* (a neuron's gate or up row, or a row of a dense matrix)
//! stored in one of the GGML block formats ([`QuantType`]). Activations are quantized once into an
//! [`ActBuf`] in the format the row's integer dot product consumes, and [`KernelSet`] holds the
//! dot products for the best instruction set detected at run time (scalar reference always).
//!
//! This crate does no I/O and allocates nothing in its hot paths: callers own the buffers.

pub mod quant;
mod simd;
mod types;

mod blocks;
mod ops;
pub mod packed;

pub use blocks::matvec_blocks;
pub use ops::{
    axpy_rows, axpy_rows_by, dot_row, gather_matvec, gather_matvec_by, matmul, matmul_many, ActBuf,
    ActRow, MatRef, MAX_MATMUL_JOBS,
};
pub use packed::PackedMat;
pub use simd::{cpu_features, KernelSet, RowKernels, Tier, X8Kernels};
pub use types::{ActKind, KernelError, QuantType};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
