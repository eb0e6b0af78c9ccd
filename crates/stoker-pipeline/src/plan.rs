//! The logical pipeline a user builds, and the options it runs with.

use std::sync::Arc;

use stoker_core::{CollatePolicy, Error, Sample};
use stoker_store::{Store, StoreOptions};

use crate::ops::SampleOp;
use crate::pack::Pack;

pub use crate::format::FormatChoice;

/// Where the samples come from.
#[derive(Clone)]
pub enum Source {
    /// Every object under a URL prefix (optionally matching a glob), in key order.
    Url {
        /// `s3://bucket/prefix/`, `file:///data/`, ...
        url: String,
        /// Store options (endpoint, credentials, part size, ...).
        options: Box<StoreOptions>,
        /// Only keys matching this glob (relative to the prefix).
        glob: Option<String>,
        /// These objects (keys relative to the URL's prefix, in this order) instead of a
        /// listing: a manifest (see [`Pipeline::keys`]).
        keys: Option<Arc<Vec<String>>>,
    },
    /// These keys of an open store, in this order.
    Keys {
        /// The store.
        store: Store,
        /// Keys relative to the bucket.
        keys: Vec<String>,
    },
    /// Samples already in memory (tests, engine-overhead benchmarks).
    Memory(Arc<Vec<Sample>>),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Url {
                url,
                glob,
                keys: None,
                ..
            } => write!(f, "Url({url}, glob={glob:?})"),
            Source::Url {
                url, keys: Some(k), ..
            } => write!(f, "Url({url}, {} keys)", k.len()),
            Source::Keys { keys, .. } => write!(f, "Keys({} keys)", keys.len()),
            Source::Memory(s) => write!(f, "Memory({} samples)", s.len()),
        }
    }
}

/// What happens to a bad record or a failing operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorPolicy {
    /// The error is returned and the run ends (the default).
    #[default]
    Raise,
    /// The sample (or the unreadable rest of a shard) is skipped, counted and listed in the
    /// stats.
    Skip,
}

/// What ranks do with the samples that do not divide evenly among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RankPolicy {
    /// Every rank drops the last incomplete round (each gets floor(n / world)).
    #[default]
    Drop,
    /// The last round is completed by repeating samples (each gets ceil(n / world)).
    Pad,
}

/// How a rank's share is cut from a dataset of shards of many records (tar, TFRecord,
/// Parquet, JSONL, CSV). One-sample-per-object formats always split the epoch's object order
/// by index, so every rank reads only its own objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitMode {
    /// `contiguous` when every shard's record count can be known before the run (the
    /// format counts from metadata, as Parquet does from its footers, or a shard index is
    /// given), otherwise `interleaved`.
    #[default]
    Auto,
    /// The stream of all shards, interleaved, is dealt out one sample per rank in rounds:
    /// exact and equal shares, but every rank reads every shard.
    Interleaved,
    /// Each rank takes a contiguous span of the epoch's records (the shards in the epoch's
    /// order, concatenated): it reads only the shards in its span, about `1 / world` of the
    /// data, and at most two of them in part. Needs every shard's record count (see
    /// [`Pipeline::shard_index`]); a shard whose records differ from its count is an error
    /// naming it.
    Contiguous,
}

/// Data-parallel sharding: this process is `rank` of `world`, and within the rank's share,
/// part `part` of `parts` (the rank's DataLoader workers).
///
/// The rank's share is decided first: every rank gets the same number of samples, the
/// remainder of `world` dropped or padded by `policy`. The share is then dealt out to the
/// parts in turn (its samples 0, `parts`, 2 `parts`, ... to part 0), with nothing dropped:
/// parts differ by at most one sample, and since every rank's share has the same length,
/// part `k` of every rank gets the same number of samples (so of batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankSplit {
    /// This rank (0-based).
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// What to do with the remainder.
    pub policy: RankPolicy,
    /// This part of the rank's share (0-based).
    pub part: u32,
    /// Number of parts the rank's share is dealt to (1: the whole share).
    pub parts: u32,
    /// How the share is cut from sharded formats.
    pub mode: SplitMode,
}

impl RankSplit {
    /// Whether anything is split off (more than one rank or part).
    pub fn splits(&self) -> bool {
        self.world > 1 || self.parts > 1
    }
}

