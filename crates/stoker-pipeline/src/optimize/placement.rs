//! Placement: which operators run where.
//!
//! Per-sample operators before any sequential stage run on the parallel workers (fused into
//! one stage). A map after a shuffle buffer moves ahead of it when it never drops a sample:
//! it then commutes with the shuffle (a shuffle's picks depend only on how many samples it
//! has seen), so the results do not change. Every other map stays in the tail, where each
//! run of consecutive maps is one parallel stage on the same workers ([`par_runs`]), or runs
//! on the tail thread while it is cheaper than a hand-off ([`INLINE_NS`]).

use super::{Physical, TailOp};
use crate::ops::SampleOp;
use crate::plan::Op;
use std::sync::Arc;

/// The prefetch depth when the plan names none.
pub(crate) const DEFAULT_PREFETCH: usize = 4;

/// The logical plan placed: each map goes to the workers' producer when it comes before any
/// sequential stage, or when only shuffle buffers come before it and it never drops a
/// sample (it commutes with them; the reason is given); everything else goes to the tail in
/// order. A `prefetch` in the plan sets the depth (0 here: not given, see [`prefetch`]).
pub(crate) fn place(ops: &[Op]) -> Physical {
    let mut producer = Vec::new();
    let mut tail = Vec::new();
    let mut explain = Vec::new();
    let mut prefetch = 0;
    // True while every tail stage so far is a shuffle (through which 1:1 maps may move).
    // A filter left in the tail ends it too: a map after it must not run before it (the
    // filter would see what the map made of the sample).
    let mut only_shuffles = true;
    for (i, op) in ops.iter().enumerate() {
        let stage = match op {
            Op::Map(m) => {
                let meta = m.meta();
                if tail.is_empty() || (only_shuffles && !meta.filters) {
                    if !tail.is_empty() {
                        explain.push(format!(
                            "moved {} before the shuffle buffer: it keeps every sample, so \
                             it commutes with the shuffle and can run on the workers",
                            meta.name
                        ));
                    }
                    producer.push((i, m.clone()));
                    continue;
                }
                TailOp::Map(i, m.clone())
            }
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
        only_shuffles &= matches!(stage, TailOp::Shuffle(_));
        tail.push(stage);
    }
    Physical {
        producer,
        tail,
        prefetch,
        explain,
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
    fn a_map_that_keeps_every_sample_moves_ahead_of_a_shuffle_with_its_reason() {
        let ph = place(&[Op::Shuffle(8), map("m"), Op::Shuffle(4), map("n")]);
        assert_eq!(producer_names(&ph), ["m", "n"]);
        assert_eq!(tail_names(&ph), ["shuffle(8)", "shuffle(4)"]);
        assert_eq!(ph.producer[0].0, 1);
        assert_eq!(ph.explain.len(), 2);
        assert!(ph.explain[0].contains("moved m before the shuffle buffer"));
    }

    #[test]
    fn a_filter_after_a_shuffle_stays_after_it_and_so_does_what_follows_it() {
        // Before this pass had tests, `m` moved ahead of the shuffle and so ahead of `f`,
        // which then saw what `m` made of each sample.
        let ph = place(&[Op::Shuffle(8), filter("f"), map("m")]);
        assert!(ph.producer.is_empty());
        assert_eq!(tail_names(&ph), ["shuffle(8)", "map[f]", "map[m]"]);
        assert!(ph.explain.is_empty());
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
