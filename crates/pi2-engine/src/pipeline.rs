//! The two-phase sparse FFN of one token-layer, as a cluster pipeline: predictor ->
//! candidates (in clusters) -> gate rows -> confirmed neurons -> their up rows and down
//! columns. Rows come from a [`StepRows`]: a cluster's gate phase starts once its gate rows
//! are resident (missing ones are read meanwhile), and its up/down phase once its confirmed
//! neurons' rows are. Each cluster sums into its own partial; partials are added in cluster
//! order, so the result does not depend on residency, timing or threads.

use crate::error::EngineError;
use crate::neurons::{fires, is_candidate, predict};
use crate::residency::{NeuronRows, StepCounts, StepRows, Tag, UpDown};
use crate::scratch::{grow, Scratch};
use crate::sparse::{SparseFfn, SparseStats};
use crate::NeuronStep;
use pi2_io::{Completion, Request};
use pi2_kernels::{axpy_rows_by, gather_matvec_by, ActBuf, KernelSet};
use pi2_model::FfnAct;
use std::sync::atomic::{
    AtomicU32, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Release,
};
use std::sync::Mutex;

/// Buffers of one step, reused.
#[derive(Default)]
pub(crate) struct StepBuffers {
    /// Candidate neurons (unit-local indices) and the unit (index into the step's list) of each.
    cand: Vec<u32>,
    cand_unit: Vec<u32>,
    rows: Vec<NeuronRows>,
    /// Gate values and coefficients (NaN: not confirmed).
    vals: Vec<f32>,
    coeff: Vec<f32>,
    /// Reads each cluster still waits for before its gate / up-down phase.
    pend_gate: Vec<AtomicU32>,
    pend_updown: Vec<AtomicU32>,
    reqs: Vec<Request>,
    acts_up: ActBuf,
}

/// The step to compute.
pub(crate) struct Step<'a> {
    pub ks: &'a KernelSet,
    pub act: FfnAct,
    pub sparse: &'a SparseFfn<'a>,
    pub use_predictor: bool,
    /// Neurons per cluster.
    pub cluster: usize,
    pub layer: usize,
    /// The FFN units and their output weights: the layer (weight 1), or the chosen experts.
    pub units: &'a [(usize, f32)],
    /// Bytes of the layer's dense FFN (statistics).
    pub dense_bytes: u64,
    /// Only neurons resident now take part (nothing is read): a draft from what is resident.
    pub resident_only: bool,
}

/// A pointer that tasks of one step share; each task touches only its own cluster's range.
#[derive(Clone, Copy)]
struct Disjoint<T>(*mut T);
// SAFETY: used only for per-cluster disjoint ranges, ordered by the pipeline's atomics.
unsafe impl<T> Send for Disjoint<T> {}
unsafe impl<T> Sync for Disjoint<T> {}

impl<T> Disjoint<T> {
    /// # Safety
    /// No other live reference may overlap `r`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, r: std::ops::Range<usize>) -> &mut [T] {
        // SAFETY: `r` lies within the buffer; the caller excludes overlapping references.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(r.start), r.len()) }
    }
}

/// The rows of one step, by address (file mapping, pinned block or cache slot).
///
/// # Safety
/// `at` must be the address of `len` readable bytes that nothing writes meanwhile.
unsafe fn row_at<'a>(at: usize, len: usize) -> &'a [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(at as *const u8, len) }
}

/// Confirmed positions of the cluster a task is computing, their coefficients, up values,
/// and the reads it queues.
type ClusterBuffers = (Vec<u32>, Vec<f32>, Vec<f32>, Vec<Request>);

thread_local! {
    static CONFIRMED: std::cell::RefCell<ClusterBuffers> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
}

