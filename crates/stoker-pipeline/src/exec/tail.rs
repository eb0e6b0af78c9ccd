//! The tail thread: takes the workers' results in `seq` order and pushes each through the
//! sequential stages (shuffle, batch, unbatch, pack, take, skip, and the parallel stages
//! between them), then hands finished items, with their marks, to the consumer. It also
//! runs each epoch: restores the stages, starts the source thread, pumps until the source
//! has ended and everything it emitted has been seen, then flushes the stages.

use super::feed::spawn_source;
use super::marks::{Mark, StageMark, Upstream};
use super::par::{ParDone, ParOps, ParStage, ParWork};
use super::tuner::Tuner;
use super::worker::Done;
use super::{Item, OutMsg, Shared};
use crate::ops::SampleOp;
use crate::optimize::{Physical, TailOp};
use crate::pack::PackStage;
use crate::plan::ErrorPolicy;
use crate::source::{Dataset, Element, Pos, Produced, SourceConfig};
use crate::state::{CutFrom, Key, PipelineState, StageState};
use crate::stats::StageCounters;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoker_core::{
    Batch, BatchSlots, CollatePolicy, Error, MemoryBudget, Reservation, Sample, Stacker,
};

/// Most items in one hand-off to the consumer.
pub(super) const OUT_CHUNK: usize = 32;

pub(super) const SHUFFLE_PICK: u64 = 0x5348_5546;

/// What the tail passes between its stages: a sample (with the batch it was cut from,
/// after an unbatch), or a batch (with its samples' keys).
pub(super) enum Flow {
    Elem(Element, CutFrom),
    Batch(Batch, Arc<[Key]>, Option<Reservation>),
}

impl Flow {
    pub(super) fn key(&self) -> Key {
        match self {
            Flow::Elem(el, cut) => Key::of_sample(el.pos, cut),
            Flow::Batch(_, m, _) => Key::Batch(m.clone()),
        }
    }
}

mod batch;
mod count;
mod pack;
mod shuffle;
mod unbatch;

pub(super) use batch::BatchStage;
pub(super) use count::CountStage;
pub(super) use shuffle::ShuffleStage;
pub(super) use unbatch::UnbatchStage;

/// A batch `unbatch` cuts: its members' keys and its samples, which go on one at a time.
pub(super) type Cut = (Arc<[Key]>, Vec<Sample>);

/// What a sequential stage sees of the run when it takes or hands on an item.
pub(super) struct StageCx<'a> {
    /// Its index among the tail stages.
    pub(super) index: usize,
    pub(super) seed: u64,
    pub(super) epoch: u64,
    pub(super) shared: &'a Shared,
    pub(super) budget: &'a MemoryBudget,
    pub(super) ds: &'a Dataset,
    /// Its statistics.
    pub(super) counters: &'a StageCounters,
}

/// A sequential stage of the tail (one file each in `tail/`: shuffle, batch, unbatch,
/// take/skip, pack). The tail thread pushes items into it in order and passes on what it
/// gives back, counts items in and out and its time, and at the end of an epoch flushes it.
/// A new stage is a `TailOp` (the plan), a type implementing this, a [`Stage`] variant, its
/// initial state (`exec/marks.rs`) and its restore (`exec/restore.rs`).
pub(super) trait TailStage {
    /// Takes `item`; what goes on now is pushed to `outs` in order (nothing: it holds or
    /// dropped the item). An unbatch stage returns the batch it cuts instead.
    fn push(
        &mut self,
        item: Flow,
        cx: &StageCx<'_>,
        outs: &mut Vec<Flow>,
    ) -> Result<Option<Cut>, Error>;
    /// At the end of an epoch: the next item it still holds, to hand on (`None`: none).
    fn flush(&mut self, cx: &StageCx<'_>) -> Result<Option<Flow>, Error>;
    /// Its part of the mark of an item that leaves the tail now: its checkpoint, or why
    /// this position cannot be one.
    fn mark(&self) -> Result<StageMark, String>;
    /// `item` went on to the next stage.
    fn sent(&mut self, _item: &Flow) {}
    /// What one push gave went on.
    fn pushed(&mut self) {}
}

pub(super) enum Stage {
    /// The first of a run of maps and filters, run on the workers (see [`ParStage`]).
    Par(Box<ParStage>),
    /// A later map of that run: it never sees an item itself.
    Fused,
    Shuffle(ShuffleStage),
    Batch(BatchStage),
    Pack(Box<PackStage>),
    Unbatch(UnbatchStage),
    /// Take or skip.
    Count(CountStage),
}

impl Stage {
    /// The sequential stage (`None`: a parallel stage, or a later map of one).
    fn seq(&mut self) -> Option<&mut dyn TailStage> {
        Some(match self {
            Stage::Par(_) | Stage::Fused => return None,
            Stage::Shuffle(s) => s,
            Stage::Batch(s) => s,
            Stage::Pack(s) => &mut **s,
            Stage::Unbatch(s) => s,
            Stage::Count(s) => s,
        })
    }

