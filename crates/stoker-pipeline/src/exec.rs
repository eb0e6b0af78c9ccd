//! The executor: threads, bounded queues, ordered reassembly, the sequential tail, and the
//! checkpoints that make a run resumable.
//!
//! ```text
//! source thread ──work queue──▶ N workers (fused per-sample ops) ──▶ reorder ──▶ tail thread
//!   (fetch/parse,                 (CPU pool, autotuned)              (by seq)    (shuffle, batch,
//!    cursor history)                    ▲                                        take/skip; marks)
//!                                       └──── maps after a tail stage ◀──────────┘  │
//!                                             (same workers, reordered by the tail) ▼
//!                                                                   ──output queue──▶ consumer
//! ```
//!
//! **Order.** The source numbers what it emits (`seq`); workers finish in any order; the
//! tail takes results strictly by `seq` (unless the run is not deterministic), so the
//! output does not depend on the number of workers or their timing. Every random choice is
//! a pure function of (seed, epoch, position), see [`crate::rng`].
//!
//! **Maps after a tail stage.** The sequential stages (shuffle, batch, unbatch, pack,
//! take, skip) run on the tail thread; a run of consecutive maps and filters between or
//! after them (a Python function after a shuffle buffer, column-wise operators or a Python
//! function on batches) is a [`ParStage`]: the tail numbers the items entering it and
//! hands them to the same workers in chunks (the workers take such work before the
//! source's, being nearer the consumer), and passes the results on to the next stage in
//! that order (as they finish when the run is not deterministic). Meanwhile the stages
//! before it go on, so each item takes along its mark as of those stages ([`Upstream`]),
//! and the stages after it complete the mark: a checkpoint is exactly the one a single
//! thread running every stage would have taken. A parallel stage holds a bounded number of
//! items ([`TailRun::par_cap`]); when it is full the tail waits for its next result, so
//! it stops taking from the source and the window and the budget hold the source back.
//!
//! **The columnar path.** For a format that decodes columns (Parquet) with a `batch` first
//! (at most `rename`/`select`/`drop` before it) and one shard at a time, the source cuts
//! the decoded columns into the batch's rows itself and emits one item per batch, which a
//! worker collates ([`Batch::from_columns`]) and the tail passes on as that batch stage's
//! output. The batches, positions and errors are the row path's (see `source`; the choice
//! and its reason are in [`explain`]); the window then counts batches.
//!
//! **Memory.** Every queue is bounded, and the source may not run more than `window`
//! samples ahead of the tail: a slow consumer stops the whole pipeline, it never grows it.
//! A sample holds a reservation in the run's budget from the source to the consumer; the
//! source reserves what the operators are expected to need for it at once (learnt from the
//! samples so far, [`expected_bytes`]), and an operator tops it up before it allocates a
//! buffer (a decoded frame) through its [`OpContext`], waiting first in line when there is
//! no room; the reservation shrinks to the sample's bytes when its operators return. A
//! source that waits [`BUDGET_WAIT`] for room ends the run with its own error (no sample is
//! at fault); an operator that waits as long fails its sample.
//!
//! **Resume.** Each item handed to the consumer carries a mark: the epoch, the last `seq`
//! the tail had taken in, the position of each shuffle buffer's undo log, and the small
//! state of the other tail stages (a partial batch's positions, take/skip counters). The
//! source keeps the cursor it had after each `seq` until the consumer is past it, and the
//! shuffle stage keeps an undo log of its moves. So [`Run::state`] can give the state as of
//! the last item the consumer took (not as of what the pipeline has read ahead): the source
//! cursor after that `seq`, and the shuffle buffers rewound to that moment, as positions. A
//! restored run reopens the source at the cursor and reads the buffered positions again.
//!
//! An item in the tail carries what it is made of as positions (a [`Key`]): a sample its
//! source position, a batch its samples' keys, and a sample `unbatch` cut from a batch that
//! batch's keys and its place in it (such a sample can depend on the whole batch: a padding
//! collate, operators on batches). So a shuffle buffer of batches, or of cut samples, is
//! checkpointed as positions too, and made again on resume by reading the samples, collating
//! and cutting them again. An unbatch stage notes the batch it is cutting and how many of
//! its samples it has handed on; a restored run hands on the rest first (as the first run
//! did after the checkpoint), from the deepest stage up, as a pack stage replays its
//! documents.
//!
//! **Where things are.** This file starts a [`Run`] (the plan from [`crate::optimize`], the
//! [`Resources`] resolved once, the threads) and iterates it. The source thread is
//! `feed`, the worker pool `worker`, applying a chain of operators (everywhere) `chain`,
//! the tail thread and its sequential stages `tail`, the parallel stages in the tail `par`,
//! marks and [`Run::state`] `marks`, [`Run::explain`] `report`, resume `restore`, the
//! autotuner `tuner`, the I/O runtime and the budget wait `runtime`. The checkpoint types are in [`crate::state`].
//! The submodules use each other's items (a tail stage hands items to the parallel stages,
//! which hand results back to the tail): they are one executor split by concern, not
//! layers.

