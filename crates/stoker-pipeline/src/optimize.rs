//! The optimizer: from the logical plan (the operators as the user wrote them) to the
//! physical plan the executor runs ([`Physical`]: whether the source permutes the epoch's
//! objects, the operators the parallel workers apply to each sample, then the sequential
//! tail stages, then the prefetch depth), with its reasons.
//!
//! Each pass is a pure function from plan to plan that says why it changed what it changed,
//! and decides from what operators declare about themselves (`OpMeta`) and what a run has
//! measured ([`Facts`]), never from an operator's name:
//!
//! - [`shuffle`] (`"shuffle"`): where a shuffle does its work: a seeded permutation of the
//!   objects at the source when each sample is one object, else a buffer at the point where
//!   samples are smallest;
//! - [`batching`] (`"batching"`): per-sample operators with a batch form, written just
//!   before a `batch`, run after it, once per batch;
//! - [`placement`]: which operators run on the workers before the tail and which stay in
//!   the tail, in the order the plan gives, and where the maps in the tail run
//!   ([`placement::par_runs`]; [`INLINE_NS`]);
//! - [`cache`] (`"cache"`): whether the workers keep samples after the deterministic head
//!   of their chain for later epochs and later runs;
//! - [`fusion`] (`"fusion"`): adjacent operators with one fused kernel (decode + random
//!   resized crop) become that kernel, on the workers and in the tail's parallel stages;
//! - [`read_path`]: whether a columnar format is read straight into batches;
//! - [`explain`]: the plan and every reason, as text (`Pipeline::explain`, `stoker run
//!   --explain`).
//!
//! [`optimize`] runs them in order; the passes named above can be turned off
//! (`RunOptions::disable`, [`PASSES`]) for ablation and debugging, and the plan is then the
//! one without that rewrite. Adding a pass: a file here with a function from plan to plan
//! that pushes its reasons, a call in [`optimize`] (and a name in [`PASSES`] if it can be
//! turned off), and unit tests next to it.

mod batching;
mod cache;
mod explain;
mod fusion;
mod placement;
mod read_path;
mod shuffle;

pub use explain::explain;
pub(crate) use explain::explain_with;
pub(crate) use placement::{par_runs, INLINE_NS};
pub(crate) use read_path::{read_path, ReadPath};

use crate::ops::SampleOp;
#[cfg(test)]
use crate::ops::{Builtin, FnOp};
use crate::pack::Pack;
use crate::plan::Op;
use std::sync::Arc;
use stoker_core::CollatePolicy;

/// The passes that can be turned off, by name (`RunOptions::disable`).
pub const PASSES: &[&str] = &["shuffle", "batching", "cache", "fusion"];

/// What the passes know of the data beyond the plan (see each field).
#[derive(Debug, Clone, Default)]
pub(crate) struct Facts {
    /// Whether each sample is one object (files, ImageFolder, samples in memory): known
    /// once the format is; `None` before a run lists a source whose format it detects.
    pub(crate) per_object: Option<bool>,
    /// Output bytes per input byte of operators a run has measured, by their index in the
    /// logical plan (they win over the operators' hints).
    pub(crate) measured_ratio: std::collections::HashMap<usize, f64>,
    /// Nanoseconds per sample of operators a run has measured, by their index in the
    /// logical plan (they win over the operators' declared costs).
    pub(crate) measured_ns: std::collections::HashMap<usize, f64>,
    /// Epochs the run reads (`None`: no end).
    pub(crate) epochs: Option<u64>,
    /// The bytes the source reads in an epoch, when the listing gives every object's size.
    pub(crate) input_bytes: Option<u64>,
    /// What a cache of samples may hold: half the run's memory budget (known to a run).
    pub(crate) cache_room: Option<u64>,
    /// Later runs in the process may read the same samples again (the run reads through
    /// the process's shared store, as each epoch of a PyTorch loop does): a cache can be
    /// kept for them.
    pub(crate) later_runs: bool,
}

impl Facts {
    /// What the pipeline's source and format tell before a run.
    pub(crate) fn of(p: &crate::plan::Pipeline) -> Facts {
        use crate::plan::{FormatChoice, Source};
        let per_object = match (&p.source, &p.format) {
            (Source::Memory(_), _) => Some(true),
            (_, FormatChoice::Files | FormatChoice::ImageFolder) => Some(true),
            (_, FormatChoice::Fixed(f)) => Some(f.one_sample_per_object()),
            (_, FormatChoice::Auto(_)) => None,
        };
        Facts {
            per_object,
            epochs: p.epochs,
            later_runs: p.later_runs(),
            ..Facts::default()
        }
    }
}

pub(crate) use cache::{CachePlan, WATCH_SAMPLES};

/// The physical plan: producer ops (parallel) and tail stages (sequential).
pub(crate) struct Physical {
    /// Where the workers keep samples for later epochs (see [`cache`]).
    pub(crate) cache: Option<CachePlan>,
    /// The source permutes each epoch's objects (a shuffle made a permutation, see
    /// [`shuffle`]).
    pub(crate) permute: bool,
    /// The operators the workers apply to each sample from the source, each with its
    /// index in the logical plan (its random generator's).
    pub(crate) producer: Vec<(usize, Arc<dyn SampleOp>)>,
    /// The sequential stages after them, in order (maps among them run in parallel
    /// stages, see [`par_runs`]).
    pub(crate) tail: Vec<TailOp>,
    /// Items the consumer's queue holds.
    pub(crate) prefetch: usize,
    /// Why the passes did what they did, in order.
    pub(crate) explain: Vec<String>,
}