    fn seq_ref(&self) -> Option<&dyn TailStage> {
        Some(match self {
            Stage::Par(_) | Stage::Fused => return None,
            Stage::Shuffle(s) => s,
            Stage::Batch(s) => s,
            Stage::Pack(s) => &**s,
            Stage::Unbatch(s) => s,
            Stage::Count(s) => s,
        })
    }
}

pub(super) struct TailCtx {
    pub(super) ds: Arc<Dataset>,
    pub(super) budget: MemoryBudget,
    pub(super) cfg: SourceConfig,
    pub(super) shared: Arc<Shared>,
    pub(super) ph_tail: Vec<TailOp>,
    pub(super) producer: Arc<Vec<(usize, Arc<dyn SampleOp>)>>,
    pub(super) seed: u64,
    /// The epoch a run from the beginning starts at.
    pub(super) first_epoch: u64,
    /// The epoch it stops before (`None`: never).
    pub(super) epochs: Option<u64>,
    pub(super) policy: ErrorPolicy,
    pub(super) deterministic: bool,
    pub(super) window: u64,
    pub(super) threads: usize,
    pub(super) autotune: bool,
    pub(super) state: Option<PipelineState>,
    pub(super) tail_offset: usize,
    /// Per tail stage: the operators of the parallel stage that starts there.
    pub(super) par_ops: Vec<Option<Arc<ParOps>>>,
}

/// The tail's running state within one epoch.
pub(super) struct TailRun<'a> {
    pub(super) ctx: &'a TailCtx,
    pub(super) epoch: u64,
    pub(super) stages: Vec<Stage>,
    pub(super) last_seq: Option<u64>,
    pub(super) yielded_in_epoch: u64,
    pub(super) out: &'a Sender<Vec<OutMsg>>,
    pub(super) out_buf: Vec<OutMsg>,
    pub(super) failed: bool,
    pub(super) par_tx: &'a Sender<ParWork>,
    pub(super) par_rx: &'a Receiver<ParDone>,
    /// While the result of a parallel stage goes on through the stages after it: its mark
    /// as of the stages before (see [`Upstream`]).
    pub(super) upstream: Option<Box<Upstream>>,
    /// Whether the plan has a parallel stage (else the tail waits on the workers alone).
    pub(super) has_par: bool,
}

impl TailCtx {
    pub(super) fn run(
        self,
        work_tx: Sender<(u64, Vec<Produced>)>,
        done_tx: Sender<Done>,
        done_rx: Receiver<Done>,
        out_tx: Sender<Vec<OutMsg>>,
        (par_tx, par_rx): (Sender<ParWork>, Receiver<ParDone>),
    ) {
        let start_epoch = self.state.as_ref().map_or(self.first_epoch, |s| s.epoch);
        let mut epoch = start_epoch;
        let mut tuner = Tuner::new(&self);
        loop {
            if self.epochs.is_some_and(|n| epoch >= n) || self.shared.stop.load(Ordering::Relaxed) {
                break;
            }
            self.shared.stats.epoch.store(epoch, Ordering::Relaxed);
            let restored = self.state.as_ref().filter(|s| s.epoch == epoch);
            let cursor0 = restored.map(|s| s.cursor.clone()).unwrap_or_default();
            self.shared
                .epoch_start
                .lock()
                .insert(epoch, cursor0.clone());
            let mut run = TailRun {
                ctx: &self,
                epoch,
                stages: Vec::new(),
                last_seq: None,
                yielded_in_epoch: restored.map_or(0, |s| s.yielded_in_epoch),
                out: &out_tx,
                out_buf: Vec::new(),
                failed: false,
                par_tx: &par_tx,
                par_rx: &par_rx,
                upstream: None,
                has_par: self.par_ops.iter().any(Option::is_some),
            };
            let got = match run.init_stages(restored) {
                Ok((s, got)) => {
                    run.stages = s;
                    got
                }
                Err(e) => {
                    let _ = out_tx.send(vec![OutMsg::Err(e)]);
                    return;
                }
            };
            if let Some(st) = restored {
                if let Err(e) = run.replay(st, &got) {
                    run.fail(e);
                }
                if run.failed {
                    return;
                }
            }
            // The source for this epoch.
            *self.shared.tail_next.lock() = cursor0.emitted;
            let source = spawn_source(&self, epoch, cursor0, work_tx.clone(), done_tx.clone());
            let first = self
                .state
                .as_ref()
                .filter(|s| s.epoch == epoch)
                .map_or(0, |s| s.cursor.emitted);
            run.pump(&done_rx, first, &mut tuner);
            let _ = source.join();
            if run.failed || self.shared.stop.load(Ordering::Relaxed) {
                return;
            }
            run.flush(0);
            run.flush_out();
            if run.failed {
                return;
            }
            epoch += 1;
        }
    }
}

