//! Reuse of large batch buffers.
//!
//! A stacked batch is one large allocation (an ImageNet batch of 64 x 3 x 224 x 224 float32
//! is 38.5 MiB), made for every batch and freed when the consumer drops it. glibc serves
//! anything above its mmap threshold (at most 32 MiB) with a fresh `mmap` and unmaps it on
//! free, so in the Python package (which, unlike the CLI, runs on the process's allocator)
//! every batch was faulted in again page by page, zeroed by the kernel: 385,000 page faults
//! and 1.1-1.5 s of system time per 2,000 ImageNet images, a third of the run's CPU.
//! Swapping in mimalloc fixed the faults but kept freed memory around for longer than needed
//! (peak RSS up 150-200 MiB with torch).
//!
//! Instead, stacking takes its buffer from here ([`Recycler::take`]), and a consumer that
//! knows when the last reference to a batch's bytes goes (the Python package, when the NumPy
//! array or torch tensor over it is collected) hands the allocation back
//! ([`Recycler::put`]). A few idle buffers are kept and given to the next batch of about the
//! same size. What is kept is bounded ([`MAX_IDLE`] buffers, [`MAX_IDLE_BYTES`] in all) and
//! dropped [`LINGER`] after the last pipeline run ends ([`Recycler::hold`]), unless a run
//! starts in between: runs that follow one another (an epoch a run, as `stoker.torch`
//! makes them; a Ray worker's pieces, a run each) keep stacking into the same memory, while
//! a process that stops running pipelines gives the memory back. (Dropping it at every
//! run's end faulted a Ray worker's batches in afresh, about 9% of its CPU.)
//!
//! The bytes themselves stay plain `Bytes::from(Vec)`, so `Bytes::is_unique` still tells a
//! consumer whether anything else shares them (a `Bytes` with a custom owner would always
//! say it is shared, and torch would then get a copy).
//!
//! A batch's data starts on a [`ALIGN`]-byte boundary ([`Recycler::take_aligned`], then
//! [`freeze`]): the allocator aligns to 16 bytes, and XLA's CPU client imports a DLPack
//! buffer without a copy only when it is 64-byte aligned (as do aligned vector loads). The
//! buffer is a few bytes longer, and its `Bytes` is a slice past them, still unique and
//! still handed back whole.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Buffers smaller than this are left to the allocator, which reuses them well.
pub const MIN_SIZE: usize = 1 << 20;
/// Idle buffers kept at most.
pub const MAX_IDLE: usize = 2;
/// Idle bytes kept at most.
pub const MAX_IDLE_BYTES: usize = 256 << 20;
/// Where a batch's data starts: a multiple of this many bytes.
pub const ALIGN: usize = 64;
/// How long idle buffers outlive the last run.
pub const LINGER: Duration = Duration::from_secs(1);

/// The bytes of `buf` after its first `pad` (the padding [`Recycler::take_aligned`] put
/// there), as one `Bytes` that owns the whole buffer.
pub fn freeze(buf: Vec<u8>, pad: usize) -> bytes::Bytes {
    bytes::Bytes::from(buf).slice(pad..)
}

/// A set of idle buffers; [`GLOBAL`] is the one stacking uses.
#[derive(Debug)]
pub struct Recycler {
    idle: Mutex<Vec<Vec<u8>>>,
    reused: AtomicU64,
    /// Runs holding the recycler ([`Recycler::hold`]).
    users: AtomicUsize,
    /// When the last run let go (None while a run holds it, or once cleared).
    left: Mutex<Option<Instant>>,
    wake: Condvar,
}

/// The process's recycler.
pub static GLOBAL: Recycler = Recycler::new();

impl Recycler {
    /// An empty recycler.
    pub const fn new() -> Recycler {
        Recycler {
            idle: Mutex::new(Vec::new()),
            reused: AtomicU64::new(0),
            users: AtomicUsize::new(0),
            left: Mutex::new(None),
            wake: Condvar::new(),
        }
    }

