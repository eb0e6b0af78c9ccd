//! The optimizer: from the logical plan (the operators as the user wrote them) to the
//! physical plan the executor runs ([`Physical`]: the operators the parallel workers apply to
//! each sample, then the sequential tail stages, then the prefetch depth), with its reasons.
//!
//! Each pass is a pure function from plan to plan that says why it changed what it changed:
//!
//! - [`placement`]: which operators run on the workers before the tail and which stay in
//!   the tail (a map moves ahead of a shuffle buffer when it keeps every sample), and where
//!   the maps in the tail run ([`placement::par_runs`]; [`INLINE_NS`]);
//! - [`fusion`]: adjacent operators with one fused kernel (decode + random resized crop)
//!   become that kernel;
//! - [`read_path`]: whether a columnar format is read straight into batches;
//! - [`explain`]: the plan and every reason, as text (`Pipeline::explain`, `stoker run
//!   --explain`).
//!
//! [`optimize`] runs them in order. Adding a pass: a file here with a function from
//! `Physical` to `Physical` that pushes its reasons, a call in [`optimize`], and unit tests
//! next to it.

mod explain;
mod fusion;
mod placement;
mod read_path;

pub use explain::explain;
pub(crate) use placement::{par_runs, INLINE_NS};
pub(crate) use read_path::{read_path, ReadPath};

use crate::ops::SampleOp;
#[cfg(test)]
use crate::ops::{Builtin, FnOp};
use crate::pack::Pack;
use crate::plan::Op;
use std::sync::Arc;
use stoker_core::CollatePolicy;

/// The physical plan: producer ops (parallel) and tail stages (sequential).
pub(crate) struct Physical {
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

/// The optimizer: placement, then fusion, then the prefetch at the end (see the passes).
pub(crate) fn optimize(ops: &[Op]) -> Physical {
    let ph = placement::place(ops);
    let ph = fusion::fuse(ph);
    placement::prefetch(ph)
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
