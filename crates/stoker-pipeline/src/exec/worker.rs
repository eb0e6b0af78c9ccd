//! The worker pool: `threads` CPU threads that take chunks of samples from the source and
//! apply the operators placed before the tail (the producer), and take work for the
//! parallel stages in the tail first when there is some ([`next_work`]). A worker parked by
//! the tuner sleeps; a panic in an operator is that sample's error. The source's hand-offs
//! are sized by the measured cost per sample ([`chunk_cap`]), and what operators make of a
//! sample is learnt for the source's reservations ([`expected_bytes`]).

use super::chain::{sample_through, How};
use super::par::{run_par, ParDone, ParWork};
use super::runtime::Charging;
use super::tail::Flow;
use super::Shared;
use crate::ops::SampleOp;
use crate::optimize::producer_name;
use crate::source::{Dataset, Produced};
use crate::state::Key;
use crate::stats::{OpProfile, StageCounters};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stoker_core::{Batch, BatchSlots, Error};

/// Most samples in one hand-off between threads.
pub(super) const CHUNK: usize = 64;

/// The work one hand-off to the workers aims at. A chunk of expensive samples (a decoded
/// clip, a large image) is cut short so that workers share the work and results flow in
/// order (a 64-sample chunk of 40 ms samples held the first batch back by 2.5 s), while
/// cheap samples still travel 64 at a time (a hand-off costs a few microseconds).
pub(super) const CHUNK_WORK_NS: u64 = 1_000_000;

/// Samples per hand-off for samples that take `cost_ns` each on a worker (0: not measured
/// yet, start small).
pub(super) fn chunk_cap(cost_ns: u64) -> usize {
    if cost_ns == 0 {
        return 4;
    }
    ((CHUNK_WORK_NS / cost_ns) as usize).clamp(1, CHUNK)
}

pub(super) enum Done {
    Items(Vec<(u64, Result<Option<Flow>, Error>)>),
    SourceEnd { next_seq: u64 },
    Fatal(Error),
}

/// What a worker takes next: work for a parallel stage after the tail's sequential stages
/// first (it is nearer the consumer, and the tail may be waiting for it), else the
/// source's samples.
pub(super) enum Work {
    Source(u64, Vec<Produced>),
    Par(ParWork),
    Idle,
    Closed,
}

/// (`par`: `None` when the plan has no parallel stage after the tail.)
pub(super) fn next_work(
    rx: &Receiver<(u64, Vec<Produced>)>,
    par: Option<&Receiver<ParWork>>,
) -> Work {
    let Some(par) = par else {
        return match rx.recv_timeout(Duration::from_millis(50)) {
            Ok((e, c)) => Work::Source(e, c),
            Err(RecvTimeoutError::Timeout) => Work::Idle,
            Err(RecvTimeoutError::Disconnected) => Work::Closed,
        };
    };
    match par.try_recv() {
        Ok(w) => return Work::Par(w),
        Err(crossbeam_channel::TryRecvError::Disconnected) => return Work::Closed,
        Err(crossbeam_channel::TryRecvError::Empty) => {}
    }
    crossbeam_channel::select! {
        recv(par) -> m => m.map_or(Work::Closed, Work::Par),
        recv(rx) -> m => m.map_or(Work::Closed, |(e, c)| Work::Source(e, c)),
        default(Duration::from_millis(50)) => Work::Idle,
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn worker(
    index: usize,
    (rx, tx): (Receiver<(u64, Vec<Produced>)>, Sender<Done>),
    par: Option<(Receiver<ParWork>, Sender<ParDone>)>,
    producer: &[(usize, Arc<dyn SampleOp>)],
    shared: &Shared,
    (stage, collating): (Option<Arc<StageCounters>>, Option<Arc<StageCounters>>),
    seed: u64,
    ds: &Dataset,
) {
    loop {
        // Parked by the autotuner.
        while index >= shared.active.load(Ordering::Relaxed) {
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let t0 = Instant::now();
        let (epoch, chunk) = match next_work(&rx, par.as_ref().map(|(r, _)| r)) {
            Work::Source(epoch, chunk) => (epoch, chunk),
            Work::Par(work) => {
                if let Some(s) = &stage {
                    s.add(&s.wait_ns, t0.elapsed().as_nanos() as u64);
                }
                let done = run_par(work, seed, ds, shared.charging());
                if par.as_ref().is_none_or(|(_, tx)| tx.send(done).is_err()) {
                    return;
                }
                continue;
            }
            Work::Idle => {
                if let Some(s) = &stage {
                    s.add(&s.wait_ns, t0.elapsed().as_nanos() as u64);
                }
                continue;
            }
            Work::Closed => return,
        };
        let t1 = Instant::now();
        if let Some(s) = &stage {
            s.add(&s.wait_ns, (t1 - t0).as_nanos() as u64);
        }
        let mut results = Vec::with_capacity(chunk.len());
        let n = chunk.len() as u64;
        let slots = shared.slots.as_ref();
        for p in chunk {
            let stages = (stage.as_deref(), collating.as_deref());
            let ops = (
                producer,
                slots,
                shared.charging(),
                &shared.producer_profile[..],
                shared.op_cache.as_deref(),
            );
            results.push(run_one(p, ops, seed, epoch, ds, stages));
        }
        let t2 = Instant::now();
        let busy = (t2 - t1).as_nanos() as u64;
        stoker_core::trace::span_sampled("stage", 0, (t1, t2), || format!("{n} samples").into());
        if let Some(s) = &stage {
            s.add(&s.busy_ns, busy);
        }
        if let Some(cost) = busy.checked_div(n) {
            let cost = cost.max(1);
            let old = shared.sample_cost_ns.load(Ordering::Relaxed);
            let new = if old == 0 { cost } else { (old * 3 + cost) / 4 };
            shared.sample_cost_ns.store(new, Ordering::Relaxed);
        }
        if !shared.warm.load(Ordering::Relaxed) {
            shared.warm.store(true, Ordering::Release);
        }
        if tx.send(Done::Items(results)).is_err() {
            return;
        }
    }
}

/// A producer operator and its index in the pipeline.
pub(super) type ProducerOp = (usize, Arc<dyn SampleOp>);

/// What the workers apply to each sample: the producer's operators, the batch slots its
/// last one writes into, the budget, and the operators' profiles.
pub(super) type ProducerRun<'a> = (
    &'a [ProducerOp],
    Option<&'a Arc<BatchSlots>>,
    Charging<'a>,
    &'a [Arc<OpProfile>],
    Option<&'a super::opcache::OpCache>,
);

/// One sample through the producer operators (a panic in an operator is its error).
pub(super) fn run_one(
    p: Produced,
    (producer, slots, budget, profile, cache): ProducerRun<'_>,
    seed: u64,
    epoch: u64,
    ds: &Dataset,
    (stage, collating): (Option<&StageCounters>, Option<&StageCounters>),
) -> (u64, Result<Option<Flow>, Error>) {
    let (seq, result) = match p {
        Produced::Fail { seq, pos, error } => (
            seq,
            Err(error
                .with_object(ds.shards[pos.shard as usize].url.clone())
                .with_record(pos.record)),
        ),
        // A batch's rows (columnar path): collated here, in parallel, not on the tail.
        Produced::Rows {
            seq,
            positions,
            parts,
            collate,
            hold,
        } => {
            let t0 = Instant::now();
            let members: Arc<[Key]> = positions.into_iter().map(Key::Pos).collect();
            let r =
                Batch::from_columns(parts, &collate).map(|b| Some(Flow::Batch(b, members, hold)));
            if let Some(c) = collating {
                c.add(&c.busy_ns, t0.elapsed().as_nanos() as u64);
            }
            return (seq, r);
        }
        Produced::Elem(el) => {
            let seq = el.seq;
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let how = How {
                    budget: Some(budget),
                    slots,
                    cache,
                    profile: Some(profile),
                    learn: true,
                    ..How::plain(seed, epoch, ds)
                };
                sample_through(producer, el, how)
            }));
            (
                seq,
                r.unwrap_or_else(|p| {
                    Err(Error::operator(format!(
                        "panicked: {} ({})",
                        stoker_core::panic_message(&*p),
                        producer_name(producer)
                    )))
                })
                .map(|el| el.map(|el| Flow::Elem(el, None))),
            )
        }
    };
    if let Some(s) = stage {
        s.add(&s.items_in, 1);
        match &result {
            Ok(Some(_)) => s.add(&s.items_out, 1),
            Ok(None) => s.add(&s.dropped, 1),
            Err(_) => {}
        }
    }
    (seq, result)
}

