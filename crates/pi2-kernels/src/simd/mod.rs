//! Run-time kernel selection: a [`KernelSet`] is a table of row dot products for one instruction
//! set tier, chosen once from the detected CPU features (or forced lower by the caller).

use crate::packed::{self, Rows8Fn, Rows8KFn};
use crate::quant::{
    self, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1,
    BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, QuantBlock,
};
use crate::QuantType;
use std::sync::OnceLock;

// The kernel modules: `unsafe fn`s whose whole bodies are intrinsics and raw loads under each
// module's `# Safety` contract (the tier's features detected, lengths checked by the safe
// dispatcher); an `unsafe {}` around every body would add nothing.

#[cfg(target_arch = "aarch64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod arm;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod avx2_k;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod avx2_x8;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod avx2_x8k;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod avx512;
#[cfg(target_arch = "aarch64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod neon;
#[cfg(target_arch = "aarch64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod neon_k;
#[cfg(target_arch = "aarch64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod neon_x8;
#[cfg(target_arch = "aarch64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod neon_x8k;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod x86;

/// An instruction-set tier, lowest first within each architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Portable Rust: the reference every other tier is tested against.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX2 + AVX-VNNI (`vpdpbusd` on 256 bits, VEX: Alder Lake, Zen 5).
    AvxVnni,
    /// x86-64 AVX-512 F/BW/VL (plus the AVX2 set).
    Avx512,
    /// x86-64 AVX-512 F/BW/VL + AVX512-VNNI (Ice Lake, Sapphire Rapids, Zen 4).
    Avx512Vnni,
    /// aarch64 baseline NEON (ARMv8.0, e.g. Cortex-A53).
    Neon,
    /// aarch64 NEON + dotprod (ARMv8.2 `sdot`, e.g. Cortex-A55/A76 and later).
    Dotprod,
}

impl Tier {
    pub const ALL: [Tier; 7] = [
        Tier::Scalar,
        Tier::Avx2,
        Tier::AvxVnni,
        Tier::Avx512,
        Tier::Avx512Vnni,
        Tier::Neon,
        Tier::Dotprod,
    ];

