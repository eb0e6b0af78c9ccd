//! The source: shards in epoch order, read and turned into samples.
//!
//! Two shapes, chosen by the format:
//!
//! - **One sample per object** (files, ImageFolder, samples in memory). The epoch's order
//!   of objects is known in advance (a seeded permutation when shuffling; this rank's share
//!   of it when sharding by rank), so the source asks the store for the objects in exactly
//!   that order with [`Store::fetch_many`]: many in flight, delivered in order, within the
//!   byte window. The cursor is an index into the order.
//! - **Shards of many records** (tar, TFRecord, Parquet, JSONL, CSV). `cycle` shards are
//!   open at once, each parsed on its own thread from a streamed read (or ranged reads for
//!   Parquet), and the source takes one sample from each in turn; an exhausted shard is
//!   replaced in its slot by the next one in the epoch's order. The cursor is the next
//!   shard, each slot's shard and records consumed, and whose turn it is. Ranks split the
//!   resulting stream in rounds of `world` samples (see [`RankPolicy`]).
//!
//! Every sample leaves with its position (global shard index, record index) and a sequence
//! number; the cursor after each emission is what a checkpoint resumes from.
//!
//! **The columnar path** (a format that decodes columns, one shard at a time, a `batch`
//! first; the executor decides, see `exec`): the shards are read in the same order, but as
//! [`Columns`] chunks, and the source cuts them into the batch's rows itself, across row
//! groups and files, and emits one [`Produced::Rows`] per batch (collated by a worker).
//! Positions and the cursor count exactly as above (a row, or an error, is one record of
//! its shard), so the batches, their positions and the errors between them are those the
//! row path makes; a checkpoint always falls after a whole batch, and a restored run skips
//! the consumed records of the open shard as the row path does.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use stoker_core::{CollatePolicy, Columns, Error, Sample};
use stoker_formats::files::{Files, ImageFolder};
use stoker_formats::{Access, ByteSource, ChunkCursor, Format, Input, RandomAccess, ShardInfo};
use stoker_store::{FetchManyOptions, ListOptions, MetricsSnapshot, Store, StoreOptions};

use crate::ops::SampleOp;
use crate::plan::{FormatChoice, RankPolicy, RankSplit, Source};
use crate::rng::permutation;
use crate::split::Piece;
pub use crate::state::{Pos, SourceCursor};

mod columnar;
mod count;
use columnar::run_columnar;
pub(crate) use count::record_counts;

/// A sample on its way through the pipeline, holding its bytes against the budget.
#[derive(Debug)]
pub(crate) struct Element {
    pub seq: u64,
    pub pos: Pos,
    pub sample: Sample,
    pub hold: Option<stoker_core::Reservation>,
}

/// What the source emits.
#[derive(Debug)]
pub(crate) enum Produced {
    Elem(Element),
    Fail {
        seq: u64,
        pos: Pos,
        error: Error,
    },
    /// The rows of one batch (columnar path), to collate under `collate`.
    Rows {
        seq: u64,
        positions: Vec<Pos>,
        parts: Vec<Columns>,
        collate: Arc<CollatePolicy>,
        hold: Option<stoker_core::Reservation>,
    },
}

impl Produced {
    fn set_seq(&mut self, s: u64) {
        match self {
            Produced::Elem(e) => e.seq = s,
            Produced::Fail { seq, .. } | Produced::Rows { seq, .. } => *seq = s,
        }
    }

    pub(crate) fn seq(&self) -> u64 {
        match self {
            Produced::Elem(e) => e.seq,
            Produced::Fail { seq, .. } | Produced::Rows { seq, .. } => *seq,
        }
    }
}

/// The columnar path's batching (see the module docs): the first `batch` of the plan,
/// with the structural operators before it.
#[derive(Debug)]
pub(crate) struct Columnar {
    pub size: usize,
    pub drop_last: bool,
    pub collate: Arc<CollatePolicy>,
    /// `rename`/`select`/`drop`, with their places in the plan: applied to each chunk's
    /// field names.
    pub ops: Vec<(usize, Arc<dyn SampleOp>)>,
}

/// The dataset, resolved: shards, format, store.
/// [`Dataset::growth`] for "as read".
pub(crate) const GROWTH_ONE: u64 = 1024;

pub(crate) struct Dataset {
    pub store: Option<Store>,
    pub shards: Arc<Vec<ShardInfo>>,
    pub memory: Option<Arc<Vec<Sample>>>,
    pub format: Arc<dyn Format>,
    pub per_object: bool,
    pub runtime: tokio::runtime::Handle,
    pub fetch: FetchManyOptions,
    pub cache: Option<SampleCache>,
    /// What the workers' operators make of a sample's bytes, times 1024, smoothed over the
    /// samples so far (1024 until one is measured): the source reserves a sample's bytes
    /// times this, so that the budget holds what the sample will be, not what was read.
    pub growth: std::sync::atomic::AtomicU64,
    /// The store's metrics when the dataset was resolved: a shared store's counters also
    /// count earlier runs, and a run's stats report what happened since.
    pub storage_baseline: Option<MetricsSnapshot>,
}