/// One step of the logical plan.
#[derive(Debug, Clone)]
pub enum Op {
    /// A per-sample operator (map, or filter when it drops samples).
    Map(Arc<dyn SampleOp>),
    /// A seeded shuffle buffer of this many samples.
    Shuffle(usize),
    /// Groups samples into batches.
    Batch {
        /// Samples per batch.
        size: usize,
        /// Drop a last, smaller batch.
        drop_last: bool,
        /// How fields are combined.
        collate: CollatePolicy,
    },
    /// Packs the token ids of consecutive samples into fixed-length blocks (see [`Pack`]).
    Pack(Arc<Pack>),
    /// Splits batches back into samples.
    Unbatch,
    /// At most this many items per epoch.
    Take(u64),
    /// Skips this many items at the start of each epoch.
    Skip(u64),
    /// Keeps this many finished items ready ahead of the consumer.
    Prefetch(usize),
}

/// How a pipeline runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunOptions {
    /// CPU worker threads for per-sample operators (the autotuner moves within 1..=this).
    /// Default: the machine's cores.
    pub threads: usize,
    /// Adjust the active workers at run time from measured utilisation.
    pub autotune: bool,
    /// Same seed, same samples in the same order whatever the parallelism (default true).
    /// When false, samples leave the workers in the order they finish.
    pub deterministic: bool,
    /// Raise or skip on bad records.
    pub errors: ErrorPolicy,
    /// The one memory budget for fetch windows, queues, shuffle buffers and the store's
    /// cache. Default: the store's (a share of the machine's memory).
    pub memory_limit: Option<u64>,
    /// Samples in flight between the source and the consumer (reorder window).
    pub window: usize,
    /// Let a format that decodes columns (Parquet) build the first `batch` itself, straight
    /// from its columns, when the result is the same (default true; see `docs/pipeline.md`,
    /// "The columnar path"). False always reads rows as samples.
    pub columnar: bool,
    /// Read a URL source through the process's shared store for its bucket and options
    /// (see [`crate::shared`]), so that its block cache, connections and metadata carry
    /// over to later runs, such as the next epoch of a training loop that starts a run per
    /// epoch (default false: a run's store ends with it). Such a run keeps a memory block
    /// cache even when it reads one epoch (the store's default: half its budget for an
    /// object store, none for local files; `cache_memory` sets it).
    pub share_store: bool,
    /// Optimizer passes to turn off, by name (see `optimize::PASSES`: `"shuffle"`,
    /// `"cache"`, `"fusion"`): the plan is then the one without their rewrites, for ablation
    /// and debugging (default: none).
    pub disable: Vec<String>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            autotune: true,
            deterministic: true,
            errors: ErrorPolicy::Raise,
            memory_limit: None,
            window: 1024,
            columnar: true,
            share_store: false,
            disable: Vec::new(),
        }
    }
}

impl RunOptions {
    /// Sets the worker threads.
    pub fn with_threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }
    /// Turns the autotuner on or off.
    pub fn with_autotune(mut self, on: bool) -> Self {
        self.autotune = on;
        self
    }
    /// Sets deterministic ordering.
    pub fn with_deterministic(mut self, on: bool) -> Self {
        self.deterministic = on;
        self
    }
    /// Sets the error policy.
    pub fn with_errors(mut self, p: ErrorPolicy) -> Self {
        self.errors = p;
        self
    }
    /// Sets the memory budget.
    pub fn with_memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }
    /// Sets the reorder window.
    pub fn with_window(mut self, n: usize) -> Self {
        self.window = n.max(1);
        self
    }
    /// Allows or forbids the columnar path.
    pub fn with_columnar(mut self, on: bool) -> Self {
        self.columnar = on;
        self
    }
    /// Reads through the process's shared store (see [`RunOptions::share_store`]).
    pub fn with_share_store(mut self, on: bool) -> Self {
        self.share_store = on;
        self
    }
    /// Turns off these optimizer passes (see [`RunOptions::disable`]).
    pub fn with_disabled_passes<S: Into<String>>(
        mut self,
        passes: impl IntoIterator<Item = S>,
    ) -> Self {
        self.disable = passes.into_iter().map(Into::into).collect();
        self
    }
}

