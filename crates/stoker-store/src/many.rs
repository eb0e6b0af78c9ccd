//! [`Store::fetch_many`]: whole objects, many at once, delivered in the order asked.
//!
//! This is the call a pipeline makes once it knows its future (the shuffled order of the next
//! samples). Small objects are dominated by per-request latency, so the only way to go fast is
//! many requests in flight; but delivery must stay in order and memory must stay bounded. The
//! stream keeps a window of fetch tasks, launched in the order given and yielded in that same
//! order: at most `concurrency` requests running, and at most `max_bytes` (estimated from the
//! metadata cache, else from the sizes seen so far) and `WINDOW_PER_REQUEST * concurrency`
//! objects in the window, each also holding its bytes against the store's memory budget.
//! Because tasks are launched in yield order, the oldest task never waits behind younger ones
//! for budget: there is no head-of-line deadlock.
//!
//! A finished fetch frees its request slot at once, not when it is yielded: a slow response
//! at the head of the window does not stall the requests behind it (with `concurrency`
//! counting the window, as `buffered(n)` does, one slow head lets the pipe drain to nothing
//! in flight while finished objects wait; that cost 13% of throughput on 2,000 small objects
//! at 10 ms of latency against curl, which starts a new transfer whenever any finishes).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, BoxStream, Stream, StreamExt};
use futures::FutureExt;
use stoker_core::Reservation;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::store::Store;

/// One object delivered by [`Store::fetch_many`].
#[derive(Debug, Clone)]
pub struct FetchedObject {
    /// Its key.
    pub key: String,
    /// Its bytes.
    pub bytes: Bytes,
}

/// Options of [`Store::fetch_many`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FetchManyOptions {
    /// Objects in flight. Default: the store's `fetch_concurrency`.
    pub concurrency: Option<usize>,
    /// Bytes in flight (fetched but not yet yielded included). Default 256 MiB.
    pub max_bytes: u64,
}

impl Default for FetchManyOptions {
    fn default() -> Self {
        FetchManyOptions {
            concurrency: None,
            max_bytes: 256 << 20,
        }
    }
}

impl FetchManyOptions {
    /// Sets the number of objects in flight.
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = Some(n.max(1));
        self
    }

    /// Sets the byte window.
    pub fn with_max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes.max(1);
        self
    }
}

struct Pending {
    key: String,
    estimate: u64,
    task: JoinHandle<Result<Bytes>>,
    _hold: Reservation,
}

struct State {
    store: Store,
    keys: BoxStream<'static, String>,
    keys_done: bool,
    window: VecDeque<Pending>,
    bytes_in_flight: u64,
    concurrency: usize,
    /// Requests running (launched and not finished), shared with the tasks.
    running: Arc<AtomicUsize>,
    /// Signalled by each task as it finishes: a slot is free.
    finished: Arc<Notify>,
    max_bytes: u64,
    seen_bytes: u64,
    seen_objects: u64,
    deferred: Option<String>,
}

impl Drop for State {
    fn drop(&mut self) {
        for p in &self.window {
            p.task.abort();
        }
    }
}

const DEFAULT_ESTIMATE: u64 = 256 << 10;

/// Objects the window may hold (finished ones waiting to be yielded included) per request
/// slot: room for the fast responses behind a slow head.
const WINDOW_PER_REQUEST: usize = 4;

impl Store {
    /// Fetches every key in `keys` (whole objects), many concurrently, and yields them in the
    /// order given. See the module docs for the bounds.
    pub fn fetch_many<I>(
        &self,
        keys: I,
        options: FetchManyOptions,
    ) -> BoxStream<'static, Result<FetchedObject>>
    where
        I: IntoIterator<Item = String>,
        I::IntoIter: Send + 'static,
    {
        self.fetch_many_stream(stream::iter(keys), options)
    }

