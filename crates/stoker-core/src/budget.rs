//! One memory budget shared by everything that holds bytes: the block cache, read-ahead
//! windows, in-flight fetches and (later) the queues between pipeline stages.
//!
//! The budget is a counter of bytes with a hard limit. Consumers that may wait (a read-ahead
//! window, a prefetch) call [`MemoryBudget::reserve`], which waits until enough bytes are free:
//! that wait *is* the backpressure. Consumers that must not wait (a cache insert on the read
//! path) call [`MemoryBudget::try_reserve`] and, when it fails, make room themselves (the cache
//! evicts) or do without (the block is not cached). Every reservation is a [`Reservation`]
//! guard that gives its bytes back when dropped, so a panic or an early return cannot leak
//! budget.
//!
//! A single request larger than the whole budget is clamped to the budget (it waits until it is
//! alone) rather than deadlocking: a 64 MiB budget can still read a 100 MiB object, one window
//! at a time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// A byte budget shared by cloning (the clones are handles to one counter).
#[derive(Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

struct Inner {
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
    freed: Notify,
}

impl fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("limit", &self.limit())
            .field("used", &self.used())
            .field("peak", &self.peak())
            .finish()
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        MemoryBudget {
            inner: Arc::new(Inner {
                limit: limit.max(1),
                used: AtomicU64::new(0),
                peak: AtomicU64::new(0),
                freed: Notify::new(),
            }),
        }
    }

    /// A budget sized from this machine's memory: a quarter of the physical memory, at least
    /// 256 MiB and at most 64 GiB. Falls back to 1 GiB when the size cannot be read.
    pub fn from_system() -> Self {
        Self::new(default_limit())
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// Bytes currently reserved.
    pub fn used(&self) -> u64 {
        self.inner.used.load(Ordering::Acquire)
    }

    /// Bytes currently free.
    pub fn available(&self) -> u64 {
        self.limit().saturating_sub(self.used())
    }

    /// The highest number of bytes ever reserved at once.
    pub fn peak(&self) -> u64 {
        self.inner.peak.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` now if they are free; `None` otherwise. Never waits.
    pub fn try_reserve(&self, bytes: u64) -> Option<Reservation> {
        let bytes = bytes.min(self.inner.limit);
        let mut used = self.inner.used.load(Ordering::Acquire);
        loop {
            let next = used.checked_add(bytes)?;
            if next > self.inner.limit {
                return None;
            }
            match self.inner.used.compare_exchange_weak(
                used,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.inner.peak.fetch_max(next, Ordering::Relaxed);
                    return Some(Reservation {
                        budget: self.clone(),
                        bytes,
                    });
                }
                Err(actual) => used = actual,
            }
        }
    }

    /// Reserves `bytes`, waiting until they are free. A request larger than the limit is
    /// clamped to the limit.
    pub async fn reserve(&self, bytes: u64) -> Reservation {
        loop {
            let notified = self.inner.freed.notified();
            tokio::pin!(notified);
            // Register interest before checking, so a release between the check and the
            // await is not missed.
            notified.as_mut().enable();
            if let Some(r) = self.try_reserve(bytes) {
                return r;
            }
            notified.await;
        }
    }

    fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.inner.used.fetch_sub(bytes, Ordering::AcqRel);
        self.inner.freed.notify_waiters();
    }
}

/// Bytes held against a [`MemoryBudget`]; given back on drop.
pub struct Reservation {
    budget: MemoryBudget,
    bytes: u64,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Reservation {
    /// The number of bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives back all but `keep` bytes (for a window that turned out smaller than reserved).
    pub fn shrink_to(&mut self, keep: u64) {
        if keep < self.bytes {
            let give = self.bytes - keep;
            self.bytes = keep;
            self.budget.release(give);
        }
    }

    /// Merges another reservation on the same budget into this one.
    pub fn merge(&mut self, mut other: Reservation) {
        debug_assert!(Arc::ptr_eq(&self.budget.inner, &other.budget.inner));
        self.bytes += other.bytes;
        other.bytes = 0;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

fn default_limit() -> u64 {
    const MIB: u64 = 1 << 20;
    let total = system_memory_bytes().unwrap_or(4 * 1024 * MIB);
    (total / 4).clamp(256 * MIB, 64 * 1024 * MIB)
}

/// Physical memory in bytes, from `/proc/meminfo` (Linux); `None` elsewhere.
pub fn system_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn try_reserve_respects_limit_and_releases_on_drop() {
        let b = MemoryBudget::new(100);
        let r1 = b.try_reserve(60).unwrap();
        assert!(b.try_reserve(50).is_none());
        let r2 = b.try_reserve(40).unwrap();
        assert_eq!(b.used(), 100);
        drop(r1);
        assert_eq!(b.used(), 40);
        drop(r2);
        assert_eq!(b.used(), 0);
        assert_eq!(b.peak(), 100);
    }

    #[test]
    fn shrink_and_merge() {
        let b = MemoryBudget::new(100);
        let mut r = b.try_reserve(50).unwrap();
        r.shrink_to(10);
        assert_eq!(b.used(), 10);
        let r2 = b.try_reserve(20).unwrap();
        r.merge(r2);
        assert_eq!(r.bytes(), 30);
        drop(r);
        assert_eq!(b.used(), 0);
    }

    #[tokio::test]
    async fn reserve_waits_for_release() {
        let b = MemoryBudget::new(100);
        let r = b.try_reserve(80).unwrap();
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.reserve(50).await.bytes() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "must wait while the budget is full");
        drop(r);
        assert_eq!(waiter.await.unwrap(), 50);
        assert_eq!(b.used(), 0);
    }

    #[tokio::test]
    async fn oversized_request_is_clamped_not_deadlocked() {
        let b = MemoryBudget::new(100);
        let r = b.reserve(1000).await;
        assert_eq!(r.bytes(), 100);
    }

    proptest::proptest! {
        #[test]
        fn never_exceeds_limit(ops in proptest::collection::vec((0u64..200, proptest::bool::ANY), 1..200)) {
            let b = MemoryBudget::new(500);
            let mut held = Vec::new();
            for (n, release) in ops {
                if release && !held.is_empty() {
                    held.remove(0);
                } else if let Some(r) = b.try_reserve(n) {
                    held.push(r);
                }
                proptest::prop_assert!(b.used() <= b.limit());
                let sum: u64 = held.iter().map(|r| r.bytes()).sum();
                proptest::prop_assert_eq!(sum, b.used());
            }
        }
    }
}