/// Runs `step` on the token in `s.xn[..d]`, adding the FFN output to `s.x`.
pub(crate) fn token<R: StepRows>(
    step: &Step<'_>,
    s: &mut Scratch,
    b: &mut StepBuffers,
    res: &mut R,
    stats: &mut SparseStats,
    record: Option<&mut Vec<NeuronStep>>,
) -> Result<(), EngineError> {
    let sp = step.sparse;
    let ff = sp.layers[step.units[0].0].down_t.rows;
    let d = sp.layers[step.units[0].0].down_t.cols;
    candidates(step, s, b, d, ff);
    if step.resident_only {
        // A draft from what is resident: candidates that would need a read are left out.
        let (cand, unit) = (&mut b.cand, &mut b.cand_unit);
        let mut keep = 0;
        for k in 0..cand.len() {
            if res.resident(step.units[unit[k] as usize].0, cand[k] as usize) {
                (cand[keep], unit[keep]) = (cand[k], unit[k]);
                keep += 1;
            }
        }
        cand.truncate(keep);
        unit.truncate(keep);
    }
    let nc = b.cand.len();
    let cl = step.cluster;
    let nclust = nc.div_ceil(cl);
    let [(gty, _), (uty, _), _] = res.formats(step.units[0].0);

    // Where every candidate's rows are; queue the gate reads of missing ones.
    res.begin_step();
    b.rows.clear();
    b.reqs.clear();
    if b.pend_gate.len() < nclust {
        b.pend_gate.resize_with(nclust, || AtomicU32::new(0));
        b.pend_updown.resize_with(nclust, || AtomicU32::new(0));
    }
    b.pend_gate[..nclust]
        .iter()
        .for_each(|p| p.store(0, Release));
    for (k, (&i, &j)) in b.cand.iter().zip(&b.cand_unit).enumerate() {
        let rows = res.locate(step.units[j as usize].0, i as usize, k, &mut b.reqs)?;
        if rows.gate_missing {
            b.pend_gate[k / cl].fetch_add(1, AcqRel);
        }
        b.rows.push(rows);
    }
    // SAFETY: the requests come from `locate` in this step.
    unsafe { res.submit(&b.reqs)? };

    // Activations for the gate and up rows.
    s.acts.quantize(gty.act_kind(), &s.xn[..d], d);
    b.acts_up.quantize(uty.act_kind(), &s.xn[..d], d);
    grow(&mut b.vals, nc);
    grow(&mut b.coeff, nc);
    grow(&mut s.partials, nclust.max(1) * d);
    let counts = run_clusters(step, s, b, res, d)?;

    if let Some(rec) = record {
        // Experts' neurons numbered expert-major within the layer.
        let id = |k: usize| {
            ((step.units[b.cand_unit[k] as usize].0 % sp.experts) * ff) as u32 + b.cand[k]
        };
        rec.push(NeuronStep {
            layer: step.layer as u32,
            candidates: (0..nc).map(id).collect(),
            confirmed: (0..nc).filter(|&k| !b.coeff[k].is_nan()).map(id).collect(),
        });
    }
    for part in s.partials[..nclust * d].chunks_exact(d) {
        s.x[..d].iter_mut().zip(part).for_each(|(x, p)| *x += p);
    }
    res.end_step(&counts);
    record_stats(step, stats, res, nc, counts.confirmed);
    Ok(())
}

/// The step's candidates: each unit's predicted neurons, or all of them.
fn candidates(step: &Step<'_>, s: &mut Scratch, b: &mut StepBuffers, d: usize, ff: usize) {
    b.cand.clear();
    b.cand_unit.clear();
    for (j, &(u, _)) in step.units.iter().enumerate() {
        let sl = &step.sparse.layers[u];
        match sl.predictor.as_ref().filter(|_| step.use_predictor) {
            Some(p) => {
                predict(step.ks, s, sl, d, ff, 1);
                b.cand.extend(
                    (0..ff as u32).filter(|&i| is_candidate(p, step.act, s.pred_s[i as usize])),
                );
            }
            None => b.cand.extend(0..ff as u32),
        }
        b.cand_unit.resize(b.cand.len(), j as u32);
    }
}

/// One step's clusters in flight: what every task reads, and the counters they share.
struct Clusters<'a, R> {
    step: &'a Step<'a>,
    res: &'a R,
    acts: &'a ActBuf,
    acts_up: &'a ActBuf,
    cand: &'a [u32],
    cand_unit: &'a [u32],
    rows: &'a [NeuronRows],
    pend_gate: &'a [AtomicU32],
    pend_updown: &'a [AtomicU32],
    vals: Disjoint<f32>,
    coeff: Disjoint<f32>,
    partials: Disjoint<f32>,
    /// Width and the rows' formats: (type, bytes) of gate, up, down.
    d: usize,
    formats: [(pi2_kernels::QuantType, usize); 3],
    confirmed: AtomicUsize,
    updown_reads: AtomicUsize,
    updown_cached: AtomicUsize,
    done: AtomicUsize,
    failed: Mutex<Option<pi2_io::IoError>>,
}