/// The bytes to reserve for a sample read as `read` bytes: times what operators have
/// made of samples so far ([`Dataset::growth`]).
///
/// Before the first sample is measured (0), a sample is reserved as a sixteenth of the
/// budget at least, so that however much the operators grow them, at most about 16 are
/// admitted before the first measurement (a few milliseconds).
///
/// It is at most three quarters of the budget: a sample reserved as the whole budget would
/// wait for everything else to be given back, a partial batch included, which waits for
/// it. (Its operators charge what they find they need, and may then wait for the rest.)
pub(super) fn expected_bytes(ds: &Dataset, read: u64, limit: u64) -> u64 {
    let n = match ds.growth.load(Ordering::Relaxed) {
        0 => read.max(limit / 16),
        g => ((read as u128 * g as u128) / crate::source::GROWTH_ONE as u128).min(u64::MAX as u128)
            as u64,
    };
    n.min(limit / 4 * 3)
}

/// The worker threads of a run and what each one needs.
pub(super) struct Pool {
    pub(super) threads: usize,
    pub(super) producer: Arc<Vec<ProducerOp>>,
    pub(super) shared: Arc<Shared>,
    /// The producer's statistics (when it has operators).
    pub(super) map_stage: Option<Arc<StageCounters>>,
    /// The batch stage's, on the columnar path (the workers collate).
    pub(super) collate_stage: Option<Arc<StageCounters>>,
    pub(super) seed: u64,
    pub(super) ds: Arc<Dataset>,
}

impl Pool {
    /// Starts the workers on the source's work (`rx`, results to `tx`) and, when the plan
    /// has parallel stages in the tail, theirs.
    #[allow(clippy::type_complexity)]
    pub(super) fn spawn(
        self,
        (rx, tx): (Receiver<(u64, Vec<Produced>)>, Sender<Done>),
        par: Option<(Receiver<ParWork>, Sender<ParDone>)>,
    ) -> Vec<JoinHandle<()>> {
        (0..self.threads)
            .map(|w| {
                let io = (rx.clone(), tx.clone());
                let par = par.clone();
                let producer = self.producer.clone();
                let shared = self.shared.clone();
                let stages = (self.map_stage.clone(), self.collate_stage.clone());
                let (seed, ds) = (self.seed, self.ds.clone());
                std::thread::Builder::new()
                    .name(format!("stoker-cpu-{w}"))
                    .spawn(move || worker(w, io, par, &producer, &shared, stages, seed, &ds))
                    .expect("spawn worker")
            })
            .collect()
    }
}
