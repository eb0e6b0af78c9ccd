//! Placement: which operators run where, in the order the plan gives them.
//!
//! Per-sample operators before any sequential stage run on the parallel workers (fused into
//! one stage). Every other map stays in the tail in its place, where each run of
//! consecutive maps is one parallel stage on the same workers ([`par_runs`]), or runs on
//! the tail thread while it is cheaper than a hand-off ([`INLINE_NS`]). Moving operators
//! across a shuffle is the `shuffle` pass's decision (by the samples' sizes), not this
//! one's.

use super::{Physical, TailOp};
use crate::ops::SampleOp;
use crate::plan::Op;
use std::sync::Arc;

/// The prefetch depth when the plan names none.
pub(crate) const DEFAULT_PREFETCH: usize = 4;

/// The logical plan placed (each operator with its index in the plan as written, for tests).
#[cfg(test)]
pub(crate) fn place(ops: &[Op]) -> Physical {
    let indexed: Vec<(usize, Op)> = ops.iter().cloned().enumerate().collect();
    place_indexed(&indexed)
}

/// The logical plan placed: each map goes to the workers' producer when it comes before any
/// sequential stage; everything else goes to the tail in order. A `prefetch` in the plan
/// sets the depth (0 here: not given, see [`prefetch`]). Each operator carries its index in
/// the plan as written (the shuffle pass may have moved a buffer among them), which keys
/// its random generator.
pub(crate) fn place_indexed(ops: &[(usize, Op)]) -> Physical {
    let mut producer = Vec::new();
    let mut tail = Vec::new();
    let mut prefetch = 0;
    for (i, op) in ops.iter().map(|(i, op)| (*i, op)) {
        let stage = match op {
            Op::Map(m) if tail.is_empty() => {
                producer.push((i, m.clone()));
                continue;
            }
            Op::Map(m) => TailOp::Map(i, m.clone()),
            Op::Shuffle(n) => TailOp::Shuffle(*n),
            Op::Batch {
                size,
                drop_last,
                collate,
            } => TailOp::Batch(*size, *drop_last, collate.clone()),
            Op::Pack(p) => TailOp::Pack(p.clone()),
            Op::Unbatch => TailOp::Unbatch,
            Op::Take(n) => TailOp::Take(*n),
            Op::Skip(n) => TailOp::Skip(*n),
            Op::Prefetch(n) => {
                prefetch = *n;
                continue;
            }
        };
        tail.push(stage);
    }
    Physical {
        cache: None,
        permute: false,
        producer,
        tail,
        prefetch,
        explain: Vec::new(),
    }
}

/// A prefetch of [`DEFAULT_PREFETCH`] items at the end when the plan names none.
pub(crate) fn prefetch(mut ph: Physical) -> Physical {
    if ph.prefetch == 0 {
        ph.explain
            .push(format!("added prefetch({DEFAULT_PREFETCH}) at the end"));
        ph.prefetch = DEFAULT_PREFETCH;
    }
    ph
}

/// The runs of consecutive map/filter operators in the tail, each at the tail stage it
/// starts at: each run is one parallel stage on the workers (the executor's `ParStage`).
#[allow(clippy::type_complexity)]
pub(crate) fn par_runs(tail: &[TailOp]) -> Vec<Option<Vec<(usize, Arc<dyn SampleOp>)>>> {
    let mut out: Vec<Option<Vec<(usize, Arc<dyn SampleOp>)>>> = vec![None; tail.len()];
    let mut start = None;
    for (j, t) in tail.iter().enumerate() {
        match t {
            TailOp::Map(i, op) => {
                let s = *start.get_or_insert(j);
                out[s].get_or_insert_with(Vec::new).push((*i, op.clone()));
            }
            _ => start = None,
        }
    }
    out
}

