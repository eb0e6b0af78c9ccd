//! Parallel stages in the tail: a run of consecutive maps and filters after a sequential
//! stage (a Python function after a shuffle buffer, column-wise operators on batches) runs on
//! the same workers as the producer ([`ParStage`]), numbered as its items enter and passed on
//! in that order (deterministic runs) or as they finish, holding at most `par_cap` items so
//! that backpressure reaches the source. While it costs less per item than a hand-off it runs
//! on the tail thread ([`INLINE_NS`](crate::optimize::INLINE_NS)).

use super::chain::{apply_par, locate};
use super::marks::Upstream;
use super::runtime::Charging;
use super::tail::{Flow, Stage, TailRun};
use super::worker::chunk_cap;
use crate::ops::SampleOp;
use crate::optimize::{par_runs, producer_name, TailOp, INLINE_NS};
use crate::source::Dataset;
use crate::stats::{StageCounters, StatsHub};
use crossbeam_channel::RecvTimeoutError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoker_core::Error;

/// A run of consecutive map/filter operators after a sequential tail stage, run by the
/// workers (see [`ParStage`]); shared by every epoch's stage.
pub(super) struct ParOps {
    /// The operators, with their places in the plan.
    pub(super) ops: Vec<(usize, Arc<dyn SampleOp>)>,
    /// Each operator's statistics (its tail stage's).
    pub(super) counters: Vec<Arc<StageCounters>>,
    /// Each operator's profile (see [`crate::stats::OpProfile`]).
    pub(super) profile: Vec<Arc<crate::stats::OpProfile>>,
    /// The running average of nanoseconds per item through all of `ops` (0 until
    /// measured), on the workers or the tail: sizes hand-offs and the number of items in
    /// flight, and decides where the stage runs ([`INLINE_NS`]).
    pub(super) cost_ns: AtomicU64,
}

impl ParOps {
    /// The parallel stages of a plan with this tail: per tail stage, the operators of the
    /// parallel stage that starts there (see [`par_runs`]), each operator counted as its
    /// own stage (`tail_offset`: the first tail stage's index in the statistics).
    pub(super) fn for_tail(
        tail: &[TailOp],
        stats: &StatsHub,
        tail_offset: usize,
    ) -> Vec<Option<Arc<ParOps>>> {
        par_runs(tail)
            .into_iter()
            .enumerate()
            .map(|(j, run)| {
                run.map(|ops| {
                    let counters = (j..j + ops.len())
                        .map(|k| stats.stage(tail_offset + k))
                        .collect();
                    let profile = stats.profiles(ops.iter().map(|(i, _)| *i));
                    Arc::new(ParOps {
                        ops,
                        counters,
                        profile,
                        cost_ns: AtomicU64::new(0),
                    })
                })
            })
            .collect()
    }

    /// `n` items took `took`. The average rises by at most 1.75x a measurement (a
    /// measurement counts at most 4x the average), so one call that the scheduler held up
    /// does not move a cheap stage to the workers, while a cost that really rose still
    /// does within a few items; it falls halfway to each lower measurement, so a first
    /// call that was slow (cold) is soon forgotten.
    pub(super) fn note_cost(&self, took: Duration, n: u64) {
        if let Some(cost) = (took.as_nanos() as u64).checked_div(n) {
            let cost = cost.max(1);
            let old = self.cost_ns.load(Ordering::Relaxed);
            let new = if old == 0 {
                cost
            } else if cost < old {
                (old + cost) / 2
            } else {
                (old * 3 + cost.min(old.saturating_mul(4))) / 4
            };
            self.cost_ns.store(new, Ordering::Relaxed);
        }
    }
}

/// Items for a parallel map stage: tail stage `stage`, in the order they entered it, each
/// numbered and with its mark so far.
pub(super) struct ParWork {
    pub(super) stage: usize,
    pub(super) epoch: u64,
    pub(super) run: Arc<ParOps>,
    pub(super) items: Vec<(u64, Flow, Box<Upstream>)>,
}

/// What a worker made of a [`ParWork`]: each item's result with its number and its mark.
pub(super) struct ParDone {
    pub(super) stage: usize,
    pub(super) results: Vec<ParResult>,
}

pub(super) type ParResult = (u64, Result<Option<Flow>, Error>, Box<Upstream>);

/// A parallel stage's result for one item, with the item's mark so far.
pub(super) type Finished = (Result<Option<Flow>, Error>, Box<Upstream>);

