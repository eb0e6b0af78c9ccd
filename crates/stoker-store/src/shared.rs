//! Stores shared by every user in the process: the runs of pipelines that share their store
//! (`RunOptions::share_store` in `stoker-pipeline`) and `stoker.io` in Python.
//!
//! A run normally opens its own store and I/O runtime and lets both go when it ends, so a
//! second run of the same pipeline (the next epoch of a PyTorch loop, which is a new run)
//! starts with an empty block cache and new connections. A shared store is instead the
//! process's store for its root (bucket, host, or the local file system) and its options,
//! opened on first use and kept until [`clear_shared_stores`]: its memory and disk block
//! cache, connection pool and metadata cache carry over from user to user, and so does its
//! memory budget (queues, fetch windows and cached blocks count against one limit however
//! many runs share it). Its users read on one process-wide I/O runtime ([`shared_runtime`]):
//! connections belong to the runtime they were opened on.
//!
//! Stores are kept by [`StoreKey`]: the root and every option, credentials included (by
//! value: two pipelines with different keys never share a store, though the options'
//! `Debug` form, which names only which credentials are set, reads the same).
//!
//! After `fork()` the child sees neither the parent's runtime threads nor its connections:
//! both are forgotten there (not shut down, which would wait for threads that do not exist)
//! and opened again on first use.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{Result, Store, StoreOptions, StoreUrl};

/// What tells two shared stores apart: the root they read (`s3://bucket/`, a host, the
/// local file system) and every option. Its `Debug` form hides credentials, as the
/// options' does.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StoreKey {
    root: String,
    options: StoreOptions,
}

impl StoreKey {
    /// The key of the store that reads `url` with `options`, and the key `url` names in it.
    pub fn of(url: &str, options: &StoreOptions) -> Result<(StoreKey, String)> {
        let parsed = StoreUrl::parse(url)?;
        let mut options = options.clone();
        // The order extra options were given in does not make another store.
        options.extra.sort();
        let key = StoreKey {
            root: parsed.object_url(""),
            options,
        };
        Ok((key, parsed.key))
    }

    /// The root URL the store opens.
    pub fn root(&self) -> &str {
        &self.root
    }
}

impl std::fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreKey")
            .field("root", &self.root)
            .field("options", &self.options)
            .finish()
    }
}

struct Registry {
    pid: u32,
    runtime: Option<Arc<tokio::runtime::Runtime>>,
    stores: HashMap<StoreKey, Store>,
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
pub fn shared_runtime() -> std::io::Result<Arc<tokio::runtime::Runtime>> {
    with_registry(|r| {
        if let Some(rt) = &r.runtime {
            return Ok(rt.clone());
        }
        let rt = Arc::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("stoker-shared-io")
                .enable_all()
                .build()?,
        );
        r.runtime = Some(rt.clone());
        Ok(rt)
    })
}

/// The shared store that reads `url` with `options` (opened on first use), and the key
/// `url` names in it.
pub fn shared_store(url: &str, options: &StoreOptions) -> Result<(Store, String)> {
    let (id, key) = StoreKey::of(url, options)?;
    with_registry(|r| {
        let store = match r.stores.get(&id) {
            Some(s) => s.clone(),
            None => {
                let s = Store::open(id.root(), options.clone())?;
                r.stores.insert(id, s.clone());
                s
            }
        };
        Ok((store, key))
    })
}

/// Lets the shared stores go: later users start with empty caches. Runs still going, and
/// files still open, keep theirs until they end. Returns how many were let go.
pub fn clear_shared_stores() -> usize {
    with_registry(|r| {
        let n = r.stores.len();
        r.stores.clear();
        n
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_with_other_credentials_are_other_stores_though_they_print_alike() {
        let a = StoreOptions::default().with_credentials("id", "secret-one");
        let b = StoreOptions::default().with_credentials("id", "secret-two");
        assert_eq!(
            format!("{a:?}"),
            format!("{b:?}"),
            "Debug hides the secrets"
        );
        let (ka, key) = StoreKey::of("s3://bucket/train/x.tar", &a).unwrap();
        let (kb, _) = StoreKey::of("s3://bucket/other/", &b).unwrap();
        assert_eq!(key, "train/x.tar");
        assert_eq!(ka.root(), kb.root());
        assert_ne!(ka, kb);
        assert!(!format!("{ka:?}").contains("secret-one"));
        // Another prefix of the same bucket with the same options is the same store.
        let (ka2, _) = StoreKey::of("s3://bucket/other/", &a).unwrap();
        assert_eq!(ka, ka2);
        // The order of extra options does not matter; their values do.
        let mut x = StoreOptions::default();
        x.set("aws_request_payer", "true").unwrap();
        x.set("aws_unsigned_payload", "true").unwrap();
        let mut y = StoreOptions::default();
        y.set("aws_unsigned_payload", "true").unwrap();
        y.set("aws_request_payer", "true").unwrap();
        let key = |o: &StoreOptions| StoreKey::of("s3://b/", o).unwrap().0;
        assert_eq!(key(&x), key(&y));
        y.set("aws_request_payer", "false").unwrap();
        assert_ne!(key(&x), key(&y));
    }

    #[test]
    fn a_shared_store_is_opened_once_per_key() {
        let dir = std::env::temp_dir();
        let url = format!("file://{}/", dir.display());
        let o = StoreOptions::default();
        let (s1, _) = shared_store(&url, &o).unwrap();
        let (s2, _) = shared_store(&url, &o).unwrap();
        assert!(s1.same_as(&s2));
        let (other, _) = shared_store(&url, &o.clone().with_cache_memory(1 << 20)).unwrap();
        assert!(!other.same_as(&s1));
        assert!(clear_shared_stores() >= 1);
    }
}