/// A pipeline: a source, a format, operators, and how to run them. Build it with the
/// chained methods, then [`Pipeline::run`] it.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub(crate) source: Source,
    pub(crate) format: FormatChoice,
    pub(crate) shuffle_shards: bool,
    pub(crate) cycle: usize,
    pub(crate) cache: bool,
    pub(crate) cache_dir: Option<std::path::PathBuf>,
    pub(crate) cache_size: Option<u64>,
    pub(crate) rank: Option<RankSplit>,
    pub(crate) split_mode: SplitMode,
    pub(crate) shard_index: Option<String>,
    pub(crate) ops: Vec<Op>,
    pub(crate) epochs: Option<u64>,
    pub(crate) first_epoch: u64,
    pub(crate) seed: u64,
    pub(crate) options: RunOptions,
    /// Only entries `start..end` of each epoch's order (see [`Pipeline::span`]).
    pub(crate) span: Option<(u64, u64)>,
}

impl Pipeline {
    /// A pipeline over `source` read as `format`.
    pub fn new(source: Source, format: FormatChoice) -> Pipeline {
        Pipeline {
            source,
            format,
            shuffle_shards: false,
            cache: false,
            cache_dir: None,
            cache_size: None,
            cycle: 1,
            rank: None,
            split_mode: SplitMode::Auto,
            shard_index: None,
            ops: Vec::new(),
            epochs: Some(1),
            first_epoch: 0,
            seed: 0,
            options: RunOptions::default(),
            span: None,
        }
    }

    /// Every object under `url` read as `format`.
    pub fn from_url(url: &str, options: StoreOptions, format: FormatChoice) -> Pipeline {
        Pipeline::new(
            Source::Url {
                url: url.to_string(),
                options: Box::new(options),
                glob: None,
                keys: None,
            },
            format,
        )
    }

    /// Samples in memory.
    pub fn from_samples(samples: Vec<Sample>) -> Pipeline {
        Pipeline::new(Source::Memory(Arc::new(samples)), FormatChoice::Files)
    }

    /// Only keys matching `glob` (for a URL source).
    pub fn glob(mut self, glob: impl Into<String>) -> Self {
        if let Source::Url { glob: g, .. } = &mut self.source {
            *g = Some(glob.into());
        }
        self
    }

    /// Reads these objects, keys relative to the URL's prefix, in this order, instead of
    /// listing the prefix (for a URL source): a manifest. An object's size is asked for
    /// when a reader needs it, and a missing one fails the run when it reaches it, naming
    /// it; with a disk cache a run looks every key up first (many at once), for the
    /// versions that tell a changed object, and fails at its start on a missing one.
    pub fn keys(mut self, keys: Vec<String>) -> Self {
        if let Source::Url { keys: k, .. } = &mut self.source {
            *k = Some(Arc::new(keys));
        }
        self
    }

    /// Shuffles the order of shards (for one-sample-per-object formats: of the objects,
    /// which is a full shuffle) with a new order every epoch.
    pub fn shuffle_shards(mut self, on: bool) -> Self {
        self.shuffle_shards = on;
        self
    }

    /// Reads `cycle` shards at once, taking samples from each in turn.
    pub fn interleave(mut self, cycle: usize) -> Self {
        self.cycle = cycle.max(1);
        self
    }

    /// Keeps this rank's share (see [`RankPolicy`]).
    pub fn shard_by_rank(self, rank: u32, world: u32, policy: RankPolicy) -> Self {
        self.shard_by_rank_part(rank, world, policy, 0, 1)
    }

    /// Keeps part `part` of `parts` of this rank's share (see [`RankSplit`]): what one of
    /// a rank's `parts` DataLoader workers reads.
    pub fn shard_by_rank_part(
        mut self,
        rank: u32,
        world: u32,
        policy: RankPolicy,
        part: u32,
        parts: u32,
    ) -> Self {
        self.rank = Some(RankSplit {
            rank,
            world,
            policy,
            part,
            parts: parts.max(1),
            mode: self.split_mode,
        });
        self
    }

    /// How a rank's share is cut from sharded formats (see [`SplitMode`]; default `Auto`).
    pub fn split_mode(mut self, mode: SplitMode) -> Self {
        self.split_mode = mode;
        if let Some(r) = &mut self.rank {
            r.mode = mode;
        }
        self
    }