mod chain;
mod feed;
mod marks;
mod opcache;
pub(crate) use opcache::clear_shared_caches;
mod par;
mod report;
mod restore;
mod runtime;
mod tail;
mod timeline;
mod tuner;
mod worker;

use crate::optimize::{explain, optimize, producer_name, read_path, Facts, ReadPath, TailOp};
use crate::plan::{FormatChoice, Pipeline};
use crate::source::{Dataset, Produced, SourceConfig, SourceCursor};
use crate::state::PipelineState;
use crate::stats::{Stats, StatsHub};
use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError};
use marks::{resumable, Mark, ShuffleMirror};
use par::{ParDone, ParOps, ParWork};
use parking_lot::{Condvar, Mutex};
use runtime::{budget_wait, Charging, Resources, RunRuntime};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use stoker_core::{Batch, BatchSlots, Error, MemoryBudget, Reservation, Sample};
use tail::{batch_slots, TailCtx};
use worker::{Done, Pool, CHUNK};

/// What a pipeline yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A sample.
    Sample(Sample),
    /// A batch.
    Batch(Batch),
}

impl Item {
    /// Samples in it.
    pub fn samples(&self) -> usize {
        match self {
            Item::Sample(_) => 1,
            Item::Batch(b) => b.len(),
        }
    }
    /// The sample, if it is one.
    pub fn into_sample(self) -> Option<Sample> {
        match self {
            Item::Sample(s) => Some(s),
            Item::Batch(_) => None,
        }
    }
    /// The batch, if it is one.
    pub fn into_batch(self) -> Option<Batch> {
        match self {
            Item::Batch(b) => Some(b),
            Item::Sample(_) => None,
        }
    }
    fn size_bytes(&self) -> usize {
        match self {
            Item::Sample(s) => s.size_bytes(),
            Item::Batch(b) => b.size_bytes(),
        }
    }
}

enum OutMsg {
    Item(Item, Mark, Option<Reservation>),
    Err(Error),
}

struct Shared {
    stats: StatsHub,
    history: Mutex<VecDeque<(u64, u64, SourceCursor)>>,
    epoch_start: Mutex<HashMap<u64, SourceCursor>>,
    shuffle: Mutex<ShuffleMirror>,
    stop: AtomicBool,
    tail_next: Mutex<u64>,
    tail_moved: Condvar,
    active: AtomicUsize,
    /// The workers' running average of nanoseconds per sample (0 until measured): sizes
    /// the source's hand-offs.
    sample_cost_ns: AtomicU64,
    /// The batch stage's slots, when the producer's last operator feeds it directly (see
    /// [`batch_slots`]).
    slots: Option<Arc<BatchSlots>>,
    /// The run's memory budget, which operators charge their buffers to (see
    /// [`OpContext::reserve`]).
    budget: MemoryBudget,
    /// How long the source and the operators wait for budget ([`budget_wait`]).
    budget_wait: Duration,
    /// A sample has been through the workers' operators, so the source's estimate of what
    /// a sample becomes is a measurement, not a guess: until then it admits one sample.
    warm: AtomicBool,
    /// The profiles of the workers' operators (see [`crate::stats::OpProfile`]).
    producer_profile: Vec<Arc<crate::stats::OpProfile>>,
    /// The workers' cache of samples at the optimizer's cache point, when the plan has one.
    op_cache: Option<Arc<opcache::OpCache>>,
    /// The run's timeline (see [`crate::profile`]).
    timeline: Mutex<Vec<crate::profile::TimePoint>>,
}