impl<'a> TailRun<'a> {
    /// What stage `i` sees of the run (borrowing the run's context, not the tail).
    fn stage_cx<'c>(&self, i: usize, counters: &'c StageCounters) -> StageCx<'c>
    where
        'a: 'c,
    {
        let ctx: &'a TailCtx = self.ctx;
        StageCx {
            index: i,
            seed: ctx.seed,
            epoch: self.epoch,
            shared: &ctx.shared,
            budget: &ctx.budget,
            ds: &ctx.ds,
            counters,
        }
    }
}

impl TailRun<'_> {
    /// Takes worker results in order and pushes them through the stages until the source
    /// has ended and everything it emitted has been seen.
    pub(super) fn pump(&mut self, done_rx: &Receiver<Done>, first: u64, tuner: &mut Tuner) {
        let ctx = self.ctx;
        let mut next = first;
        let mut end: Option<u64> = None;
        let mut pending: BTreeMap<u64, Result<Option<Flow>, Error>> = BTreeMap::new();
        // Without determinism, results are numbered as they arrive.
        let mut arrived = first;
        while end != Some(next) {
            if ctx.shared.stop.load(Ordering::Relaxed) {
                return;
            }
            tuner.tick(ctx, self.par_tx.len());
            self.deliver_ready();
            if self.failed {
                return;
            }
            if done_rx.is_empty() && self.par_rx.is_empty() {
                // About to wait: what is finished goes to the consumer first, and what the
                // parallel stages hold goes to the workers.
                self.send_all_par();
                self.flush_out();
            }
            let msg = if !self.has_par {
                match done_rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                crossbeam_channel::select! {
                recv(done_rx) -> m => match m {
                    Ok(m) => m,
                    Err(_) => return,
                },
                recv(self.par_rx) -> m => match m {
                    Ok(d) => {
                        self.file(d);
                        continue;
                    }
                    Err(_) => return,
                },
                default(Duration::from_millis(100)) => continue,
                }
            };
            match msg {
                Done::SourceEnd { next_seq } => end = Some(next_seq),
                Done::Fatal(e) => {
                    self.fail(e);
                    return;
                }
                Done::Items(items) => {
                    for (seq, result) in items {
                        let k = if ctx.deterministic {
                            seq
                        } else {
                            arrived += 1;
                            arrived - 1
                        };
                        pending.insert(k, result);
                    }
                }
            }
            let before = next;
            while let Some(result) = pending.remove(&next) {
                self.last_seq = Some(next);
                next += 1;
                match result {
                    Ok(Some(Flow::Elem(el, cut))) => self.push(0, Flow::Elem(el, cut)),
                    Ok(Some(batch)) => self.push_batched(batch),
                    Ok(None) => {}
                    Err(e) => self.error(e),
                }
                if self.failed {
                    return;
                }
            }
            if next != before {
                *ctx.shared.tail_next.lock() = next;
                ctx.shared.tail_moved.notify_all();
            }
        }
    }

    /// A batch the source made (columnar path) passes the first stage, the batch it
    /// stands for, as that stage would have made it.
    pub(super) fn push_batched(&mut self, batch: Flow) {
        let Flow::Batch(b, ..) = &batch else {
            return self.push(0, batch);
        };
        debug_assert!(matches!(self.stages.first(), Some(Stage::Batch(_))));
        let c = self.counters(0);
        c.add(&c.items_in, b.len() as u64);
        c.add(&c.items_out, 1);
        self.push(1, batch);
    }

    /// The mark stages `0..upto` make now: for the stages before the parallel stage whose
    /// result is going on ([`TailRun::upstream`]), as of when that item entered it; for the
    /// others, as they are.
    pub(super) fn snapshot(&self, upto: usize) -> Upstream {
        let mut up = match &self.upstream {
            Some(u) => (**u).clone(),
            None => Upstream {
                upto: 0,
                broken: None,
                last_seq: self.last_seq,
                shuffle_ops: vec![0; self.stages.len()],
                stages: Vec::with_capacity(upto),
            },
        };
        if up.upto >= upto {
            return up;
        }
        let mirror = self.ctx.shared.shuffle.lock();
        for i in up.upto..upto {
            up.stages
                .push(match self.stages[i].seq_ref().map(TailStage::mark) {
                    None => StageMark::Fixed(StageState::Stateless),
                    Some(Ok(m)) => m,
                    Some(Err(why)) => {
                        up.broken = Some(why);
                        StageMark::Fixed(StageState::Stateless)
                    }
                });
            up.shuffle_ops[i] = mirror.ops_of(i);
        }
        up.upto = upto;
        up
    }

    /// Stage `i` (an unbatch) hands on the samples of the batch of `members` from the
    /// `from`-th on, noting how many it has handed on (a checkpoint names the rest).
    pub(super) fn cut_out(
        &mut self,
        i: usize,
        members: Arc<[Key]>,
        samples: Vec<Sample>,
        from: u32,
    ) {
        if let Stage::Unbatch(u) = &mut self.stages[i] {
            u.cutting = Some(members.clone());
            u.sent = from;
        }
        let c = self.counters(i);
        for (k, sample) in samples.into_iter().enumerate().skip(from as usize) {
            let Some(key) = members.get(k) else { break };
            let el = Element {
                seq: 0,
                pos: key.pos(),
                sample,
                hold: None,
            };
            if let Stage::Unbatch(u) = &mut self.stages[i] {
                u.sent = k as u32 + 1;
            }
            c.add(&c.items_out, 1);
            self.push(i + 1, Flow::Elem(el, Some((members.clone(), k as u32))));
            if self.failed {
                return;
            }
        }
        if let Stage::Unbatch(u) = &mut self.stages[i] {
            u.cutting = None;
            u.sent = 0;
        }
    }

    /// Ends the run with `e`, after what was finished before it.
    pub(super) fn fail(&mut self, e: Error) {
        self.out_buf.push(OutMsg::Err(e));
        self.flush_out();
        self.failed = true;
    }

    /// Hands the finished items to the consumer.
    pub(super) fn flush_out(&mut self) {
        if self.out_buf.is_empty() {
            return;
        }
        let chunk = std::mem::take(&mut self.out_buf);
        let out_i = self.ctx.shared.stats.stages.len() - 1;
        let c = self.ctx.shared.stats.stage(out_i);
        let t0 = Instant::now();
        if self.out.send(chunk).is_err() {
            self.failed = true;
        }
        c.add(&c.wait_ns, t0.elapsed().as_nanos() as u64);
        c.queue_len.store(self.out.len() as u64, Ordering::Relaxed);
    }

    pub(super) fn error(&mut self, e: Error) {
        if self.ctx.policy == ErrorPolicy::Skip && e.kind.skippable() {
            self.ctx.shared.stats.skip(&e);
        } else {
            self.fail(e);
        }
    }

    pub(super) fn counters(&self, i: usize) -> Arc<StageCounters> {
        self.ctx.shared.stats.stage(self.ctx.tail_offset + i)
    }

    /// Pushes one flow item into stage `i` (and on down).
    pub(super) fn push(&mut self, i: usize, item: Flow) {
        if self.failed {
            return;
        }
        if i == self.stages.len() {
            self.emit(item);
            return;
        }
        match self.stages[i] {
            Stage::Par(_) => return self.enter_par(i, item),
            Stage::Fused => return self.push(i + 1, item),
            _ => {}
        }
        let c = self.counters(i);
        c.add(&c.items_in, 1);
        let t0 = Instant::now();
        let mut outs: Vec<Flow> = Vec::new();
        let r = {
            let cx = self.stage_cx(i, &c);
            match self.stages[i].seq() {
                Some(stage) => stage.push(item, &cx, &mut outs),
                None => unreachable!("handled above"),
            }
        };
        let t1 = Instant::now();
        c.add(&c.busy_ns, (t1 - t0).as_nanos() as u64);
        stoker_core::trace::span_sampled("stage", i, (t0, t1), || {
            self.ctx.shared.stats.stages[self.ctx.tail_offset + i]
                .0
                .clone()
                .into()
        });
        match r {
            Err(e) => return self.error(e),
            // A batch an unbatch stage cuts: its samples go on one by one.
            Ok(Some((members, samples))) => return self.cut_out(i, members, samples, 0),
            Ok(None) => {}
        }
        for o in outs {
            c.add(&c.items_out, 1);
            if let Some(stage) = self.stages[i].seq() {
                stage.sent(&o);
            }
            self.push(i + 1, o);
        }
        if let Some(stage) = self.stages[i].seq() {
            stage.pushed();
        }
    }

    /// End of the epoch from stage `i` on: drain the shuffle, emit a last partial batch.
    pub(super) fn flush(&mut self, i: usize) {
        if i >= self.stages.len() || self.failed {
            return;
        }
        if matches!(self.stages[i], Stage::Par(_)) {
            while !self.failed && self.par(i).outstanding > 0 {
                self.await_par(i);
            }
            return self.flush(i + 1);
        }
        loop {
            let c = self.counters(i);
            let r = {
                let cx = self.stage_cx(i, &c);
                match self.stages[i].seq() {
                    Some(stage) => stage.flush(&cx),
                    None => Ok(None),
                }
            };
            let item = match r {
                Ok(Some(item)) => item,
                Ok(None) => break,
                Err(e) => return self.error(e),
            };
            c.add(&c.items_out, 1);
            if let Some(stage) = self.stages[i].seq() {
                stage.sent(&item);
            }
            self.push(i + 1, item);
            if self.failed {
                return;
            }
        }
        self.flush(i + 1);
    }

    pub(super) fn emit(&mut self, item: Flow) {
        let (item, hold) = match item {
            Flow::Elem(e, _) => (Item::Sample(e.sample), e.hold),
            Flow::Batch(b, _, hold) => (Item::Batch(b), hold),
        };
        self.yielded_in_epoch += 1;
        let up = self.snapshot(self.stages.len());
        let mark = Mark {
            broken: up.broken,
            epoch: self.epoch,
            last_seq: up.last_seq,
            shuffle_ops: up.shuffle_ops,
            stages: up.stages,
            yielded_in_epoch: self.yielded_in_epoch,
        };
        let out_i = self.ctx.shared.stats.stages.len() - 1;
        let c = self.ctx.shared.stats.stage(out_i);
        c.add(&c.items_in, 1);
        c.add(&c.bytes, item.size_bytes() as u64);
        // Batches go at once; samples in chunks, or at once when the consumer is waiting.
        let now = matches!(item, Item::Batch(_)) || self.out.is_empty();
        self.out_buf.push(OutMsg::Item(item, mark, hold));
        if now || self.out_buf.len() >= OUT_CHUNK {
            self.flush_out();
        }
    }
}