/// A parallel stage's items through its operators, on a worker (a panic in an operator is
/// that item's error).
pub(super) fn run_par(work: ParWork, seed: u64, ds: &Dataset, budget: Charging<'_>) -> ParDone {
    let ParWork {
        stage,
        epoch,
        run,
        items,
    } = work;
    let t0 = Instant::now();
    let n = items.len() as u64;
    let results = items
        .into_iter()
        .map(|(t, flow, up)| (t, run_par_one(flow, &run, (seed, epoch), ds, budget), up))
        .collect();
    run.note_cost(t0.elapsed(), n);
    ParDone { stage, results }
}

/// One item through a parallel stage's operators where it is (a panic in an operator is
/// its error).
pub(super) fn run_par_one(
    flow: Flow,
    run: &ParOps,
    (seed, epoch): (u64, u64),
    ds: &Dataset,
    budget: Charging<'_>,
) -> Result<Option<Flow>, Error> {
    let pos = flow.key().pos();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        apply_par(flow, run, (seed, epoch), ds, budget)
    }))
    .unwrap_or_else(|p| {
        Err(locate(
            ds,
            Error::operator(format!(
                "panicked: {} ({})",
                stoker_core::panic_message(&*p),
                producer_name(&run.ops)
            )),
            pos,
        ))
    })
}

/// A run of consecutive maps and filters after a sequential tail stage, run in parallel by
/// the workers. The tail hands it items (numbered as they enter, each with its mark so far,
/// [`Upstream`]) in chunks sized by the measured cost per item, and passes its results on
/// to the stage after the run in the order the items entered (deterministic runs) or as
/// they finish. At most [`TailRun::par_cap`] items are in it (on the workers, or finished
/// and waiting for their turn); at that many the tail waits for the next result instead of
/// reading on, so the budget's backpressure reaches the source.
pub(super) struct ParStage {
    pub(super) run: Arc<ParOps>,
    /// Number the next item entering gets.
    pub(super) next_in: u64,
    /// Number of the next item to pass on (deterministic runs).
    pub(super) next_out: u64,
    /// Items in it: handed to the workers or not yet, finished or not.
    pub(super) outstanding: usize,
    /// Items not yet handed to the workers (a chunk being filled).
    pub(super) unsent: Vec<(u64, Flow, Box<Upstream>)>,
    /// Results waiting for their turn.
    pub(super) finished: BTreeMap<u64, Finished>,
    /// Running on the tail thread for now (a cheap stage, see [`INLINE_NS`]).
    pub(super) inline: bool,
}

impl ParStage {
    pub(super) fn new(run: Arc<ParOps>) -> ParStage {
        ParStage {
            run,
            next_in: 0,
            next_out: 0,
            outstanding: 0,
            unsent: Vec::new(),
            finished: BTreeMap::new(),
            inline: false,
        }
    }

    /// Items per hand-off: one until the cost is measured (a slow function on batches
    /// should not start with several on one worker), then about 1 ms of work.
    pub(super) fn chunk(&self) -> usize {
        match self.run.cost_ns.load(Ordering::Relaxed) {
            0 => 1,
            c => chunk_cap(c),
        }
    }

    /// The next result to pass on: in order, or, when `any`, whichever finished first.
    pub(super) fn take(&mut self, any: bool) -> Option<Finished> {
        let r = if any {
            self.finished.pop_first().map(|(_, r)| r)
        } else {
            self.finished.remove(&self.next_out)
        }?;
        self.next_out += 1;
        self.outstanding -= 1;
        Some(r)
    }
}

