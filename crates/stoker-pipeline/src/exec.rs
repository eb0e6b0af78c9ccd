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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender};
use parking_lot::{Condvar, Mutex};
use stoker_core::{
    Batch, BatchSlots, CollatePolicy, Error, MemoryBudget, Reservation, Sample, Stacker,
};

use crate::ops::Builtin;
use crate::ops::{OpContext, SampleOp};
use crate::pack::{Pack, PackStage, BLOCK_SHARD};
use crate::plan::{ErrorPolicy, FormatChoice, Op, Pipeline};
use crate::rng::Rng;
use crate::source::{
    materialize, run_source, Columnar, Dataset, Element, Pos, Produced, SourceConfig, SourceCursor,
};
use crate::stats::{StageCounters, Stats, StatsHub};

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

/// An item a tail stage holds, as positions: enough to make it again on resume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum ItemPos {
    /// A sample from the source: its position.
    Sample(Pos),
    /// A sample `unbatch` cut from a batch: the batch (an index into
    /// [`PipelineState::cuts`]) and the sample's place in it. Such a sample depends on the
    /// whole batch (a padding collate, operators on batches), so the batch is made again.
    Cut {
        /// Index into [`PipelineState::cuts`].
        cut: u32,
        /// Place in that batch.
        index: u32,
    },
    /// A batch: its samples, in order.
    Batch(Vec<ItemPos>),
}

/// A tail stage's state in a checkpoint.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StageState {
    /// Keeps nothing.
    Stateless,
    /// A shuffle buffer: picks made this epoch, and the buffered items (samples, or
    /// batches for a shuffle after a batch) in buffer order.
    Shuffle {
        /// Picks made.
        emitted: u64,
        /// The items in the buffer.
        buffer: Vec<ItemPos>,
    },
    /// A batch being filled.
    Batch {
        /// Its samples so far.
        partial: Vec<ItemPos>,
    },
    /// An unbatch stage, cutting a batch into samples.
    Unbatch {
        /// The batch it is cutting (an index into [`PipelineState::cuts`]), if it has
        /// handed on some of its samples but not all.
        cut: Option<u32>,
        /// Samples of it handed on.
        sent: u32,
    },
    /// A take or skip counter.
    Count {
        /// Items counted this epoch.
        seen: u64,
    },
    /// A pack stage: the documents to replay (see the `pack` module).
    Pack {
        /// Blocks it handed on this epoch (the replay makes block `blocks` first).
        blocks: u64,
        /// Positions of the documents to push again, in order.
        docs: Vec<Pos>,
        /// Tokens (separators included) of the first document that were in earlier blocks.
        skip: u64,
        /// The first document's index in the epoch's stream.
        next_doc: u64,
    },
}

/// Where a run is: enough to continue it exactly, in a restored run of the same pipeline.
/// Small (positions, not data) and serialisable (serde; JSON via `to_json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PipelineState {
    /// Format version of this state.
    pub version: u32,
    /// The pipeline's seed (a state only fits a pipeline with the same seed).
    pub seed: u64,
    /// The epoch being read.
    pub epoch: u64,
    /// The source's cursor in that epoch.
    pub cursor: SourceCursor,
    /// One per tail stage.
    pub stages: Vec<StageState>,
    /// Items yielded in this epoch.
    pub yielded_in_epoch: u64,
    /// Items yielded in all.
    pub yielded: u64,
    /// Samples yielded in all.
    pub samples_yielded: u64,
    /// The batches `unbatch` cut samples from that the stages still hold samples of (or
    /// are cutting): each one's samples, in order. A batch may name earlier ones (after a
    /// second unbatch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cuts: Vec<Vec<ItemPos>>,
    /// The rank split was contiguous (the source's cursor indexes this rank's pieces).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub contiguous: bool,
}

impl PipelineState {
    /// As JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("state serialises")
    }
    /// From JSON.
    pub fn from_json(s: &str) -> Result<PipelineState, Error> {
        serde_json::from_str(s).map_err(|e| Error::invalid(format!("not a pipeline state: {e}")))
    }
}

const STATE_VERSION: u32 = 2;
/// Most samples in one hand-off between threads.
const CHUNK: usize = 64;
/// The work one hand-off to the workers aims at. A chunk of expensive samples (a decoded
/// clip, a large image) is cut short so that workers share the work and results flow in
/// order (a 64-sample chunk of 40 ms samples held the first batch back by 2.5 s), while
/// cheap samples still travel 64 at a time (a hand-off costs a few microseconds).
const CHUNK_WORK_NS: u64 = 1_000_000;

/// Samples per hand-off for samples that take `cost_ns` each on a worker (0: not measured
/// yet, start small).
fn chunk_cap(cost_ns: u64) -> usize {
    if cost_ns == 0 {
        return 4;
    }
    ((CHUNK_WORK_NS / cost_ns) as usize).clamp(1, CHUNK)
}
/// Most items in one hand-off to the consumer.
const OUT_CHUNK: usize = 32;
/// How long the source, or an operator charging a sample's buffers, waits for budget
/// before it calls the budget too small.
const BUDGET_WAIT: Duration = Duration::from_secs(10);

/// [`BUDGET_WAIT`], or `STOKER_BUDGET_WAIT_S` seconds when that is set (tests of a full
/// budget set it short); read when a run starts.
fn budget_wait() -> Duration {
    std::env::var("STOKER_BUDGET_WAIT_S")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(BUDGET_WAIT, Duration::from_secs_f64)
}

/// The error of a source that waited `wait` for `n` bytes to admit its next sample.
fn budget_full(limit: u64, wait: Duration, n: u64) -> String {
    format!(
        "the memory budget ({}) stayed full for {} s while the source waited for {} to \
         admit its next sample; this is not about one sample: what the pipeline must hold \
         at once (the shuffle buffer, the batch being filled, the queues, samples waiting \
         for one ahead of them) needs more than the budget; raise memory_limit or make the \
         shuffle buffer or the batch smaller",
        crate::ops::size(limit),
        wait.as_secs_f64(),
        crate::ops::size(n)
    )
}

/// The run's memory budget and how long an operator waits in it (see
/// [`OpContext::reserve`]).
type Charging<'a> = (&'a MemoryBudget, Duration);
const SHUFFLE_PICK: u64 = 0x5348_5546;

/// The physical plan: producer ops (parallel) and tail stages (sequential).
struct Physical {
    producer: Vec<(usize, Arc<dyn SampleOp>)>,
    tail: Vec<TailOp>,
    prefetch: usize,
    explain: Vec<String>,
}

#[derive(Debug, Clone)]
enum TailOp {
    Map(usize, Arc<dyn SampleOp>),
    Shuffle(usize),
    Batch(usize, bool, CollatePolicy),
    Pack(Arc<Pack>),
    Unbatch,
    Take(u64),
    Skip(u64),
}

impl TailOp {
    fn name(&self) -> String {
        match self {
            TailOp::Map(_, op) => format!("map[{}]", op.meta().name),
            TailOp::Shuffle(n) => format!("shuffle({n})"),
            TailOp::Batch(n, d, _) => format!("batch({n}{})", if *d { ", drop_last" } else { "" }),
            TailOp::Pack(p) => p.name(),
            TailOp::Unbatch => "unbatch".into(),
            TailOp::Take(n) => format!("take({n})"),
            TailOp::Skip(n) => format!("skip({n})"),
        }
    }
}

/// The first optimizer: per-sample operators go to the parallel workers (fused into one
/// stage) when they come before any sequential stage, or after a shuffle buffer when they
/// never drop samples (then they commute with it: a shuffle's picks depend only on how many
/// samples it has seen); a prefetch is added at the end when missing.
fn optimize(ops: &[Op]) -> Physical {
    let mut producer = Vec::new();
    let mut tail = Vec::new();
    let mut explain = Vec::new();
    let mut prefetch = None;
    // True while every tail stage so far is a shuffle (through which 1:1 maps may move).
    let mut only_shuffles = true;
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Map(m) => {
                let meta = m.meta();
                if tail.is_empty() || (only_shuffles && !meta.filters) {
                    if !tail.is_empty() {
                        explain.push(format!(
                            "moved {} before the shuffle buffer: it keeps every sample, so \
                             it commutes with the shuffle and can run on the workers",
                            meta.name
                        ));
                    }
                    producer.push((i, m.clone()));
                } else {
                    tail.push(TailOp::Map(i, m.clone()));
                }
            }
            Op::Shuffle(n) => tail.push(TailOp::Shuffle(*n)),
            Op::Batch {
                size,
                drop_last,
                collate,
            } => {
                only_shuffles = false;
                tail.push(TailOp::Batch(*size, *drop_last, collate.clone()))
            }
            Op::Pack(p) => {
                only_shuffles = false;
                tail.push(TailOp::Pack(p.clone()))
            }
            Op::Unbatch => {
                only_shuffles = false;
                tail.push(TailOp::Unbatch)
            }
            Op::Take(n) => {
                only_shuffles = false;
                tail.push(TailOp::Take(*n))
            }
            Op::Skip(n) => {
                only_shuffles = false;
                tail.push(TailOp::Skip(*n))
            }
            Op::Prefetch(n) => prefetch = Some(*n),
        }
    }
    let producer = fuse_kernels(producer, &mut explain);
    if producer.len() > 1 {
        explain.push(format!(
            "fused {} per-sample operators into one worker stage",
            producer.len()
        ));
    }
    let prefetch = prefetch.unwrap_or_else(|| {
        explain.push("added prefetch(4) at the end".into());
        4
    });
    Physical {
        producer,
        tail,
        prefetch,
        explain,
    }
}

/// The runs of consecutive map/filter operators in the tail, each at the tail stage it
/// starts at: each run is one parallel stage on the workers (see [`ParStage`]).
#[allow(clippy::type_complexity)]
fn par_runs(tail: &[TailOp]) -> Vec<Option<Vec<(usize, Arc<dyn SampleOp>)>>> {
    let mut out: Vec<Option<Vec<(usize, Arc<dyn SampleOp>)>>> = vec![None; tail.len()];
    let mut start = None;
    for (j, t) in tail.iter().enumerate() {
        match t {
            TailOp::Map(i, op) => {
                let s = *start.get_or_insert(j);
                out[s].get_or_insert_with(Vec::new).push((*i, op.clone()));
            }
            _ => start = None,
        }
    }
    out
}