    /// A run's hold: while any is alive, idle buffers are kept for the next batches; when
    /// the last is dropped they are dropped [`LINGER`] later, unless another hold was
    /// taken by then (one thread a process waits for that).
    pub fn hold(&'static self) -> Hold {
        self.users.fetch_add(1, Ordering::SeqCst);
        *self.left.lock() = None;
        Hold(self)
    }

    fn let_go(&'static self) {
        if self.users.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        *self.left.lock() = Some(Instant::now());
        // One reaper per recycler and process: a child forked after the parent started one
        // (a DataLoader worker) has none running, and starts its own.
        static REAPERS: OnceLock<Mutex<Vec<(usize, u32)>>> = OnceLock::new();
        let me = (self as *const Recycler as usize, std::process::id());
        let mut started = REAPERS.get_or_init(|| Mutex::new(Vec::new())).lock();
        if !started.contains(&me) {
            let spawned = std::thread::Builder::new()
                .name("stoker-recycle".into())
                .spawn(move || self.reap());
            if spawned.is_err() {
                // No thread to wait with: let go now, as before.
                self.clear();
                return;
            }
            started.push(me);
        }
        self.wake.notify_all();
    }

    /// The reaper: drops the idle buffers once no run has held them for [`LINGER`].
    fn reap(&self) {
        let mut left = self.left.lock();
        loop {
            match *left {
                None => self.wake.wait(&mut left),
                Some(t) if t.elapsed() >= LINGER => {
                    *left = None;
                    if self.users.load(Ordering::SeqCst) == 0 {
                        // Not holding `left` meanwhile: a run starting now does not wait.
                        parking_lot::MutexGuard::unlocked(&mut left, || self.clear());
                    }
                }
                Some(t) => {
                    let _ = self
                        .wake
                        .wait_for(&mut left, LINGER.saturating_sub(t.elapsed()));
                }
            }
        }
    }

    /// An empty buffer with room for at least `len` bytes: an idle one whose capacity is
    /// within a quarter above `len` when there is one, else a new one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        if len >= MIN_SIZE {
            let mut idle = self.idle.lock();
            if let Some(i) = idle
                .iter()
                .position(|b| b.capacity() >= len && b.capacity() - len <= len / 4)
            {
                self.reused.fetch_add(1, Ordering::Relaxed);
                return idle.swap_remove(i);
            }
        }
        Vec::with_capacity(len)
    }

    /// A buffer for `len` bytes that start [`ALIGN`]-aligned: `pad` zero bytes come first
    /// (what the allocation's address needs), then room for `len` more without growing.
    /// Returns `(buffer, pad)`; push the data, then [`freeze`] it.
    pub fn take_aligned(&self, len: usize) -> (Vec<u8>, usize) {
        let mut buf = self.take(len + ALIGN - 1);
        let pad = buf.as_ptr().align_offset(ALIGN).min(ALIGN - 1);
        buf.resize(pad, 0);
        (buf, pad)
    }

    /// Drops every idle buffer.
    pub fn clear(&self) {
        let idle = std::mem::take(&mut *self.idle.lock());
        drop(idle);
    }

    /// How many [`take`](Recycler::take)s were given an idle buffer.
    pub fn reused(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    /// Bytes held by idle buffers now.
    pub fn idle_bytes(&self) -> usize {
        self.idle.lock().iter().map(Vec::capacity).sum()
    }

    /// Keeps `buf` (emptied) for a later [`take`](Recycler::take) when it is large and
    /// there is room; otherwise frees it.
    pub fn put(&self, mut buf: Vec<u8>) {
        if buf.capacity() < MIN_SIZE {
            return;
        }
        let mut idle = self.idle.lock();
        let held: usize = idle.iter().map(Vec::capacity).sum();
        if idle.len() < MAX_IDLE && held + buf.capacity() <= MAX_IDLE_BYTES {
            buf.clear();
            idle.push(buf);
        }
    }
}

