//! The workers' cache of samples at the optimizer's cache point (`optimize::cache`): each
//! sample as the deterministic operators at the head of the workers' chain leave it (a
//! decoded image), by its position, kept for the run's later epochs, and, for a run that
//! reads through the process's shared store, for the later runs of the same pipeline (the
//! next epoch of a PyTorch loop is a new run).
//!
//! A worker that meets a sample the cache holds starts from the cached sample at the cache
//! point (a clone: tensors and bytes are shared, not copied) and runs only the operators after
//! it; otherwise it runs the head and stores what the head made. The source does not read
//! again an object whose sample the cache holds (for a format of one sample per object: an
//! image from S3 is neither fetched nor decoded in later epochs); it sends an empty sample
//! in its place (`source::HeldAhead`). What the cache holds counts
//! in the run's memory budget, and stays within its limit (half the budget, set by the
//! optimizer): a sample that does not fit, or finds the budget full at that moment, is not
//! stored and is made again the next epoch. Nothing is evicted.
//!
//! A run's own cache ends with the run. A shared one ([`OpCache::shared`]) lives in a
//! process-wide registry, one per source URL, and holds its bytes in the shared store's
//! budget (which is the budget of every run reading through that store). A later run uses
//! it only when everything that makes its samples is the same: the source's listing (every
//! object's key, size and version, in order: positions name objects by their place in it),
//! the format, the operators before the cache point (their parameters), and the budget
//! (the same shared store). Otherwise the old cache is dropped, its bytes given back, and
//! a new one starts. [`clear_shared_caches`] drops them all (`clear_shared_stores` in the
//! Python package does, with the stores).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock};

use parking_lot::{Mutex, RwLock};
use stoker_core::{MemoryBudget, Reservation, Sample};
use stoker_formats::ShardInfo;

use crate::optimize::WATCH_SAMPLES;
use crate::source::Pos;
use crate::stats::CacheCounters;

/// See the module documentation: the cache as one run uses it (its counters are the run's).
#[derive(Debug)]
pub(crate) struct OpCache {
    /// The number of the workers' operators before the cache point.
    pub(crate) after: usize,
    held: Arc<Held>,
    pub(crate) counters: Arc<CacheCounters>,
}

/// What the cache holds, possibly for several runs.
#[derive(Debug)]
struct Held {
    entries: RwLock<HashMap<(u32, u64), Sample>>,
    /// What the entries hold in the budget.
    hold: Mutex<Option<Reservation>>,
    budget: MemoryBudget,
    limit: u64,
    /// What made the samples (see [`fingerprint`]); 0 for a run's own cache.
    fingerprint: u64,
    /// The epoch's input bytes, when the size of its samples at the cache point is measured
    /// as the cache fills (`CachePlan::watch`).
    watch: Option<u64>,
    /// [`PENDING`], [`KEEP`] or [`DROPPED`]: whether the measured size fits (always
    /// [`KEEP`] without `watch`).
    verdict: AtomicU8,
    /// Samples measured, their bytes before the chain and at the cache point.
    seen: Mutex<(u64, u64, u64)>,
    /// The epoch's bytes at the cache point as measured (0: not yet).
    projected: AtomicU64,
}

/// The measured size is not known yet: the cache stores, but the source reads everything.
const PENDING: u8 = 0;
/// The epoch fits: the cache keeps what it stores for good.
const KEEP: u8 = 1;
/// The epoch would not fit: the cache gave back what it held and stores nothing more.
const DROPPED: u8 = 2;

impl Held {
    fn new(limit: u64, budget: MemoryBudget, fingerprint: u64, watch: Option<u64>) -> Held {
        Held {
            entries: RwLock::new(HashMap::new()),
            hold: Mutex::new(None),
            budget,
            limit,
            fingerprint,
            watch,
            verdict: AtomicU8::new(if watch.is_some() { PENDING } else { KEEP }),
            seen: Mutex::new((0, 0, 0)),
            projected: AtomicU64::new(0),
        }
    }

    /// Notes a sample of `bytes_in` bytes at the source and `bytes` at the cache point while
    /// the verdict is pending; once [`WATCH_SAMPLES`] samples (or the whole epoch) are
    /// measured, decides. Returns the verdict.
    fn measure(&self, bytes_in: u64, bytes: u64, counters: &CacheCounters) -> u8 {
        let Some(epoch_in) = self.watch else {
            return KEEP;
        };
        // Decided already: no lock (checked again under it below).
        let v = self.verdict.load(Ordering::Acquire);
        if v != PENDING {
            return v;
        }
        let mut seen = self.seen.lock();
        let v = self.verdict.load(Ordering::Acquire);
        if v != PENDING {
            return v;
        }
        seen.0 += 1;
        seen.1 += bytes_in;
        seen.2 += bytes;
        if seen.0 < WATCH_SAMPLES && seen.1 < epoch_in {
            return PENDING;
        }
        let projected = ((seen.2 as f64 / seen.1.max(1) as f64 * epoch_in as f64) as u64).max(1);
        self.projected.store(projected, Ordering::Relaxed);
        counters.projected.store(projected, Ordering::Relaxed);
        if projected <= self.limit {
            self.verdict.store(KEEP, Ordering::Release);
            return KEEP;
        }
        // Dropped while pending: the source has skipped no object for it (it skips only
        // what a kept cache holds), so every sample is still read and made.
        // Under the hold's lock, which `put` keeps from its check to its insert.
        let mut hold = self.hold.lock();
        self.verdict.store(DROPPED, Ordering::Release);
        self.entries.write().clear();
        *hold = None;
        counters.bytes.store(0, Ordering::Relaxed);
        counters.dropped.store(1, Ordering::Relaxed);
        DROPPED
    }

