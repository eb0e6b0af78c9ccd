//! `stoker-pipeline`: the pipeline engine.
//!
//! A [`Pipeline`] is a source (objects under a URL, a key list, or samples in memory) read
//! in a record format, followed by operators: per-sample maps and filters ([`SampleOp`]),
//! shuffle buffers, batching, take/skip, prefetch, over one or more epochs, optionally
//! split across data-parallel ranks. [`Pipeline::run`] starts a [`Run`]: an iterator of
//! [`Item`]s with [`Run::stats`] (per stage, always on) and [`Run::state`] (a small
//! position that [`Pipeline::resume`] continues from exactly).
//!
//! ```
//! use stoker_core::Sample;
//! use stoker_pipeline::{Builtin, FieldOp, Pipeline};
//!
//! let samples: Vec<Sample> = (0..100i64).map(|i| [("x", i)].into_iter().collect()).collect();
//! let p = Pipeline::from_samples(samples)
//!     .shuffle_shards(true)
//!     .map(Builtin::Fields(FieldOp::RandomInt { to: "noise".into(), below: 10 }))
//!     .batch(32, false)
//!     .seed(7);
//! let mut run = p.run().unwrap();
//! let first = run.next().unwrap().unwrap();
//! let state = run.state().unwrap();
//! let rest: Vec<_> = run.map(Result::unwrap).collect();
//! let resumed: Vec<_> = p.resume(&state).unwrap().map(Result::unwrap).collect();
//! assert_eq!(rest, resumed);
//! assert_eq!(first.samples(), 32);
//! ```
//!
//! How it runs (threads, queues, ordering, memory, checkpoints) is described in the
//! `exec` module; how shards are read in `source`; every random choice in `rng`.

mod exec;
mod format;
mod ops;
mod optimize;
mod pack;
mod plan;
pub mod profile;
pub mod shared;
pub use stoker_core::rng;
mod diskcache;
mod source;
pub mod spec;
mod split;
mod state;
mod stats;

pub use exec::{Item, Run};
pub use ops::{
    AudioOp, Builtin, ColumnOp, FieldOp, FillValue, FnOp, ImageOp, OpContext, Rate, SampleOp, Size,
    TextOp,
};
pub use optimize::{explain, PASSES as OPTIMIZER_PASSES};
pub use pack::{Pack, PackRemainder};
pub use plan::{
    ErrorPolicy, FormatChoice, Op, Pipeline, RankPolicy, RankSplit, RunOptions, Source, SplitMode,
};
pub use profile::{Cause, Profile, Recommendation, Verdict};
pub use source::{Pos, SourceCursor};
pub use spec::{DistributeSpec, PipelineSpec, Workers};
pub use state::{ItemPos, PipelineState, StageState};
pub use stats::{
    BatchSlotStats, MemoryStats, OperatorStats, SampleCacheStats, Skipped, StageStats, Stats,
};