/// Parsed records kept in memory across epochs (`Pipeline::cache`), shard by shard, within
/// the memory budget: a shard is kept only when it was read whole without errors and its
/// samples fit in the budget; otherwise it is read again next epoch. The records are the
/// same either way, so a partial cache changes speed, never results.
///
/// With a directory (`Pipeline::cache_on_disk`), shards go to files there instead (see
/// [`crate::diskcache`]): not bounded by memory, reused by later runs and by other
/// processes over the same objects, and read back without parsing. With a size limit
/// (`Pipeline::cache_on_disk_limited`), a shard whose file would take the directory over it
/// is not written, and this run does not try it again (nothing in the directory is evicted,
/// so it would not fit later either): it is read from the source every epoch.
pub(crate) struct SampleCache {
    shards: parking_lot::Mutex<std::collections::HashMap<u32, Arc<Vec<Sample>>>>,
    holds: parking_lot::Mutex<Vec<stoker_core::Reservation>>,
    budget: stoker_core::MemoryBudget,
    disk: Option<(crate::diskcache::DiskTier, Arc<Vec<ShardInfo>>, String)>,
    /// Shards that did not fit (the limit on disk, half the budget in memory).
    refused: parking_lot::Mutex<std::collections::HashSet<u32>>,
    pub counters: Arc<crate::stats::CacheCounters>,
}

impl SampleCache {
    pub(crate) fn new(budget: stoker_core::MemoryBudget) -> SampleCache {
        let counters = crate::stats::CacheCounters::default();
        counters.limit.store(budget.limit() / 2, Ordering::Relaxed);
        SampleCache {
            shards: Default::default(),
            holds: Default::default(),
            budget,
            disk: None,
            refused: Default::default(),
            counters: Arc::new(counters),
        }
    }

    /// A cache in files under `dir` for the shards of `ds`, within `limit` bytes if given.
    pub(crate) fn on_disk(
        budget: stoker_core::MemoryBudget,
        dir: &std::path::Path,
        limit: Option<u64>,
        ds: &Dataset,
    ) -> Result<SampleCache, Error> {
        let mut c = SampleCache::new(budget);
        let tier = crate::diskcache::DiskTier::new(dir, limit)?;
        c.counters.bytes.store(tier.used(), Ordering::Relaxed);
        c.counters
            .limit
            .store(tier.limit().unwrap_or(u64::MAX), Ordering::Relaxed);
        c.disk = Some((tier, ds.shards.clone(), format!("{:?}", ds.format)));
        Ok(c)
    }

    /// What identifies shard `id`'s parsed records: the format with its options, and the
    /// object's URL, size and version.
    fn identity(shards: &[ShardInfo], format: &str, id: u32) -> String {
        let s = &shards[id as usize];
        format!(
            "{format}\n{}\n{:?}\n{:?}",
            s.url,
            s.size,
            s.version.as_deref()
        )
    }