impl TailRun<'_> {
    pub(super) fn par(&mut self, i: usize) -> &mut ParStage {
        match &mut self.stages[i] {
            Stage::Par(p) => p,
            _ => unreachable!("stage {i} is not a parallel stage"),
        }
    }

    /// Most items in a parallel stage at once: enough for every worker to have a chunk
    /// and the next one ready (results that finish early wait for their turn), within the
    /// window.
    pub(super) fn par_cap(&self, chunk: usize) -> usize {
        (2 * self.ctx.threads * chunk).clamp(2, (self.ctx.window as usize).max(2))
    }

    /// `item` enters the parallel stage `i`: it is numbered, its mark so far taken, and
    /// it goes to the workers with the next chunk. With the stage full, waits for its
    /// next result and passes that on first.
    pub(super) fn enter_par(&mut self, i: usize, item: Flow) {
        let p = self.par(i);
        let cost = p.run.cost_ns.load(Ordering::Relaxed);
        if p.inline && cost > 2 * INLINE_NS {
            p.inline = false;
        } else if !p.inline && cost != 0 && cost < INLINE_NS {
            p.inline = true;
        }
        if p.inline {
            // What the workers have of it goes on first.
            while !self.failed && self.par(i).outstanding > 0 {
                self.await_par(i);
            }
            if !self.failed {
                self.run_inline(i, item);
            }
            return;
        }
        let len = self.ctx.par_ops[i].as_ref().map_or(1, |r| r.ops.len());
        let up = Box::new(self.snapshot(i + len));
        let p = self.par(i);
        p.unsent.push((p.next_in, item, up));
        p.next_in += 1;
        p.outstanding += 1;
        let chunk = p.chunk();
        if p.unsent.len() >= chunk {
            self.send_par(i);
        }
        let cap = self.par_cap(chunk);
        while !self.failed && self.par(i).outstanding >= cap {
            self.await_par(i);
        }
    }

    /// `item` through the parallel stage `i` on this thread (a cheap stage, see
    /// [`INLINE_NS`]), and on: its mark is the stages' now, as for any tail stage.
    pub(super) fn run_inline(&mut self, i: usize, item: Flow) {
        let run = self.par(i).run.clone();
        let t0 = Instant::now();
        let ctx = self.ctx;
        let r = run_par_one(
            item,
            &run,
            (ctx.seed, self.epoch),
            &ctx.ds,
            ctx.shared.charging(),
        );
        run.note_cost(t0.elapsed(), 1);
        match r {
            Ok(Some(flow)) => self.push(i + run.ops.len(), flow),
            Ok(None) => {}
            Err(e) => self.error(e),
        }
    }

    /// Hands stage `i`'s unsent items to the workers.
    pub(super) fn send_par(&mut self, i: usize) {
        let epoch = self.epoch;
        let p = self.par(i);
        if p.unsent.is_empty() {
            return;
        }
        let work = ParWork {
            stage: i,
            epoch,
            run: p.run.clone(),
            items: std::mem::take(&mut p.unsent),
        };
        if self.par_tx.send(work).is_err() {
            self.failed = true;
        }
    }

    /// Hands every parallel stage's unsent items to the workers (before the tail waits).
    pub(super) fn send_all_par(&mut self) {
        for i in 0..self.stages.len() {
            if matches!(&self.stages[i], Stage::Par(p) if !p.unsent.is_empty()) {
                self.send_par(i);
            }
        }
    }

    /// Puts the workers' results where they wait for their turn.
    pub(super) fn file(&mut self, done: ParDone) {
        let p = self.par(done.stage);
        for (t, r, up) in done.results {
            p.finished.insert(t, (r, up));
        }
    }

    /// Waits for the next result of the parallel stage `i` and passes it on. Results of
    /// other parallel stages that arrive meanwhile wait for their turn.
    pub(super) fn await_par(&mut self, i: usize) {
        self.send_par(i);
        let any = !self.ctx.deterministic;
        loop {
            if self.failed {
                return;
            }
            if self.ctx.shared.stop.load(Ordering::Relaxed) {
                self.failed = true;
                return;
            }
            if let Some(r) = self.par(i).take(any) {
                return self.pass_on(i, r);
            }
            // About to wait: what is finished goes to the consumer first.
            self.flush_out();
            match self.par_rx.recv_timeout(Duration::from_millis(100)) {
                Ok(done) => self.file(done),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return self.fail(Error::invalid("the worker threads ended"));
                }
            }
        }
    }

    /// A result of the parallel stage `i` goes on to the stage after it, with the mark
    /// its item had when it entered.
    pub(super) fn pass_on(&mut self, i: usize, (r, up): Finished) {
        let next = i + self.ctx.par_ops[i].as_ref().map_or(1, |r| r.ops.len());
        let outer = self.upstream.replace(up);
        match r {
            Ok(Some(flow)) => self.push(next, flow),
            Ok(None) => {}
            Err(e) => self.error(e),
        }
        self.upstream = outer;
    }

    /// Passes on every result whose turn it is, stage by stage.
    pub(super) fn deliver_ready(&mut self) {
        let any = !self.ctx.deterministic;
        for i in 0..self.stages.len() {
            if !matches!(self.stages[i], Stage::Par(_)) {
                continue;
            }
            while let Some(r) = self.par(i).take(any) {
                self.pass_on(i, r);
                if self.failed {
                    return;
                }
            }
        }
    }
}
