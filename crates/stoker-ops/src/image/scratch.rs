//! Reused per-thread byte buffers for the intermediate images of a kernel.
//!
//! A fused crop allocates a decoded region, a transposed tile, a horizontally resampled
//! image: a few hundred KB each, per image. Fresh allocations of that size come from
//! `mmap` or a grown heap, so every image paid for page faults and zeroing (about a
//! tenth of the post-decode time on ImageNet-sized files). A [`Scratch`] buffer is taken
//! from a small per-thread pool and goes back to it when dropped, keeping its capacity.
//! Only buffers that are overwritten before they are read may use one: their contents
//! are whatever the previous user left.
//!
//! What a pool keeps is outside the run's memory budget (a kernel charges a buffer for
//! the sample that uses it, not while it waits in the pool), so the pool is small: at
//! most [`POOL_BYTES`] a thread, of buffers of at most [`KEEP_MAX`]. A large image's
//! buffers go back to the allocator (which returns buffers that large to the system at
//! once).

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Buffers larger than this go back to the allocator rather than stay cached (an
/// ImageNet-sized image's are a few hundred KB).
const KEEP_MAX: usize = 8 << 20;
/// Bytes kept per thread, at most.
const POOL_BYTES: usize = 16 << 20;
/// Buffers kept per thread.
const POOL_MAX: usize = 8;

thread_local! {
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A byte buffer borrowed from this thread's pool (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Scratch(Vec<u8>);

impl Scratch {
    /// A buffer from the pool (length unspecified, contents stale), or a new empty one.
    pub fn take() -> Scratch {
        Scratch(
            POOL.try_with(|p| p.borrow_mut().pop())
                .ok()
                .flatten()
                .unwrap_or_default(),
        )
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        if v.capacity() == 0 || v.capacity() > KEEP_MAX {
            return;
        }
        let _ = POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            let kept: usize = p.iter().map(Vec::capacity).sum();
            if p.len() < POOL_MAX && kept + v.capacity() <= POOL_BYTES {
                p.push(v);
            }
        });
    }
}

impl Deref for Scratch {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_with_their_capacity() {
        let mut a = Scratch::take();
        a.resize(1000, 7);
        let cap = a.capacity();
        drop(a);
        let b = Scratch::take();
        assert!(b.capacity() >= cap.min(1000));
        // Two at once are two different buffers.
        let mut c = Scratch::take();
        c.push(1);
        assert_ne!(b.as_ptr(), c.as_ptr());
    }
}
