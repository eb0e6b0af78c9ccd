//! Single-flight bookkeeping: at most one fetch per key in flight; later callers for the same
//! key wait for its outcome.
//!
//! A flight is a `watch` channel. The leader holds the sender inside a [`Leader`] guard; the
//! map holds a receiver that followers clone. The leader publishes the outcome (removing the
//! flight first, so later callers find the cache instead). If the leader is dropped without
//! publishing (its future was cancelled, or it panicked), the guard removes the flight and
//! drops the sender; waiting followers see the channel close and retry, one of them becoming
//! the new leader. Nobody waits on a flight that can no longer finish.
//!
//! Errors are shared type-erased (`Arc<dyn Any>`), because the map serves callers with any
//! error type; a follower downcasts to its own.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::BlockKey;

/// A fetch's outcome as followers see it.
pub(crate) type Outcome = Result<Bytes, Arc<dyn Any + Send + Sync>>;

type Slot = Option<Outcome>;

/// key -> (flight id, a receiver followers clone).
type FlightMap = Arc<Mutex<HashMap<BlockKey, (u64, watch::Receiver<Slot>)>>>;

/// The flights in progress.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    map: FlightMap,
    next_id: AtomicU64,
}

/// The caller's part in a flight.
pub(crate) enum Role {
    /// Run the fetch and [`Leader::complete`] the flight.
    Leader(Leader),
    /// Wait on [`wait`] for the leader's outcome.
    Follower(watch::Receiver<Slot>),
}

impl Flights {
    /// Joins the flight for `key`, or starts one.
    pub fn join_or_lead(&self, key: &BlockKey) -> Role {
        let mut map = self.map.lock();
        if let Some((_, rx)) = map.get(key) {
            return Role::Follower(rx.clone());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(None);
        map.insert(key.clone(), (id, rx));
        Role::Leader(Leader {
            map: self.map.clone(),
            key: key.clone(),
            id,
            tx: Some(tx),
        })
    }

    /// Flights in progress (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }
}

/// Waits for the leader's outcome; `None` if the leader gave up without one.
pub(crate) async fn wait(mut rx: watch::Receiver<Slot>) -> Option<Outcome> {
    match rx.wait_for(Option::is_some).await {
        Ok(slot) => slot.clone(),
        Err(_) => None,
    }
}

/// The leader's guard: publishes the outcome, or on drop abandons the flight.
pub(crate) struct Leader {
    map: FlightMap,
    key: BlockKey,
    id: u64,
    tx: Option<watch::Sender<Slot>>,
}

impl Leader {
    /// Ends the flight with `outcome`, handing it to every follower.
    pub fn complete(mut self, outcome: Outcome) {
        self.unregister();
        if let Some(tx) = self.tx.take() {
            tx.send_replace(Some(outcome));
        }
    }

    fn unregister(&self) {
        let mut map = self.map.lock();
        if map.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            map.remove(&self.key);
        }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if self.tx.is_some() {
            // Abandoned: remove the flight before the sender goes, so that followers woken by
            // the close find no flight and one of them leads the retry.
            self.unregister();
            self.tx = None;
        }
    }
}