impl Shared {
    fn charging(&self) -> Charging<'_> {
        (&self.budget, self.budget_wait)
    }
}

/// A running pipeline: an iterator of items, with [`Run::state`] and [`Run::stats`].
pub struct Run {
    out: Receiver<Vec<OutMsg>>,
    ready: VecDeque<OutMsg>,
    shared: Arc<Shared>,
    last: Option<Mark>,
    start: PipelineState,
    seed: u64,
    yielded: u64,
    samples: u64,
    done: bool,
    resumable: Result<(), String>,
    columnar: bool,
    budget: MemoryBudget,
    store: Option<stoker_store::Store>,
    storage_baseline: Option<stoker_store::MetricsSnapshot>,
    shards: usize,
    /// The pipeline as the run planned it (its format decided) and what it knew then, for
    /// [`Run::explain`].
    planned: (Pipeline, Facts),
    threads: Vec<JoinHandle<()>>,
    runtime: Option<RunRuntime>,
    /// The consumer's clock (its wait and its step, see [`crate::profile`]).
    clock: timeline::ConsumerClock,
    /// Seconds from the start to the first item.
    first_item_s: Option<f64>,
    /// Dropped to stop the timeline's sampler.
    sampler_stop: Option<crossbeam_channel::Sender<()>>,
    /// Keeps idle batch buffers for this run and the next ([`stoker_core::recycle`]).
    _buffers: stoker_core::recycle::Hold,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("yielded", &self.yielded)
            .field("done", &self.done)
            .finish()
    }
}

impl Pipeline {
    /// Starts the pipeline from the beginning. Call it outside async code (it starts its own
    /// I/O runtime and lists the source before returning).
    pub fn run(&self) -> Result<Run, Error> {
        Run::start(self, None)
    }

    /// Starts the pipeline from a state given by [`Run::state`] of a run of the same
    /// pipeline: it yields exactly the items that run had not yet yielded.
    pub fn resume(&self, state: &PipelineState) -> Result<Run, Error> {
        Run::start(self, Some(state.clone()))
    }

    /// The optimizer's plan, with its reasons.
    pub fn explain(&self) -> String {
        explain(self)
    }
}