/// Replaces runs of adjacent operators that have a fused kernel (a decode then a random
/// resized crop of the same field, with the flip and float conversion after it) by it. The
/// fused operator draws from the same generators as the operators it replaces (see
/// `image_ops::fuse`), so results do not change.
fn fuse_kernels(
    ops: Vec<(usize, Arc<dyn SampleOp>)>,
    explain: &mut Vec<String>,
) -> Vec<(usize, Arc<dyn SampleOp>)> {
    let mut out: Vec<(usize, Arc<dyn SampleOp>)> = Vec::with_capacity(ops.len());
    let mut k = 0;
    while k < ops.len() {
        match crate::image_ops::fuse(&ops[k..]) {
            Some((n, index, fused)) => {
                let names: Vec<String> =
                    ops[k..k + n].iter().map(|(_, op)| op.meta().name).collect();
                explain.push(format!(
                    "{} run as one kernel: only the crop's region is decoded, at the \
                     smallest DCT scale that covers the output",
                    names.join(", ")
                ));
                out.push((index, fused));
                k += n;
            }
            None => {
                out.push(ops[k].clone());
                k += 1;
            }
        }
    }
    out
}

/// How the source reads a format that decodes columns (Parquet).
enum ReadPath {
    /// The format reads rows only: no choice to make.
    RowsOnly,
    /// Rows as samples, for this reason.
    Rows(String),
    /// Columns straight into the first batch.
    Columnar(Columnar),
}

/// The columnar path (see `source`) when it gives exactly what the row path gives: a
/// format that decodes columns, the shards read one at a time (no interleave, no
/// interleaved rank split, no sample cache), and a `batch` first, with at most `rename`/`select`/`drop`
/// before it (they only move names). Anything else that works per sample before the batch
/// (a map, a filter, a shuffle buffer, take/skip) needs the samples: the row path.
fn read_path(p: &Pipeline, ph: &Physical) -> ReadPath {
    let FormatChoice::Fixed(f) = &p.format else {
        return ReadPath::RowsOnly;
    };
    if !f.reads_columns() || matches!(p.source, crate::plan::Source::Memory(_)) {
        return ReadPath::RowsOnly;
    }
    let why = if !p.options.columnar {
        Some("the columnar path is turned off (options.columnar = false)".to_string())
    } else if p.cycle > 1 {
        Some(format!(
            "interleave = {} takes rows from {} shards in turn",
            p.cycle, p.cycle
        ))
    } else if p.rank.is_some_and(|r| r.splits())
        && !crate::split::choose(p).is_some_and(|(contiguous, _)| contiguous)
    {
        Some("the interleaved rank split deals rows out one round at a time".into())
    } else if p.cache {
        Some("cache keeps parsed samples".into())
    } else if let Some((_, op)) = ph.producer.iter().find(|(_, op)| {
        !matches!(
            op.as_builtin(),
            Some(Builtin::Rename { .. } | Builtin::Select { .. } | Builtin::Drop { .. })
        )
    }) {
        Some(format!(
            "{} runs on each sample before the batch",
            op.meta().name
        ))
    } else {
        match ph.tail.first() {
            None => Some("there is no batch: the pipeline yields samples".into()),
            Some(TailOp::Batch(size, drop_last, collate)) => {
                return ReadPath::Columnar(Columnar {
                    size: *size,
                    drop_last: *drop_last,
                    collate: Arc::new(collate.clone()),
                    ops: ph.producer.clone(),
                })
            }
            Some(t) => Some(format!(
                "{} comes before the batch and needs samples",
                t.name()
            )),
        }
    };
    ReadPath::Rows(why.unwrap_or_default())
}

/// Describes the plan the optimizer produces for `p` (stage names and its reasons).
pub fn explain(p: &Pipeline) -> String {
    let mut ph = optimize(&p.ops);
    let mut s = String::from("logical:\n");
    for op in &p.ops {
        s.push_str(&format!("  {}\n", op_name(op)));
    }
    if matches!(p.format, FormatChoice::Auto(_)) {
        ph.explain.push(
            "format auto: a run picks the format from the listed objects' extensions, then \
             its plan (the columnar path, the rank split) follows that format"
                .into(),
        );
    }
    match read_path(p, &ph) {
        ReadPath::RowsOnly => s.push_str("physical:\n  source\n"),
        ReadPath::Rows(why) => {
            s.push_str("physical:\n  source (rows)\n");
            ph.explain.push(format!(
                "rows: each row becomes a sample, because {why} (the columnar path needs \
                 a batch first, at most rename/select/drop before it, and one shard at a \
                 time)"
            ));
        }
        ReadPath::Columnar(c) => {
            s.push_str(&format!(
                "physical:\n  source (columnar: batches of {}{})\n",
                c.size,
                if c.ops.is_empty() {
                    String::new()
                } else {
                    format!(", with {}", producer_name(&c.ops))
                }
            ));
            ph.explain.push(format!(
                "columnar: the source cuts decoded columns into batches of {} across row \
                 groups and files and the workers collate them, with no sample per row \
                 (the same batches as the row path)",
                c.size
            ));
            ph.producer.clear();
        }
    }
    if !ph.producer.is_empty() {
        s.push_str(&format!("  workers: {}\n", producer_name(&ph.producer)));
    }
    if let Some((_, why)) = crate::split::choose(p) {
        ph.explain.push(why);
    }
    let runs = par_runs(&ph.tail);
    let mut k = 0;
    while k < ph.tail.len() {
        let Some(ops) = &runs[k] else {
            s.push_str(&format!("  {}\n", ph.tail[k].name()));
            k += 1;
            continue;
        };
        let order = if p.options.deterministic {
            "in order"
        } else {
            "as they finish"
        };
        s.push_str(&format!("  workers: {} ({order})\n", producer_name(ops)));
        let after = ph.tail[..k]
            .iter()
            .rev()
            .find(|t| !matches!(t, TailOp::Map(..)))
            .map_or_else(String::new, TailOp::name);
        ph.explain.push(
            format!(
                "{} after {after} runs on the workers too, several items at once, while the \
             stages before it go on; its results go on {}",
                producer_name(ops),
                if p.options.deterministic {
                    "in the order its items came (deterministic)"
                } else {
                    "as they finish (deterministic = false)"
                }
            ) + &format!(
                "; while it costs less than handing an item over (under {} us an item, measured), \
             it runs on the tail thread instead",
                INLINE_NS / 1000
            ),
        );
        k += ops.len();
    }
    s.push_str(&format!("  prefetch({})\n", ph.prefetch));
    for r in &ph.explain {
        s.push_str(&format!("  because: {r}\n"));
    }
    s
}

fn op_name(op: &Op) -> String {
    match op {
        Op::Map(m) => m.meta().name,
        Op::Shuffle(n) => format!("shuffle({n})"),
        Op::Batch { size, .. } => format!("batch({size})"),
        Op::Pack(p) => p.name(),
        Op::Unbatch => "unbatch".into(),
        Op::Take(n) => format!("take({n})"),
        Op::Skip(n) => format!("skip({n})"),
        Op::Prefetch(n) => format!("prefetch({n})"),
    }
}