    /// Like [`Store::fetch_many`] with keys that arrive over time (a listing still in progress,
    /// a sampler): fetching starts with the first key, not after the last.
    pub fn fetch_many_stream<S>(
        &self,
        keys: S,
        options: FetchManyOptions,
    ) -> BoxStream<'static, Result<FetchedObject>>
    where
        S: Stream<Item = String> + Send + 'static,
    {
        let state = State {
            store: self.clone(),
            keys: keys.boxed(),
            keys_done: false,
            window: VecDeque::new(),
            bytes_in_flight: 0,
            concurrency: options
                .concurrency
                .unwrap_or(self.inner.opts.fetch_concurrency)
                .max(1),
            running: Arc::default(),
            finished: Arc::default(),
            max_bytes: options.max_bytes,
            seen_bytes: 0,
            seen_objects: 0,
            deferred: None,
        };
        stream::unfold(state, |mut st| async move {
            // Deliver the head once it is done; until then, refill each freed request slot.
            let joined = loop {
                st.top_up().await;
                let finished = Arc::clone(&st.finished);
                let freed = finished.notified();
                let head = st.window.front_mut()?;
                tokio::select! {
                    biased;
                    r = &mut head.task => break r,
                    () = freed => {}
                }
            };
            let p = st.window.pop_front().expect("the head just finished");
            st.bytes_in_flight -= p.estimate;
            let res = match joined {
                Ok(r) => r,
                Err(join) => Err(Error::Io {
                    path: st.store.object_url(&p.key),
                    source: std::sync::Arc::new(std::io::Error::other(join.to_string())),
                }),
            };
            let out = res.map(|bytes| {
                st.seen_bytes += bytes.len() as u64;
                st.seen_objects += 1;
                FetchedObject { key: p.key, bytes }
            });
            Some((out, st))
        })
        .boxed()
    }
}

/// One running request: dropping it frees the slot and wakes the stream.
struct Slot {
    running: Arc<AtomicUsize>,
    finished: Arc<Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::AcqRel);
        self.finished.notify_one();
    }
}

impl State {
    fn estimate(&self, key: &str) -> u64 {
        if let Some(info) = self.store.inner.meta.get(key) {
            return info.size.max(1);
        }
        self.seen_bytes
            .checked_div(self.seen_objects)
            .map(|avg| avg.max(1))
            .unwrap_or(DEFAULT_ESTIMATE)
    }

    /// Launches fetches until the window is full. The oldest pending fetch always gets
    /// started (waiting for budget if it must); younger ones only when both the byte window
    /// and the shared budget have room now. A key that does not fit waits in `deferred`.
    async fn top_up(&mut self) {
        while self.running.load(Ordering::Acquire) < self.concurrency
            && self.window.len() < self.concurrency * WINDOW_PER_REQUEST
        {
            let key = match self.deferred.take() {
                Some(k) => k,
                None if self.keys_done => break,
                None => {
                    // Wait for a key only when nothing is in flight; otherwise take what has
                    // arrived and go back to delivering.
                    let next = if self.window.is_empty() {
                        Some(self.keys.next().await)
                    } else {
                        self.keys.next().now_or_never()
                    };
                    match next {
                        Some(Some(k)) => k,
                        Some(None) => {
                            self.keys_done = true;
                            break;
                        }
                        None => break,
                    }
                }
            };
            let estimate = self.estimate(&key);
            let budget = &self.store.inner.budget;
            let hold = if self.window.is_empty() {
                budget.reserve(estimate).await
            } else if self.bytes_in_flight + estimate > self.max_bytes {
                self.deferred = Some(key);
                break;
            } else {
                match budget.try_reserve(estimate) {
                    Some(h) => h,
                    None => {
                        self.deferred = Some(key);
                        break;
                    }
                }
            };
            let store = self.store.clone();
            let k = key.clone();
            let (running, finished) = (Arc::clone(&self.running), Arc::clone(&self.finished));
            running.fetch_add(1, Ordering::AcqRel);
            let task = tokio::spawn(async move {
                // Frees the slot however the task ends (aborted included).
                let _slot = Slot { running, finished };
                store.get(&k).await
            });
            self.bytes_in_flight += estimate;
            self.window.push_back(Pending {
                key,
                estimate,
                task,
                _hold: hold,
            });
        }
    }
}
