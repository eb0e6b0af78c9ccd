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
//!
//! A thread that is not on an async runtime (a pipeline worker charging a decoded frame
//! before it allocates it) waits with [`MemoryBudget::reserve_blocking`], which waits for
//! the same releases (and asks the same reclaimers) as `reserve`, up to a timeout. Such a
//! waiter has the first claim on what is freed: while one waits, [`try_reserve`] and
//! [`reserve`] take nothing (they fail, or wait), so that a stream of small reservations
//! (the source admitting samples) cannot keep a large one (a frame) waiting forever.
//!
//! [`try_reserve`]: MemoryBudget::try_reserve
//! [`reserve`]: MemoryBudget::reserve
//!
//! # Reclaimers: caches yield to in-flight work
//!
//! A cache charges what it holds to the budget and keeps it until it evicts on its own inserts.
//! If it holds most of the budget, a reader waiting in [`MemoryBudget::reserve`] would wait
//! forever: nothing it waits for ever gives bytes back. So a holder of *optional* bytes
//! registers a *reclaimer* with [`MemoryBudget::add_reclaimer`]: a function asked to give
//! back (at least) a number of bytes, returning how many it gave back (it frees them by
//! dropping [`Reservation`]s). Several may be registered (several stores sharing one budget);
//! they are asked in turn, starting from a different one each time, until the shortfall is
//! covered.
//!
//! Rules:
//!
//! * Only the waiting path calls reclaimers: [`reserve`](MemoryBudget::reserve) does, after a
//!   failed attempt and before it waits. [`try_reserve`](MemoryBudget::try_reserve) never does,
//!   because the cache itself calls it while holding its own lock (a reclaimer takes that
//!   lock). Conversely a reclaimer must never be called with its owner's lock held, so the
//!   owner must not call `reserve` under it.
//! * The budget holds reclaimers by [`Weak`] reference, so it does not keep their owner alive
//!   (no `budget -> cache -> budget` cycle); the owner keeps the [`Arc`], and a reclaimer whose
//!   owner is gone is dropped from the list. No budget lock is held while one runs.
//! * No lost wake-up, no spinning: the waiter registers for the release notification before
//!   its attempt, so bytes freed at any point after that (by a reclaimer or anyone else) wake
//!   it; and it only goes round again after a release, never because a reclaimer merely ran.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// A reclaimer (see [`MemoryBudget::add_reclaimer`]).
type Reclaimer = dyn Fn(u64) -> u64 + Send + Sync;

/// A byte budget shared by cloning (the clones are handles to one counter).
#[derive(Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
    /// Where this handle's reservations are also counted ([`MemoryBudget::counting`]).
    account: Option<Arc<AtomicU64>>,
}

struct Inner {
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
    freed: Notify,
    /// Threads waiting in [`MemoryBudget::reserve_blocking`] (they go first).
    first: AtomicUsize,
    reclaimers: Mutex<Vec<Weak<Reclaimer>>>,
    /// Which reclaimer is asked first next time (round robin, so one cache of several sharing
    /// the budget is not always the one that gives).
    next_reclaimer: AtomicUsize,
}

