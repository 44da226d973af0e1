//! Plans, their predicted costs and hardware profiles as text for people: what `pi2 plan` and
//! `pi2 profile-hw` print, and what any front end can show.

use crate::cost::{Breakdown, Mode};
use crate::hw::{HardwareProfile, KernelOp};
use crate::plan::PlanFile;
use std::fmt;

const MIB: f64 = (1 << 20) as f64;

/// A table of the measured rates per core class and thread count, and the flash fit.
impl fmt::Display for HardwareProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| class | threads | step us | RAM GB/s | Q4_1 matvec GB/s | Q4_1 gather GB/s | Q8_0 axpy GB/s |")?;
        writeln!(f, "| ----- | ------: | ------: | -------: | ---------------: | ---------------: | -------------: |")?;
        for c in &self.classes {
            for r in &c.rates {
                let rate = |op, ty: &str| {
                    let k = r.kernels.iter().find(|k| k.op == op && k.ty == ty);
                    k.map_or(0.0, |k| k.bytes_per_sec / 1e9)
                };
                writeln!(
                    f,
                    "| {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} |",
                    c.name,
                    r.threads,
                    r.step_ns / 1e3,
                    r.mem_bytes_per_sec / 1e9,
                    rate(KernelOp::Matvec, "Q4_1"),
                    rate(KernelOp::Gather, "Q4_1"),
                    rate(KernelOp::Axpy, "Q8_0")
                )?;
            }
        }
        let fl = &self.flash;
        let (lat, bw) = (fl.latency_us, fl.bytes_per_sec / 1e6);
        writeln!(
            f,
            "flash ({}): {lat:.0} us + size / {bw:.0} MB/s per read",
            fl.engine
        )?;
        let (ns, hbw) = (fl.handling_ns_per_request, fl.handling_bytes_per_sec / 1e6);
        write!(
            f,
            "reader handling (copy, checksum, report): {ns:.0} ns per request + size / {hbw:.0} MB/s"
        )
    }
}

/// The chosen knobs and the predicted speed and memory of a plan, in three lines.
impl fmt::Display for PlanFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.knobs;
        let mode = match k.mode {
            Mode::Dense => "dense (in memory)".to_string(),
            Mode::Sparse => format!("sparse (in memory), cluster {}", k.cluster),
            Mode::Offload => format!(
                "offload: budget {:.1} MiB, hot share {}, cluster {}, merge gap {} K, max read {} K, depth {}",
                k.budget as f64 / MIB,
                k.hot_share,
                k.cluster,
                k.merge_gap >> 10,
                k.max_read >> 10,
                k.io_depth
            ),
        };
        writeln!(
            f,
            "plan: {} thread(s) on CPUs {:?}, {mode}",
            k.threads, self.cpus
        )?;
        if k.mode == Mode::Offload && !self.dense_layers.is_empty() {
            let dense = self.dense_layers.iter().filter(|&&d| d).count();
            let n = self.dense_layers.len();
            writeln!(
                f,
                "dense where wholly pinned: {dense} of {n} layers (faster here)"
            )?;
        }
        let p = &self.predicted;
        let reads = p.hit_rate.map_or(String::new(), |h| {
            let mb = p.read_bytes_per_token / 1e6;
            let n = p.device_reads_per_token;
            format!(", hit rate {h:.3}, {mb:.2} MB read per token in {n:.0} reads")
        });
        writeln!(
            f,
            "predicted: decode {:.2} tok/s, prefill {:.1} tok/s (batches of {}), memory {:.1} MiB{reads}",
            p.decode_tps,
            p.prefill_tps,
            self.n_batch,
            p.memory as f64 / MIB,
        )?;
        write!(
            f,
            "solver: {} of {} plans evaluated",
            self.evaluated, self.space_size
        )
    }
}

/// The predicted time per decoded token, by component.
impl fmt::Display for Breakdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total();
        writeln!(f, "predicted time per decoded token: {:.2} ms", total * 1e3)?;
        for (name, v) in [
            ("attention", self.attention),
            ("predictor", self.predictor),
            ("FFN compute", self.ffn_compute),
            ("reads not hidden", self.io_exposed),
            ("output head", self.output),
            ("parallel steps", self.steps),
            ("serial work", self.serial),
        ] {
            let (ms, share) = (v * 1e3, v / total * 100.0);
            writeln!(f, "  {name:<17} {ms:>8.3} ms {share:>5.1}%")?;
        }
        if self.io_total > 0.0 {
            writeln!(f, "  (device busy {:.3} ms per token)", self.io_total * 1e3)?;
        }
        Ok(())
    }
}

/// The predicted speed of the best plan at each memory limit (`None`: no plan fits), as bars
/// against the model file's size.
pub struct SpeedCurve<'a> {
    pub points: &'a [(u64, Option<f64>)],
    pub file_bytes: u64,
}

impl fmt::Display for SpeedCurve<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let top = self.points.iter().filter_map(|c| c.1).fold(0.0, f64::max);
        let top = top.max(1e-9);
        writeln!(f, "predicted decode speed vs memory limit:")?;
        for &(limit, tps) in self.points {
            let bar = tps.map_or(0, |t| (t / top * 50.0).round() as usize);
            let speed = tps.map_or("infeasible".into(), |t| format!("{t:.2} tok/s"));
            writeln!(
                f,
                "  {:>8.1} MiB ({:>3.0}%) {:<50} {speed}",
                limit as f64 / MIB,
                limit as f64 / self.file_bytes as f64 * 100.0,
                "#".repeat(bar),
            )?;
        }
        Ok(())
    }
}