    fn bytes(&self) -> u64 {
        self.hold.lock().as_ref().map_or(0, Reservation::bytes)
    }
}

/// The shared caches, by source URL.
static SHARED: LazyLock<Mutex<HashMap<String, Arc<Held>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Drops every shared cache (their bytes go back to their budgets once no run uses them);
/// returns how many there were.
pub fn clear_shared_caches() -> usize {
    let mut r = SHARED.lock();
    let n = r.len();
    r.clear();
    n
}

/// What makes the samples at the cache point: the listing (key, size and version of every
/// object, in order), the format and the operators before the cache point, each by its
/// `Debug` form (every parameter).
pub(crate) fn fingerprint(
    shards: &[ShardInfo],
    format: &dyn std::fmt::Debug,
    head: &[&dyn std::fmt::Debug],
) -> u64 {
    let mut h = DefaultHasher::new();
    shards.len().hash(&mut h);
    for s in shards {
        (&s.key, s.size, &s.version).hash(&mut h);
    }
    format!("{format:?}").hash(&mut h);
    for op in head {
        format!("{op:?}").hash(&mut h);
    }
    // 0 is a run's own cache.
    h.finish().max(1)
}

impl OpCache {
    /// A cache of this run's own.
    /// (`watch`: the epoch's input bytes, when the size at the cache point is measured as
    /// the cache fills.)
    pub(crate) fn new(
        after: usize,
        limit: u64,
        budget: MemoryBudget,
        watch: Option<u64>,
    ) -> OpCache {
        OpCache::using(after, Arc::new(Held::new(limit, budget, 0, watch)))
    }

    /// The shared cache of `url` when it was made by what makes this run's samples
    /// (`fingerprint`) in this `budget`; else a new one, which replaces it.
    pub(crate) fn shared(
        url: &str,
        fingerprint: u64,
        after: usize,
        limit: u64,
        budget: &MemoryBudget,
        watch: Option<u64>,
    ) -> OpCache {
        let mut r = SHARED.lock();
        let held = match r.get(url) {
            Some(h) if h.fingerprint == fingerprint && h.budget.same_as(budget) => h.clone(),
            _ => {
                let h = Arc::new(Held::new(limit, budget.clone(), fingerprint, watch));
                r.insert(url.to_string(), h.clone());
                h
            }
        };
        OpCache::using(after, held)
    }

    fn using(after: usize, held: Arc<Held>) -> OpCache {
        let counters = CacheCounters::default();
        counters.limit.store(held.limit, Ordering::Relaxed);
        counters.bytes.store(held.bytes(), Ordering::Relaxed);
        counters
            .projected
            .store(held.projected.load(Ordering::Relaxed), Ordering::Relaxed);
        let dropped = held.verdict.load(Ordering::Acquire) == DROPPED;
        counters.dropped.store(dropped as u64, Ordering::Relaxed);
        OpCache {
            after,
            held,
            counters: Arc::new(counters),
        }
    }

    /// The sample at `pos` as the cache point has it, if held (counted as a hit).
    pub(crate) fn get(&self, pos: Pos) -> Option<Sample> {
        let s = self
            .held
            .entries
            .read()
            .get(&(pos.shard, pos.record))
            .cloned()?;
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        Some(s)
    }

    /// Whether the sample at `pos` is held for good (not counted as a hit): never while a
    /// measured size is pending, since a pending cache may still be dropped.
    pub(crate) fn contains(&self, pos: Pos) -> bool {
        self.held.verdict.load(Ordering::Acquire) == KEEP
            && self
                .held
                .entries
                .read()
                .contains_key(&(pos.shard, pos.record))
    }

    /// Keeps `sample` (what the head made of the sample at `pos`, which had `bytes_in`
    /// bytes at the source) when it fits in the cache's limit and the budget has room now;
    /// counts it as stored or not. A cache whose size is measured as it fills measures it
    /// first ([`Held::measure`]).
    pub(crate) fn put(&self, pos: Pos, sample: &Sample, bytes_in: u64) {
        let held = &*self.held;
        let bytes = sample.size_bytes() as u64;
        if held.measure(bytes_in, bytes, &self.counters) == DROPPED {
            return;
        }
        let mut hold = held.hold.lock();
        if held.verdict.load(Ordering::Acquire) == DROPPED {
            return;
        }
        let now = hold.as_ref().map_or(0, Reservation::bytes);
        let room = now.saturating_add(bytes) <= held.limit;
        let Some(more) = room.then(|| held.budget.try_reserve(bytes)).flatten() else {
            self.counters.over_limit.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let mut entries = held.entries.write();
        if entries.contains_key(&(pos.shard, pos.record)) {
            // Another worker stored it first (the same sample in another epoch's overlap).
            return;
        }
        entries.insert((pos.shard, pos.record), sample.clone());
        match hold.as_mut() {
            Some(h) => h.merge(more),
            None => *hold = Some(more),
        }
        self.counters.stored.fetch_add(1, Ordering::Relaxed);
        self.counters
            .stored_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        self.counters.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

impl crate::source::HeldAhead for OpCache {
    fn holds(&self, pos: Pos) -> bool {
        self.contains(pos)
    }
}