impl fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("limit", &self.limit())
            .field("used", &self.used())
            .field("peak", &self.peak())
            .field("reclaimers", &self.inner.reclaimers.lock().len())
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
                first: AtomicUsize::new(0),
                reclaimers: Mutex::new(Vec::new()),
                next_reclaimer: AtomicUsize::new(0),
            }),
            account: None,
        }
    }

    /// A handle on this budget whose reservations (and theirs alone) are also counted in
    /// `account`: for telling who holds what (a pipeline's samples against the store's
    /// read-ahead) without a budget of their own. The limit, the waiting and the
    /// reclaimers are the budget's, shared with every handle.
    pub fn counting(&self, account: Arc<AtomicU64>) -> MemoryBudget {
        MemoryBudget {
            inner: self.inner.clone(),
            account: Some(account),
        }
    }

    /// Adds `bytes` to this handle's account, if it has one (`sub`: takes them away).
    fn tally(&self, bytes: u64, sub: bool) {
        if let Some(a) = &self.account {
            if sub {
                a.fetch_sub(bytes, Ordering::Relaxed);
            } else {
                a.fetch_add(bytes, Ordering::Relaxed);
            }
        }
    }

    /// A budget sized from this machine's memory: a quarter of the physical memory, at least
    /// 256 MiB and at most 64 GiB. Falls back to 1 GiB when the size cannot be read.
    pub fn from_system() -> Self {
        Self::new(default_limit())
    }

    /// Whether `other` is this budget (a clone of it), not another of the same size.
    pub fn same_as(&self, other: &MemoryBudget) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
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

    /// Reserves `bytes` now if they are free; `None` otherwise. Never waits. Fails while a
    /// thread waits in [`reserve_blocking`](Self::reserve_blocking) (it goes first).
    pub fn try_reserve(&self, bytes: u64) -> Option<Reservation> {
        if self.inner.first.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.take(bytes)
    }

    /// [`try_reserve`](Self::try_reserve), whoever waits.
    fn take(&self, bytes: u64) -> Option<Reservation> {
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
                    self.tally(bytes, false);
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
    ///
    /// When the bytes are not free, the registered [reclaimers](Self::add_reclaimer) are first
    /// asked to give back the shortfall (a cache evicts its coldest blocks); only if that is
    /// not enough does it wait for someone to release bytes.
    pub async fn reserve(&self, bytes: u64) -> Reservation {
        self.reserve_as(bytes, false).await
    }

    /// [`reserve`](Self::reserve); `first`: for a thread in
    /// [`reserve_blocking`](Self::reserve_blocking), which others wait for.
    async fn reserve_as(&self, bytes: u64, first: bool) -> Reservation {
        let want = bytes.min(self.inner.limit);
        let attempt = |b: &MemoryBudget| {
            if first {
                b.take(want)
            } else {
                b.try_reserve(want)
            }
        };
        loop {
            let notified = self.inner.freed.notified();
            tokio::pin!(notified);
            // Register interest before checking, so a release between the check and the
            // await (including one made by a reclaimer below) is not missed.
            notified.as_mut().enable();
            if let Some(r) = attempt(self) {
                return r;
            }
            let shortfall = want.saturating_sub(self.available());
            if shortfall > 0 && self.reclaim(shortfall) > 0 {
                if let Some(r) = attempt(self) {
                    return r;
                }
                // Someone else took what was freed. The release notified us, so the await
                // below returns at once and we go round again (asking again); each round
                // follows a real release, so this cannot spin on a reclaimer with nothing left.
            }
            notified.await;
        }
    }

    /// [`reserve`](Self::reserve) on a thread that is not on an async runtime: waits (the
    /// thread sleeps until bytes are released, asking the reclaimers as `reserve` does) for
    /// at most `timeout`; `None` when the bytes did not become free in that time. A request
    /// larger than the limit is clamped to the limit, as in `reserve`.
    ///
    /// While it waits, it has the first claim on freed bytes: [`try_reserve`](Self::try_reserve)
    /// and `reserve` take nothing until no thread waits here (waiters here compete among
    /// themselves).
    pub fn reserve_blocking(&self, bytes: u64, timeout: Duration) -> Option<Reservation> {
        if let Some(r) = self.try_reserve(bytes) {
            return Some(r);
        }
        self.inner.first.fetch_add(1, Ordering::AcqRel);
        let r = self.wait_first(bytes, timeout);
        if self.inner.first.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The others may go again.
            self.inner.freed.notify_waiters();
        }
        r
    }

    /// The wait of [`reserve_blocking`](Self::reserve_blocking).
    fn wait_first(&self, bytes: u64, timeout: Duration) -> Option<Reservation> {
        let deadline = Instant::now() + timeout;
        let fut = self.reserve_as(bytes, true);
        let mut fut = std::pin::pin!(fut);
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
                return Some(r);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            // A release unparks the thread (and a stray unpark only means one more poll).
            std::thread::park_timeout(deadline - now);
        }
    }

    /// Counts `bytes` that are in memory already, made before they could be charged (a
    /// sample remade when a run resumes, a block packed from documents that held theirs):
    /// asks the [reclaimers](Self::add_reclaimer) for any shortfall (a cache gives way),
    /// then holds the bytes even past the limit, never waiting and never clamped, so that
    /// [`used`](Self::used) and [`peak`](Self::peak) say what is held. While `used` is past
    /// the limit, [`try_reserve`](Self::try_reserve) and [`reserve`](Self::reserve) take
    /// nothing, so the pipeline admits nothing new until the excess is gone.
    pub fn count_held(&self, bytes: u64) -> Reservation {
        let shortfall = bytes.saturating_sub(self.available());
        if shortfall > 0 {
            self.reclaim(shortfall);
        }
        let mut r = Reservation {
            budget: self.clone(),
            bytes: 0,
        };
        r.resize_to(bytes);
        r
    }

    /// Registers `reclaimer`, which a waiting [`reserve`](Self::reserve) calls to get bytes
    /// back (see the module documentation). Called with the number of bytes `reserve` is short
    /// of, it frees what it can by dropping [`Reservation`]s of this budget and returns how
    /// many bytes it freed (0 when it has nothing left to give). It runs synchronously, on
    /// whatever thread is in `reserve`, so it must be quick, must not wait for budget, and must
    /// not be able to run while its owner holds a lock it takes.
    ///
    /// The budget keeps only the weak reference: the caller keeps the `Arc` alive for as long
    /// as the reclaimer should be asked; once that is dropped the entry is forgotten. Several
    /// may be registered (several caches sharing one budget).
    pub fn add_reclaimer(&self, reclaimer: Weak<dyn Fn(u64) -> u64 + Send + Sync>) {
        let mut list = self.inner.reclaimers.lock();
        list.retain(|r| r.strong_count() > 0);
        list.push(reclaimer);
    }

    /// Asks the registered reclaimers, in turn, to give back `shortfall` bytes; returns how
    /// many they gave back. Holds no lock while a reclaimer runs.
    fn reclaim(&self, shortfall: u64) -> u64 {
        let live: Vec<Arc<Reclaimer>> = {
            let mut list = self.inner.reclaimers.lock();
            list.retain(|r| r.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        if live.is_empty() {
            return 0;
        }
        let start = self.inner.next_reclaimer.fetch_add(1, Ordering::Relaxed);
        let mut freed = 0u64;
        for i in 0..live.len() {
            let reclaimer = &live[(start + i) % live.len()];
            freed = freed.saturating_add(reclaimer(shortfall - freed));
            if freed >= shortfall {
                break;
            }
        }
        freed
    }

    fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.tally(bytes, true);
        self.inner.used.fetch_sub(bytes, Ordering::AcqRel);
        self.inner.freed.notify_waiters();
    }
}