    /// Whether this CPU can run the tier.
    pub fn is_supported(self) -> bool {
        match self {
            Tier::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Tier::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Tier::AvxVnni => Tier::Avx2.is_supported() && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512 => {
                Tier::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512Vnni => {
                Tier::Avx512.is_supported() && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Tier::Neon => true,
            #[cfg(target_arch = "aarch64")]
            Tier::Dotprod => std::arch::is_aarch64_feature_detected!("dotprod"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The best tier this CPU supports.
    pub fn detect() -> Tier {
        Tier::ALL
            .into_iter()
            .rev()
            .find(|t| t.is_supported())
            .unwrap_or(Tier::Scalar)
    }

    /// Lower-case name as used on command lines (`scalar`, `avx2`).
    pub fn name(self) -> &'static str {
        match self {
            Tier::Scalar => "scalar",
            Tier::Avx2 => "avx2",
            Tier::AvxVnni => "avxvnni",
            Tier::Avx512 => "avx512",
            Tier::Avx512Vnni => "avx512vnni",
            Tier::Neon => "neon",
            Tier::Dotprod => "dotprod",
        }
    }

    /// Parse a name from [`Tier::name`].
    pub fn from_name(s: &str) -> Option<Tier> {
        Tier::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }
}

/// Four rows against one activation row.
pub type Dot4<B> = fn([&[B]; 4], &[<B as QuantBlock>::Act]) -> [f32; 4];
/// Four rows against two activation rows: `out[row][token]`.
pub type Dot4x2<B> = fn([&[B]; 4], [&[<B as QuantBlock>::Act]; 2]) -> [[f32; 2]; 4];

/// The dot products of one weight block type `B` against its activation blocks.
pub struct RowKernels<B: QuantBlock> {
    /// One row.
    pub dot: fn(&[B], &[B::Act]) -> f32,
    /// Four rows against the same activations (independent accumulators, one activation load).
    pub dot4: Dot4<B>,
    /// Four rows against two activation rows (prefill): `out[row][token]`.
    pub dot4x2: Dot4x2<B>,
    /// `y += a * row` (a neuron's down column, stored as a row of the transposed down matrix);
    /// `y.len()` is the row's element count.
    pub axpy: fn(&[B], f32, &mut [f32]),
}

impl<B: QuantBlock> Clone for RowKernels<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: QuantBlock> Copy for RowKernels<B> {}
impl<B: QuantBlock> std::fmt::Debug for RowKernels<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RowKernels")
    }
}

impl<B: QuantBlock> RowKernels<B> {
    /// The scalar reference: `dot4` is four `dot`s.
    pub fn reference() -> Self {
        Self {
            dot: B::vec_dot_ref,
            dot4: |w, x| w.map(|r| B::vec_dot_ref(r, x)),
            dot4x2: |w, x| w.map(|r| x.map(|xt| B::vec_dot_ref(r, xt))),
            axpy: axpy_ref::<B>,
        }
    }
}

/// How a k-quant block's exact integer sums become its share of a row's dot product, one
/// definition for every tier's kernels: `sums` is the sub-block-scaled sum of the block's quants
/// (unsigned for Q6_K and Q3_K) times the activations, `extra` the integer kept beside it (the
/// mins' sum, or the offset's that turns the unsigned quants signed).
pub(crate) trait KTerm {
    fn k_term(&self, x: &quant::BlockQ8K, sums: i32, extra: i32) -> f32;
}

/// Q2_K, Q4_K and Q5_K: a scale and a min per sub-block, `dx * (d * sums - dmin * mins)`.
macro_rules! k_min_term {
    ($($block:ty),*) => {$(
        impl KTerm for $block {
            fn k_term(&self, x: &quant::BlockQ8K, sums: i32, mins: i32) -> f32 {
                let (d, dmin) = (quant::f16_to_f32(self.d), quant::f16_to_f32(self.dmin));
                quant::term::k_min(x.d, d, sums, dmin, mins)
            }
        }
    )*};
}
k_min_term!(BlockQ2K, BlockQ4K, BlockQ5K);

impl KTerm for BlockQ3K {
    /// `q - 4 * !hbit` taken as `u - 4`: the offset's sum times 4 comes out.
    fn k_term(&self, x: &quant::BlockQ8K, sums: i32, offset: i32) -> f32 {
        quant::term::scaled(quant::f16_to_f32(self.d), x.d, sums - 4 * offset)
    }
}

impl KTerm for BlockQ6K {
    /// Quants stored `q + 32`: the offset's sum times 32 comes out.
    fn k_term(&self, x: &quant::BlockQ8K, sums: i32, offset: i32) -> f32 {
        quant::term::scaled(quant::f16_to_f32(self.d), x.d, sums - 32 * offset)
    }
}

impl KTerm for BlockIQ4XS {
    fn k_term(&self, x: &quant::BlockQ8K, sums: i32, _: i32) -> f32 {
        quant::term::scaled(quant::f16_to_f32(self.d), x.d, sums)
    }
}

/// Scalar reference of [`RowKernels::axpy`]: dequantize block by block into a stack buffer.
pub fn axpy_ref<B: QuantBlock>(w: &[B], a: f32, y: &mut [f32]) {
    let mut buf = [0.0f32; quant::QK_K];
    for (b, ys) in w.iter().zip(y.chunks_exact_mut(B::LEN)) {
        let vals = &mut buf[..B::LEN];
        b.dequantize(vals);
        for (o, v) in ys.iter_mut().zip(vals.iter()) {
            *o += a * v;
        }
    }
}

/// Row dot products for one tier. Every entry computes the scalar reference's value bit for bit
/// (exact integer sums per block, `quant::term`'s float steps, `quant::float_order`), so a file
/// gives the same answer on every CPU, and a token computed in a batch the same as alone.
#[derive(Clone, Copy, Debug)]
pub struct KernelSet {
    pub tier: Tier,
    pub f32: fn(&[f32], &[f32]) -> f32,
    pub f16: fn(&[u16], &[f32]) -> f32,
    /// `y += a * x` with f16 `x` (attention over an f16 value cache).
    pub axpy_f16: fn(f32, &[u16], &mut [f32]),
    pub bf16: fn(&[u16], &[f32]) -> f32,
    /// `y += a * x` with BF16 `x` (sparse down rows of a BF16 model).
    pub axpy_bf16: fn(f32, &[u16], &mut [f32]),
    pub q4_0: RowKernels<BlockQ4_0>,
    pub q4_1: RowKernels<BlockQ4_1>,
    pub q5_0: RowKernels<BlockQ5_0>,
    pub q5_1: RowKernels<BlockQ5_1>,
    pub q8_0: RowKernels<BlockQ8_0>,
    pub q4_k: RowKernels<BlockQ4K>,
    pub q5_k: RowKernels<BlockQ5K>,
    pub q6_k: RowKernels<BlockQ6K>,
    pub iq4_nl: RowKernels<BlockIQ4NL>,
    pub iq4_xs: RowKernels<BlockIQ4XS>,
    pub q2_k: RowKernels<BlockQ2K>,
    pub q3_k: RowKernels<BlockQ3K>,
    /// MXFP4: the scalar reference on every tier (the same answer everywhere).
    pub mxfp4: RowKernels<BlockMXFP4>,
    /// Kernels over row-interleaved copies (`PackedMat`) of the 32-element formats.
    pub x8: X8Kernels,
}

/// The interleaved-group kernels of one tier, one per packable format.
#[derive(Clone, Copy, Debug)]
pub struct X8Kernels {
    pub q4_0: Rows8Fn,
    pub q4_1: Rows8Fn,
    pub q5_0: Rows8Fn,
    pub q5_1: Rows8Fn,
    pub q8_0: Rows8Fn,
    pub q4_k: Rows8KFn,
    pub q5_k: Rows8KFn,
    pub q6_k: Rows8KFn,
    /// SIMD kernels (the reference unpacks every call: correct, for tests, far too slow to
    /// be worth a copy).
    pub fast: bool,
}

impl X8Kernels {
    /// The scalar reference kernels.
    pub fn reference() -> Self {
        Self {
            q4_0: packed::rows8_ref_fn(QuantType::Q4_0),
            q4_1: packed::rows8_ref_fn(QuantType::Q4_1),
            q5_0: packed::rows8_ref_fn(QuantType::Q5_0),
            q5_1: packed::rows8_ref_fn(QuantType::Q5_1),
            q8_0: packed::rows8_ref_fn(QuantType::Q8_0),
            q4_k: packed::rows8k_ref_fn(QuantType::Q4_K),
            q5_k: packed::rows8k_ref_fn(QuantType::Q5_K),
            q6_k: packed::rows8k_ref_fn(QuantType::Q6_K),
            fast: false,
        }
    }

    /// The k-quant kernel for `ty`, or `None` if `ty` is not a k-quant.
    pub fn get_k(&self, ty: QuantType) -> Option<Rows8KFn> {
        Some(match ty {
            QuantType::Q4_K => self.q4_k,
            QuantType::Q5_K => self.q5_k,
            QuantType::Q6_K => self.q6_k,
            _ => return None,
        })
    }

    /// The kernel for `ty`, or `None` if `ty` has no 32-element interleaved form.
    pub fn get(&self, ty: QuantType) -> Option<Rows8Fn> {
        Some(match ty {
            QuantType::Q4_0 => self.q4_0,
            QuantType::Q4_1 => self.q4_1,
            QuantType::Q5_0 => self.q5_0,
            QuantType::Q5_1 => self.q5_1,
            QuantType::Q8_0 => self.q8_0,
            _ => return None,
        })
    }
}

static BEST: OnceLock<KernelSet> = OnceLock::new();

impl KernelSet {
    /// The scalar reference set.
    pub fn scalar() -> KernelSet {
        KernelSet {
            tier: Tier::Scalar,
            f32: quant::f32::vec_dot_ref,
            f16: quant::f16::vec_dot_ref,
            axpy_f16: quant::f16::axpy_ref,
            bf16: quant::bf16::vec_dot_ref,
            axpy_bf16: quant::bf16::axpy_ref,
            q4_0: RowKernels::reference(),
            q4_1: RowKernels::reference(),
            q5_0: RowKernels::reference(),
            q5_1: RowKernels::reference(),
            q8_0: RowKernels::reference(),
            q4_k: RowKernels::reference(),
            q5_k: RowKernels::reference(),
            q6_k: RowKernels::reference(),
            iq4_nl: RowKernels::reference(),
            iq4_xs: RowKernels::reference(),
            q2_k: RowKernels::reference(),
            q3_k: RowKernels::reference(),
            mxfp4: RowKernels::reference(),
            x8: X8Kernels::reference(),
        }
    }

    /// The set for `tier`, or `None` if this CPU cannot run it.
    pub fn for_tier(tier: Tier) -> Option<KernelSet> {
        if !tier.is_supported() {
            return None;
        }
        Some(match tier {
            Tier::Scalar => Self::scalar(),
            #[cfg(target_arch = "x86_64")]
            Tier::Avx2 => avx2::kernel_set(Tier::Avx2),
            #[cfg(target_arch = "x86_64")]
            Tier::AvxVnni => avx2::kernel_set(Tier::AvxVnni),
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512 => avx512::kernel_set(Tier::Avx512),
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512Vnni => avx512::kernel_set(Tier::Avx512Vnni),
            #[cfg(target_arch = "aarch64")]
            Tier::Neon => neon::kernel_set(false),
            #[cfg(target_arch = "aarch64")]
            Tier::Dotprod => neon::kernel_set(true),
            #[allow(unreachable_patterns)]
            _ => return None,
        })
    }

    /// The best set for this CPU, detected once per process.
    pub fn best() -> &'static KernelSet {
        BEST.get_or_init(|| Self::for_tier(Tier::detect()).unwrap_or_else(Self::scalar))
    }
}

/// The CPU features the kernels care about that this CPU has, by their usual names
/// (`avx512bw`, `dotprod`, `i8mm`, ...), for `pi2 info` and bench tables.
pub fn cpu_features() -> Vec<&'static str> {
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => { $(if std::is_x86_feature_detected!($f) { out.push($f); })* };
        }
        probe!(
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512vnni",
            "avxvnni"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => { $(if std::arch::is_aarch64_feature_detected!($f) { out.push($f); })* };
        }
        probe!("neon", "fp16", "dotprod", "i8mm", "sve");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatcher_picks_a_supported_tier() {
        let best = KernelSet::best();
        assert!(best.tier.is_supported());
        // Nothing better than the chosen tier is supported.
        for t in Tier::ALL {
            if t > best.tier {
                assert!(
                    !t.is_supported(),
                    "{t:?} supported but {:?} chosen",
                    best.tier
                );
            }
        }
        #[cfg(target_arch = "x86_64")]
        if Tier::Avx512.is_supported() && std::is_x86_feature_detected!("avx512vnni") {
            assert_eq!(best.tier, Tier::Avx512Vnni);
        } else if std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
        {
            assert_eq!(best.tier, Tier::Avx512);
        } else if Tier::Avx2.is_supported() && std::is_x86_feature_detected!("avxvnni") {
            assert_eq!(best.tier, Tier::AvxVnni);
        } else if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            assert_eq!(best.tier, Tier::Avx2);
        }
        #[cfg(target_arch = "aarch64")]
        assert_eq!(
            best.tier,
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                Tier::Dotprod
            } else {
                Tier::Neon
            }
        );
    }

    #[test]
    fn tier_names_round_trip() {
        for t in Tier::ALL {
            assert_eq!(Tier::from_name(t.name()), Some(t));
        }
        assert_eq!(Tier::from_name("nope"), None);
    }
}