impl Run {
    fn start(p: &Pipeline, state: Option<PipelineState>) -> Result<Run, Error> {
        p.validate()?;
        let Resources {
            runtime,
            opened,
            budget,
        } = Resources::resolve(p)?;
        if let Some(s) = &state {
            s.check_epoch(p.first_epoch)?;
        }
        let mut ds = Dataset::resolve(
            &p.source,
            &p.format,
            runtime.handle(),
            Some(budget.clone()),
            // The disk cache tells a changed object by its version.
            p.cache_dir.is_some(),
            opened,
        )?;
        // `auto` is decided now that the objects are listed: the plan below sees the format.
        let detected;
        let p = if matches!(p.format, FormatChoice::Auto(_)) {
            let mut q = p.clone();
            q.format = FormatChoice::Fixed(ds.format.clone());
            detected = q;
            &detected
        } else {
            p
        };
        if p.cache {
            ds.cache = Some(match &p.cache_dir {
                Some(dir) => {
                    crate::source::SampleCache::on_disk(budget.clone(), dir, p.cache_size, &ds)?
                }
                None => crate::source::SampleCache::new(budget.clone()),
            });
        }
        let ds = Arc::new(ds);
        // The caches hold `root`'s bytes; the samples the run has in flight (admitted by the
        // source, grown by the operators, in queues and batches) are counted apart too, so
        // that the profile tells them from the store's read-ahead.
        let root = budget;
        let in_flight = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let budget = root.counting(in_flight.clone());
        // The bytes an epoch reads (this rank's and part's share of them), when the listing
        // gives every size; the room a cache of samples may take: half the budget, a
        // quarter next to the pipeline's own `cache` (which takes half).
        let input_bytes = ds
            .shards
            .iter()
            .map(|s| s.size)
            .sum::<Option<u64>>()
            .map(|b| match p.rank {
                Some(r) if r.splits() => b / (r.world as u64 * r.parts.max(1) as u64),
                _ => b,
            });
        let facts = Facts {
            per_object: Some(ds.per_object),
            epochs: p.epochs,
            input_bytes,
            cache_room: Some(budget.limit() / if p.cache { 4 } else { 2 }),
            later_runs: p.later_runs(),
            ..Facts::default()
        };
        let mut ph = optimize(&p.ops, &facts, &p.options.disable);
        let columnar = match read_path(p, &ph) {
            ReadPath::Columnar(c) => {
                // The structural operators run in the source, on each chunk's names.
                ph.producer.clear();
                Some(Arc::new(c))
            }
            _ => None,
        };
        if !ph.producer.is_empty() {
            // Operators may grow samples: reserve conservatively until one is measured.
            ds.growth.store(0, Ordering::Relaxed);
        }
        // The window counts what the source emits: batches on the columnar path.
        let window = match &columnar {
            Some(c) => (p.options.window / c.size).max(2),
            None => p.options.window,
        };
        let contiguous = crate::split::choose(p).is_some_and(|(c, _)| c);
        let counts = if contiguous {
            // The shard index is read with the source's store options (same endpoint,
            // same credentials).
            let options = match &p.source {
                crate::plan::Source::Url { options, .. } => (**options).clone(),
                _ => stoker_store::StoreOptions::default(),
            };
            Some(crate::source::record_counts(
                &ds,
                p.shard_index.as_deref(),
                &options,
            )?)
        } else {
            None
        };
        let mut cfg = SourceConfig {
            // Set below, with the workers' cache.
            held_ahead: None,
            // A shuffle the optimizer made a permutation of the objects at the source.
            shuffle_shards: p.shuffle_shards || ph.permute,
            cycle: p.cycle,
            rank: p.rank,
            seed: p.seed,
            columnar,
            counts,
            span: p.span,
        };
        if let Some(s) = &state {
            s.check_fits(p.seed, ph.tail.len(), contiguous)?;
        }
        let resumable = resumable(&ph.tail, p.options.deterministic);
        let mut names = vec![format!(
            "source({}{})",
            ds.format.name(),
            match (&p.cache, &p.cache_dir) {
                (true, Some(d)) => format!(", cached on disk in {}", d.display()),
                (true, None) => ", cached".to_string(),
                _ => String::new(),
            }
        )];
        if !ph.producer.is_empty() {
            names.push(producer_name(&ph.producer));
        }
        names.extend(ph.tail.iter().map(TailOp::name));
        names.push(format!("prefetch({})", ph.prefetch));
        let threads = p.options.threads.max(1);
        // Every operator that runs per item, in the order they run, for the profile.
        let operators: Vec<(usize, stoker_core::OpMeta)> = ph
            .producer
            .iter()
            .map(|(i, op)| (*i, op.meta()))
            .chain(ph.tail.iter().filter_map(|t| match t {
                TailOp::Map(i, op) => Some((*i, op.meta())),
                _ => None,
            }))
            .collect();
        let mut stats = StatsHub::new(
            names,
            ds.cache.as_ref().map(|c| c.counters.clone()),
            operators,
        );
        let op_cache = ph.cache.map(|c| {
            Arc::new(match &p.source {
                crate::plan::Source::Url { url, .. } if c.shared => {
                    let head: Vec<&dyn std::fmt::Debug> = ph.producer[..c.after]
                        .iter()
                        .map(|(_, op)| op as &dyn std::fmt::Debug)
                        .collect();
                    let made_by = opcache::fingerprint(&ds.shards, &p.format, &head);
                    opcache::OpCache::shared(url, made_by, c.after, c.limit, &root, c.watch)
                }
                _ => opcache::OpCache::new(c.after, c.limit, root.clone(), c.watch),
            })
        });
        stats.sample_cache = op_cache.as_ref().map(|c| c.counters.clone());
        stats.in_flight = in_flight;
        cfg.held_ahead = op_cache
            .clone()
            .map(|c| c as Arc<dyn crate::source::HeldAhead>);
        let producer_profile = stats.profiles(ph.producer.iter().map(|(i, _)| *i));
        let shared = Arc::new(Shared {
            stats,
            producer_profile,
            op_cache,
            timeline: Mutex::new(Vec::new()),
            history: Mutex::new(VecDeque::new()),
            epoch_start: Mutex::new(HashMap::new()),
            shuffle: Mutex::new(ShuffleMirror::new(ph.tail.len())),
            stop: AtomicBool::new(false),
            tail_next: Mutex::new(0),
            tail_moved: Condvar::new(),
            active: AtomicUsize::new(threads),
            sample_cost_ns: AtomicU64::new(0),
            slots: batch_slots(&ph, cfg.columnar.is_some(), p.options.deterministic),
            budget: budget.clone(),
            budget_wait: budget_wait(),
            warm: AtomicBool::new(false),
        });
        shared
            .stats
            .threads
            .store(threads as u64, Ordering::Relaxed);
        let start_state = state.clone().unwrap_or_else(|| {
            let stages = ph.tail.iter().map(marks::initial_stage).collect();
            PipelineState::initial(p.seed, p.first_epoch, stages, contiguous)
        });

        // Hand-offs carry chunks of up to CHUNK samples: one wake-up per chunk, not per
        // sample (measured: per-sample hand-offs cost 6-10 us a sample, docs/benchmarks-history.md).
        let (work_tx, work_rx) = bounded::<(u64, Vec<Produced>)>((window / CHUNK).max(2));
        let (done_tx, done_rx) = unbounded::<Done>();
        let (out_tx, out_rx) = bounded::<Vec<OutMsg>>(ph.prefetch);
        // The queues' capacities, for the profile's occupancy (the source's work queue
        // holds chunks; the output queue, chunks of items).
        let last = shared.stats.stages.len() - 1;
        for (i, cap) in [(0, (window / CHUNK).max(2)), (last, ph.prefetch)] {
            let c = shared.stats.stage(i);
            c.queue_cap.store(cap as u64, Ordering::Relaxed);
        }
        // Work for the parallel stages after the tail's sequential ones, and its results.
        // Unbounded: the tail bounds what it hands out (`TailRun::par_cap`).
        let (par_tx, par_rx) = unbounded::<ParWork>();
        let (par_done_tx, par_done_rx) = unbounded::<ParDone>();
        let tail_offset = if ph.producer.is_empty() { 1 } else { 2 };
        let par_ops = ParOps::for_tail(&ph.tail, &shared.stats, tail_offset);
        let has_par = par_ops.iter().any(Option::is_some);
        let producer = Arc::new(ph.producer.clone());
        // On the columnar path the workers collate: their time is the batch stage's.
        let columnar = cfg.columnar.is_some();
        let pool = Pool {
            threads,
            producer: producer.clone(),
            shared: shared.clone(),
            map_stage: (!ph.producer.is_empty()).then(|| shared.stats.stage(1)),
            collate_stage: columnar.then(|| shared.stats.stage(1)),
            seed: p.seed,
            ds: ds.clone(),
        };
        let par = has_par.then_some((par_rx, par_done_tx));
        let mut handles = pool.spawn((work_rx, done_tx.clone()), par);
        let tail_ctx = TailCtx {
            ds: ds.clone(),
            budget: budget.clone(),
            cfg,
            shared: shared.clone(),
            ph_tail: ph.tail.clone(),
            producer,
            seed: p.seed,
            first_epoch: p.first_epoch,
            // The epoch to stop at, counted from the first.
            epochs: p.epochs.map(|n| p.first_epoch.saturating_add(n)),
            policy: p.options.errors,
            deterministic: p.options.deterministic,
            window: window as u64,
            threads,
            autotune: p.options.autotune,
            state: state.clone(),
            tail_offset,
            par_ops,
        };
        handles.push(
            std::thread::Builder::new()
                .name("stoker-tail".into())
                .spawn(move || {
                    tail_ctx.run(work_tx, done_tx, done_rx, out_tx, (par_tx, par_done_rx))
                })
                .expect("spawn tail"),
        );
        let (sampler_stop, sampler_rx) = bounded::<()>(0);
        let view = timeline::StatsView {
            shared: shared.clone(),
            budget: budget.clone(),
            store: ds.store.clone(),
            baseline: ds.storage_baseline.clone(),
        };
        handles.extend(timeline::spawn(view, sampler_rx));
        Ok(Run {
            out: out_rx,
            ready: VecDeque::new(),
            shared,
            last: None,
            yielded: start_state.yielded,
            samples: start_state.samples_yielded,
            seed: p.seed,
            start: start_state,
            done: false,
            resumable,
            columnar,
            budget,
            store: ds.store.clone(),
            storage_baseline: ds.storage_baseline.clone(),
            shards: ds.shards.len(),
            planned: (p.clone(), facts),
            threads: handles,
            runtime: Some(runtime),
            clock: timeline::ConsumerClock::default(),
            first_item_s: None,
            sampler_stop: Some(sampler_stop),
            _buffers: stoker_core::recycle::GLOBAL.hold(),
        })
    }