/// Wakes a thread parked in [`MemoryBudget::reserve_blocking`].
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
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

    /// Holds `bytes` from now on: gives back the difference when that is less, and takes
    /// the difference when it is more, even past the limit. That is for something already
    /// admitted that grew (a sample an operator decoded into more bytes): it is in memory
    /// whether or not the budget has room, and counting it makes the next
    /// [`try_reserve`](MemoryBudget::try_reserve) or [`reserve`](MemoryBudget::reserve)
    /// wait until the budget is back under its limit, which is what bounds the pipeline.
    pub fn resize_to(&mut self, bytes: u64) {
        if bytes <= self.bytes {
            self.shrink_to(bytes);
            return;
        }
        let more = bytes - self.bytes;
        self.budget.tally(more, false);
        let now = self.budget.inner.used.fetch_add(more, Ordering::AcqRel) + more;
        self.budget.inner.peak.fetch_max(now, Ordering::Relaxed);
        self.bytes = bytes;
    }

    /// Merges another reservation on the same budget into this one.
    pub fn merge(&mut self, mut other: Reservation) {
        debug_assert!(Arc::ptr_eq(&self.budget.inner, &other.budget.inner));
        // The bytes change hands: from the other's account (if any) to this one's.
        other.budget.tally(other.bytes, true);
        self.budget.tally(other.bytes, false);
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
    fn a_counting_handle_tells_its_share_of_the_budget() {
        let b = MemoryBudget::new(100);
        let mine = Arc::new(AtomicU64::new(0));
        let h = b.counting(mine.clone());
        let other = b.try_reserve(30).unwrap();
        let mut r = h.try_reserve(20).unwrap();
        assert_eq!((b.used(), mine.load(Ordering::Relaxed)), (50, 20));
        // The handle shares the limit: 50 are free, not 100.
        assert!(h.try_reserve(60).is_none());
        r.resize_to(45);
        assert_eq!((b.used(), mine.load(Ordering::Relaxed)), (75, 45));
        r.shrink_to(5);
        assert_eq!((b.used(), mine.load(Ordering::Relaxed)), (35, 5));
        // Merged in, the other's bytes become the handle's; dropped, all go.
        r.merge(other);
        assert_eq!((b.used(), mine.load(Ordering::Relaxed)), (35, 35));
        let held = h.count_held(10);
        assert_eq!(mine.load(Ordering::Relaxed), 45);
        drop((r, held));
        assert_eq!((b.used(), mine.load(Ordering::Relaxed)), (0, 0));
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

    #[test]
    fn reserve_blocking_waits_for_a_release_on_another_thread_and_times_out_without() {
        let b = MemoryBudget::new(100);
        let r = b.try_reserve(80).unwrap();
        // Nobody releases: it gives up after the timeout, holding nothing.
        let t0 = std::time::Instant::now();
        assert!(b.reserve_blocking(50, Duration::from_millis(50)).is_none());
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert_eq!(b.used(), 80);
        // A release on another thread wakes it well before its timeout.
        let b2 = b.clone();
        let waiter = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            let got = b2
                .reserve_blocking(50, Duration::from_secs(30))
                .map(|r| r.bytes());
            (got, t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(30));
        drop(r);
        let (got, took) = waiter.join().unwrap();
        assert_eq!(got, Some(50));
        assert!(took < Duration::from_secs(10), "woke after {took:?}");
        assert_eq!(b.used(), 0);
        // Free bytes are taken at once.
        assert_eq!(
            b.reserve_blocking(100, Duration::ZERO).unwrap().bytes(),
            100
        );
    }

    #[test]
    fn a_blocked_waiter_goes_before_new_reservations() {
        let b = MemoryBudget::new(100);
        let r = b.try_reserve(60).unwrap();
        let b2 = b.clone();
        let waiter =
            std::thread::spawn(move || b2.reserve_blocking(80, Duration::from_secs(30)).is_some());
        while b.inner.first.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        // 40 bytes are free, but the waiter came first: small reservations wait.
        assert!(b.try_reserve(10).is_none());
        drop(r);
        assert!(waiter.join().unwrap());
        // The waiter is served (and gone): others may reserve again.
        assert!(b.try_reserve(10).is_some());
    }

    #[tokio::test]
    async fn oversized_request_is_clamped_not_deadlocked() {
        let b = MemoryBudget::new(100);
        let r = b.reserve(1000).await;
        assert_eq!(r.bytes(), 100);
    }

    /// A reclaimer over reservations held in a list (standing in for a cache): gives back the
    /// oldest ones until `want` bytes are freed; records what it was asked.
    #[allow(clippy::type_complexity)]
    fn holder(
        held: Vec<Reservation>,
    ) -> (
        Arc<parking_lot::Mutex<Vec<Reservation>>>,
        Arc<parking_lot::Mutex<Vec<u64>>>,
        Arc<dyn Fn(u64) -> u64 + Send + Sync>,
    ) {
        let held = Arc::new(parking_lot::Mutex::new(held));
        let asked = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (h, a) = (held.clone(), asked.clone());
        let f: Arc<dyn Fn(u64) -> u64 + Send + Sync> = Arc::new(move |want| {
            a.lock().push(want);
            let mut freed = 0;
            let mut h = h.lock();
            while freed < want && !h.is_empty() {
                freed += h.remove(0).bytes();
            }
            freed
        });
        (held, asked, f)
    }

    #[test]
    fn bytes_already_held_are_counted_past_the_limit_after_the_reclaimers() {
        let b = MemoryBudget::new(100);
        let held: Vec<_> = (0..6).map(|_| b.try_reserve(10).unwrap()).collect();
        let (held, asked, f) = holder(held);
        b.add_reclaimer(Arc::downgrade(&f));
        let other = b.try_reserve(30).unwrap();
        // 10 free, 60 a cache could give back: it gives the 60 missing of 70, then the
        // 150 are held whole (not clamped), past the limit.
        let big = b.count_held(150);
        assert_eq!(*asked.lock(), vec![140]);
        assert!(held.lock().is_empty());
        assert_eq!(big.bytes(), 150);
        assert_eq!(b.used(), 180);
        assert_eq!(b.peak(), 180);
        // Nothing more is admitted until the excess is gone.
        assert!(b.try_reserve(1).is_none());
        drop(other);
        assert!(b.try_reserve(1).is_none());
        drop(big);
        assert_eq!(b.used(), 0);
        assert!(b.try_reserve(100).is_some());
    }

    #[tokio::test]
    async fn reclaimer_lets_a_waiting_reserve_proceed() {
        let b = MemoryBudget::new(100);
        let held: Vec<_> = (0..9).map(|_| b.try_reserve(10).unwrap()).collect();
        let (held, asked, f) = holder(held);
        b.add_reclaimer(Arc::downgrade(&f));
        assert!(b.try_reserve(50).is_none(), "try_reserve never reclaims");
        assert!(asked.lock().is_empty());
        let r = tokio::time::timeout(Duration::from_secs(5), b.reserve(50))
            .await
            .expect("the reclaimer must let reserve through");
        assert_eq!(r.bytes(), 50);
        // 10 bytes were free: it was asked for the 40 missing, and gave back just that.
        assert_eq!(*asked.lock(), vec![40]);
        assert_eq!(held.lock().len(), 5);
        assert_eq!(b.used(), 100);
        // An oversized request is clamped, and may take everything the reclaimer has.
        drop(r);
        let all = tokio::time::timeout(Duration::from_secs(5), b.reserve(1000))
            .await
            .unwrap();
        assert_eq!(all.bytes(), 100);
        assert!(held.lock().is_empty());
    }

    #[tokio::test]
    async fn several_reclaimers_share_the_shortfall_and_dead_ones_are_skipped() {
        let b = MemoryBudget::new(100);
        let (h1, _, f1) = holder(vec![b.try_reserve(30).unwrap()]);
        let (h2, _, f2) = holder(vec![b.try_reserve(30).unwrap()]);
        let dead: Arc<dyn Fn(u64) -> u64 + Send + Sync> = Arc::new(|_| unreachable!());
        b.add_reclaimer(Arc::downgrade(&f1));
        b.add_reclaimer(Arc::downgrade(&dead));
        b.add_reclaimer(Arc::downgrade(&f2));
        drop(dead);
        let _other = b.try_reserve(40).unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), b.reserve(60))
            .await
            .expect("both reclaimers together cover the shortfall");
        assert_eq!(r.bytes(), 60);
        assert!(h1.lock().is_empty() && h2.lock().is_empty());
        assert_eq!(
            b.inner.reclaimers.lock().len(),
            2,
            "the dead entry is pruned"
        );
    }

    #[tokio::test]
    async fn reserve_still_waits_when_reclaimers_have_nothing_left() {
        let b = MemoryBudget::new(100);
        let (_held, asked, f) = holder(Vec::new());
        b.add_reclaimer(Arc::downgrade(&f));
        let r = b.try_reserve(80).unwrap();
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.reserve(50).await.bytes() });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "must wait while the budget is full");
        // It asked once and then slept: no spinning on a reclaimer that frees nothing.
        assert_eq!(*asked.lock(), vec![30]);
        drop(r);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("a release still wakes the waiter")
            .unwrap();
        assert_eq!(got, 50);
        assert_eq!(b.used(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_waiters_and_a_refilling_holder_all_finish() {
        // A holder that grabs whatever is free (like cache inserts) races waiters that rely
        // on the reclaimer: every waiter must finish.
        let b = MemoryBudget::new(1000);
        let (held, _, f) = holder(Vec::new());
        b.add_reclaimer(Arc::downgrade(&f));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let filler = {
            let (b, held, stop) = (b.clone(), held.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(r) = b.try_reserve(7) {
                        held.lock().push(r);
                    } else {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move {
                    for _ in 0..50 {
                        let r = b.reserve(100 + i * 50).await;
                        tokio::task::yield_now().await;
                        drop(r);
                    }
                })
            })
            .collect();
        let all = async {
            for t in tasks {
                t.await.unwrap();
            }
        };
        let done = tokio::time::timeout(Duration::from_secs(30), all).await;
        stop.store(true, Ordering::Relaxed);
        filler.join().unwrap();
        done.expect("every waiter finishes");
        assert!(b.peak() <= b.limit());
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