/// A parallel stage whose operators cost less than this per item (measured) runs on the
/// tail thread instead, item by item as the tail ran maps before: handing an item to a
/// worker and back (its mark, the hand-off, the reordering) costs the tail about as much,
/// so a cheaper operator (a native filter on a sample, a column-wise operator on a small
/// batch) is faster where the item already is. It goes back to the workers when the cost
/// rises above twice this. An unoptimized build (the tests') does everything several times
/// slower, the hand-off too: there a native operator on a sample measures about 5 us with
/// the stage's own overhead, right at the release bound (it then flapped between the tail
/// and the workers), so the bound is twice as high.
pub(crate) const INLINE_NS: u64 = if cfg!(debug_assertions) {
    10_000
} else {
    5_000
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimize::test_ops::{filter, map, producer_names, tail_names};

    #[test]
    fn maps_before_any_sequential_stage_go_to_the_workers() {
        let ph = place(&[map("a"), map("b"), Op::Shuffle(8), Op::Take(3)]);
        assert_eq!(producer_names(&ph), ["a", "b"]);
        assert_eq!(tail_names(&ph), ["shuffle(8)", "take(3)"]);
        assert_eq!(
            ph.producer[1].0, 1,
            "each keeps its index in the logical plan"
        );
        assert!(ph.explain.is_empty(), "{:?}", ph.explain);
    }

    #[test]
    fn maps_after_a_shuffle_stay_after_it_in_order() {
        // Whether a map moves across a shuffle is the shuffle pass's decision; placement
        // keeps the plan's order (before the shuffle pass, a map that kept every sample
        // moved ahead of the buffer here, whatever it made of the sample's size).
        let ph = place(&[Op::Shuffle(8), map("m"), Op::Shuffle(4), map("n")]);
        assert!(ph.producer.is_empty());
        assert_eq!(
            tail_names(&ph),
            ["shuffle(8)", "map[m]", "shuffle(4)", "map[n]"]
        );
        assert!(ph.explain.is_empty());
        let ph = place(&[Op::Shuffle(8), filter("f"), map("m")]);
        assert!(ph.producer.is_empty());
        assert_eq!(tail_names(&ph), ["shuffle(8)", "map[f]", "map[m]"]);
    }

    #[test]
    fn nothing_moves_across_a_batch_take_skip_pack_or_unbatch() {
        for stage in [
            Op::Batch {
                size: 4,
                drop_last: false,
                collate: Default::default(),
            },
            Op::Take(2),
            Op::Skip(2),
            Op::Unbatch,
        ] {
            let ph = place(&[stage, map("m")]);
            assert!(ph.producer.is_empty());
            assert_eq!(tail_names(&ph)[1], "map[m]");
        }
        // Not after a shuffle that follows one of them either.
        let ph = place(&[Op::Take(5), Op::Shuffle(3), map("m")]);
        assert!(ph.producer.is_empty());
        assert_eq!(tail_names(&ph), ["take(5)", "shuffle(3)", "map[m]"]);
    }

    #[test]
    fn the_plan_s_prefetch_is_kept_and_a_missing_one_added_with_its_reason() {
        let ph = prefetch(place(&[map("a"), Op::Prefetch(9)]));
        assert_eq!(ph.prefetch, 9);
        assert!(ph.explain.is_empty());
        let ph = prefetch(place(&[map("a")]));
        assert_eq!(ph.prefetch, DEFAULT_PREFETCH);
        assert_eq!(ph.explain, ["added prefetch(4) at the end"]);
    }

    #[test]
    fn each_run_of_tail_maps_is_one_parallel_stage_at_its_first_map() {
        let ph = place(&[
            Op::Take(10),
            map("a"),
            map("b"),
            Op::Shuffle(4),
            filter("c"),
        ]);
        let runs = par_runs(&ph.tail);
        assert_eq!(runs.len(), ph.tail.len());
        let names = |k: usize| -> Option<Vec<String>> {
            runs[k]
                .as_ref()
                .map(|r| r.iter().map(|(_, op)| op.meta().name).collect())
        };
        assert_eq!(names(0), None);
        assert_eq!(names(1), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(
            names(2),
            None,
            "a later map of a run is not a stage of its own"
        );
        assert_eq!(names(3), None);
        assert_eq!(names(4), Some(vec!["c".to_string()]));
    }
}