    fn get(&self, id: u32) -> Option<Arc<Vec<Sample>>> {
        let r = match &self.disk {
            None => self.shards.lock().get(&id).cloned(),
            Some((tier, shards, format)) => {
                tier.get(&Self::identity(shards, format, id)).map(Arc::new)
            }
        };
        if r.is_some() {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn contains(&self, id: u32) -> bool {
        match &self.disk {
            None => self.shards.lock().contains_key(&id),
            Some((tier, shards, format)) => tier.contains(&Self::identity(shards, format, id)),
        }
    }

    /// Whether shard `id` is worth collecting for [`SampleCache::insert`]: not when its
    /// file did not fit the directory's limit already (in memory the budget moves, so a
    /// shard is tried again).
    fn wants(&self, id: u32) -> bool {
        self.disk.is_none() || !self.refused.lock().contains(&id)
    }

    fn refuse(&self, id: u32) {
        if self.refused.lock().insert(id) {
            self.counters.over_limit.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn insert(&self, id: u32, samples: Vec<Sample>) {
        if let Some((tier, shards, format)) = &self.disk {
            let identity = Self::identity(shards, format, id);
            match tier.put(&identity, &samples) {
                Ok(crate::diskcache::Put::Written(n)) => {
                    self.counters.stored.fetch_add(1, Ordering::Relaxed);
                    self.counters.stored_bytes.fetch_add(n, Ordering::Relaxed);
                }
                Ok(crate::diskcache::Put::Present) => {}
                Ok(crate::diskcache::Put::OverLimit(_)) => self.refuse(id),
                Err(e) => {
                    // The cache only saves work: a shard it cannot keep is read again.
                    tracing::warn!(shard = shards[id as usize].url, error = %e, "cannot write the disk cache");
                }
            }
            self.counters.bytes.store(tier.used(), Ordering::Relaxed);
            return;
        }
        let bytes: u64 = samples.iter().map(|s| s.size_bytes() as u64 + 64).sum();
        // Keep at most half the budget for the cache: the rest is for the pipeline itself.
        if self.budget.used() + bytes > self.budget.limit() / 2 {
            self.refuse(id);
            return;
        }
        if let Some(h) = self.budget.try_reserve(bytes) {
            self.holds.lock().push(h);
            self.shards.lock().insert(id, Arc::new(samples));
            self.counters.stored.fetch_add(1, Ordering::Relaxed);
            self.counters
                .stored_bytes
                .fetch_add(bytes, Ordering::Relaxed);
            self.counters.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.refuse(id);
        }
    }
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Dataset({} shards, {})",
            self.shards.len(),
            self.format.name()
        )
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

/// Opens the store a run (or a count of records) reads a URL source through, drawing on
/// `budget`, the run's memory budget (the memory limit is the budget's: it is not given to
/// the store again). A run that reads its data once (`single_pass`: one epoch, in a store
/// of its own) gets no memory block cache unless the options set `cache_memory`: nothing
/// would be read twice, and every block kept would be memory taken from the budget for
/// nothing. Returns the store and the key the URL names in it.
pub(crate) fn open_url_store(
    url: &str,
    options: &StoreOptions,
    budget: &stoker_core::MemoryBudget,
    single_pass: bool,
) -> Result<(Store, String), Error> {
    let mut options = options.clone();
    if single_pass && options.cache_memory.is_none() {
        options = options.with_cache_memory(0);
    }
    let store = Store::open_with_budget(url, options, budget.clone()).map_err(Error::from)?;
    let key = store.url_key().to_string();
    Ok((store, key))
}

impl Dataset {
    /// Lists the source and picks the format. A URL source is read through `opened`, the
    /// store the run opened for it ([`open_url_store`], or a shared one) and the key the URL
    /// names in it. A store given by the caller (`Source::Keys`) is used as it is. A URL
    /// source's list of keys is looked up first (HEAD, many at once) when `look_up_keys`,
    /// for the versions a disk cache needs; else each object's size is asked for when a
    /// reader needs it.
    pub(crate) fn resolve(
        source: &Source,
        format: &FormatChoice,
        runtime: &tokio::runtime::Handle,
        budget: Option<stoker_core::MemoryBudget>,
        look_up_keys: bool,
        opened: Option<(Store, String)>,
    ) -> Result<Dataset, Error> {
        let storage = Error::from;
        let mut baseline = None;
        let (store, infos, memory, prefix) = match source {
            Source::Memory(m) => {
                let shards = (0..m.len())
                    .map(|i| ShardInfo::new(format!("{i}"), format!("memory:{i}")))
                    .collect::<Vec<_>>();
                (None, shards, Some(m.clone()), String::new())
            }
            Source::Url {
                url,
                options: _,
                glob,
                keys,
            } => {
                let (store, key) = opened.ok_or_else(|| {
                    Error::invalid(format!("internal: no store was opened for {url}"))
                })?;
                baseline = Some(store.metrics());
                let mut lo = ListOptions::default();
                if let Some(g) = glob {
                    lo = lo.with_glob(g.clone());
                }
                let dir = if key.is_empty() || key.ends_with('/') {
                    key.clone()
                } else {
                    format!("{key}/")
                };
                let (shards, prefix) = if let Some(keys) = keys {
                    if keys.is_empty() {
                        return Err(Error::invalid("the source's list of keys is empty"));
                    }
                    let shards = if look_up_keys {
                        head_keys(runtime, &store, &dir, keys)?
                            .iter()
                            .map(|o| listed_shard(&store, o))
                            .collect()
                    } else {
                        // Sizes come when a reader needs one (a HEAD then), and a missing
                        // object fails when the run reaches it, naming it.
                        keys.iter()
                            .map(|k| {
                                let key = format!("{dir}{k}");
                                ShardInfo::new(key.clone(), store.object_url(&key))
                            })
                            .collect()
                    };
                    (shards, dir)
                } else {
                    let listed = runtime
                        .block_on(store.list_all(&key, &lo))
                        .map_err(storage)?;
                    let (listed, prefix) =
                        if listed.is_empty() && !key.is_empty() && !key.ends_with('/') {
                            // The URL names one object.
                            let info = runtime.block_on(store.head(&key)).map_err(storage)?;
                            let prefix = key
                                .rfind('/')
                                .map_or(String::new(), |i| key[..=i].to_string());
                            (vec![info], prefix)
                        } else {
                            (listed, dir)
                        };
                    if listed.is_empty() {
                        return Err(Error::not_found(format!(
                            "no objects under {url}{}",
                            glob.as_ref()
                                .map(|g| format!(" matching {g:?}"))
                                .unwrap_or_default()
                        )));
                    }
                    let shards = listed.iter().map(|o| listed_shard(&store, o)).collect();
                    (shards, prefix)
                };
                (Some(store), shards, None, prefix)
            }
            Source::Keys { store, keys } => {
                baseline = Some(store.metrics());
                let shards = keys
                    .iter()
                    .map(|k| ShardInfo::new(k.clone(), store.object_url(k)))
                    .collect();
                (Some(store.clone()), shards, None, String::new())
            }
        };
        let detected;
        let format = match format {
            FormatChoice::Auto(fo) => {
                let url = match source {
                    Source::Url { url, .. } => url.as_str(),
                    _ => "the source",
                };
                detected =
                    crate::format::detect_format(infos.iter().map(|s| s.key.as_str()), fo, url)?;
                &detected
            }
            other => other,
        };
        let format: Arc<dyn Format> = match format {
            FormatChoice::Auto(_) => unreachable!("detected above"),
            FormatChoice::Files => Arc::new(Files { prefix }),
            FormatChoice::ImageFolder => Arc::new(ImageFolder::from_keys(
                &prefix,
                infos.iter().map(|s| s.key.as_str()),
            )),
            FormatChoice::Fixed(f) => f.clone(),
        };
        Ok(Dataset {
            storage_baseline: baseline,
            store,
            shards: Arc::new(infos),
            memory,
            per_object: format.one_sample_per_object(),
            format,
            runtime: runtime.clone(),
            cache: None,
            growth: std::sync::atomic::AtomicU64::new(GROWTH_ONE),
            // Fetched-but-unparsed bytes get a quarter of the budget; the rest is for
            // samples on their way to the consumer.
            fetch: FetchManyOptions::default().with_max_bytes(
                budget
                    .as_ref()
                    .map_or(256 << 20, |b| (b.limit() / 4).clamp(1 << 20, 256 << 20)),
            ),
        })
    }
}

/// Samples the workers start from without the source's: those their cache holds at its cache
/// point (`exec/opcache.rs`), by position. The source does not read such an object again
/// (for a one-sample-per-object format); it hands on an empty sample in its place, which
/// the workers replace with the cached one. Entries are never removed during a run, so one
/// held when the source looks is held when the worker does.
pub(crate) trait HeldAhead: std::fmt::Debug + Send + Sync {
    fn holds(&self, pos: Pos) -> bool;
}

/// How the source orders and splits an epoch.
#[derive(Debug, Clone)]
pub(crate) struct SourceConfig {
    /// See [`HeldAhead`].
    pub held_ahead: Option<Arc<dyn HeldAhead>>,
    pub shuffle_shards: bool,
    pub cycle: usize,
    pub rank: Option<RankSplit>,
    pub seed: u64,
    /// Read columns and emit whole batches (only with `cycle` 1, no rank split).
    pub columnar: Option<Arc<Columnar>>,
    /// Every shard's record count, when the rank split is contiguous (see `split`).
    pub counts: Option<Arc<Vec<u64>>>,
    /// Only these entries of the epoch's order (see `Pipeline::span`).
    pub span: Option<(u64, u64)>,
}

const SHARD_ORDER: u64 = 0x0053_4841_5244;

/// The epoch's order of shard indices (for one-sample-per-object formats: this rank's
/// share of it).
pub(crate) fn epoch_order(ds: &Dataset, cfg: &SourceConfig, epoch: u64) -> Vec<u32> {
    let mut order = whole_order(ds, cfg, epoch);
    if let Some((start, end)) = cfg.span {
        let len = order.len() as u64;
        let (start, end) = (start.min(len) as usize, end.min(len) as usize);
        order.truncate(end);
        order.drain(..start);
    }
    order
}

/// [`epoch_order`] before its span.
fn whole_order(ds: &Dataset, cfg: &SourceConfig, epoch: u64) -> Vec<u32> {
    let n = ds.shards.len();
    let order = if cfg.shuffle_shards {
        permutation(n, &[cfg.seed, epoch, SHARD_ORDER])
    } else {
        (0..n as u32).collect()
    };
    match (ds.per_object, cfg.rank) {
        (true, Some(r)) if r.splits() => {
            let w = r.world as usize;
            let rounds = match r.policy {
                RankPolicy::Drop => n / w,
                RankPolicy::Pad => n.div_ceil(w),
            };
            (0..rounds)
                .skip(r.part as usize)
                .step_by(r.parts.max(1) as usize)
                .map(|i| order[(i * w + r.rank as usize) % n.max(1)])
                .collect()
        }
        _ => order,
    }
}

/// Shard `o` of a listing (or a lookup): with its size and version.
fn listed_shard(store: &Store, o: &stoker_store::ObjectInfo) -> ShardInfo {
    ShardInfo {
        key: o.key.clone(),
        url: store.object_url(&o.key),
        size: Some(o.size),
        version: Some(o.version_tag()),
    }
}

/// How many lookups of a source's keys are in flight at once.
const HEAD_CONCURRENCY: usize = 64;

/// Looks up `keys` (relative to `prefix`), many at once, in their order: each object's size
/// and version, as a listing gives them. A missing one fails, naming it.
fn head_keys(
    rt: &tokio::runtime::Handle,
    store: &Store,
    prefix: &str,
    keys: &[String],
) -> Result<Vec<stoker_store::ObjectInfo>, Error> {
    // The first failure ends the lookups.
    let heads = futures::stream::iter(keys)
        .map(|k| {
            let key = format!("{prefix}{k}");
            async move {
                store
                    .head(&key)
                    .await
                    .map_err(|e| Error::from(e).with_object(store.object_url(&key)))
            }
        })
        .buffered(HEAD_CONCURRENCY)
        .try_collect::<Vec<_>>();
    rt.block_on(heads)
}

/// A streamed object as a [`ByteSource`]: a task on the runtime reads it part by part.
struct StoreStream {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
}

impl StoreStream {
    fn start(store: Store, key: String, rt: &tokio::runtime::Handle) -> StoreStream {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        rt.spawn(async move {
            match store.read_stream(&key, None).await {
                Ok(mut s) => {
                    while let Some(part) = s.next().await {
                        let part = part.map_err(std::io::Error::from);
                        let failed = part.is_err();
                        if tx.send(part).await.is_err() || failed {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(std::io::Error::from(e))).await;
                }
            }
        });
        StoreStream { rx }
    }
}

impl ByteSource for StoreStream {
    fn next_chunk(&mut self) -> std::io::Result<Option<Bytes>> {
        self.rx.blocking_recv().transpose()
    }
}

/// Ranged reads of one object.
struct StoreRange {
    store: Store,
    key: String,
    size: u64,
    rt: tokio::runtime::Handle,
}

impl RandomAccess for StoreRange {
    fn len(&self) -> u64 {
        self.size
    }
    fn read_range(&self, start: u64, end: u64) -> std::io::Result<Bytes> {
        self.rt
            .block_on(self.store.get_range(&self.key, start..end))
            .map_err(std::io::Error::from)
    }
}

/// The input of shard `id`.
pub(crate) fn open_input(ds: &Dataset, id: u32) -> Result<Input, Error> {
    let shard = &ds.shards[id as usize];
    let store = ds
        .store
        .clone()
        .ok_or_else(|| Error::invalid("this source has no store"))?;
    Ok(match ds.format.access() {
        Access::Stream => Input::Stream(ChunkCursor::new(Box::new(StoreStream::start(
            store,
            shard.key.clone(),
            &ds.runtime,
        )))),
        Access::Random => {
            let size = match shard.size {
                Some(s) => s,
                None => {
                    ds.runtime
                        .block_on(store.head(&shard.key))
                        .map_err(|e| Error::from(e).with_object(shard.url.clone()))?
                        .size
                }
            };
            Input::Random(Arc::new(StoreRange {
                store,
                key: shard.key.clone(),
                size,
                rt: ds.runtime.clone(),
            }))
        }
    })
}

enum ReaderMsg {
    Sample(Sample),
    Err(Error),
    End,
}

/// Parses shard `id` on its own thread, after skipping `skip` records.
fn spawn_reader(ds: &Arc<Dataset>, id: u32, skip: u64) -> crossbeam_channel::Receiver<ReaderMsg> {
    let (tx, rx) = crossbeam_channel::bounded(64);
    let ds = ds.clone();
    std::thread::Builder::new()
        .name("stoker-shard".into())
        .spawn(move || {
            let shard = &ds.shards[id as usize];
            if let Some(cached) = ds.cache.as_ref().and_then(|c| c.get(id)) {
                for s in cached.iter().skip(skip as usize) {
                    if tx.send(ReaderMsg::Sample(s.clone())).is_err() {
                        return;
                    }
                }
                let _ = tx.send(ReaderMsg::End);
                return;
            }
            // Collect the shard for the cache (only a read from the start can fill it).
            let mut keep: Option<Vec<Sample>> =
                (ds.cache.as_ref().is_some_and(|c| c.wants(id)) && skip == 0).then(Vec::new);
            let reader = open_input(&ds, id).and_then(|input| ds.format.open(shard, input));
            let mut reader = match reader {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(ReaderMsg::Err(e.with_object(shard.url.clone())));
                    let _ = tx.send(ReaderMsg::End);
                    return;
                }
            };
            // Records before the checkpoint were delivered (or reported) already.
            for _ in 0..skip {
                if let Ok(None) = reader.next() {
                    break;
                }
            }
            loop {
                let msg = match reader.next() {
                    Ok(Some(s)) => {
                        if let Some(k) = keep.as_mut() {
                            k.push(s.clone());
                        }
                        ReaderMsg::Sample(s)
                    }
                    Ok(None) => {
                        if let (Some(k), Some(c)) = (keep.take(), ds.cache.as_ref()) {
                            c.insert(id, k);
                        }
                        ReaderMsg::End
                    }
                    Err(e) => {
                        keep = None;
                        ReaderMsg::Err(e.with_object(shard.url.clone()))
                    }
                };
                let end = matches!(msg, ReaderMsg::End);
                if tx.send(msg).is_err() || end {
                    return;
                }
            }
        })
        .expect("spawn shard reader");
    rx
}

/// Runs the source for `epoch` from `cursor`, calling `emit` with each product and the
/// cursor just after it. Stops early when `emit` returns false.
pub(crate) fn run_source(
    ds: &Arc<Dataset>,
    cfg: &SourceConfig,
    epoch: u64,
    mut cursor: SourceCursor,
    emit: &mut dyn FnMut(Produced, &SourceCursor) -> bool,
) {
    let order = epoch_order(ds, cfg, epoch);
    if ds.per_object {
        return run_per_object(ds, cfg.held_ahead.as_deref(), &order, &mut cursor, emit);
    }
    let (pieces, counts) = match (&cfg.counts, &cfg.rank) {
        (Some(counts), Some(r)) if r.splits() => (
            crate::split::contiguous_pieces(&order, counts, r),
            Some(counts.as_slice()),
        ),
        _ => (order.iter().map(|&s| Piece::whole(s)).collect(), None),
    };
    match &cfg.columnar {
        Some(c) => run_columnar(ds, c, &pieces, counts, &mut cursor, emit),
        None => run_shards(ds, cfg, &pieces, counts, &mut cursor, emit),
    }
}

fn sample_of_object(ds: &Dataset, id: u32, bytes: Bytes) -> Result<Sample, Error> {
    let shard = &ds.shards[id as usize];
    let mut r = ds
        .format
        .open(shard, Input::Stream(ChunkCursor::from_bytes(bytes)))?;
    r.next()?
        .ok_or_else(|| Error::record("no sample").with_object(shard.url.clone()))
}

fn run_per_object(
    ds: &Arc<Dataset>,
    held_ahead: Option<&dyn HeldAhead>,
    order: &[u32],
    cursor: &mut SourceCursor,
    emit: &mut dyn FnMut(Produced, &SourceCursor) -> bool,
) {
    let start = cursor.next as usize;
    if start >= order.len() {
        return;
    }
    let mut send = |cursor: &mut SourceCursor, id: u32, r: Result<Sample, Error>| {
        let seq = cursor.emitted;
        cursor.emitted += 1;
        cursor.next += 1;
        let pos = Pos {
            shard: id,
            record: 0,
        };
        let p = match r {
            Ok(sample) => Produced::Elem(Element {
                seq,
                pos,
                sample,
                hold: None,
            }),
            Err(error) => Produced::Fail { seq, pos, error },
        };
        emit(p, cursor)
    };
    if let Some(mem) = &ds.memory {
        for &id in &order[start..] {
            if !send(cursor, id, Ok(mem[id as usize].clone())) {
                return;
            }
        }
        return;
    }
    let store = ds.store.clone().expect("a store");
    // Objects cached by an earlier epoch (or run), as read or as the workers' head made
    // them, are not fetched again.
    #[derive(Clone, Copy, PartialEq)]
    enum From {
        Store,
        Cache,
        Workers,
    }
    let from: Vec<From> = order[start..]
        .iter()
        .map(|&i| {
            let pos = Pos {
                shard: i,
                record: 0,
            };
            if held_ahead.is_some_and(|h| h.holds(pos)) {
                From::Workers
            } else if ds.cache.as_ref().is_some_and(|c| c.contains(i)) {
                From::Cache
            } else {
                From::Store
            }
        })
        .collect();
    let keys: Vec<String> = order[start..]
        .iter()
        .zip(&from)
        .filter(|(_, &f)| f == From::Store)
        .map(|(&i, _)| ds.shards[i as usize].key.clone())
        .collect();
    // Small: what waits here has left the fetch window's budget and not yet entered the
    // pipeline's.
    let (tx, mut rx) = tokio::sync::mpsc::channel(2);
    let fetch = ds.fetch.clone();
    let task = ds.runtime.spawn(async move {
        let mut s = store.fetch_many(keys, fetch);
        while let Some(r) = s.next().await {
            if tx.send(r).await.is_err() {
                return;
            }
        }
    });
    for (&id, &f) in order[start..].iter().zip(&from) {
        match f {
            From::Workers => {
                if !send(cursor, id, Ok(Sample::new())) {
                    break;
                }
                continue;
            }
            From::Cache => {
                let s = ds.cache.as_ref().and_then(|c| c.get(id)).expect("cached");
                if !send(cursor, id, Ok(s[0].clone())) {
                    break;
                }
                continue;
            }
            From::Store => {}
        }
        let Some(r) = rx.blocking_recv() else { break };
        let r = r
            .map_err(|e| Error::from(e).with_object(ds.shards[id as usize].url.clone()))
            .and_then(|o| sample_of_object(ds, id, o.bytes));
        if let (Ok(s), Some(c)) = (&r, ds.cache.as_ref().filter(|c| c.wants(id))) {
            c.insert(id, vec![s.clone()]);
        }
        if !send(cursor, id, r) {
            break;
        }
    }
    task.abort();
}

struct Slot {
    order_index: u64,
    /// Records of the shard consumed (from its start, not the piece's).
    consumed: u64,
    /// Where its piece ends (`None`: the shard's end).
    end: Option<u64>,
    /// The piece ends at the shard's counted end: the shard must end there.
    ends_shard: bool,
    rx: crossbeam_channel::Receiver<ReaderMsg>,
}

/// Reads `pieces` (shards, or parts of them, in the epoch's order), `cycle` at a time,
/// taking samples from each in turn. `counts` is set for a contiguous rank split: the
/// pieces are this rank part's span already, and each is checked against its count.
fn run_shards(
    ds: &Arc<Dataset>,
    cfg: &SourceConfig,
    pieces: &[Piece],
    counts: Option<&[u64]>,
    cursor: &mut SourceCursor,
    emit: &mut dyn FnMut(Produced, &SourceCursor) -> bool,
) {
    let open = |i: u64, consumed: Option<u64>| {
        let p = pieces[i as usize];
        let consumed = consumed.unwrap_or(p.start);
        Slot {
            order_index: i,
            consumed,
            end: p.end,
            // (A position past the end means the check was made and reported.)
            ends_shard: counts.is_some_and(|c| p.end == Some(c[p.shard as usize]))
                && p.end.is_some_and(|e| consumed <= e),
            rx: spawn_reader(ds, p.shard, consumed),
        }
    };
    let mut slots: Vec<Slot> = if cursor.slots.is_empty() && cursor.next == 0 {
        let n = cfg.cycle.min(pieces.len()) as u64;
        cursor.next = n;
        (0..n).map(|i| open(i, None)).collect()
    } else {
        cursor
            .slots
            .iter()
            .map(|&(i, c)| open(i, Some(c)))
            .collect()
    };
    let (rank, world, policy, part, parts) = match cfg.rank {
        Some(r) if r.splits() && counts.is_none() => (
            r.rank as u64,
            r.world as u64,
            r.policy,
            r.part as u64,
            r.parts.max(1) as u64,
        ),
        _ => (0, 1, RankPolicy::Drop, 0, 1),
    };
    // Round `k` (of `world` samples) gives this rank its `k`-th sample; with parts, only the
    // rounds `k` with `k % parts == part` are this part's (failures met during a round go
    // with it, so exactly one part of each rank reports them).
    let ours = |round_index: u64| round_index % parts == part;
    // The current round of `world` samples (kept to pad the last one), and failures
    // waiting for the round to end (so checkpoints fall on round boundaries).
    let mut round: Vec<Element> = Vec::new();
    let mut fails: Vec<(Pos, Error)> = Vec::new();
    let sync = |cursor: &mut SourceCursor, slots: &[Slot]| {
        cursor.slots = slots.iter().map(|s| (s.order_index, s.consumed)).collect();
    };
    // Emits in order, numbering as it goes; false once the consumer is gone.
    let mut emit_all = |cursor: &mut SourceCursor,
                        slots: &[Slot],
                        items: &mut dyn Iterator<Item = Produced>|
     -> bool {
        sync(cursor, slots);
        for mut p in items {
            p.set_seq(cursor.emitted);
            cursor.emitted += 1;
            if !emit(p, cursor) {
                return false;
            }
        }
        true
    };
    // Slot `i`'s piece is done: the next piece of the order takes its place.
    let next_piece = |slots: &mut Vec<Slot>, i: usize, cursor: &mut SourceCursor| {
        slots.remove(i);
        if (cursor.next as usize) < pieces.len() {
            slots.insert(i, open(cursor.next, None));
            cursor.next += 1;
        }
        cursor.rr = if slots.is_empty() {
            0
        } else {
            (i % slots.len()) as u32
        };
    };
    let fail = |(pos, error)| Produced::Fail { seq: 0, pos, error };
    loop {
        if slots.is_empty() {
            break;
        }
        let i = cursor.rr as usize % slots.len();
        let shard = pieces[slots[i].order_index as usize].shard;
        let counted = counts.map(|c| c[shard as usize]);
        let at_end = slots[i].end.is_some_and(|e| slots[i].consumed >= e);
        if at_end && !slots[i].ends_shard {
            // The piece is read; the rest of the shard is another rank's (or part's).
            next_piece(&mut slots, i, cursor);
            continue;
        }
        let msg = slots[i].rx.recv().unwrap_or(ReaderMsg::End);
        // A count is a promise: a shard that ends before it, or goes on past it, is an
        // error naming it (a stale index would shift every rank's span). Either is
        // reported once: the slot's position moves past the check (a resume does not
        // report it again).
        if let (Some(n), true) = (counted, slots[i].ends_shard) {
            let short = matches!(msg, ReaderMsg::End) && !at_end;
            let long = !matches!(msg, ReaderMsg::End) && at_end;
            if short || long {
                let got = slots[i].consumed;
                let url = ds.shards[shard as usize].url.clone();
                let error = if short {
                    slots[i].consumed = n;
                    crate::split::ended_early(url, got, n)
                } else {
                    slots[i].consumed = n + 1;
                    slots[i].ends_shard = false;
                    crate::split::goes_on(url, got, n)
                };
                let pos = Pos { shard, record: got };
                if !emit_all(cursor, &slots, &mut std::iter::once(fail((pos, error)))) {
                    return;
                }
                continue;
            }
        }
        match msg {
            ReaderMsg::Sample(sample) => {
                let pos = Pos {
                    shard,
                    record: slots[i].consumed,
                };
                slots[i].consumed += 1;
                cursor.rr = ((i + 1) % slots.len()) as u32;
                let k = cursor.stream_index;
                cursor.stream_index += 1;
                round.push(Element {
                    seq: 0,
                    pos,
                    sample,
                    hold: None,
                });
                if k % world == world - 1 {
                    // A full round: this rank's sample, then any failures met on the way.
                    let own = round.swap_remove(rank as usize);
                    round.clear();
                    if !ours(k / world) {
                        fails.clear();
                        continue;
                    }
                    let mut out =
                        std::iter::once(Produced::Elem(own)).chain(fails.drain(..).map(fail));
                    if !emit_all(cursor, &slots, &mut out) {
                        return;
                    }
                }
            }
            ReaderMsg::Err(error) => {
                let pos = Pos {
                    shard,
                    record: slots[i].consumed,
                };
                slots[i].consumed += 1;
                if world == 1 && parts == 1 {
                    if !emit_all(cursor, &slots, &mut std::iter::once(fail((pos, error)))) {
                        return;
                    }
                } else {
                    fails.push((pos, error));
                }
            }
            ReaderMsg::End => next_piece(&mut slots, i, cursor),
        }
    }
    // The last, incomplete round (and failures after the last full one), if this part's.
    if !ours(cursor.stream_index / world) {
        return;
    }
    let own = (!round.is_empty() && policy == RankPolicy::Pad).then(|| {
        let m = round.len();
        Produced::Elem(round.swap_remove((rank as usize) % m))
    });
    let mut out = own.into_iter().chain(fails.drain(..).map(fail));
    emit_all(cursor, &slots, &mut out);
}

/// Reads the samples at `positions` again (to rebuild a shuffle buffer or a partial batch
/// on resume), in the order given.
pub(crate) fn materialize(ds: &Arc<Dataset>, positions: &[Pos]) -> Result<Vec<Sample>, Error> {
    use std::collections::BTreeMap;
    let mut by_shard: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for p in positions {
        by_shard.entry(p.shard).or_default().push(p.record);
    }
    let mut found: std::collections::HashMap<Pos, Sample> = std::collections::HashMap::new();
    for (shard, mut records) in by_shard {
        records.sort_unstable();
        records.dedup();
        if let Some(mem) = &ds.memory {
            found.insert(Pos { shard, record: 0 }, mem[shard as usize].clone());
            continue;
        }
        if ds.per_object {
            let store = ds.store.as_ref().expect("a store");
            let key = &ds.shards[shard as usize].key;
            let bytes = ds.runtime.block_on(store.get(key)).map_err(Error::from)?;
            found.insert(
                Pos { shard, record: 0 },
                sample_of_object(ds, shard, bytes)?,
            );
            continue;
        }
        let info = &ds.shards[shard as usize];
        let mut r = ds.format.open(info, open_input(ds, shard)?)?;
        let mut at = 0u64;
        for want in records {
            while at < want {
                let _ = r.next();
                at += 1;
            }
            let s = r.next()?.ok_or_else(|| {
                Error::record(format!("record {want} is gone on resume"))
                    .with_object(info.url.clone())
            })?;
            at += 1;
            found.insert(
                Pos {
                    shard,
                    record: want,
                },
                s,
            );
        }
    }
    positions
        .iter()
        .map(|p| {
            found
                .get(p)
                .cloned()
                .ok_or_else(|| Error::invalid(format!("position {p:?} not found on resume")))
        })
        .collect()
}
