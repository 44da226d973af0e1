//! Measuring this device for the planner (`pi2 profile-hw`), and re-predicting a plan with the
//! flash measured again just before it runs (a shared disk's speed drifts between profiling and
//! use; this separates the cost model's error from the drift).

use crate::device::{classes, cpu_name, load_hw, storage};
use crate::error::{Result, RuntimeError};
use crate::options::parse_emulate;
use crate::plan::{
    cost_model, model_profile, recording_threads, recording_tokens, EngineResidency,
};
use pi2_engine::topology::Topology;
use pi2_model::Model;
use pi2_planner::cost::Mode;
use pi2_planner::hw::{HardwareProfile, HwOptions};
use pi2_planner::PlanFile;
use std::path::Path;
use std::time::Duration;

/// Read sizes the flash is profiled at.
const READ_SIZES: [usize; 5] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];

/// Best effort: an unpinned thread only measures less precisely.
fn pin(cpu: usize) {
    let _ = pi2_engine::topology::pin_current_thread(cpu);
}

/// How `profile-hw` measures.
pub struct ProfileRequest<'a> {
    /// A file on the storage to profile (normally the model).
    pub file: &'a Path,
    pub kernel_time: Duration,
    pub read_time: Duration,
    pub emulate: Option<&'a str>,
    /// io_uring at depths 1, 2, 4, 8 (else `pread`, one read at a time).
    pub uring: bool,
    pub progress: &'a dyn Fn(&str),
}

/// Measures this device: kernels by type and thread count per core class, parallel-step and
/// serial costs, memory, flash reads idle and under load.
pub fn measure(r: &ProfileRequest<'_>) -> Result<HardwareProfile> {
    if r.uring && r.emulate.is_some() {
        return Err(RuntimeError::option(
            "--emulate-flash",
            "models a device read one request at a time: use --io-engine pread",
        ));
    }
    use pi2_kernels::QuantType::*;
    let hw = pi2_planner::hw::measure(HwOptions {
        cpu: cpu_name(),
        storage: storage(r.file, r.emulate)?,
        emulate: r.emulate.map(parse_emulate).transpose()?,
        classes: classes(&Topology::detect()),
        // The types of common model files and of what `pi2 convert` writes (Q5_0 down rows);
        // others are costed as the slowest measured one.
        types: vec![Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, F32],
        kernel_time: r.kernel_time,
        flash_file: r.file,
        read_sizes: READ_SIZES.to_vec(),
        depths: match r.uring {
            true => pi2_io::choice::CHOICE_DEPTHS.to_vec(),
            false => vec![1],
        },
        read_time: r.read_time,
        uring: r.uring,
        pin: Some(pin),
        progress: r.progress,
    })?;
    Ok(hw)
}

/// The plan's prediction again, with the flash measured now, for a process holding `process`
/// bytes outside the offload's regions (measured before any offload was built; see
/// [`crate::offload::process_bytes`]). `None` for plans that read nothing or without a cached
/// hardware profile.
pub fn repredict_now(
    model: &Model,
    path: &Path,
    plan: &PlanFile,
    process: u64,
) -> Result<Option<(f64, f64)>> {
    if plan.knobs.mode != Mode::Offload {
        return Ok(None);
    }
    let emulate = plan.device.emulated.as_deref();
    let Ok(mut hw) = load_hw(None, path, emulate) else {
        return Ok(None);
    };
    let Some(sparse) = crate::sparse::build(&Default::default(), model, path, false)? else {
        return Ok(None);
    };
    let progress = |_: &str| {};
    // The engine and depths the plan's profile measured.
    let mut depths: Vec<usize> = hw.flash.points.iter().map(|p| p.depth).collect();
    depths.sort_unstable();
    depths.dedup();
    let flash = pi2_planner::hw::measure_flash(&HwOptions {
        cpu: String::new(),
        storage: String::new(),
        classes: classes(&Topology::detect()),
        types: vec![],
        kernel_time: Duration::from_millis(30),
        flash_file: path,
        read_sizes: READ_SIZES.to_vec(),
        depths,
        uring: hw.flash.engine.starts_with("uring"),
        read_time: Duration::from_millis(600),
        emulate: emulate.map(parse_emulate).transpose()?,
        pin: Some(pin),
        progress: &progress,
    })?;
    hw.flash = flash;
    let res = EngineResidency::new(model, &sparse, plan.n_ctx, plan.n_batch, Some(process))?;
    let toks = recording_tokens(model, None, 32)?;
    let mp = model_profile(model, path, &sparse, recording_threads(&hw), &toks)?;
    let cm = cost_model(&hw, &mp, &res, toks.len(), plan.n_batch);
    let p = cm.evaluate(&plan.knobs)?;
    Ok(Some((p.decode_tps, p.prefill_tps)))
}