    /// A JSON file (any store URL) giving each shard's record count, for the contiguous
    /// rank split of formats that cannot count from metadata. Either
    /// `{"shards": [{"url": ..., "records": N}, ...]}` or WebDataset's shard index
    /// (`{"shardlist": [{"url": ..., "nsamples": N}, ...]}`); a relative `url` is relative
    /// to the index's own directory. `stoker index` writes the first form.
    pub fn shard_index(mut self, url: impl Into<String>) -> Self {
        self.shard_index = Some(url.into());
        self
    }

    /// Adds a per-sample operator.
    pub fn map(mut self, op: impl SampleOp + 'static) -> Self {
        self.ops.push(Op::Map(Arc::new(op)));
        self
    }

    /// Adds a per-sample operator already in an `Arc`.
    pub fn map_arc(mut self, op: Arc<dyn SampleOp>) -> Self {
        self.ops.push(Op::Map(op));
        self
    }

    /// Adds a shuffle buffer.
    pub fn shuffle(mut self, buffer: usize) -> Self {
        self.ops.push(Op::Shuffle(buffer.max(1)));
        self
    }

    /// Batches (auto collate).
    pub fn batch(self, size: usize, drop_last: bool) -> Self {
        self.batch_with(size, drop_last, CollatePolicy::default())
    }

    /// Batches with a collate policy.
    pub fn batch_with(mut self, size: usize, drop_last: bool, collate: CollatePolicy) -> Self {
        self.ops.push(Op::Batch {
            size: size.max(1),
            drop_last,
            collate,
        });
        self
    }

    /// Packs documents' token ids into blocks of `pack.block_size` (see [`Pack`]): a
    /// sequential stage that takes samples (before any `batch`) and gives blocks.
    pub fn pack(mut self, pack: Pack) -> Self {
        self.ops.push(Op::Pack(Arc::new(pack)));
        self
    }

    /// Splits batches into samples.
    pub fn unbatch(mut self) -> Self {
        self.ops.push(Op::Unbatch);
        self
    }

    /// At most `n` items per epoch.
    pub fn take(mut self, n: u64) -> Self {
        self.ops.push(Op::Take(n));
        self
    }

    /// Skips `n` items per epoch.
    pub fn skip(mut self, n: u64) -> Self {
        self.ops.push(Op::Skip(n));
        self
    }

    /// Keeps the parsed records in memory after the first epoch reads them (within the
    /// memory budget, at most half of it), so later epochs neither fetch nor parse them.
    /// Operators still run every epoch (random ones draw anew). Raw bytes can also be kept
    /// on local disk by the store's disk cache (store option `cache_dir`).
    pub fn cache(mut self) -> Self {
        self.cache = true;
        self
    }

    /// Like [`Pipeline::cache`], but keeps the parsed records in files under `dir`, one per
    /// shard, instead of memory: not bounded by the memory budget, and reused by later runs
    /// and other processes reading the same objects with the same format (a changed object
    /// is read anew: files are named by the object's version). A shard is written when
    /// read whole without errors; later epochs read it back without fetching or parsing.
    pub fn cache_on_disk(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.cache = true;
        self.cache_dir = Some(dir.into());
        self.cache_size = None;
        self
    }

    /// Like [`Pipeline::cache_on_disk`], within `max_bytes`: the directory's files never
    /// add up to more. Nothing is evicted: the shards whose files fit stay cached and are
    /// reused; a shard whose file would go over is not written and is read from the source
    /// every epoch (never an error, never a partial file). [`Stats::cache`](crate::Stats)
    /// counts both. Runs and processes sharing the directory share the limit (see
    /// `docs/pipeline.md`).
    pub fn cache_on_disk_limited(
        mut self,
        dir: impl Into<std::path::PathBuf>,
        max_bytes: u64,
    ) -> Self {
        self.cache = true;
        self.cache_dir = Some(dir.into());
        self.cache_size = Some(max_bytes);
        self
    }

