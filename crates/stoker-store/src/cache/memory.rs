//! The memory tier: the [`Policy`] holding blocks, each charged against the shared
//! [`MemoryBudget`] by a [`Reservation`] it owns, plus an index of which versions of each
//! object are cached (so that invalidating other versions is O(1) when there are none).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use stoker_core::{MemoryBudget, Reservation};

use super::policy::Policy;
use super::BlockKey;

/// One cached block and the budget it holds.
#[derive(Debug)]
pub(crate) struct Slot {
    data: Bytes,
    /// `None` only transiently, inside [`MemoryTier::insert`].
    reservation: Option<Reservation>,
}

/// What an insert did.
#[derive(Debug, Default)]
pub(crate) struct InsertReport {
    /// The block is in memory now.
    pub stored: bool,
    /// It already was (nothing changed).
    pub present: bool,
    /// Blocks that left memory to make room (the new one included, if it lost admission).
    pub evicted: u64,
    /// Of those, candidates that lost the admission test.
    pub rejected: u64,
    /// The block was not cached: larger than the tier or the budget, or the shared budget
    /// could not give its bytes.
    pub skipped: bool,
    /// Data to drop after the lock is released (freeing large buffers is not free).
    pub garbage: Vec<Bytes>,
}

/// What a reclaim gave back.
#[derive(Debug, Default)]
pub(crate) struct Reclaimed {
    /// Budget bytes released.
    pub bytes: u64,
    /// The evicted blocks' data (one per block), to drop after the lock is released.
    pub garbage: Vec<Bytes>,
}

/// The memory tier. Not synchronised: the cache wraps it in one mutex.
#[derive(Debug)]
pub(crate) struct MemoryTier {
    policy: Policy<BlockKey, Slot>,
    capacity: u64,
    /// object -> [(version, number of cached blocks)].
    versions: HashMap<Arc<str>, Vec<(Arc<str>, usize)>>,
}

