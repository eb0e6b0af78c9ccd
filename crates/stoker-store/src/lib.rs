//! `stoker-store`: reading objects from object storage as fast as the storage allows.
//!
//! Training data lives in S3 (or GCS, Azure, an S3-compatible server, plain files); GPUs
//! consume it far faster than one request at a time can deliver it. Everything above this
//! crate (record formats, pipelines, the FUSE mount) reads through a [`Store`], which adds to
//! the `object_store` crate what feeding accelerators needs:
//!
//! * **Parallel ranged reads.** A large read is split into parts (`part_size`, 8 MiB) fetched
//!   concurrently (`max_concurrency`, 16) and delivered in order, first part first
//!   ([`Store::read_stream`]). Without a cache, the oldest part streams to the caller as it
//!   arrives and each part behind it reads at most 2 MiB ahead, then waits in its socket:
//!   bytes pass through memory that stays warm instead of piling up (`ordered.rs`).
//! * **Sequential read-ahead.** An [`ObjectReader`] keeps a window of fetches ahead of its
//!   position that starts at 1 MiB and doubles while reads stay sequential; a seek resets it.
//! * **Many small objects at once.** [`Store::fetch_many`] fetches whole objects with many
//!   requests in flight and yields them in the order asked: the pipeline knows its future and
//!   says it here.
//! * **A shared block cache** ([`cache::BlockCache`]): memory with a scan-resistant policy and
//!   an optional disk tier that survives restarts; single-flight on concurrent misses; keys
//!   carry the object's ETag/version, so a changed object is never served from old blocks.
//! * **One memory budget** ([`stoker_core::MemoryBudget`]) for the cache and all read-ahead:
//!   in-flight reads wait for budget rather than overcommitting memory.
//! * **Listing** page by page ([`Store::list`]) or fanned out across sub-prefixes
//!   ([`Store::list_all`]), with glob filters and a metadata cache with a TTL.
//! * **Retries** with exponential backoff and jitter on throttling (503 SlowDown), 5xx,
//!   timeouts and resets (through `object_store`'s retry loop), plus Stoker's own resume of a
//!   body cut short from the last byte received; the retry budget counts cuts in a row
//!   without progress (a response that delivers 64 KiB, or a quarter of what is left), so a
//!   long read with sporadic cuts completes and a server that trickles a few bytes per
//!   response fails. Every read checks its length.
//! * **Metrics** ([`Store::metrics`]): logical operations and every HTTP attempt, bytes,
//!   retries, time-to-first-byte percentiles, cache and memory figures.
//!
//! ```
//! # tokio_test_block_on(async {
//! use stoker_store::{Store, StoreOptions};
//! use object_store::{ObjectStoreExt, PutPayload};
//!
//! let store = Store::open("memory://doc-example", StoreOptions::default())?;
//! let path = object_store::path::Path::from("data/a.bin");
//! store.backend().put(&path, PutPayload::from(vec![7u8; 1000])).await.unwrap();
//! let bytes = store.get("data/a.bin").await?;
//! assert_eq!(bytes.len(), 1000);
//! assert_eq!(&store.get_range("data/a.bin", 10..20).await?[..], &[7u8; 10]);
//! # Ok::<(), stoker_store::Error>(())
//! # }).unwrap();
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Runtime::new().unwrap().block_on(f)
//! # }
//! ```
//!
//! Why a wrapper around `object_store` and not a new client: `object_store` already speaks
//! every backend correctly (SigV4, GCS and Azure auth, pagination, retries with backoff); what
//! it lacks is the read path for training data, and that is what this crate is.

mod backend;
mod body;
pub mod cache;
mod error;
mod keys;
mod list;
mod local;
mod location;
mod many;
mod metrics;
mod options;
mod ordered;
mod pool;
mod reader;
pub mod shared;
mod store;

pub use error::{Error, Result};
pub use keys::{escape_key, is_file_name, key_problem, SkipReason, Skipped};
pub use list::{ListOptions, Listing};
pub use location::{Scheme, StoreUrl};
pub use many::{FetchManyOptions, FetchedObject};
pub use metrics::MetricsSnapshot;
pub use options::{StoreOptions, OPTION_KEYS};
pub use reader::ObjectReader;
pub use store::{ObjectInfo, Store};
