//! Stores shared by every run in the process (and by `stoker.io` in Python): the registry
//! lives in `stoker-store` ([`stoker_store::shared`], keyed by [`stoker_store::shared::StoreKey`]);
//! a run with [`RunOptions::share_store`](crate::RunOptions::share_store) reads through it.
//! This module keeps the names the Python package and earlier code use.

pub use stoker_store::shared::{shared_runtime, shared_store, StoreKey};

/// Drops the process's shared stores and the samples cached at the optimizer's cache point
/// for later runs over them (see `exec/opcache.rs`); returns how many stores there were.
/// Runs still going keep what they use until they end.
pub fn clear_shared_stores() -> usize {
    crate::exec::clear_shared_caches();
    stoker_store::shared::clear_shared_stores()
}