impl MemoryTier {
    pub fn new(capacity: u64) -> Self {
        MemoryTier {
            policy: Policy::new(capacity),
            capacity,
            versions: HashMap::new(),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.policy.weight()
    }

    /// Blocks held now.
    pub fn entries(&self) -> usize {
        self.policy.len()
    }

    /// Looks a block up as a request (see [`Policy::access`]).
    pub fn get(&mut self, key: &BlockKey, hash: u64, count_miss: bool) -> Option<Bytes> {
        self.policy
            .access(key, hash, count_miss)
            .map(|s| s.data.clone())
    }

    /// Looks a block up without counting a request.
    pub fn peek(&self, key: &BlockKey) -> Option<Bytes> {
        self.policy.peek(key).map(|s| s.data.clone())
    }

    /// Caches `data` under `key` if the policy admits it and the budget has (or can be made
    /// to have, by evicting this tier's own colder blocks) room for it. Never waits.
    pub fn insert(
        &mut self,
        key: BlockKey,
        hash: u64,
        data: Bytes,
        budget: &MemoryBudget,
    ) -> InsertReport {
        let mut report = InsertReport::default();
        if self.policy.contains(&key) {
            // Same key, same version: same bytes. Keep the resident copy.
            report.stored = true;
            report.present = true;
            report.garbage.push(data);
            return report;
        }
        // An empty block still costs an entry: charge it one byte.
        let weight = (data.len() as u64).max(1);
        if weight > self.capacity || weight > budget.limit() {
            report.skipped = true;
            report.garbage.push(data);
            return report;
        }
        // Room inside the shared budget: what this tier holds plus what is free. When other
        // users hold most of the budget the tier shrinks, evicting through the policy.
        let cap = self
            .capacity
            .min(self.policy.weight().saturating_add(budget.available()));
        let object = key.object.clone();
        let version = key.version.clone();
        let slot = Slot {
            data,
            reservation: None,
        };
        let out = self.policy.insert(key.clone(), hash, slot, weight, cap);
        report.rejected = out.rejected as u64;
        for (k, slot) in out.evicted {
            report.evicted += 1;
            if slot.reservation.is_some() {
                self.forget_version(&k);
            }
            // Dropping the reservation here gives its bytes back before we reserve ours.
            report.garbage.push(slot.data);
        }
        if !out.stored {
            return report;
        }
        match budget.try_reserve(weight) {
            Some(r) if r.bytes() == weight => {
                if let Some(slot) = self.policy.peek_mut(&key) {
                    slot.reservation = Some(r);
                }
                self.note_version(object, version);
                report.stored = true;
            }
            _ => {
                // Someone else took the budget between our look and our reservation.
                if let Some(slot) = self.policy.remove(&key) {
                    report.garbage.push(slot.data);
                }
                report.skipped = true;
            }
        }
        report
    }

    /// Gives budget back on request (the cache's reclaimer): evicts the coldest blocks (see
    /// [`Policy::evict_coldest`]) until at least `want` bytes of reservations are released or
    /// the tier is empty. Returns the bytes released and the blocks evicted, whose data the
    /// caller drops after releasing the lock.
    pub fn reclaim(&mut self, want: u64) -> Reclaimed {
        let mut out = Reclaimed::default();
        while out.bytes < want {
            let Some((k, slot)) = self.policy.evict_coldest() else {
                break;
            };
            if let Some(r) = slot.reservation {
                out.bytes += r.bytes();
                self.forget_version(&k);
                // Dropping `r` gives its bytes back to the budget (and wakes its waiters).
            }
            out.garbage.push(slot.data);
        }
        out
    }

    /// Drops every block of `object` whose version is not `current`; returns their data.
    pub fn invalidate_other_versions(&mut self, object: &str, current: &str) -> Vec<Bytes> {
        let stale = self
            .versions
            .get(object)
            .is_some_and(|vs| vs.iter().any(|(v, _)| &**v != current));
        if !stale {
            return Vec::new();
        }
        let doomed: Vec<BlockKey> = self
            .policy
            .keys()
            .filter(|k| &*k.object == object && &*k.version != current)
            .cloned()
            .collect();
        let mut garbage = Vec::with_capacity(doomed.len());
        for k in doomed {
            if let Some(slot) = self.policy.remove(&k) {
                self.forget_version(&k);
                garbage.push(slot.data);
            }
        }
        garbage
    }

    fn note_version(&mut self, object: Arc<str>, version: Arc<str>) {
        let vs = self.versions.entry(object).or_default();
        match vs.iter_mut().find(|(v, _)| *v == version) {
            Some((_, n)) => *n += 1,
            None => vs.push((version, 1)),
        }
    }

    fn forget_version(&mut self, key: &BlockKey) {
        if let Some(vs) = self.versions.get_mut(&key.object) {
            if let Some(pos) = vs.iter().position(|(v, _)| *v == key.version) {
                vs[pos].1 -= 1;
                if vs[pos].1 == 0 {
                    vs.swap_remove(pos);
                }
            }
            if vs.is_empty() {
                self.versions.remove(&key.object);
            }
        }
    }

    /// Checks that the bytes held match the reservations held (tests only).
    #[cfg(test)]
    pub fn check_invariants(&self) {
        self.policy.check_invariants();
        let mut reserved = 0;
        let mut per_object: HashMap<(Arc<str>, Arc<str>), usize> = HashMap::new();
        for k in self.policy.keys() {
            let slot = self.policy.peek(k).expect("key maps to a slot");
            let r = slot
                .reservation
                .as_ref()
                .expect("every resident block holds budget");
            assert_eq!(r.bytes(), (slot.data.len() as u64).max(1));
            reserved += r.bytes();
            *per_object
                .entry((k.object.clone(), k.version.clone()))
                .or_default() += 1;
        }
        assert_eq!(reserved, self.bytes());
        let indexed: usize = self.versions.values().flatten().map(|(_, n)| n).sum();
        assert_eq!(indexed, self.entries());
        for ((o, v), n) in per_object {
            let vs = &self.versions[&o];
            assert_eq!(vs.iter().find(|(x, _)| *x == v).map(|(_, n)| *n), Some(n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(o: &str, v: &str, b: u64) -> BlockKey {
        BlockKey::new(o, v, b)
    }

    fn put(t: &mut MemoryTier, k: &BlockKey, n: usize, budget: &MemoryBudget) -> InsertReport {
        let h = super::super::key_hash(k);
        t.get(k, h, true);
        t.insert(k.clone(), h, Bytes::from(vec![k.block as u8; n]), budget)
    }

    #[test]
    fn shrinks_to_fit_a_shared_budget_and_never_waits() {
        let budget = MemoryBudget::new(10_000);
        let mut t = MemoryTier::new(8_000);
        for b in 0..8 {
            assert!(put(&mut t, &key("s3://b/o", "v", b), 1000, &budget).stored);
        }
        assert_eq!(budget.used(), 8000);
        // Someone else takes most of the budget: the tier gives up blocks to cache new ones.
        let other = budget.try_reserve(1500).unwrap();
        let r = put(&mut t, &key("s3://b/o", "v", 100), 1000, &budget);
        t.check_invariants();
        assert!(budget.used() <= budget.limit());
        assert!(r.stored || r.skipped || r.rejected > 0);
        assert!(t.bytes() <= 8_500);
        // The whole budget taken by others: nothing can be cached, nothing waits.
        drop(other);
        let all = budget.try_reserve(budget.available()).unwrap();
        let r = put(&mut t, &key("s3://b/o", "v", 200), 1000, &budget);
        assert!(budget.used() <= budget.limit());
        t.check_invariants();
        drop(all);
        drop(r);
        drop(t);
        assert_eq!(budget.used(), 0, "every reservation is given back");
    }

    #[test]
    fn reclaim_gives_back_at_least_what_is_asked_coldest_first() {
        let budget = MemoryBudget::new(10_000);
        let mut t = MemoryTier::new(10_000);
        for b in 0..10 {
            assert!(put(&mut t, &key("s3://b/o", "v", b), 1000, &budget).stored);
        }
        assert_eq!(budget.used(), 10_000);
        let r = t.reclaim(2500);
        assert_eq!(r.bytes, 3000, "whole blocks, at least what was asked");
        assert_eq!(r.garbage.len(), 3);
        assert_eq!(budget.used(), 7000);
        assert_eq!(t.bytes(), 7000);
        t.check_invariants();
        // The newest block is among the last to go.
        assert!(t.peek(&key("s3://b/o", "v", 9)).is_some());
        let r = t.reclaim(u64::MAX);
        assert_eq!(r.bytes, 7000);
        assert_eq!(t.entries(), 0);
        assert_eq!(budget.used(), 0);
        t.check_invariants();
        assert_eq!(t.reclaim(1).bytes, 0, "nothing left to give");
    }

    #[test]
    fn oversized_blocks_are_skipped() {
        let budget = MemoryBudget::new(500);
        let mut t = MemoryTier::new(1000);
        assert!(put(&mut t, &key("a", "v", 0), 800, &budget).skipped);
        assert!(put(&mut t, &key("a", "v", 1), 2000, &budget).skipped);
        assert_eq!(t.entries(), 0);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn invalidates_other_versions_only() {
        let budget = MemoryBudget::new(1 << 20);
        let mut t = MemoryTier::new(1 << 20);
        for b in 0..3 {
            put(&mut t, &key("a", "v1", b), 10, &budget);
            put(&mut t, &key("a", "v2", b), 10, &budget);
            put(&mut t, &key("b", "v1", b), 10, &budget);
        }
        assert!(t.invalidate_other_versions("a", "v2").len() == 3);
        assert!(t.invalidate_other_versions("a", "v2").is_empty());
        t.check_invariants();
        assert_eq!(t.entries(), 6);
        assert!(t.peek(&key("a", "v1", 0)).is_none());
        assert!(t.peek(&key("a", "v2", 0)).is_some());
        assert!(t.peek(&key("b", "v1", 0)).is_some());
        assert_eq!(budget.used(), 60);
    }
}
