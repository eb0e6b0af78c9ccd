//! The workers' cache of samples at the optimizer's cache point (`optimize::cache`): each
//! sample as the deterministic operators at the head of the workers' chain leave it (a
//! decoded image), by its position, kept for the run's later epochs.
//!
//! A worker that meets a sample the cache holds starts from the cached sample at the cache
//! point (a clone: tensors and bytes are shared, not copied) and runs only the operators after
//! it; otherwise it runs the head and stores what the head made. What the cache holds counts
//! in the run's memory budget, and stays within its limit (half the budget, set by the
//! optimizer): a sample that does not fit, or finds the budget full at that moment, is not
//! stored and is made again the next epoch. Nothing is evicted; the cache ends with the run.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use stoker_core::{MemoryBudget, Reservation, Sample};

use crate::source::Pos;
use crate::stats::CacheCounters;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct OpCache {
    /// The number of the workers' operators before the cache point.
    pub(crate) after: usize,
    entries: RwLock<HashMap<(u32, u64), Sample>>,
    /// What the entries hold in the budget.
    hold: Mutex<Option<Reservation>>,
    budget: MemoryBudget,
    limit: u64,
    pub(crate) counters: Arc<CacheCounters>,
}

impl OpCache {
    pub(crate) fn new(after: usize, limit: u64, budget: MemoryBudget) -> OpCache {
        let counters = CacheCounters::default();
        counters.limit.store(limit, Ordering::Relaxed);
        OpCache {
            after,
            entries: RwLock::new(HashMap::new()),
            hold: Mutex::new(None),
            budget,
            limit,
            counters: Arc::new(counters),
        }
    }

    /// The sample at `pos` as the cache point has it, if held (counted as a hit).
    pub(crate) fn get(&self, pos: Pos) -> Option<Sample> {
        let s = self.entries.read().get(&(pos.shard, pos.record)).cloned()?;
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        Some(s)
    }

    /// Keeps `sample` (what the head made of the sample at `pos`) when it fits in the
    /// cache's limit and the budget has room now; counts it as stored or not.
    pub(crate) fn put(&self, pos: Pos, sample: &Sample) {
        let bytes = sample.size_bytes() as u64;
        let mut hold = self.hold.lock();
        let held = hold.as_ref().map_or(0, Reservation::bytes);
        let room = held.saturating_add(bytes) <= self.limit;
        let Some(more) = room.then(|| self.budget.try_reserve(bytes)).flatten() else {
            self.counters.over_limit.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let mut entries = self.entries.write();
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