    /// Keeps `n` items ready ahead of the consumer.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.ops.push(Op::Prefetch(n.max(1)));
        self
    }

    /// Number of epochs (`None`: repeat forever).
    pub fn epochs(mut self, n: Option<u64>) -> Self {
        self.epochs = n;
        self
    }

    /// Runs begin at epoch `k` (default 0): the shard order, the shuffle buffer and the
    /// random operators draw as in epoch `k` of a run from epoch 0, and with
    /// [`epochs`](Self::epochs)`(Some(n))` the run reads epochs `k..k + n`. So a loop that
    /// starts one run per epoch (`first_epoch(e)`, one epoch each) reads exactly what one
    /// run of `e + 1` epochs reads. A state from [`Run::state`](crate::Run::state) records
    /// its epoch, so resume it with the same `first_epoch`.
    pub fn first_epoch(mut self, k: u64) -> Self {
        self.first_epoch = k;
        self
    }

    /// Reads only entries `start..end` of each epoch's order of objects (formats with one
    /// sample per object: samples `start..end` of the epoch) or of shards (formats of many
    /// records: those shards, whole), the order being the one the whole pipeline reads
    /// (shuffled by `shuffle_shards`, this rank's share with a rank split of objects).
    /// Every sample keeps its position, so its random draws are the ones the whole run
    /// gives it: the spans `0..a`, `a..b`, `b..n` read, one after the other, what the whole
    /// pipeline reads (up to what the tail stages hold across a span's end: a shuffle buffer
    /// or a batch is filled within a span). This is the piece a distributed run hands a
    /// worker. An end past the order's length stops at it.
    pub fn span(mut self, start: u64, end: u64) -> Self {
        self.span = Some((start, end));
        self
    }

    /// Whether later runs in the process may read what this one reads: it reads a URL
    /// through the process's shared store (each epoch of a PyTorch loop is such a run), whose
    /// budget outlives the run, and so may a cache of samples in it.
    pub(crate) fn later_runs(&self) -> bool {
        self.options.share_store && matches!(self.source, Source::Url { .. })
    }

    /// The seed of every random choice.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Run options.
    pub fn options(mut self, options: RunOptions) -> Self {
        self.options = options;
        self
    }

    /// The epochs a run reads (`None`: without end) and the first of them.
    pub fn epoch_range(&self) -> (Option<u64>, u64) {
        (self.epochs, self.first_epoch)
    }

    /// The batch stages' sizes, in order (a distributed run cuts its pieces at multiples
    /// of the first, so that the pieces' batches are the whole run's).
    pub fn batch_sizes(&self) -> Vec<usize> {
        self.ops
            .iter()
            .filter_map(|o| match o {
                Op::Batch { size, .. } => Some(*size),
                _ => None,
            })
            .collect()
    }

    /// Whether a tail stage holds samples across what it is given: a shuffle buffer, a
    /// pack (cut at a span's end, its output differs from the whole run's).
    pub fn holds_across(&self) -> bool {
        self.ops
            .iter()
            .any(|o| matches!(o, Op::Shuffle(_) | Op::Pack(_)))
    }

    /// The memory limit of a run: the run options', else the source store's
    /// (`memory_limit` among a URL's store options), else none (a share of the system's).
    pub(crate) fn memory_limit(&self) -> Option<u64> {
        self.options.memory_limit.or(match &self.source {
            Source::Url { options, .. } => options.memory_limit,
            _ => None,
        })
    }

    /// Checks the plan before running.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if let Some(r) = self.rank {
            if r.world == 0 || r.rank >= r.world {
                return Err(Error::invalid(format!(
                    "rank {} of world {} is not a valid rank",
                    r.rank, r.world
                )));
            }
        }
        if self.epochs == Some(0) {
            return Err(Error::invalid("epochs must be at least 1"));
        }
        if let Some((start, end)) = self.span {
            if start > end {
                return Err(Error::invalid(format!(
                    "span {start}..{end}: the start is past the end"
                )));
            }
            let objects = matches!(&self.format, FormatChoice::Fixed(f) if f.one_sample_per_object())
                || matches!(self.source, Source::Memory(_));
            if self.rank.is_some_and(|r| r.splits()) && !objects {
                return Err(Error::invalid(
                    "a span with a rank split needs a format of one sample per object (files, \
                     imagefolder): a rank's records of other formats are not a list of shards",
                ));
            }
        }
        crate::optimize::check_disabled(&self.options.disable)?;
        if let Source::Url {
            glob: Some(_),
            keys: Some(_),
            ..
        } = &self.source
        {
            return Err(Error::invalid("give the source keys or a glob, not both"));
        }
        for op in &self.ops {
            match op {
                Op::Pack(p) => p.validate()?,
                // A spec operator built in code (not from a spec, which checks it when it
                // reads it): its arguments and files, before the run lists anything.
                Op::Map(m) => {
                    if let Some(b) = m.as_builtin() {
                        b.validate()?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}