/// A run's hold on a [`Recycler`] (see [`Recycler::hold`]).
#[derive(Debug)]
pub struct Hold(&'static Recycler);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.let_go();
    }
}

impl Default for Recycler {
    fn default() -> Recycler {
        Recycler::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static R: Recycler = Recycler::new();

    #[test]
    fn large_buffers_come_back_small_ones_do_not_and_what_is_kept_is_bounded() {
        let len = 3 * MIN_SIZE;
        let mut a = R.take(len);
        a.resize(len, 7);
        let at = a.as_ptr();
        R.put(a);
        assert!(R.idle_bytes() >= len);
        // The next buffer of about that size is the same memory, empty.
        let b = R.take(len - 10);
        assert_eq!(b.as_ptr(), at);
        assert_eq!(R.reused(), 1);
        assert!(b.is_empty());
        assert_eq!(R.idle_bytes(), 0);
        // A much smaller request does not get it.
        R.put(b);
        let c = R.take(len / 2);
        assert_ne!(c.as_ptr(), at);
        // Small buffers are not kept.
        R.put(vec![1u8; MIN_SIZE / 2]);
        let kept = R.idle_bytes();
        assert!(kept >= len && kept < len + MIN_SIZE, "{kept}");
        // At most MAX_IDLE buffers are kept.
        for _ in 0..MAX_IDLE + 2 {
            R.put(vec![1u8; len]);
        }
        assert!(R.idle_bytes() <= MAX_IDLE * (len + len / 4));
        R.clear();
        assert_eq!(R.idle_bytes(), 0);
    }

    #[test]
    fn idle_buffers_outlive_the_last_run_by_the_linger_and_a_new_run_keeps_them() {
        static L: Recycler = Recycler::new();
        let len = 2 * MIN_SIZE;
        let a = L.hold();
        L.put(vec![1u8; len]);
        drop(a);
        // The next run, soon after, finds the buffer.
        std::thread::sleep(LINGER / 4);
        assert!(L.idle_bytes() >= len);
        let b = L.hold();
        std::thread::sleep(LINGER + LINGER / 2);
        assert!(L.idle_bytes() >= len, "kept while a run holds it");
        drop(b);
        let t = Instant::now();
        while L.idle_bytes() > 0 {
            assert!(t.elapsed() < 5 * LINGER, "not let go");
            std::thread::sleep(LINGER / 20);
        }
        assert!(t.elapsed() >= LINGER / 2);
    }

    #[test]
    fn aligned_buffers_start_their_data_on_the_boundary_and_come_back_whole() {
        static A: Recycler = Recycler::new();
        for len in [10, 1000, 3 * MIN_SIZE] {
            let (mut buf, pad) = A.take_aligned(len);
            assert_eq!(buf.len(), pad);
            assert!(pad < ALIGN);
            let cap = buf.capacity();
            buf.extend((0..len).map(|i| i as u8));
            assert_eq!(buf.capacity(), cap, "no growth");
            let alloc = buf.as_ptr();
            let b = freeze(buf, pad);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.len(), len);
            assert_eq!(b[len - 1], (len - 1) as u8);
            assert!(b.is_unique());
            // Handed back (as the Python package does), the whole allocation returns.
            let mut whole = b.try_into_mut().expect("unique");
            whole.clear();
            let v = Vec::from(whole);
            assert_eq!(v.as_ptr(), alloc);
            assert_eq!(v.capacity(), cap);
            A.put(v);
        }
        // A recycled buffer is aligned again for its next batch.
        let (buf, pad) = A.take_aligned(3 * MIN_SIZE - 100);
        assert_eq!(A.reused(), 1);
        assert_eq!(freeze(buf, pad).as_ptr() as usize % ALIGN, 0);
    }
}