/// A stage of the tail, as the plan names it.
#[derive(Debug, Clone)]
pub(crate) enum TailOp {
    Map(usize, Arc<dyn SampleOp>),
    Shuffle(usize),
    Batch(usize, bool, CollatePolicy),
    Pack(Arc<Pack>),
    Unbatch,
    Take(u64),
    Skip(u64),
}

impl TailOp {
    pub(crate) fn name(&self) -> String {
        match self {
            TailOp::Map(_, op) => format!("map[{}]", op.meta().name),
            TailOp::Shuffle(n) => format!("shuffle({n})"),
            TailOp::Batch(n, d, _) => format!("batch({n}{})", if *d { ", drop_last" } else { "" }),
            TailOp::Pack(p) => p.name(),
            TailOp::Unbatch => "unbatch".into(),
            TailOp::Take(n) => format!("take({n})"),
            TailOp::Skip(n) => format!("skip({n})"),
        }
    }
}

/// The optimizer: shuffle placement, placement, fusion, then the prefetch at the end (see
/// the passes), without the passes named in `disabled`.
pub(crate) fn optimize(ops: &[Op], facts: &Facts, disabled: &[String]) -> Physical {
    let off = |pass: &str| disabled.iter().any(|d| d == pass);
    let mut explain = Vec::new();
    let placed = if off("shuffle") {
        shuffle::Placed {
            ops: ops.iter().cloned().enumerate().collect(),
            permute: false,
        }
    } else {
        shuffle::place_shuffles(ops, facts, &mut explain)
    };
    let ops = if off("batching") {
        placed.ops
    } else {
        batching::place_batch_forms(placed.ops, &mut explain)
    };
    let mut ph = placement::place_indexed(&ops);
    ph.permute = placed.permute;
    explain.append(&mut ph.explain);
    ph.explain = explain;
    let ph = if off("cache") {
        ph
    } else {
        cache::place_cache(ph, facts, !off("fusion"))
    };
    let ph = if off("fusion") { ph } else { fusion::fuse(ph) };
    placement::prefetch(ph)
}

/// Checks a list of passes to turn off: each must be one of [`PASSES`].
pub(crate) fn check_disabled(disabled: &[String]) -> Result<(), stoker_core::Error> {
    match disabled.iter().find(|d| !PASSES.contains(&d.as_str())) {
        Some(d) => Err(stoker_core::Error::invalid(format!(
            "unknown optimizer pass {d:?} to disable (the passes that can be turned off: {})",
            PASSES.join(", ")
        ))),
        None => Ok(()),
    }
}

pub(crate) fn producer_name(p: &[(usize, Arc<dyn SampleOp>)]) -> String {
    format!(
        "map[{}]",
        p.iter()
            .map(|(_, o)| o.meta().name)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

pub(crate) fn op_name(op: &Op) -> String {
    match op {
        Op::Map(m) => m.meta().name,
        Op::Shuffle(n) => format!("shuffle({n})"),
        Op::Batch { size, .. } => format!("batch({size})"),
        Op::Pack(p) => p.name(),
        Op::Unbatch => "unbatch".into(),
        Op::Take(n) => format!("take({n})"),
        Op::Skip(n) => format!("skip({n})"),
        Op::Prefetch(n) => format!("prefetch({n})"),
    }
}

/// Plans and operators for the passes' tests.
#[cfg(test)]
pub(crate) mod test_ops {
    use super::*;
    use stoker_core::OpMeta;

    /// A built-in operator from its spec form (`{"op": "decode_image", "field": "jpg"}`).
    pub(crate) fn builtin(v: serde_json::Value) -> Arc<dyn SampleOp> {
        let b: Builtin = serde_json::from_value(v).expect("a built-in operator");
        Arc::new(b)
    }

    /// A map named `name` that keeps every sample and declares that it makes samples
    /// `ratio` times their size.
    pub(crate) fn sized(name: &str, ratio: f64) -> Op {
        Op::Map(Arc::new(FnOp::new(
            OpMeta::new(name).with_size_ratio(ratio),
            |s, _| Ok(Some(s)),
        )))
    }

    /// The names of a logical plan's operators.
    pub(crate) fn op_names(ops: &[Op]) -> Vec<String> {
        ops.iter().map(super::op_name).collect()
    }

    /// A map named `name` that keeps every sample.
    pub(crate) fn map(name: &str) -> Op {
        Op::Map(Arc::new(FnOp::new(OpMeta::new(name), |s, _| Ok(Some(s)))))
    }

    /// A filter named `name`.
    pub(crate) fn filter(name: &str) -> Op {
        Op::Map(Arc::new(FnOp::new(OpMeta::new(name).filter(), |s, _| {
            Ok(Some(s))
        })))
    }

    /// The names of the producer's operators.
    pub(crate) fn producer_names(ph: &Physical) -> Vec<String> {
        ph.producer.iter().map(|(_, op)| op.meta().name).collect()
    }

    /// The names of the tail's stages.
    pub(crate) fn tail_names(ph: &Physical) -> Vec<String> {
        ph.tail.iter().map(TailOp::name).collect()
    }
}