/// Slots for the batch stage ([`BatchSlots`]: the producer's last operator writes a
/// sample's tensor where the batch will stack it) when the producer feeds a batch stage
/// directly, in order (a run that is not deterministic numbers samples as they finish, so
/// the prediction would rarely hold). `STOKER_BATCH_SLOTS=0` turns them off, to measure
/// what they save.
pub(super) fn batch_slots(
    ph: &Physical,
    columnar: bool,
    deterministic: bool,
) -> Option<Arc<BatchSlots>> {
    let off = std::env::var("STOKER_BATCH_SLOTS").is_ok_and(|v| v == "0");
    match ph.tail.first() {
        Some(TailOp::Batch(n, ..))
            if !off && !columnar && deterministic && !ph.producer.is_empty() =>
        {
            Some(Arc::new(BatchSlots::new(*n)))
        }
        _ => None,
    }
}

/// The batch of `members`; `stacker`, when given, has been pushed every member's sample
/// in order (the batch stage's eager stacking).
pub(super) fn collate_elems(
    members: Vec<(Element, CutFrom)>,
    stacker: Option<Stacker>,
    collate: &CollatePolicy,
) -> Result<Flow, Error> {
    let keys = members
        .iter()
        .map(|(e, c)| Key::of_sample(e.pos, c))
        .collect();
    let mut hold: Option<Reservation> = None;
    let mut samples = Vec::with_capacity(members.len());
    for (e, _) in members {
        samples.push(e.sample);
        if let Some(r) = e.hold {
            match &mut hold {
                Some(h) => h.merge(r),
                None => hold = Some(r),
            }
        }
    }
    let b = match stacker {
        Some(st) => st.finish(&mut samples, collate)?,
        None => Batch::collate(&samples, collate)?,
    };
    Ok(Flow::Batch(b, keys, hold))
}

/// A block a pack stage made, as the next stage takes it: it counts in the budget (the
/// documents it was made of left it with them).
fn block(budget: &MemoryBudget, pos: Pos, sample: Sample) -> Flow {
    let hold = Some(budget.count_held(sample.size_bytes() as u64));
    Flow::Elem(
        Element {
            seq: 0,
            pos,
            sample,
            hold,
        },
        None,
    )
}
