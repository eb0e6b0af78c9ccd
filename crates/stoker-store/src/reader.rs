//! [`ObjectReader`]: a cursor over one object with adaptive sequential read-ahead.
//!
//! The reader keeps a window of fetches in flight ahead of its position. The window starts
//! small (`read_ahead_initial`, 1 MiB: a reader that only wants a header pays for little) and
//! doubles each time the reader consumes a whole fetch while staying sequential, up to
//! `read_ahead_max`. A seek outside the window cancels the fetches in flight and starts the
//! window small again; a small forward skip inside the window keeps it. Fetches run as tasks,
//! so they progress while the caller is busy with the previous bytes.
//!
//! Every fetch holds its bytes against the store's memory budget. The fetch the reader needs
//! next waits for budget (backpressure); fetches further ahead are only started when budget is
//! free right now, so read-ahead shrinks under pressure instead of deadlocking or
//! overcommitting. Fetches aligned to whole parts go through the shared block cache (and its
//! single-flight); the small first fetches go straight to the server.

use std::collections::VecDeque;
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use stoker_core::Reservation;
use tokio::task::JoinHandle;

use crate::error::Result;
use crate::store::{ObjectInfo, Store};

struct Fetch {
    range: Range<u64>,
    task: JoinHandle<Result<Bytes>>,
    done: Option<Bytes>,
    _hold: Reservation,
}

/// A sequential reader with read-ahead over one object. Create it with [`Store::reader`].
pub struct ObjectReader {
    store: Store,
    info: ObjectInfo,
    pos: u64,
    window: u64,
    next_fetch: u64,
    inflight: VecDeque<Fetch>,
}

impl std::fmt::Debug for ObjectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectReader")
            .field("key", &self.info.key)
            .field("pos", &self.pos)
            .field("window", &self.window)
            .field("inflight", &self.inflight.len())
            .finish()
    }
}

impl Drop for ObjectReader {
    fn drop(&mut self) {
        for f in &self.inflight {
            f.task.abort();
        }
    }
}

impl Store {
    /// A reader over `key` (metadata from the cache or one HEAD).
    pub async fn reader(&self, key: &str) -> Result<ObjectReader> {
        let info = self.head(key).await?;
        Ok(self.reader_of(info))
    }

    /// A reader over an object whose metadata the caller already has.
    pub fn reader_of(&self, info: ObjectInfo) -> ObjectReader {
        ObjectReader {
            window: self.inner.opts.read_ahead_initial,
            store: self.clone(),
            info,
            pos: 0,
            next_fetch: 0,
            inflight: VecDeque::new(),
        }
    }
}

impl ObjectReader {
    /// The object's metadata.
    pub fn info(&self) -> &ObjectInfo {
        &self.info
    }

    /// The current position.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The current read-ahead window in bytes.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Moves to `pos`. Inside the window (forward) the fetches in flight are kept; elsewhere
    /// they are cancelled and the window starts small again.
    pub fn seek(&mut self, pos: u64) {
        if pos == self.pos {
            return;
        }
        let inside = pos > self.pos && pos < self.next_fetch;
        if inside {
            while let Some(f) = self.inflight.front() {
                if f.range.end <= pos {
                    self.inflight.pop_front();
                } else {
                    break;
                }
            }
        } else {
            for f in self.inflight.drain(..) {
                f.task.abort();
            }
            self.window = self.store.inner.opts.read_ahead_initial;
            self.next_fetch = pos;
        }
        self.pos = pos;
    }

    /// The next bytes from the current position, at most `max` of them; empty at the end of
    /// the object. Returns as soon as the fetch covering the position has arrived.
    pub async fn read(&mut self, max: usize) -> Result<Bytes> {
        if self.pos >= self.info.size || max == 0 {
            return Ok(Bytes::new());
        }
        if self.inflight.is_empty() {
            self.next_fetch = self.pos;
        }
        self.fill().await;
        let front = self
            .inflight
            .front_mut()
            .expect("fill starts at least one fetch");
        if front.done.is_none() {
            let res = match (&mut front.task).await {
                Ok(r) => r,
                Err(join) => Err(crate::Error::Io {
                    path: self.info.key.clone(),
                    source: std::sync::Arc::new(std::io::Error::other(join.to_string())),
                }),
            };
            match res {
                Ok(bytes) => front.done = Some(bytes),
                Err(e) => {
                    // The failed fetch is spent: forget it and what was queued behind it, so
                    // the next read asks again instead of polling a finished task.
                    for f in self.inflight.drain(..) {
                        f.task.abort();
                    }
                    self.next_fetch = self.pos;
                    return Err(e);
                }
            }
        }
        let data = front.done.as_ref().expect("set above");
        let off = (self.pos - front.range.start) as usize;
        let n = (data.len() - off).min(max);
        let out = data.slice(off..off + n);
        self.pos += n as u64;
        if self.pos >= front.range.end {
            self.inflight.pop_front();
            // A whole fetch consumed sequentially: grow the window.
            let max_window = self.store.inner.opts.read_ahead_max;
            self.window = (self.window * 2).min(max_window);
        }
        Ok(out)
    }

    /// Exactly `len` bytes from `offset` (fewer only at the end of the object).
    pub async fn read_at(&mut self, offset: u64, len: usize) -> Result<Bytes> {
        self.seek(offset);
        let first = self.read(len).await?;
        if first.len() == len || first.is_empty() {
            return Ok(first);
        }
        let mut buf = BytesMut::with_capacity(len);
        buf.extend_from_slice(&first);
        while buf.len() < len {
            let more = self.read(len - buf.len()).await?;
            if more.is_empty() {
                break;
            }
            buf.extend_from_slice(&more);
        }
        Ok(buf.freeze())
    }

    /// Starts fetches until the window ahead of the position is covered.
    async fn fill(&mut self) {
        let opts = &self.store.inner.opts;
        let ps = opts.part_size;
        let size = self.info.size;
        let target = (self.pos + self.window).min(size);
        while self.next_fetch < size && (self.next_fetch < target || self.inflight.is_empty()) {
            let start = self.next_fetch;
            let want = self.window.min(ps).max(1);
            // Never cross a part boundary, so whole parts line up with cache blocks.
            let boundary = (start / ps + 1) * ps;
            let end = (start + want).min(boundary).min(size);
            let len = end - start;
            let budget = &self.store.inner.budget;
            let hold = if self.inflight.is_empty() {
                budget.reserve(len).await
            } else {
                match budget.try_reserve(len) {
                    Some(h) => h,
                    None => break,
                }
            };
            let store = self.store.clone();
            let info = self.info.clone();
            let whole_part = start.is_multiple_of(ps) && (end == start + ps || end == size);
            let task = tokio::spawn(async move {
                if whole_part {
                    store.block(&info, start / ps).await
                } else {
                    store.get_range_of(&info, start..end).await
                }
            });
            self.inflight.push_back(Fetch {
                range: start..end,
                task,
                done: None,
                _hold: hold,
            });
            self.next_fetch = end;
        }
    }
}
