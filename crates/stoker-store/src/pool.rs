//! A small pool of part-sized buffers.
//!
//! A large read allocates one `part_size` buffer per part, fills it from the socket, hands it
//! out and (unless the cache keeps it) frees it. Fresh memory is expensive: the kernel zeroes
//! every page on first touch, and allocators return large blocks to the kernel when they are
//! freed, so each part paid for page faults and zeroing again (measured on the 1 GiB read: most
//! of the client's CPU went to `clear_page`). The pool keeps a few freed part buffers and gives
//! them to the next part instead. Idle buffers hold memory budget like everything else; when
//! the budget is short they are simply freed.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use stoker_core::{MemoryBudget, Reservation};

pub(crate) struct BufferPool {
    size: usize,
    max_idle: usize,
    budget: MemoryBudget,
    idle: Mutex<Vec<(Vec<u8>, Reservation)>>,
    this: Weak<BufferPool>,
    _reclaimer: Arc<dyn Fn(u64) -> u64 + Send + Sync>,
}

impl BufferPool {
    pub(crate) fn new(size: usize, max_idle: usize, budget: MemoryBudget) -> Arc<Self> {
        Arc::new_cyclic(|this: &Weak<BufferPool>| {
            let me = this.clone();
            let r: Arc<dyn Fn(u64) -> u64 + Send + Sync> = Arc::new(move |want: u64| {
                let Some(pool) = me.upgrade() else { return 0 };
                let mut freed = 0;
                let mut idle = pool.idle.lock();
                while freed < want {
                    match idle.pop() {
                        Some((_buf, hold)) => freed += hold.bytes(),
                        None => break,
                    }
                }
                freed
            });
            budget.add_reclaimer(Arc::downgrade(&r));
            BufferPool {
                size,
                max_idle,
                budget,
                idle: Mutex::new(Vec::new()),
                this: this.clone(),
                _reclaimer: r,
            }
        })
    }

    /// An empty buffer with room for `len` bytes; a recycled one when `len` is a whole part.
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        if len == self.size {
            if let Some((buf, _hold)) = self.idle.lock().pop() {
                return buf;
            }
        }
        let buf = Vec::with_capacity(len);
        populate(buf.as_ptr(), buf.capacity());
        buf
    }

    /// Freezes a filled buffer into `Bytes` that come back to the pool when the last reference
    /// is dropped.
    pub(crate) fn freeze(&self, buf: Vec<u8>) -> Bytes {
        if buf.capacity() == self.size && self.max_idle > 0 {
            Bytes::from_owner(Pooled {
                buf,
                pool: self.this.clone(),
            })
        } else {
            Bytes::from(buf)
        }
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        let mut idle = self.idle.lock();
        // (A reservation larger than the whole budget is clamped, which must not let an idle
        // buffer past a budget too small for it.)
        if idle.len() >= self.max_idle || buf.capacity() as u64 > self.budget.limit() {
            return;
        }
        if let Some(hold) = self.budget.try_reserve(buf.capacity() as u64) {
            buf.clear();
            idle.push((buf, hold));
        }
    }

    #[cfg(test)]
    fn idle(&self) -> usize {
        self.idle.lock().len()
    }
}

struct Pooled {
    buf: Vec<u8>,
    pool: Weak<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.buf));
        }
    }
}

/// Faults a new buffer's pages in with one system call (`MADV_POPULATE_WRITE`, Linux 5.14+)
/// instead of one page fault per 4 KiB while the body is copied in: the same zeroing, without
/// 2,048 traps per 8 MiB part. Small buffers, and kernels without it, fault as usual.
fn populate(ptr: *const u8, capacity: usize) {
    const MIN: usize = 1 << 20;
    #[cfg(target_os = "linux")]
    if capacity >= MIN {
        // Only whole pages inside the allocation.
        let page = 4096usize;
        let start = ptr as usize;
        let first = start.next_multiple_of(page);
        let end = (start + capacity) / page * page;
        if end > first {
            // SAFETY: the range lies inside the vector's allocation, which is live and ours;
            // MADV_POPULATE_WRITE only faults pages in (it does not change their contents).
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, MADV_POPULATE_WRITE);
            }
        }
    }
}

/// Not in every libc crate version yet (value from linux/mman.h).
#[cfg(target_os = "linux")]
const MADV_POPULATE_WRITE: libc::c_int = 23;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_buffers_are_recycled_and_budgeted() {
        let budget = MemoryBudget::new(1 << 20);
        let pool = BufferPool::new(1024, 2, budget.clone());
        let mut v = pool.take(1024);
        v.extend_from_slice(&[1u8; 1024]);
        let ptr = v.as_ptr();
        let b = pool.freeze(v);
        let b2 = b.slice(10..20);
        drop(b);
        assert_eq!(pool.idle(), 0, "still referenced by a slice");
        assert_eq!(&b2[..], &[1u8; 10]);
        drop(b2);
        assert_eq!(pool.idle(), 1);
        assert_eq!(budget.used(), 1024, "an idle buffer holds budget");
        let again = pool.take(1024);
        assert_eq!(again.as_ptr(), ptr, "the same memory comes back");
        assert!(again.is_empty());
        assert_eq!(budget.used(), 0);
        // Other sizes are not pooled.
        let other = pool.freeze(vec![0u8; 10]);
        drop(other);
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn no_idle_buffer_without_budget() {
        let budget = MemoryBudget::new(100);
        let pool = BufferPool::new(1024, 4, budget.clone());
        let mut v = pool.take(1024);
        v.resize(1024, 0);
        drop(pool.freeze(v));
        assert_eq!(pool.idle(), 0);
        assert_eq!(budget.used(), 0);
    }
}