    /// Statistics now (cheap; safe to call while iterating from another thread's copy).
    pub fn stats(&self) -> Stats {
        self.view().stats()
    }

    /// Whether the source reads columns straight into batches (the columnar path; see
    /// [`Pipeline::explain`] for why or why not).
    pub fn columnar(&self) -> bool {
        self.columnar
    }

    /// Number of shards (objects) in the dataset.
    pub fn shards(&self) -> usize {
        self.shards
    }
}

impl Iterator for Run {
    type Item = Result<Item, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        self.clock.ask(&self.shared);
        let prefetch = self.shared.stats.stages.len() - 1;
        let out_stage = self.shared.stats.stage(prefetch);
        out_stage
            .queue_len
            .store(self.out.len() as u64, Ordering::Relaxed);
        if self.ready.is_empty() {
            if let Ok(chunk) = self.out.recv() {
                self.ready.extend(chunk);
            }
        }
        self.clock.got(&self.shared);
        match self.ready.pop_front().ok_or(()) {
            Ok(OutMsg::Item(item, mark, hold)) => {
                if self.first_item_s.is_none() {
                    self.first_item_s = Some(self.shared.stats.started.elapsed().as_secs_f64());
                }
                // The consumer owns the item now: its bytes leave the budget.
                drop(hold);
                self.yielded += 1;
                let n = item.samples() as u64;
                self.samples += n;
                self.shared.stats.items.fetch_add(1, Ordering::Relaxed);
                self.shared.stats.samples.fetch_add(n, Ordering::Relaxed);
                out_stage.add(&out_stage.items_out, 1);
                // What the consumer is past can be forgotten.
                if let Some(seq) = mark.last_seq {
                    let mut h = self.shared.history.lock();
                    while h
                        .front()
                        .is_some_and(|(e, s, _)| (*e, *s) < (mark.epoch, seq))
                    {
                        h.pop_front();
                    }
                }
                self.shared
                    .shuffle
                    .lock()
                    .keep_from
                    .clone_from(&mark.shuffle_ops);
                self.last = Some(mark);
                Some(Ok(item))
            }
            Ok(OutMsg::Err(e)) => {
                self.done = true;
                Some(Err(e))
            }
            Err(_) => {
                self.done = true;
                None
            }
        }
    }
}

impl Run {
    /// Like [`Iterator::next`], but waits at most `timeout` for the next item: `None` when
    /// none arrived in time, and then the run is as it was (call again). For consumers that
    /// must stay responsive while they wait, such as the Python binding, which checks for
    /// Ctrl-C between waits.
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Option<Result<Item, Error>>> {
        if !self.done {
            self.clock.ask(&self.shared);
        }
        if !self.done && self.ready.is_empty() {
            match self.out.recv_timeout(timeout) {
                Ok(chunk) => self.ready.extend(chunk),
                Err(RecvTimeoutError::Timeout) => return None,
                // `next` sees the closed queue at once and ends the run.
                Err(RecvTimeoutError::Disconnected) => {}
            }
        }
        Some(self.next())
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.tail_moved.notify_all();
        self.sampler_stop.take();
        // Unblock the tail if it waits for room in the output queue.
        let (_, empty) = bounded::<Vec<OutMsg>>(0);
        self.out = empty;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Without waiting for I/O tasks, so that a run may be dropped from async code too.
        if let Some(RunRuntime::Own(rt)) = self.runtime.take() {
            rt.shutdown_background();
        }
        // The batch buffers kept for this run's batches go a moment after the last run
        // (the hold's drop, after this).
    }
}
