//! Stores shared by every run in the process (and by `stoker.io` in Python).
//!
//! A run normally opens its own store and I/O runtime and lets both go when it ends, so a
//! second run of the same pipeline (the next epoch of a PyTorch loop, which is a new run)
//! starts with an empty block cache and new connections. A run with
//! [`RunOptions::share_store`](crate::RunOptions::share_store) instead reads through the
//! process's store for its bucket (or host, or the local file system) and store options,
//! opened by the first such run and kept until [`clear_shared_stores`]: its memory and disk
//! block cache, connection pool and metadata cache carry over from run to run. The run then
//! draws on that store's memory budget (queues, fetch windows and cached blocks count
//! against one limit however many runs share it), and runs on one process-wide I/O runtime
//! (connections belong to the runtime they were opened on).
//!
//! After `fork()` the child sees neither the parent's runtime threads nor its connections:
//! both are forgotten there (not shut down, which would wait for threads that do not exist)
//! and opened again on first use.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use stoker_store::{Store, StoreOptions, StoreUrl};

use stoker_core::Error;

struct Registry {
    pid: u32,
    runtime: Option<Arc<tokio::runtime::Runtime>>,
    stores: HashMap<String, Store>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

/// Runs `f` on this process's registry, replacing one inherited through `fork()`.
fn with_registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let pid = std::process::id();
    let mut slot = REGISTRY.lock();
    if slot.as_ref().is_none_or(|r| r.pid != pid) {
        if let Some(old) = slot.take() {
            // Its runtime's threads and its stores' connections are the parent's.
            std::mem::forget(old);
        }
        *slot = Some(Registry {
            pid,
            runtime: None,
            stores: HashMap::new(),
        });
    }
    f(slot.as_mut().expect("just set"))
}

/// The process-wide I/O runtime (two threads, started on first use).
pub fn shared_runtime() -> Result<Arc<tokio::runtime::Runtime>, Error> {
    with_registry(|r| {
        if let Some(rt) = &r.runtime {
            return Ok(rt.clone());
        }
        let rt = Arc::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("stoker-shared-io")
                .enable_all()
                .build()
                .map_err(|e| Error::invalid(format!("cannot start the I/O runtime: {e}")))?,
        );
        r.runtime = Some(rt.clone());
        Ok(rt)
    })
}

/// The shared store that reads `url` with `options` (opened on first use), and the key
/// `url` names in it. Stores are kept by root (bucket, host or local file system) and by
/// every option, credentials included, so two pipelines share one only when they would
/// have opened identical stores.
pub fn shared_store(
    url: &str,
    options: &StoreOptions,
) -> Result<(Store, String), stoker_store::Error> {
    let parsed = StoreUrl::parse(url)?;
    let root = parsed.object_url("");
    // The options' Debug form names every setting; it stays in this process's memory, as
    // the options themselves do.
    let id = format!("{root}\n{options:?}");
    with_registry(|r| {
        let store = match r.stores.get(&id) {
            Some(s) => s.clone(),
            None => {
                let s = Store::open(&root, options.clone())?;
                r.stores.insert(id, s.clone());
                s
            }
        };
        Ok((store, parsed.key))
    })
}

/// Lets the shared stores go: later runs and opens start with empty caches. Runs still
/// going, and files still open, keep theirs until they end. Returns how many were let go.
pub fn clear_shared_stores() -> usize {
    with_registry(|r| {
        let n = r.stores.len();
        r.stores.clear();
        n
    })
}