/// The two phases of every cluster, scheduled as their rows arrive; the calling thread drives
/// the completions and helps with compute.
fn run_clusters<R: StepRows>(
    step: &Step<'_>,
    s: &mut Scratch,
    b: &mut StepBuffers,
    res: &mut R,
    d: usize,
) -> Result<StepCounts, EngineError> {
    let formats = res.formats(step.units[0].0);
    let cl = Clusters {
        step,
        res: &*res,
        acts: &s.acts,
        acts_up: &b.acts_up,
        cand: &b.cand,
        cand_unit: &b.cand_unit,
        rows: &b.rows,
        pend_gate: &b.pend_gate,
        pend_updown: &b.pend_updown,
        vals: Disjoint(b.vals.as_mut_ptr()),
        coeff: Disjoint(b.coeff.as_mut_ptr()),
        partials: Disjoint(s.partials.as_mut_ptr()),
        d,
        formats,
        confirmed: AtomicUsize::new(0),
        updown_reads: AtomicUsize::new(0),
        updown_cached: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        failed: Mutex::new(None),
    };
    let io_wait = cl.drive();
    let Clusters {
        confirmed,
        updown_reads,
        updown_cached,
        failed,
        ..
    } = cl;
    if let Some(e) = failed.into_inner().unwrap() {
        res.fail();
        return Err(e.into());
    }
    Ok(StepCounts {
        updown_reads: updown_reads.into_inner(),
        updown_cached: updown_cached.into_inner(),
        confirmed: confirmed.into_inner(),
        updown_row_bytes: formats[1].1 + formats[2].1,
        io_wait,
    })
}