fn producer_name(p: &[(usize, Arc<dyn SampleOp>)]) -> String {
    format!(
        "map[{}]",
        p.iter()
            .map(|(_, o)| o.meta().name)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// What an item in the tail is made of, as positions (the run's form of [`ItemPos`]).
/// Batches share their list of members: a sample cut from a batch points at it, so the
/// samples of one batch name it once, and a checkpoint writes it once.
#[derive(Debug, Clone)]
enum Key {
    /// A sample from the source.
    Pos(Pos),
    /// The sample at this place of a batch that `unbatch` cut.
    Cut(Arc<[Key]>, u32),
    /// A batch of these samples.
    Batch(Arc<[Key]>),
}

/// A sample's place in the batch `unbatch` cut it from (None: it was never in one).
type CutFrom = Option<(Arc<[Key]>, u32)>;

impl Key {
    fn of_elem(el: &Element, cut: &CutFrom) -> Key {
        match cut {
            Some((m, k)) => Key::Cut(m.clone(), *k),
            None => Key::Pos(el.pos),
        }
    }

    /// The source position (of a batch: of its first sample).
    fn pos(&self) -> Pos {
        match self {
            Key::Pos(p) => *p,
            Key::Cut(m, k) => m[*k as usize].pos(),
            Key::Batch(m) => m.first().map_or(
                Pos {
                    shard: 0,
                    record: 0,
                },
                Key::pos,
            ),
        }
    }

    /// The source positions it is made of (a cut sample: those of its whole batch).
    fn leaves(&self, out: &mut Vec<Pos>) {
        match self {
            Key::Pos(p) => out.push(*p),
            Key::Cut(m, _) | Key::Batch(m) => m.iter().for_each(|k| k.leaves(out)),
        }
    }

    fn decode(i: &ItemPos, cuts: &[Arc<[Key]>]) -> Result<Key, Error> {
        Ok(match i {
            ItemPos::Sample(p) => Key::Pos(*p),
            ItemPos::Cut { cut, index } => match cuts.get(*cut as usize) {
                Some(m) if (*index as usize) < m.len() => Key::Cut(m.clone(), *index),
                _ => return Err(foreign_state("a cut sample names no batch")),
            },
            ItemPos::Batch(v) => Key::Batch(
                v.iter()
                    .map(|i| Key::decode(i, cuts))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
}

fn foreign_state(what: &str) -> Error {
    Error::invalid(format!(
        "this state was not taken from a run of this pipeline ({what})"
    ))
}

/// The batches of a checkpoint's cut samples, each written once ([`PipelineState::cuts`]).
#[derive(Default)]
struct CutTable {
    cuts: Vec<Vec<ItemPos>>,
    /// By the address of the batch's member list.
    ids: HashMap<usize, u32>,
}

impl CutTable {
    fn cut_id(&mut self, m: &Arc<[Key]>) -> u32 {
        let addr = Arc::as_ptr(m) as *const Key as usize;
        if let Some(id) = self.ids.get(&addr) {
            return *id;
        }
        // Members first: a batch names only earlier ones.
        let members = m.iter().map(|k| self.item(k)).collect();
        self.cuts.push(members);
        let id = (self.cuts.len() - 1) as u32;
        self.ids.insert(addr, id);
        id
    }

    fn item(&mut self, k: &Key) -> ItemPos {
        match k {
            Key::Pos(p) => ItemPos::Sample(*p),
            Key::Cut(m, index) => ItemPos::Cut {
                cut: self.cut_id(m),
                index: *index,
            },
            Key::Batch(m) => ItemPos::Batch(m.iter().map(|k| self.item(k)).collect()),
        }
    }
}

/// The batches a state's cut samples come from, as the run holds them.
fn decode_cuts(cuts: &[Vec<ItemPos>]) -> Result<Vec<Arc<[Key]>>, Error> {
    let mut out: Vec<Arc<[Key]>> = Vec::with_capacity(cuts.len());
    for c in cuts {
        let m = c
            .iter()
            .map(|i| Key::decode(i, &out))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(m.into());
    }
    Ok(out)
}

/// The shuffle buffers' contents (as keys) and an undo log of each one's moves, shared with
/// the consumer side. Indexed by tail stage.
///
/// Each buffer has its own log and its own count of moves, so a mark names a position in
/// every log: with a parallel map stage between two shuffle buffers, the upstream buffer
/// moves on while items the downstream one has not yet seen are on the workers, and a
/// checkpoint rewinds each buffer to where it was when the consumer's item passed it.
#[derive(Debug, Default)]
struct ShuffleMirror {
    bufs: Vec<Vec<Key>>,
    emitted: Vec<u64>,
    logs: Vec<VecDeque<ShufMove>>,
    /// Moves pruned from the front of each log.
    base: Vec<u64>,
    /// Each log's moves before this count may be pruned (the consumer is past them).
    keep_from: Vec<u64>,
}

#[derive(Debug, Clone)]
enum ShufMove {
    Push,
    Replace { slot: usize, out: Key },
    Remove { slot: usize, out: Key },
    EpochStart { emitted: u64 },
}

impl ShuffleMirror {
    fn new(stages: usize) -> ShuffleMirror {
        ShuffleMirror {
            bufs: vec![Vec::new(); stages],
            emitted: vec![0; stages],
            logs: vec![VecDeque::new(); stages],
            base: vec![0; stages],
            keep_from: vec![0; stages],
        }
    }
    /// Moves made so far by stage `stage`.
    fn ops_of(&self, stage: usize) -> u64 {
        self.base[stage] + self.logs[stage].len() as u64
    }
    fn record(&mut self, stage: usize, m: ShufMove) {
        let log = &mut self.logs[stage];
        while self.base[stage] < self.keep_from[stage] && !log.is_empty() {
            log.pop_front();
            self.base[stage] += 1;
        }
        log.push_back(m);
    }
    /// Every buffer and pick count as they were after `ops[i]` moves of stage `i`.
    #[allow(clippy::type_complexity)]
    fn rewound(&self, ops: &[u64]) -> Result<(Vec<Vec<Key>>, Vec<u64>), Error> {
        let mut bufs = self.bufs.clone();
        let mut emitted = self.emitted.clone();
        for (i, log) in self.logs.iter().enumerate() {
            let ops = ops.get(i).copied().unwrap_or(0);
            if ops < self.base[i] {
                return Err(Error::invalid(
                    "checkpoint too old: the undo log was pruned",
                ));
            }
            let (buf, emitted) = (&mut bufs[i], &mut emitted[i]);
            for m in log.iter().skip((ops - self.base[i]) as usize).rev() {
                match m {
                    ShufMove::Push => {
                        buf.pop();
                    }
                    ShufMove::Replace { slot, out } => {
                        buf[*slot] = out.clone();
                        *emitted -= 1;
                    }
                    ShufMove::Remove { slot, out } => {
                        if *slot == buf.len() {
                            buf.push(out.clone());
                        } else {
                            let moved = buf[*slot].clone();
                            buf.push(moved);
                            buf[*slot] = out.clone();
                        }
                        *emitted -= 1;
                    }
                    ShufMove::EpochStart { emitted: e } => *emitted = *e,
                }
            }
        }
        Ok((bufs, emitted))
    }
}

/// A stage's part of a mark: its checkpoint, or what makes it when asked for.
#[derive(Debug, Clone)]
enum StageMark {
    Fixed(StageState),
    /// Filled in from the shuffle mirror, rewound.
    Shuffle,
    Batch(Vec<Key>),
    Unbatch(Option<Arc<[Key]>>, u32),
}

/// Where the consumer is, as of one item.
#[derive(Debug, Clone)]
struct Mark {
    /// Why this position cannot be a checkpoint (a stage lost what it needs for it).
    broken: Option<String>,
    epoch: u64,
    last_seq: Option<u64>,
    /// Each shuffle stage's moves (see [`ShuffleMirror`]).
    shuffle_ops: Vec<u64>,
    stages: Vec<StageMark>,
    yielded_in_epoch: u64,
}

/// The part of a mark that tail stages `0..upto` make: taken when an item enters a
/// parallel map stage (the stages before it have moved on by the time its result comes
/// back), carried with the item to the workers and back, and completed by the stages after
/// it. An item at the end of the tail gets the whole mark this way, exactly as if every
/// stage had run on one thread.
#[derive(Debug, Clone, Default)]
struct Upstream {
    upto: usize,
    broken: Option<String>,
    last_seq: Option<u64>,
    /// Per tail stage; entries from `upto` on are not yet meaningful.
    shuffle_ops: Vec<u64>,
    /// Stages `0..upto`.
    stages: Vec<StageMark>,
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
    threads: Vec<JoinHandle<()>>,
    runtime: Option<RunRuntime>,
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

/// A run's I/O runtime: its own (shut down when the run ends), or the process's shared one
/// (with a shared store).
enum RunRuntime {
    Own(tokio::runtime::Runtime),
    Shared(Arc<tokio::runtime::Runtime>),
}

impl RunRuntime {
    fn handle(&self) -> &tokio::runtime::Handle {
        match self {
            RunRuntime::Own(rt) => rt.handle(),
            RunRuntime::Shared(rt) => rt.handle(),
        }
    }
}

/// The I/O runtime a run (or a count of a dataset's records) reads its store on.
pub(crate) fn io_runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("stoker-io")
        .enable_all()
        .build()
        .map_err(|e| Error::invalid(format!("cannot start the I/O runtime: {e}")))
}

impl Run {
    fn start(p: &Pipeline, state: Option<PipelineState>) -> Result<Run, Error> {
        p.validate()?;
        let memory_limit = p.memory_limit();
        // A run that reads its data once has no use for a memory block cache, unless it
        // shares its store with the runs that follow it.
        let single_pass = p.epochs.is_some_and(|e| e <= 1) && !p.options.share_store;
        // A shared store brings its runtime (its connections live there) and its budget (its
        // cached blocks count against it).
        let (runtime, opened) = match &p.source {
            crate::plan::Source::Url { url, options, .. } if p.options.share_store => {
                let options = crate::source::url_store_options(options, memory_limit, single_pass);
                let opened = crate::shared::shared_store(url, &options).map_err(Error::from)?;
                (
                    RunRuntime::Shared(crate::shared::shared_runtime()?),
                    Some(opened),
                )
            }
            _ => (RunRuntime::Own(io_runtime()?), None),
        };
        let budget = match (&opened, memory_limit) {
            (Some((store, _)), _) => store.budget().clone(),
            (None, Some(l)) => MemoryBudget::new(l),
            (None, None) => MemoryBudget::from_system(),
        };
        if let Some(s) = &state {
            if s.epoch < p.first_epoch {
                return Err(Error::invalid(format!(
                    "this state is at epoch {}, before the pipeline's first epoch {}: resume \
                     it with the first_epoch of the run it came from",
                    s.epoch, p.first_epoch
                )));
            }
        }
        let mut ds = Dataset::resolve(
            &p.source,
            &p.format,
            runtime.handle(),
            Some(budget.clone()),
            crate::source::ResolveOptions {
                memory_limit,
                single_pass,
                // The disk cache tells a changed object by its version.
                look_up_keys: p.cache_dir.is_some(),
            },
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
        let mut ph = optimize(&p.ops);
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
            Some(crate::split::record_counts(
                &ds,
                p.shard_index.as_deref(),
                &options,
            )?)
        } else {
            None
        };
        let cfg = SourceConfig {
            shuffle_shards: p.shuffle_shards,
            cycle: p.cycle,
            rank: p.rank,
            seed: p.seed,
            columnar,
            counts,
        };
        if let Some(s) = &state {
            if s.seed != p.seed || s.version != STATE_VERSION || s.stages.len() != ph.tail.len() {
                return Err(Error::invalid(
                    "this state was not taken from a run of this pipeline (seed, version or \
                     stages differ)",
                ));
            }
            if s.contiguous != contiguous {
                return Err(Error::invalid(
                    "this state was taken with the other rank split (contiguous against \
                     interleaved): resume with the split it was taken with",
                ));
            }
        }
        let resumable = if !p.options.deterministic {
            Err("state() needs a deterministic run".to_string())
        } else if ph.tail.iter().any(|t| matches!(t, TailOp::Unbatch))
            && ph.tail.iter().any(|t| matches!(t, TailOp::Pack(_)))
        {
            Err("state() does not support unbatch together with pack yet".to_string())
        } else if ph
            .tail
            .iter()
            .filter(|t| matches!(t, TailOp::Pack(_)))
            .count()
            > 1
        {
            Err("state() supports at most one pack stage".to_string())
        } else if ph
            .tail
            .iter()
            .skip_while(|t| !matches!(t, TailOp::Pack(_)))
            .any(|t| matches!(t, TailOp::Shuffle(_)))
        {
            Err("state() does not support a shuffle after pack yet".to_string())
        } else {
            Ok(())
        };
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
        let shared = Arc::new(Shared {
            stats: StatsHub::new(names, ds.cache.as_ref().map(|c| c.counters.clone())),
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
        let start_state = state.clone().unwrap_or(PipelineState {
            version: STATE_VERSION,
            seed: p.seed,
            epoch: p.first_epoch,
            cursor: SourceCursor::default(),
            stages: ph
                .tail
                .iter()
                .map(|t| match t {
                    TailOp::Shuffle(_) => StageState::Shuffle {
                        emitted: 0,
                        buffer: vec![],
                    },
                    TailOp::Batch(..) => StageState::Batch { partial: vec![] },
                    TailOp::Unbatch => StageState::Unbatch { cut: None, sent: 0 },
                    TailOp::Take(_) | TailOp::Skip(_) => StageState::Count { seen: 0 },
                    TailOp::Pack(_) => StageState::Pack {
                        blocks: 0,
                        docs: vec![],
                        skip: 0,
                        next_doc: 0,
                    },
                    _ => StageState::Stateless,
                })
                .collect(),
            yielded_in_epoch: 0,
            yielded: 0,
            samples_yielded: 0,
            cuts: vec![],
            contiguous,
        });

        // Hand-offs carry chunks of up to CHUNK samples: one wake-up per chunk, not per
        // sample (measured: per-sample hand-offs cost 6-10 us a sample, docs/benchmarks.md).
        let (work_tx, work_rx) = bounded::<(u64, Vec<Produced>)>((window / CHUNK).max(2));
        let (done_tx, done_rx) = unbounded::<Done>();
        let (out_tx, out_rx) = bounded::<Vec<OutMsg>>(ph.prefetch);
        // Work for the parallel stages after the tail's sequential ones, and its results.
        // Unbounded: the tail bounds what it hands out (`TailRun::par_cap`).
        let (par_tx, par_rx) = unbounded::<ParWork>();
        let (par_done_tx, par_done_rx) = unbounded::<ParDone>();
        let tail_offset = if ph.producer.is_empty() { 1 } else { 2 };
        let par_ops: Vec<Option<Arc<ParOps>>> = par_runs(&ph.tail)
            .into_iter()
            .enumerate()
            .map(|(j, run)| {
                run.map(|ops| {
                    let counters = (j..j + ops.len())
                        .map(|k| shared.stats.stage(tail_offset + k))
                        .collect();
                    Arc::new(ParOps {
                        ops,
                        counters,
                        cost_ns: AtomicU64::new(0),
                    })
                })
            })
            .collect();
        let has_par = par_ops.iter().any(Option::is_some);
        let producer = Arc::new(ph.producer.clone());
        let mut handles = Vec::new();
        let map_stage = (!ph.producer.is_empty()).then(|| shared.stats.stage(1));
        // On the columnar path the workers collate: their time is the batch stage's.
        let collate_stage = cfg.columnar.is_some().then(|| shared.stats.stage(1));
        for w in 0..threads {
            let rx = work_rx.clone();
            let tx = done_tx.clone();
            let par = has_par.then(|| (par_rx.clone(), par_done_tx.clone()));
            let producer = producer.clone();
            let shared = shared.clone();
            let stage = map_stage.clone();
            let collating = collate_stage.clone();
            let seed = p.seed;
            let ds = ds.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("stoker-cpu-{w}"))
                    .spawn(move || {
                        let stages = (stage, collating);
                        worker(w, (rx, tx), par, &producer, &shared, stages, seed, &ds)
                    })
                    .expect("spawn worker"),
            );
        }
        drop((work_rx, par_rx, par_done_tx));
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
            columnar: collate_stage.is_some(),
            budget,
            store: ds.store.clone(),
            storage_baseline: ds.storage_baseline.clone(),
            shards: ds.shards.len(),
            threads: handles,
            runtime: Some(runtime),
        })
    }

    /// Statistics now (cheap; safe to call while iterating from another thread's copy).
    pub fn stats(&self) -> Stats {
        let mut st = self.shared.stats.snapshot(
            &self.budget,
            self.store.as_ref(),
            self.storage_baseline.as_ref(),
        );
        st.batch_slots = self.shared.slots.as_ref().map(|s| crate::BatchSlotStats {
            placed: s.placed(),
            copied: s.copied(),
            given_up: s.given_up(),
        });
        st
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

    /// The position after the last item this run yielded.
    pub fn state(&self) -> Result<PipelineState, Error> {
        if let Err(why) = &self.resumable {
            return Err(Error::invalid(why.clone()));
        }
        let Some(m) = &self.last else {
            return Ok(self.start.clone());
        };
        if let Some(why) = &m.broken {
            return Err(Error::invalid(why.clone()));
        }
        let cursor = match m.last_seq {
            Some(seq) => self
                .shared
                .history
                .lock()
                .iter()
                .find(|(e, s, _)| *e == m.epoch && *s == seq)
                .map(|(_, _, c)| c.clone())
                .ok_or_else(|| Error::invalid("the source's cursor history lost this position"))?,
            None => self
                .shared
                .epoch_start
                .lock()
                .get(&m.epoch)
                .cloned()
                .unwrap_or_default(),
        };
        let shuffled = if m.stages.iter().any(|s| matches!(s, StageMark::Shuffle)) {
            Some(self.shared.shuffle.lock().rewound(&m.shuffle_ops)?)
        } else {
            None
        };
        let mut table = CutTable::default();
        let mut stages = Vec::with_capacity(m.stages.len());
        for (i, sm) in m.stages.iter().enumerate() {
            stages.push(match sm {
                StageMark::Fixed(s) => s.clone(),
                StageMark::Shuffle => {
                    let (bufs, emitted) = shuffled.as_ref().expect("rewound");
                    StageState::Shuffle {
                        emitted: emitted[i],
                        buffer: bufs[i].iter().map(|k| table.item(k)).collect(),
                    }
                }
                StageMark::Batch(keys) => StageState::Batch {
                    partial: keys.iter().map(|k| table.item(k)).collect(),
                },
                StageMark::Unbatch(Some(batch), sent) if (*sent as usize) < batch.len() => {
                    StageState::Unbatch {
                        cut: Some(table.cut_id(batch)),
                        sent: *sent,
                    }
                }
                StageMark::Unbatch(..) => StageState::Unbatch { cut: None, sent: 0 },
            });
        }
        Ok(PipelineState {
            version: STATE_VERSION,
            seed: self.seed,
            epoch: m.epoch,
            cursor,
            stages,
            yielded_in_epoch: m.yielded_in_epoch,
            yielded: self.yielded,
            samples_yielded: self.samples,
            cuts: table.cuts,
            contiguous: self.start.contiguous,
        })
    }
}

impl Iterator for Run {
    type Item = Result<Item, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
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
        match self.ready.pop_front().ok_or(()) {
            Ok(OutMsg::Item(item, mark, hold)) => {
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
        // The batch buffers kept for this run's next batches are not needed any more.
        stoker_core::recycle::GLOBAL.clear();
    }
}

enum Done {
    Items(Vec<(u64, Result<Option<Flow>, Error>)>),
    SourceEnd { next_seq: u64 },
    Fatal(Error),
}

/// A run of consecutive map/filter operators after a sequential tail stage, run by the
/// workers (see [`ParStage`]); shared by every epoch's stage.
struct ParOps {
    /// The operators, with their places in the plan.
    ops: Vec<(usize, Arc<dyn SampleOp>)>,
    /// Each operator's statistics (its tail stage's).
    counters: Vec<Arc<StageCounters>>,
    /// The running average of nanoseconds per item through all of `ops` (0 until
    /// measured), on the workers or the tail: sizes hand-offs and the number of items in
    /// flight, and decides where the stage runs ([`INLINE_NS`]).
    cost_ns: AtomicU64,
}

impl ParOps {
    /// `n` items took `took`. The average rises by at most 1.75x a measurement (a
    /// measurement counts at most 4x the average), so one call that the scheduler held up
    /// does not move a cheap stage to the workers, while a cost that really rose still
    /// does within a few items; it falls halfway to each lower measurement, so a first
    /// call that was slow (cold) is soon forgotten.
    fn note_cost(&self, took: Duration, n: u64) {
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

/// A parallel stage whose operators cost less than this per item (measured) runs on the
/// tail thread instead, item by item as the tail ran maps before: handing an item to a
/// worker and back (its mark, the hand-off, the reordering) costs the tail about as much,
/// so a cheaper operator (a native filter on a sample, a column-wise operator on a small
/// batch) is faster where the item already is. It goes back to the workers when the cost
/// rises above twice this. An unoptimized build (the tests') does everything several times
/// slower, the hand-off too: there a native operator on a sample measures about 5 us with
/// the stage's own overhead, right at the release bound (it then flapped between the tail
/// and the workers), so the bound is twice as high.
const INLINE_NS: u64 = if cfg!(debug_assertions) {
    10_000
} else {
    5_000
};

/// Items for a parallel map stage: tail stage `stage`, in the order they entered it, each
/// numbered and with its mark so far.
struct ParWork {
    stage: usize,
    epoch: u64,
    run: Arc<ParOps>,
    items: Vec<(u64, Flow, Box<Upstream>)>,
}

/// What a worker made of a [`ParWork`]: each item's result with its number and its mark.
struct ParDone {
    stage: usize,
    results: Vec<ParResult>,
}

type ParResult = (u64, Result<Option<Flow>, Error>, Box<Upstream>);

/// A parallel stage's result for one item, with the item's mark so far.
type Finished = (Result<Option<Flow>, Error>, Box<Upstream>);

/// What a worker takes next: work for a parallel stage after the tail's sequential stages
/// first (it is nearer the consumer, and the tail may be waiting for it), else the
/// source's samples.
enum Work {
    Source(u64, Vec<Produced>),
    Par(ParWork),
    Idle,
    Closed,
}

/// (`par`: `None` when the plan has no parallel stage after the tail.)
fn next_work(rx: &Receiver<(u64, Vec<Produced>)>, par: Option<&Receiver<ParWork>>) -> Work {
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

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

#[allow(clippy::too_many_arguments)]
fn worker(
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
            let ops = (producer, slots, shared.charging());
            results.push(run_one(p, ops, seed, epoch, ds, stages));
        }
        let busy = t1.elapsed().as_nanos() as u64;
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
type ProducerOp = (usize, Arc<dyn SampleOp>);

/// One sample through the producer operators (a panic in an operator is its error).
fn run_one(
    p: Produced,
    (producer, slots, budget): (&[ProducerOp], Option<&Arc<BatchSlots>>, Charging<'_>),
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
                apply_producer(el, (producer, slots, budget), seed, epoch, ds)
            }));
            (
                seq,
                r.unwrap_or_else(|p| {
                    Err(Error::operator(format!(
                        "panicked: {} ({})",
                        panic_message(&p),
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

fn apply_producer(
    mut el: Element,
    (producer, slots, budget): (&[ProducerOp], Option<&Arc<BatchSlots>>, Charging<'_>),
    seed: u64,
    epoch: u64,
    ds: &Dataset,
) -> Result<Option<Element>, Error> {
    let before = el.sample.size_bytes();
    // The most the sample needed at once (its bytes and what an operator charged).
    let mut peak = 0u64;
    let mut now = before;
    for (k, (i, op)) in producer.iter().enumerate() {
        let mut ctx = OpContext::new(seed, epoch, el.pos.shard, el.pos.record, *i).with_budget(
            budget.0,
            el.hold.take(),
            now as u64,
            budget.1,
        );
        if let Some(s) = slots.filter(|_| k + 1 == producer.len()) {
            ctx = ctx.with_batch_slots(s.clone(), el.seq);
        }
        let locate = |e: Error| {
            e.with_stage(op.meta().name)
                .with_object(ds.shards[el.pos.shard as usize].url.clone())
                .with_record(el.pos.record)
        };
        let r = op.apply(el.sample, &mut ctx);
        let (hold, need) = ctx.take_hold();
        el.hold = hold;
        peak = peak.max(need.unwrap_or(0));
        match r.map_err(locate)? {
            Some(s) => {
                el.sample = s;
                if k + 1 < producer.len() {
                    now = el.sample.size_bytes();
                }
            }
            None => {
                let meta = op.meta();
                if !meta.filters {
                    return Err(locate(Error::invalid(
                        "the operator dropped a sample but does not declare itself a filter \
                         (OpMeta::filter)",
                    )));
                }
                return Ok(None);
            }
        }
    }
    if !producer.is_empty() {
        charge_growth(&mut el, before, peak, Some(ds));
    }
    Ok(Some(el))
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
fn expected_bytes(ds: &Dataset, read: u64, limit: u64) -> u64 {
    let n = match ds.growth.load(Ordering::Relaxed) {
        0 => read.max(limit / 16),
        g => ((read as u128 * g as u128) / crate::source::GROWTH_ONE as u128).min(u64::MAX as u128)
            as u64,
    };
    n.min(limit / 4 * 3)
}

/// The budget holds what a sample is after its operators, `before` bytes when they began
/// (a decoded image is several times its file), and the growth is learnt for the next
/// reservations when `ds` is given (a moving average, so one odd sample moves it by an
/// eighth). What is learnt is the most the sample needed at once, `peak` when its
/// operators charged more than it ended with (a decoded frame that a crop made small):
/// the source then admits a sample with room for its operators' buffers, so a worker
/// seldom has to wait for them.
fn charge_growth(el: &mut Element, before: usize, peak: u64, ds: Option<&Dataset>) {
    let after = el.sample.size_bytes();
    if let Some(ds) = ds.filter(|_| before > 0) {
        let one = crate::source::GROWTH_ONE as u128;
        let most = (after as u128).max(peak as u128);
        let g = ((most * one) / before as u128).min(1 << 40) as u64;
        let _ = ds
            .growth
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 {
                    g.max(1)
                } else {
                    ((old * 7 + g) / 8).max(1)
                })
            });
    }
    if let Some(h) = el.hold.as_mut() {
        h.resize_to(after as u64);
    }
}

/// A parallel stage's items through its operators, on a worker (a panic in an operator is
/// that item's error).
fn run_par(work: ParWork, seed: u64, ds: &Dataset, budget: Charging<'_>) -> ParDone {
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
fn run_par_one(
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
                panic_message(&p),
                producer_name(&run.ops)
            )),
            pos,
        ))
    })
}

/// One item through a parallel stage's operators: a sample through each one's `apply`, a
/// batch through each one's `apply_batch` (column-wise), with the same contexts, errors
/// and checks as the operators before the tail (and as the tail ran them before).
fn apply_par(
    flow: Flow,
    run: &ParOps,
    (seed, epoch): (u64, u64),
    ds: &Dataset,
    budget: Charging<'_>,
) -> Result<Option<Flow>, Error> {
    match flow {
        Flow::Elem(mut el, cut) => {
            let before = el.sample.size_bytes();
            let mut now = before;
            for ((i, op), c) in run.ops.iter().zip(&run.counters) {
                c.add(&c.items_in, 1);
                let t0 = Instant::now();
                let mut cx = OpContext::new(seed, epoch, el.pos.shard, el.pos.record, *i)
                    .with_budget(budget.0, el.hold.take(), now as u64, budget.1);
                let r = op.apply(el.sample, &mut cx);
                el.hold = cx.take_hold().0;
                c.add(&c.busy_ns, t0.elapsed().as_nanos() as u64);
                let locate = |e: Error| locate(ds, e.with_stage(op.meta().name), el.pos);
                match r.map_err(locate)? {
                    Some(s) => {
                        el.sample = s;
                        now = el.sample.size_bytes();
                        c.add(&c.items_out, 1);
                    }
                    None => {
                        if !op.meta().filters {
                            return Err(locate(Error::invalid(
                                "the operator dropped a sample but does not declare itself a \
                                 filter (OpMeta::filter)",
                            )));
                        }
                        c.add(&c.dropped, 1);
                        return Ok(None);
                    }
                }
            }
            // Charged, not learnt: the source's estimate is for the operators before the
            // sequential stage.
            charge_growth(&mut el, before, 0, None);
            Ok(Some(Flow::Elem(el, cut)))
        }
        Flow::Batch(mut b, members, hold) => {
            let first = Key::Batch(members.clone()).pos();
            let rows = b.len();
            for ((i, op), c) in run.ops.iter().zip(&run.counters) {
                c.add(&c.items_in, 1);
                let t0 = Instant::now();
                let mut cx = OpContext::new(seed, epoch, first.shard, first.record, *i);
                let r = op.apply_batch(b, &mut cx);
                c.add(&c.busy_ns, t0.elapsed().as_nanos() as u64);
                let locate = |e: Error| locate_batch(ds, e.with_stage(op.meta().name), first, rows);
                match r {
                    None => {
                        return Err(Error::invalid(format!(
                            "{} is a per-sample operator but receives batches (put it before \
                             batch)",
                            op.meta().name
                        ))
                        .with_stage(op.meta().name))
                    }
                    Some(Err(e)) => return Err(locate(e)),
                    Some(Ok(None)) => {
                        if !op.meta().filters {
                            return Err(locate(Error::invalid(
                                "the operator dropped a batch but does not declare itself a \
                                 filter (OpMeta::filter)",
                            )));
                        }
                        c.add(&c.dropped, 1);
                        return Ok(None);
                    }
                    Some(Ok(Some(out))) => {
                        // Positions (resume, unbatch) name the batch's samples one to one.
                        if out.len() != rows {
                            return Err(locate(Error::operator(format!(
                                "returned a batch of {} rows for a batch of {rows}: an \
                                 operator on batches keeps the rows (filter samples before \
                                 the batch)",
                                out.len()
                            ))));
                        }
                        b = out;
                        c.add(&c.items_out, 1);
                    }
                }
            }
            Ok(Some(Flow::Batch(b, members, hold)))
        }
    }
}

/// What the tail passes between its stages: a sample (with the batch it was cut from,
/// after an unbatch), or a batch (with its samples' keys).
enum Flow {
    Elem(Element, CutFrom),
    Batch(Batch, Arc<[Key]>, Option<Reservation>),
}

impl Flow {
    fn key(&self) -> Key {
        match self {
            Flow::Elem(el, cut) => Key::of_elem(el, cut),
            Flow::Batch(_, m, _) => Key::Batch(m.clone()),
        }
    }
}

enum Stage {
    /// The first of a run of maps and filters, run on the workers (see [`ParStage`]).
    Par(Box<ParStage>),
    /// A later map of that run: it never sees an item itself.
    Fused,
    Shuffle {
        size: usize,
        buf: Vec<Flow>,
        emitted: u64,
    },
    Batch {
        size: usize,
        drop_last: bool,
        collate: CollatePolicy,
        partial: Vec<(Element, CutFrom)>,
        /// The partial batch's large tensors, stacked as they arrive.
        stacker: Stacker,
    },
    Pack(Box<PackStage>),
    /// The batch being cut and how many of its samples were handed on.
    Unbatch {
        cutting: Option<Arc<[Key]>>,
        sent: u32,
    },
    Take(u64, u64),
    Skip(u64, u64),
}

/// A run of consecutive maps and filters after a sequential tail stage, run in parallel by
/// the workers. The tail hands it items (numbered as they enter, each with its mark so far,
/// [`Upstream`]) in chunks sized by the measured cost per item, and passes its results on
/// to the stage after the run in the order the items entered (deterministic runs) or as
/// they finish. At most [`TailRun::par_cap`] items are in it (on the workers, or finished
/// and waiting for their turn); at that many the tail waits for the next result instead of
/// reading on, so the budget's backpressure reaches the source.
struct ParStage {
    run: Arc<ParOps>,
    /// Number the next item entering gets.
    next_in: u64,
    /// Number of the next item to pass on (deterministic runs).
    next_out: u64,
    /// Items in it: handed to the workers or not yet, finished or not.
    outstanding: usize,
    /// Items not yet handed to the workers (a chunk being filled).
    unsent: Vec<(u64, Flow, Box<Upstream>)>,
    /// Results waiting for their turn.
    finished: BTreeMap<u64, Finished>,
    /// Running on the tail thread for now (a cheap stage, see [`INLINE_NS`]).
    inline: bool,
}

impl ParStage {
    fn new(run: Arc<ParOps>) -> ParStage {
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
    fn chunk(&self) -> usize {
        match self.run.cost_ns.load(Ordering::Relaxed) {
            0 => 1,
            c => chunk_cap(c),
        }
    }

    /// The next result to pass on: in order, or, when `any`, whichever finished first.
    fn take(&mut self, any: bool) -> Option<Finished> {
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

struct TailCtx {
    ds: Arc<Dataset>,
    budget: MemoryBudget,
    cfg: SourceConfig,
    shared: Arc<Shared>,
    ph_tail: Vec<TailOp>,
    producer: Arc<Vec<(usize, Arc<dyn SampleOp>)>>,
    seed: u64,
    /// The epoch a run from the beginning starts at.
    first_epoch: u64,
    /// The epoch it stops before (`None`: never).
    epochs: Option<u64>,
    policy: ErrorPolicy,
    deterministic: bool,
    window: u64,
    threads: usize,
    autotune: bool,
    state: Option<PipelineState>,
    tail_offset: usize,
    /// Per tail stage: the operators of the parallel stage that starts there.
    par_ops: Vec<Option<Arc<ParOps>>>,
}

/// The tail's running state within one epoch.
struct TailRun<'a> {
    ctx: &'a TailCtx,
    epoch: u64,
    stages: Vec<Stage>,
    last_seq: Option<u64>,
    yielded_in_epoch: u64,
    out: &'a Sender<Vec<OutMsg>>,
    out_buf: Vec<OutMsg>,
    failed: bool,
    par_tx: &'a Sender<ParWork>,
    par_rx: &'a Receiver<ParDone>,
    /// While the result of a parallel stage goes on through the stages after it: its mark
    /// as of the stages before (see [`Upstream`]).
    upstream: Option<Box<Upstream>>,
    /// Whether the plan has a parallel stage (else the tail waits on the workers alone).
    has_par: bool,
}

impl TailCtx {
    fn run(
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
            let source = {
                let ds = self.ds.clone();
                let cfg = self.cfg.clone();
                let shared = self.shared.clone();
                let work_tx = work_tx.clone();
                let done_tx = done_tx.clone();
                let window = self.window;
                let stage = self.shared.stats.stage(0);
                let budget = self.budget.clone();
                let wait = self.shared.budget_wait;
                // Operators before the tail make samples into what the budget holds: until
                // one is measured, admit one sample at a time.
                let gate = !self.producer.is_empty() && self.cfg.columnar.is_none();
                let rt = self.ds.runtime.clone();
                std::thread::Builder::new()
                    .name("stoker-source".into())
                    .spawn(move || {
                        let mut last = Instant::now();
                        let mut next_seq = cursor0.emitted;
                        let done_tx2 = done_tx.clone();
                        // Samples (and their cursors) not yet handed to the workers.
                        let mut chunk: Vec<Produced> = Vec::with_capacity(CHUNK);
                        let mut hist: Vec<(u64, u64, SourceCursor)> = Vec::with_capacity(CHUNK);
                        let flush = |chunk: &mut Vec<Produced>,
                                     hist: &mut Vec<(u64, u64, SourceCursor)>|
                         -> bool {
                            if chunk.is_empty() {
                                return true;
                            }
                            // Cursors first: the consumer may ask for one as soon as the
                            // tail has the sample.
                            shared.history.lock().extend(hist.drain(..));
                            work_tx.send((epoch, std::mem::take(chunk))).is_ok()
                        };
                        // The tail's position plus the window, refreshed when reached.
                        let mut limit = *shared.tail_next.lock() + window;
                        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            run_source(&ds, &cfg, epoch, cursor0, &mut |mut p, cursor| {
                                let now = Instant::now();
                                // The sample's bytes count against the budget until the
                                // consumer takes it: a full budget stops the source.
                                let held = match &mut p {
                                    Produced::Elem(e) => {
                                        Some((e.sample.size_bytes() as u64, &mut e.hold))
                                    }
                                    Produced::Rows { parts, hold, .. } => Some((
                                        parts.iter().map(|c| c.size_bytes() as u64).sum(),
                                        hold,
                                    )),
                                    Produced::Fail { .. } => None,
                                };
                                if let Some((n, slot)) = held {
                                    // What the sample will be after the workers' operators
                                    // (the worker sets it right).
                                    let n = expected_bytes(&ds, n, budget.limit());
                                    let hold = budget.try_reserve(n).or_else(|| {
                                        rt.block_on(async {
                                            tokio::time::timeout(wait, budget.reserve(n)).await
                                        })
                                        .ok()
                                    });
                                    match hold {
                                        Some(h) => *slot = Some(h),
                                        None => {
                                            // Not about the sample it was admitting (any
                                            // would have waited): the run's error, named
                                            // after what waited, never skipped.
                                            let error = Error::invalid(budget_full(
                                                budget.limit(),
                                                wait,
                                                n,
                                            ))
                                            .with_stage("source");
                                            let _ = done_tx2.send(Done::Fatal(error));
                                            return false;
                                        }
                                    }
                                }
                                stage.add(&stage.busy_ns, (now - last).as_nanos() as u64);
                                match &p {
                                    Produced::Elem(e) => {
                                        stage.add(&stage.items_out, 1);
                                        stage.add(&stage.bytes, e.sample.size_bytes() as u64);
                                    }
                                    Produced::Rows {
                                        parts, positions, ..
                                    } => {
                                        stage.add(&stage.items_out, positions.len() as u64);
                                        let b: usize = parts.iter().map(|c| c.size_bytes()).sum();
                                        stage.add(&stage.bytes, b as u64);
                                    }
                                    Produced::Fail { .. } => stage.add(&stage.items_out, 1),
                                }
                                let seq = p.seq();
                                next_seq = seq + 1;
                                hist.push((epoch, seq, cursor.clone()));
                                chunk.push(p);
                                if seq + 1 >= limit {
                                    limit = *shared.tail_next.lock() + window;
                                }
                                let full = seq + 1 >= limit;
                                // Hand over when the workers are idle, the chunk is full, or
                                // before waiting for the tail (which needs these to move).
                                let mut ok = true;
                                let cap = chunk_cap(shared.sample_cost_ns.load(Ordering::Relaxed));
                                if full || chunk.len() >= cap || work_tx.is_empty() {
                                    ok = flush(&mut chunk, &mut hist);
                                }
                                if gate && !shared.warm.load(Ordering::Acquire) {
                                    // Samples admitted on a guess (a sixteenth of the
                                    // budget) would each hold part of what their operators
                                    // then charge (decoded frames) and wait for the rest of
                                    // it together; the first measured sample sets the guess
                                    // right (`expected_bytes`).
                                    ok = ok && flush(&mut chunk, &mut hist);
                                    while !shared.warm.load(Ordering::Acquire)
                                        && !shared.stop.load(Ordering::Relaxed)
                                    {
                                        std::thread::sleep(Duration::from_millis(1));
                                    }
                                }
                                if full {
                                    // Stay within the window of the tail.
                                    let mut t = shared.tail_next.lock();
                                    while seq + 1 >= *t + window
                                        && !shared.stop.load(Ordering::Relaxed)
                                    {
                                        shared
                                            .tail_moved
                                            .wait_for(&mut t, Duration::from_millis(50));
                                    }
                                    limit = *t + window;
                                }
                                let ok = ok && !shared.stop.load(Ordering::Relaxed);
                                stage
                                    .queue_len
                                    .store(work_tx.len() as u64, Ordering::Relaxed);
                                last = Instant::now();
                                stage.add(&stage.wait_ns, (last - now).as_nanos() as u64);
                                ok
                            })
                        }));
                        match ran {
                            Ok(()) => {
                                flush(&mut chunk, &mut hist);
                            }
                            Err(panic) => {
                                let _ = done_tx2.send(Done::Fatal(Error::invalid(format!(
                                    "the source failed: {}",
                                    panic_message(&panic)
                                ))));
                            }
                        }
                        let _ = done_tx.send(Done::SourceEnd { next_seq });
                    })
                    .expect("spawn source")
            };
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

impl TailRun<'_> {
    /// The stages, restored from `restored` when given; with the samples the restored
    /// stages are made of, read again (by position), for [`TailRun::replay`].
    fn init_stages(
        &self,
        restored: Option<&PipelineState>,
    ) -> Result<(Vec<Stage>, HashMap<Pos, Sample>), Error> {
        let ctx = self.ctx;
        let cuts = match restored {
            Some(s) => decode_cuts(&s.cuts)?,
            None => Vec::new(),
        };
        let decode = |v: &[ItemPos]| {
            v.iter()
                .map(|i| Key::decode(i, &cuts))
                .collect::<Result<Vec<_>, _>>()
        };
        let cut = |c: &Option<u32>| match c {
            Some(c) => cuts
                .get(*c as usize)
                .cloned()
                .map(Some)
                .ok_or_else(|| foreign_state("an unbatch names no batch")),
            None => Ok(None),
        };
        // The keys of every restored stage, and the samples they are made of, read at once.
        let mut keys: Vec<Vec<Key>> = Vec::with_capacity(ctx.ph_tail.len());
        let mut leaves = Vec::new();
        let mut after_pack = false;
        for (i, t) in ctx.ph_tail.iter().enumerate() {
            after_pack |= matches!(t, TailOp::Pack(_));
            let k = match (t, restored.map(|s| &s.stages[i])) {
                (TailOp::Shuffle(_), Some(StageState::Shuffle { buffer, .. })) => decode(buffer)?,
                (TailOp::Batch(..), Some(StageState::Batch { partial })) => decode(partial)?,
                (TailOp::Unbatch, Some(StageState::Unbatch { cut: c, .. })) => {
                    cut(c)?.map(Key::Batch).into_iter().collect()
                }
                _ => Vec::new(),
            };
            // A checkpoint is never taken while a batch after a pack holds blocks (see the
            // `pack` module).
            if after_pack && matches!(t, TailOp::Batch(..)) && !k.is_empty() {
                return Err(foreign_state("a batch of packed blocks being filled"));
            }
            k.iter().for_each(|k| k.leaves(&mut leaves));
            keys.push(k);
        }
        leaves.sort_unstable();
        leaves.dedup();
        let got: HashMap<Pos, Sample> = if leaves.is_empty() {
            HashMap::new()
        } else {
            leaves
                .iter()
                .copied()
                .zip(materialize(&ctx.ds, &leaves)?)
                .collect()
        };
        let mut stages = Vec::new();
        let mut mirror = ctx.shared.shuffle.lock();
        for (i, t) in ctx.ph_tail.iter().enumerate() {
            let st = restored.map(|s| &s.stages[i]);
            stages.push(match t {
                TailOp::Map(..) => match &ctx.par_ops[i] {
                    Some(run) => Stage::Par(Box::new(ParStage::new(run.clone()))),
                    None => Stage::Fused,
                },
                TailOp::Shuffle(n) => {
                    let emitted = match st {
                        Some(StageState::Shuffle { emitted, .. }) => *emitted,
                        _ => 0,
                    };
                    let buf = keys[i]
                        .iter()
                        .map(|k| self.remake(k, i, &got))
                        .collect::<Result<Vec<_>, _>>()?;
                    let prev = mirror.emitted[i];
                    mirror.record(i, ShufMove::EpochStart { emitted: prev });
                    mirror.bufs[i] = std::mem::take(&mut keys[i]);
                    mirror.emitted[i] = emitted;
                    Stage::Shuffle {
                        size: *n,
                        buf,
                        emitted,
                    }
                }
                TailOp::Batch(n, d, c) => {
                    let mut partial = Vec::with_capacity(keys[i].len());
                    let slots = ctx.shared.slots.clone().filter(|_| i == 0);
                    let mut stacker = Stacker::with_slots(slots);
                    for k in &keys[i] {
                        match self.remake(k, i, &got)? {
                            Flow::Elem(mut el, cut) => {
                                stacker.push(&mut el.sample, *n, c);
                                partial.push((el, cut));
                            }
                            Flow::Batch(..) => return Err(foreign_state("a batch of batches")),
                        }
                    }
                    Stage::Batch {
                        size: *n,
                        drop_last: *d,
                        collate: c.clone(),
                        partial,
                        stacker,
                    }
                }
                TailOp::Pack(p) => Stage::Pack(Box::new(match st {
                    Some(st) => PackStage::restore(p.clone(), st)?,
                    None => PackStage::new(p.clone())?,
                })),
                TailOp::Unbatch => match st {
                    Some(StageState::Unbatch { cut: c, sent }) => Stage::Unbatch {
                        cutting: cut(c)?,
                        sent: *sent,
                    },
                    _ => Stage::Unbatch {
                        cutting: None,
                        sent: 0,
                    },
                },
                TailOp::Take(n) => Stage::Take(
                    *n,
                    match st {
                        Some(StageState::Count { seen }) => *seen,
                        _ => 0,
                    },
                ),
                TailOp::Skip(n) => Stage::Skip(
                    *n,
                    match st {
                        Some(StageState::Count { seen }) => *seen,
                        _ => 0,
                    },
                ),
            });
        }
        Ok((stages, got))
    }

    /// Hands on, from the deepest stage up, what the restored stages were handing on when
    /// the checkpoint was taken (as the first run did after it): the rest of the batch an
    /// unbatch was cutting, and the blocks a pack stage's documents complete (see the
    /// `pack` module; they are pushed through it again).
    fn replay(
        &mut self,
        restored: &PipelineState,
        got: &HashMap<Pos, Sample>,
    ) -> Result<(), Error> {
        for i in (0..self.stages.len()).rev() {
            match (&self.stages[i], &restored.stages[i]) {
                (Stage::Pack(_), StageState::Pack { docs, .. }) => {
                    for el in self.rematerialize(docs, i)? {
                        self.push(i, Flow::Elem(el, None));
                        if self.failed {
                            return Ok(());
                        }
                    }
                }
                (
                    Stage::Unbatch {
                        cutting: Some(m),
                        sent,
                    },
                    _,
                ) => {
                    let (m, sent) = (m.clone(), *sent);
                    let Flow::Batch(b, ..) = self.remake_batch(&m, i, got)? else {
                        unreachable!("remake_batch makes a batch")
                    };
                    self.cut_out(i, m, b.unbatch()?, sent);
                    if self.failed {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Samples at `positions`, read again and passed through the producer and the tail
    /// maps before stage `upto`.
    fn rematerialize(&self, positions: &[Pos], upto: usize) -> Result<Vec<Element>, Error> {
        let samples = materialize(&self.ctx.ds, positions)?;
        let mut out = Vec::with_capacity(samples.len());
        for (pos, sample) in positions.iter().zip(samples) {
            out.push(self.remake_sample(*pos, sample, upto)?);
        }
        Ok(out)
    }

    /// The source's sample at `pos` as it reaches tail stage `at`: through the producer
    /// operators (on the columnar path, the structural ones the source applies) and the
    /// tail maps before `at`.
    fn remake_sample(&self, pos: Pos, sample: Sample, at: usize) -> Result<Element, Error> {
        let ctx = self.ctx;
        let hold = ctx.budget.try_reserve(sample.size_bytes() as u64);
        let el = Element {
            seq: 0,
            pos,
            sample,
            hold,
        };
        let producer = match &ctx.cfg.columnar {
            Some(c) => &c.ops[..],
            None => &ctx.producer[..],
        };
        let ops = (producer, None, ctx.shared.charging());
        let el = apply_producer(el, ops, ctx.seed, self.epoch, &ctx.ds)?
            .ok_or_else(|| Error::invalid("a buffered sample is filtered out on resume"))?;
        self.tail_maps(el, 0, at)
    }

    /// `el` through the per-sample tail maps in stages `from..at`.
    fn tail_maps(&self, mut el: Element, from: usize, at: usize) -> Result<Element, Error> {
        let ctx = self.ctx;
        for t in &ctx.ph_tail[from..at] {
            if let TailOp::Map(i, op) = t {
                let (shard, record) = (el.pos.shard, el.pos.record);
                let mut c = OpContext::new(ctx.seed, self.epoch, shard, record, *i);
                el.sample = op
                    .apply(el.sample, &mut c)?
                    .ok_or_else(|| Error::invalid("a buffered sample is filtered out on resume"))?;
            }
        }
        Ok(el)
    }

    /// The item `k` names as it reaches tail stage `at`, made again from the samples read
    /// back (`got`).
    fn remake(&self, k: &Key, at: usize, got: &HashMap<Pos, Sample>) -> Result<Flow, Error> {
        match k {
            Key::Pos(p) => {
                let s = got
                    .get(p)
                    .cloned()
                    .ok_or_else(|| Error::invalid(format!("position {p:?} not found on resume")))?;
                Ok(Flow::Elem(self.remake_sample(*p, s, at)?, None))
            }
            Key::Batch(m) => self.remake_batch(m, at, got),
            Key::Cut(m, k) => {
                let u = self.ctx.ph_tail[..at]
                    .iter()
                    .rposition(|t| matches!(t, TailOp::Unbatch))
                    .ok_or_else(|| foreign_state("a cut sample with no unbatch before it"))?;
                let Flow::Batch(b, ..) = self.remake_batch(m, u, got)? else {
                    unreachable!("remake_batch makes a batch")
                };
                let sample = b
                    .unbatch()?
                    .into_iter()
                    .nth(*k as usize)
                    .ok_or_else(|| foreign_state("a cut sample past its batch's end"))?;
                let el = Element {
                    seq: 0,
                    pos: m[*k as usize].pos(),
                    sample,
                    hold: None,
                };
                let el = self.tail_maps(el, u + 1, at)?;
                Ok(Flow::Elem(el, Some((m.clone(), *k))))
            }
        }
    }

    /// The batch of `members` as it reaches tail stage `at`: its samples made again as
    /// they reached the last batch stage before `at`, collated, and passed through the
    /// operators on batches between.
    fn remake_batch(
        &self,
        members: &Arc<[Key]>,
        at: usize,
        got: &HashMap<Pos, Sample>,
    ) -> Result<Flow, Error> {
        let ctx = self.ctx;
        let Some((b, TailOp::Batch(_, _, collate))) = ctx.ph_tail[..at]
            .iter()
            .enumerate()
            .rev()
            .find(|(_, t)| matches!(t, TailOp::Batch(..)))
        else {
            return Err(foreign_state("a batch with no batch stage before it"));
        };
        let mut elems = Vec::with_capacity(members.len());
        for k in members.iter() {
            match self.remake(k, b, got)? {
                Flow::Elem(el, cut) => elems.push((el, cut)),
                Flow::Batch(..) => return Err(foreign_state("a batch of batches")),
            }
        }
        let Flow::Batch(mut batch, _, hold) = collate_elems(elems, None, collate)? else {
            unreachable!("collate_elems makes a batch")
        };
        let first = members.first().map_or(
            Pos {
                shard: 0,
                record: 0,
            },
            Key::pos,
        );
        for t in &ctx.ph_tail[b + 1..at] {
            if let TailOp::Map(i, op) = t {
                let mut cx = OpContext::new(ctx.seed, self.epoch, first.shard, first.record, *i);
                batch = match op.apply_batch(batch, &mut cx) {
                    Some(r) => r
                        .map_err(|e| e.with_stage(op.meta().name))?
                        .ok_or_else(|| {
                            Error::invalid("a buffered batch is filtered out on resume")
                        })?,
                    None => return Err(foreign_state("a per-sample operator after a batch")),
                };
            }
        }
        Ok(Flow::Batch(batch, members.clone(), hold))
    }

    /// Stage `i` (an unbatch) hands on the samples of the batch of `members` from the
    /// `from`-th on, noting how many it has handed on (a checkpoint names the rest).
    fn cut_out(&mut self, i: usize, members: Arc<[Key]>, samples: Vec<Sample>, from: u32) {
        if let Stage::Unbatch { cutting, sent } = &mut self.stages[i] {
            *cutting = Some(members.clone());
            *sent = from;
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
            if let Stage::Unbatch { sent, .. } = &mut self.stages[i] {
                *sent = k as u32 + 1;
            }
            c.add(&c.items_out, 1);
            self.push(i + 1, Flow::Elem(el, Some((members.clone(), k as u32))));
            if self.failed {
                return;
            }
        }
        if let Stage::Unbatch { cutting, sent } = &mut self.stages[i] {
            *cutting = None;
            *sent = 0;
        }
    }

    /// Takes worker results in order and pushes them through the stages until the source
    /// has ended and everything it emitted has been seen.
    fn pump(&mut self, done_rx: &Receiver<Done>, first: u64, tuner: &mut Tuner) {
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
    fn push_batched(&mut self, batch: Flow) {
        let Flow::Batch(b, ..) = &batch else {
            return self.push(0, batch);
        };
        debug_assert!(matches!(self.stages.first(), Some(Stage::Batch { .. })));
        let c = self.counters(0);
        c.add(&c.items_in, b.len() as u64);
        c.add(&c.items_out, 1);
        self.push(1, batch);
    }

    /// The mark stages `0..upto` make now: for the stages before the parallel stage whose
    /// result is going on ([`TailRun::upstream`]), as of when that item entered it; for the
    /// others, as they are.
    fn snapshot(&self, upto: usize) -> Upstream {
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
            let s = &self.stages[i];
            up.stages.push(match s {
                Stage::Pack(p) => match p.checkpoint() {
                    Ok(st) => StageMark::Fixed(st),
                    Err(e) => {
                        up.broken = Some(e.message);
                        StageMark::Fixed(StageState::Stateless)
                    }
                },
                s => stage_mark(s),
            });
            up.shuffle_ops[i] = mirror.ops_of(i);
        }
        up.upto = upto;
        up
    }

    fn par(&mut self, i: usize) -> &mut ParStage {
        match &mut self.stages[i] {
            Stage::Par(p) => p,
            _ => unreachable!("stage {i} is not a parallel stage"),
        }
    }

    /// Most items in a parallel stage at once: enough for every worker to have a chunk
    /// and the next one ready (results that finish early wait for their turn), within the
    /// window.
    fn par_cap(&self, chunk: usize) -> usize {
        (2 * self.ctx.threads * chunk).clamp(2, (self.ctx.window as usize).max(2))
    }

    /// `item` enters the parallel stage `i`: it is numbered, its mark so far taken, and
    /// it goes to the workers with the next chunk. With the stage full, waits for its
    /// next result and passes that on first.
    fn enter_par(&mut self, i: usize, item: Flow) {
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
    fn run_inline(&mut self, i: usize, item: Flow) {
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
    fn send_par(&mut self, i: usize) {
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
    fn send_all_par(&mut self) {
        for i in 0..self.stages.len() {
            if matches!(&self.stages[i], Stage::Par(p) if !p.unsent.is_empty()) {
                self.send_par(i);
            }
        }
    }

    /// Puts the workers' results where they wait for their turn.
    fn file(&mut self, done: ParDone) {
        let p = self.par(done.stage);
        for (t, r, up) in done.results {
            p.finished.insert(t, (r, up));
        }
    }

    /// Waits for the next result of the parallel stage `i` and passes it on. Results of
    /// other parallel stages that arrive meanwhile wait for their turn.
    fn await_par(&mut self, i: usize) {
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
    fn pass_on(&mut self, i: usize, (r, up): Finished) {
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
    fn deliver_ready(&mut self) {
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

    /// Ends the run with `e`, after what was finished before it.
    fn fail(&mut self, e: Error) {
        self.out_buf.push(OutMsg::Err(e));
        self.flush_out();
        self.failed = true;
    }

    /// Hands the finished items to the consumer.
    fn flush_out(&mut self) {
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

    fn error(&mut self, e: Error) {
        if self.ctx.policy == ErrorPolicy::Skip && e.kind.skippable() {
            self.ctx.shared.stats.skip(&e);
        } else {
            self.fail(e);
        }
    }

    fn counters(&self, i: usize) -> Arc<StageCounters> {
        self.ctx.shared.stats.stage(self.ctx.tail_offset + i)
    }

    /// Pushes one flow item into stage `i` (and on down).
    fn push(&mut self, i: usize, item: Flow) {
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
        let epoch = self.epoch;
        let seed = self.ctx.seed;
        let mut outs: Vec<Flow> = Vec::new();
        let mut err = None;
        // A batch an unbatch stage cuts: its samples go on one by one (`cut_out`).
        let mut cut = None;
        match &mut self.stages[i] {
            Stage::Par(_) | Stage::Fused => unreachable!("handled above"),
            // Samples, or batches after a batch stage: the picks are the same either way.
            Stage::Shuffle { size, buf, emitted } => {
                let mut m = self.ctx.shared.shuffle.lock();
                if buf.len() < *size {
                    m.bufs[i].push(item.key());
                    m.record(i, ShufMove::Push);
                    buf.push(item);
                } else {
                    let k = Rng::from_words(&[seed, epoch, SHUFFLE_PICK, *emitted])
                        .below(buf.len() as u64) as usize;
                    *emitted += 1;
                    let out = std::mem::replace(&mut buf[k], item);
                    let out_key = std::mem::replace(&mut m.bufs[i][k], buf[k].key());
                    m.record(
                        i,
                        ShufMove::Replace {
                            slot: k,
                            out: out_key,
                        },
                    );
                    m.emitted[i] = *emitted;
                    outs.push(out);
                }
            }
            Stage::Batch {
                size,
                collate,
                partial,
                stacker,
                ..
            } => match item {
                Flow::Elem(mut el, cut) => {
                    stacker.push(&mut el.sample, *size, collate);
                    partial.push((el, cut));
                    if partial.len() == *size {
                        let members = std::mem::take(partial);
                        let st = stacker.take();
                        match collate_elems(members, Some(st), collate) {
                            Ok(f) => outs.push(f),
                            Err(e) => err = Some(e),
                        }
                    }
                }
                Flow::Batch(..) => err = Some(Error::invalid("batch of batches")),
            },
            Stage::Pack(p) => match item {
                Flow::Elem(el, _) => match p.push(el.pos, &el.sample) {
                    Ok(blocks) => {
                        // The documents' bytes leave the budget with them; blocks count.
                        drop(el);
                        for (pos, sample) in blocks {
                            let hold = self.ctx.budget.try_reserve(sample.size_bytes() as u64);
                            let el = Element {
                                seq: 0,
                                pos,
                                sample,
                                hold,
                            };
                            outs.push(Flow::Elem(el, None));
                        }
                    }
                    Err(e) => err = Some(locate(&self.ctx.ds, e.with_stage(p.spec.name()), el.pos)),
                },
                Flow::Batch(..) => {
                    err = Some(Error::invalid(format!(
                        "{} takes samples but receives batches (put it before batch)",
                        p.spec.name()
                    )))
                }
            },
            Stage::Unbatch { .. } => match item {
                // The batch's bytes leave the budget with it.
                Flow::Batch(b, members, _hold) => match b.unbatch() {
                    Ok(samples) => cut = Some((members, samples)),
                    Err(e) => err = Some(e),
                },
                e => outs.push(e),
            },
            Stage::Take(n, seen) => {
                if *seen < *n {
                    *seen += 1;
                    outs.push(item);
                } else {
                    c.add(&c.dropped, 1);
                }
            }
            Stage::Skip(n, seen) => {
                if *seen < *n {
                    *seen += 1;
                    c.add(&c.dropped, 1);
                } else {
                    outs.push(item);
                }
            }
        }
        c.add(&c.busy_ns, t0.elapsed().as_nanos() as u64);
        if let Some(e) = err {
            self.error(e);
            return;
        }
        if let Some((members, samples)) = cut {
            self.cut_out(i, members, samples, 0);
            return;
        }
        let packs = matches!(self.stages[i], Stage::Pack(_));
        for o in outs {
            c.add(&c.items_out, 1);
            if packs {
                self.note_sent(i, &o);
            }
            self.push(i + 1, o);
        }
        if let Stage::Pack(p) = &mut self.stages[i] {
            p.prune();
        }
    }

    /// A pack stage (`i`) hands `block` to the next stage.
    fn note_sent(&mut self, i: usize, block: &Flow) {
        if let (Stage::Pack(p), Flow::Elem(el, _)) = (&mut self.stages[i], block) {
            p.note_sent(el.pos.record);
        }
    }

    /// End of the epoch from stage `i` on: drain the shuffle, emit a last partial batch.
    fn flush(&mut self, i: usize) {
        if i >= self.stages.len() || self.failed {
            return;
        }
        if matches!(self.stages[i], Stage::Par(_)) {
            while !self.failed && self.par(i).outstanding > 0 {
                self.await_par(i);
            }
            return self.flush(i + 1);
        }
        let epoch = self.epoch;
        let seed = self.ctx.seed;
        loop {
            let item = match &mut self.stages[i] {
                Stage::Shuffle { buf, emitted, .. } if !buf.is_empty() => {
                    let k = Rng::from_words(&[seed, epoch, SHUFFLE_PICK, *emitted])
                        .below(buf.len() as u64) as usize;
                    *emitted += 1;
                    let out = buf.swap_remove(k);
                    let mut m = self.ctx.shared.shuffle.lock();
                    let out_key = m.bufs[i].swap_remove(k);
                    m.emitted[i] = *emitted;
                    m.record(
                        i,
                        ShufMove::Remove {
                            slot: k,
                            out: out_key,
                        },
                    );
                    out
                }
                Stage::Batch {
                    partial,
                    drop_last,
                    collate,
                    stacker,
                    ..
                } if !partial.is_empty() => {
                    let members = std::mem::take(partial);
                    let st = stacker.take();
                    if *drop_last {
                        break;
                    }
                    match collate_elems(members, Some(st), collate) {
                        Ok(f) => f,
                        Err(e) => {
                            self.error(e);
                            return;
                        }
                    }
                }
                Stage::Pack(p) if p.has_pending() => match p.finish() {
                    Ok(Some((pos, sample))) => {
                        let hold = self.ctx.budget.try_reserve(sample.size_bytes() as u64);
                        let el = Element {
                            seq: 0,
                            pos,
                            sample,
                            hold,
                        };
                        Flow::Elem(el, None)
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let e = e.with_stage(p.spec.name());
                        self.error(e);
                        return;
                    }
                },
                _ => break,
            };
            let c = self.counters(i);
            c.add(&c.items_out, 1);
            if matches!(self.stages[i], Stage::Pack(_)) {
                self.note_sent(i, &item);
            }
            self.push(i + 1, item);
            if self.failed {
                return;
            }
        }
        self.flush(i + 1);
    }

    fn emit(&mut self, item: Flow) {
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

/// A stage's part of a mark, except a pack stage's (see `TailRun::snapshot`).
fn stage_mark(s: &Stage) -> StageMark {
    match s {
        Stage::Par(_) | Stage::Fused | Stage::Pack(_) => StageMark::Fixed(StageState::Stateless),
        Stage::Shuffle { .. } => StageMark::Shuffle,
        Stage::Batch { partial, .. } => {
            StageMark::Batch(partial.iter().map(|(e, c)| Key::of_elem(e, c)).collect())
        }
        Stage::Unbatch { cutting, sent } => StageMark::Unbatch(cutting.clone(), *sent),
        Stage::Take(_, seen) | Stage::Skip(_, seen) => {
            StageMark::Fixed(StageState::Count { seen: *seen })
        }
    }
}

/// `e`, from an operator on a batch of `rows` samples whose first is at `first`, with that
/// sample's object and record, saying so.
fn locate_batch(ds: &Dataset, e: Error, first: Pos, rows: usize) -> Error {
    let mut e = locate(ds, e, first);
    e.message = format!(
        "on a batch of {rows} samples (the first at this record): {}",
        e.message
    );
    e
}

/// `e` with the object and record of the sample at `pos` (a pack's block: its number).
fn locate(ds: &Dataset, e: Error, pos: Pos) -> Error {
    match ds.shards.get(pos.shard as usize) {
        Some(shard) => e.with_object(shard.url.clone()).with_record(pos.record),
        None if pos.shard == BLOCK_SHARD => e.with_object(format!("pack block {}", pos.record)),
        None => e,
    }
}

/// Slots for the batch stage ([`BatchSlots`]: the producer's last operator writes a
/// sample's tensor where the batch will stack it) when the producer feeds a batch stage
/// directly, in order (a run that is not deterministic numbers samples as they finish, so
/// the prediction would rarely hold). `STOKER_BATCH_SLOTS=0` turns them off, to measure
/// what they save.
fn batch_slots(ph: &Physical, columnar: bool, deterministic: bool) -> Option<Arc<BatchSlots>> {
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
fn collate_elems(
    members: Vec<(Element, CutFrom)>,
    stacker: Option<Stacker>,
    collate: &CollatePolicy,
) -> Result<Flow, Error> {
    let keys = members.iter().map(|(e, c)| Key::of_elem(e, c)).collect();
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

/// Moves worker threads toward the bottleneck from measured utilisation.
struct Tuner {
    last: Instant,
    busy: u64,
    max: usize,
}

impl Tuner {
    fn new(ctx: &TailCtx) -> Tuner {
        Tuner {
            last: Instant::now(),
            busy: 0,
            max: ctx.threads,
        }
    }

    /// `par_queued`: hand-offs of the parallel stages after the tail waiting for a worker.
    fn tick(&mut self, ctx: &TailCtx, par_queued: usize) {
        let par = ctx.par_ops.iter().flatten();
        if !ctx.autotune
            || (ctx.producer.is_empty() && par.clone().next().is_none())
            || self.last.elapsed() < Duration::from_millis(250)
        {
            return;
        }
        // The workers' busy time: the operators before the tail and those after it.
        let mut busy: u64 = par
            .flat_map(|r| &r.counters)
            .map(|c| c.busy_ns.load(Ordering::Relaxed))
            .sum();
        if !ctx.producer.is_empty() {
            busy += ctx.shared.stats.stage(1).busy_ns.load(Ordering::Relaxed);
        }
        let dt = self.last.elapsed().as_nanos() as f64;
        let active = ctx.shared.active.load(Ordering::Relaxed);
        let util = busy.saturating_sub(self.busy) as f64 / (dt * active as f64);
        let queued =
            ctx.shared.stats.stage(0).queue_len.load(Ordering::Relaxed) as usize + par_queued;
        self.busy = busy;
        self.last = Instant::now();
        let new = if util > 0.85 && queued > active && active < self.max {
            Some((
                active + 1,
                format!(
                    "workers {:.0}% busy with {queued} samples waiting",
                    util * 100.0
                ),
            ))
        } else if util < 0.3 && active > 1 {
            Some((
                active - 1,
                format!("workers only {:.0}% busy", util * 100.0),
            ))
        } else {
            None
        };
        if let Some((n, why)) = new {
            ctx.shared.active.store(n, Ordering::Relaxed);
            ctx.shared.stats.threads.store(n as u64, Ordering::Relaxed);
            ctx.shared.stats.autotune.lock().push((
                ctx.shared.stats.started.elapsed().as_secs_f64(),
                n as u64,
                why,
            ));
        }
    }
}