impl<R: StepRows> Clusters<'_, R> {
    fn n_clusters(&self) -> usize {
        self.cand.len().div_ceil(self.step.cluster)
    }

    fn range(&self, c: usize) -> std::ops::Range<usize> {
        let cl = self.step.cluster;
        c * cl..((c + 1) * cl).min(self.cand.len())
    }

    /// Candidate `k`'s unit and that unit's output weight.
    fn unit_of(&self, k: usize) -> (usize, f32) {
        self.step.units[self.cand_unit[k] as usize]
    }

    fn fail(&self, e: pi2_io::IoError) {
        self.failed.lock().unwrap().get_or_insert(e);
    }

    /// Phase 1 of cluster `c`: gate rows, the threshold, then reads of the confirmed neurons'
    /// missing up/down rows (phase 2 runs here at once if none are missing).
    fn gate(&self, c: usize) {
        let (r, d, act) = (self.range(c), self.d, self.step.act);
        let [(gty, grb), _, _] = self.formats;
        // SAFETY: this cluster's ranges, owned by this task.
        let (v, cf) = unsafe { (self.vals.range(r.clone()), self.coeff.range(r.clone())) };
        // SAFETY (rows): resident, or their reads have completed.
        let gate_row = |j: usize| unsafe { row_at(self.rows[r.start + j].gate, grb) };
        gather_matvec_by(self.step.ks, gty, d, gate_row, self.acts, v);
        // Not confirmed: NaN (an exact 0 coefficient still belongs to a confirmed neuron).
        // The unit's output weight is folded into the coefficient.
        for (j, (a, &g)) in cf.iter_mut().zip(v.iter()).enumerate() {
            let (u, w) = self.unit_of(r.start + j);
            let gv = act.gate(g);
            *a = match fires(gv, self.step.sparse.layers[u].threshold) {
                true => gv * w,
                false => f32::NAN,
            };
        }
        if R::ALWAYS_RESIDENT {
            return self.updown(c);
        }
        CONFIRMED.with_borrow_mut(|(_, _, _, reqs)| {
            reqs.clear();
            let mut queued = 0;
            for (j, &a) in cf.iter().enumerate() {
                let k = r.start + j;
                let u = self.unit_of(k).0;
                let i = self.cand[k] as usize;
                match self
                    .res
                    .after_gate(u, i, k, &self.rows[k], !a.is_nan(), reqs)
                {
                    UpDown::Queued => queued += 1,
                    UpDown::Cached => {
                        self.updown_cached.fetch_add(1, AcqRel);
                    }
                    UpDown::Resident => {}
                }
            }
            self.updown_reads.fetch_add(queued, AcqRel);
            // One extra count held by this task, so the driver cannot start phase 2 first.
            self.pend_updown[c].store(reqs.len() as u32 + 1, Release);
            // SAFETY: the requests come from `after_gate` in this step.
            if let Err(e) = unsafe { self.res.submit(reqs) } {
                self.fail(e);
            }
        });
        if self.pend_updown[c].fetch_sub(1, AcqRel) == 1 {
            self.updown(c);
        }
    }

    /// Phase 2 of cluster `c`: up rows and down columns of its confirmed neurons.
    fn updown(&self, c: usize) {
        let (r, d) = (self.range(c), self.d);
        let [_, (uty, urb), (dty, drb)] = self.formats;
        let (ks, act, rows) = (self.step.ks, self.step.act, self.rows);
        CONFIRMED.with_borrow_mut(|(pos, coef, u, _)| {
            pos.clear();
            coef.clear();
            // SAFETY: this cluster's range, owned by this task.
            let cf = unsafe { self.coeff.range(r.clone()) };
            for (j, &a) in cf.iter().enumerate() {
                if !a.is_nan() {
                    pos.push((r.start + j) as u32);
                    coef.push(a);
                }
            }
            u.clear();
            u.resize(pos.len(), 0.0);
            // SAFETY (rows): resident, or their reads have completed.
            let up_row = |j: usize| unsafe { row_at(rows[pos[j] as usize].up, urb) };
            gather_matvec_by(ks, uty, d, up_row, self.acts_up, u);
            coef.iter_mut()
                .zip(u.iter())
                .for_each(|(a, &u)| *a *= act.up(u));
            // SAFETY: this cluster's partial.
            let y = unsafe { self.partials.range(c * d..(c + 1) * d) };
            y.fill(0.0);
            let down_row = |j: usize| unsafe { row_at(rows[pos[j] as usize].down, drb) };
            axpy_rows_by(ks, dty, down_row, coef, y);
            if !R::ALWAYS_RESIDENT {
                for &k in pos.iter() {
                    self.res.after_updown(&rows[k as usize]);
                }
            }
            self.confirmed.fetch_add(pos.len(), AcqRel);
        });
        self.done.fetch_add(1, AcqRel);
    }

    /// Starts resident clusters, then routes completions to their clusters while helping with
    /// compute; blocks only when nothing but I/O is left to wait for. Returns the time blocked.
    fn drive(&self) -> std::time::Duration {
        let (n, cl) = (self.n_clusters(), self.step.cluster);
        let mut io_wait = std::time::Duration::ZERO;
        rayon::scope(|sc| {
            for (c, pending) in self.pend_gate.iter().enumerate().take(n) {
                if pending.load(Acquire) == 0 {
                    sc.spawn(move |_| self.gate(c));
                }
            }
            let handle = |comp: Completion| match comp.result {
                Err(e) => self.fail(e),
                Ok(()) => match Tag::decode(comp.tag) {
                    Tag::Gate(k) if self.pend_gate[k / cl].fetch_sub(1, AcqRel) == 1 => {
                        sc.spawn(move |_| self.gate(k / cl));
                    }
                    Tag::UpDown(k) if self.pend_updown[k / cl].fetch_sub(1, AcqRel) == 1 => {
                        sc.spawn(move |_| self.updown(k / cl));
                    }
                    Tag::Gate(_) | Tag::UpDown(_) => {}
                    // A streamed read (attention, output or embedding rows) read ahead.
                    other => self.res.received(other),
                },
            };
            while self.done.load(Acquire) < n && self.failed.lock().unwrap().is_none() {
                match self.res.poll() {
                    Ok(Some(comp)) => {
                        handle(comp);
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.fail(e);
                        break;
                    }
                }
                if rayon::yield_now() == Some(rayon::Yield::Executed) {
                    continue;
                }
                if self.res.outstanding() > 0 {
                    let t0 = std::time::Instant::now();
                    let comp = self.res.wait();
                    io_wait += t0.elapsed();
                    match comp {
                        Ok(comp) => handle(comp),
                        Err(e) => self.fail(e),
                    }
                } else {
                    std::thread::yield_now();
                }
            }
        });
        io_wait
    }
}

/// The sparse statistics of a finished step.
fn record_stats<R: StepRows>(
    step: &Step<'_>,
    stats: &mut SparseStats,
    res: &R,
    nc: usize,
    nf: usize,
) {
    let li = step.layer;
    let predictors = || {
        step.units
            .iter()
            .filter_map(|&(u, _)| step.sparse.layers[u].predictor.as_ref())
            .filter(|_| step.use_predictor)
    };
    let [(_, grb), (_, urb), (_, drb)] = res.formats(step.units[0].0);
    stats.token_layers += 1;
    stats.candidates += nc as u64;
    stats.confirmed += nf as u64;
    stats.layer_candidates[li] += nc as u64;
    stats.layer_tokens[li] += 1;
    if predictors().next().is_none() {
        stats.layer_true_active[li] += nf as u64;
        stats.layer_true_found[li] += nf as u64;
    }
    let pred_bytes: usize = predictors().map(|p| p.bytes()).sum();
    stats.ffn_bytes += (pred_bytes + nc * grb + nf * (urb + drb)) as u64;
    stats.dense_ffn_bytes +=
        step.dense_bytes * step.units.len() as u64 / step.sparse.experts as u64;
}
