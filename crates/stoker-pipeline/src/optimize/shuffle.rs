//! Shuffle placement: where a shuffle the user wrote does its work.
//!
//! A shuffle buffer of `n` samples holds `n` samples in memory and gives nothing until it
//! is full, and both costs grow with what a sample is where the buffer sits: a user who
//! writes `.shuffle(2048)` after the transforms (where tf.data users write it) gets a buffer
//! of float tensors five times the size of the JPEGs, and waits for 2,048 images to be
//! decoded before the first batch. Where the buffer sits does not change what the samples
//! become, so this pass chooses it, with two rewrites, in this order:
//!
//! 1. **A permutation at the source.** When each sample is one object (files, ImageFolder,
//!    samples in memory) and nothing but per-sample operators comes before the buffer, the
//!    buffer becomes a seeded permutation of the epoch's objects at the source (what
//!    `shuffle_shards` does for such formats): every epoch the same samples, each once, in
//!    an order drawn uniformly from all orders (a buffer of `n` only moves a sample about
//!    `n` places), at no memory cost and with the first sample at once. Filters may come
//!    before it: which samples a filter keeps does not depend on their order. Only the
//!    order changes, and it stays a pure function of the seed and the epoch.
//! 2. **The smallest point.** Otherwise (a sample is a record of a shard) the buffer moves,
//!    across maps that keep every sample, to where the samples are expected to be smallest:
//!    the product of the size ratios of the maps before it, each the operator's measured
//!    output/input bytes when the run has measured it, else its declared hint
//!    (`OpMeta::size_ratio`; 1 when it declares none). It moves only for a clear gain (the
//!    point at most [`MOVE_GAIN`] of the written one). Nothing else changes: a map that
//!    keeps every sample commutes with a shuffle buffer (its picks depend only on how many
//!    samples it has seen, and a random operator draws from a generator keyed by the
//!    sample's source position, not by when it runs), so the same samples come out in the
//!    same order. Filters do not move across it (the buffer would see other samples).
//!
//! The maps the buffer leaves behind it run in a parallel stage after it, on the same
//! workers (see `placement`).

use std::collections::HashMap;

use super::Facts;
use crate::plan::Op;

/// A buffer moves to a point where samples are expected to be at most this fraction of
/// their size where it was written.
pub(crate) const MOVE_GAIN: f64 = 0.8;

/// What this pass decided: the logical plan with its shuffles placed (each operator with its
/// index in the plan as written, which keys its random generator and its measurements), and
/// whether the source permutes the epoch's objects in place of a buffer.
#[derive(Debug)]
pub(crate) struct Placed {
    pub(crate) ops: Vec<(usize, Op)>,
    pub(crate) permute: bool,
}

/// Places the plan's shuffles (see the module documentation), each decision with its reason
/// in `explain`.
pub(crate) fn place_shuffles(ops: &[Op], facts: &Facts, explain: &mut Vec<String>) -> Placed {
    let mut ops: Vec<(usize, Op)> = ops.iter().cloned().enumerate().collect();
    let mut permute = false;
    // 1. A buffer that only per-sample operators precede, over one-sample-per-object data.
    while let Some(at) = ops.iter().position(|(_, op)| !matches!(op, Op::Map(_))) {
        let Op::Shuffle(n) = ops[at].1 else {
            break;
        };
        match facts.per_object {
            Some(true) => {
                ops.remove(at);
                explain.push(if permute {
                    format!(
                        "dropped shuffle({n}): the source's permutation of the objects already \
                         shuffles the whole epoch"
                    )
                } else {
                    format!(
                        "shuffle({n}) became a seeded permutation of the epoch's objects at the \
                         source (each sample is one object): the same samples every epoch in a \
                         uniformly random order, with no buffer of {n} samples to hold and the \
                         first sample at once"
                    )
                });
                permute = true;
            }
            Some(false) => break,
            None => {
                explain.push(format!(
                    "shuffle({n}): a run whose format holds one sample per object (decided when \
                     it lists the source) makes it a seeded permutation of the objects at the \
                     source"
                ));
                break;
            }
        }
    }
    // 2. Each remaining buffer to the smallest point among the maps around it.
    let mut i = 0;
    while i < ops.len() {
        if let Op::Shuffle(n) = ops[i].1 {
            if let Some(to) = smallest_point(&ops, i, &facts.measured_ratio, explain, n) {
                let buffer = ops.remove(i);
                ops.insert(to, buffer);
                i = i.max(to);
            }
        }
        i += 1;
    }
    Placed { ops, permute }
}

/// A map that keeps every sample (so it commutes with a shuffle buffer).
fn one_to_one((_, op): &(usize, Op)) -> bool {
    matches!(op, Op::Map(m) if !m.meta().filters)
}

/// Where the buffer at `at` should go (an index into `ops` with the buffer removed), when
/// that is a clear gain over where it is; the reason goes to `explain`.
fn smallest_point(
    ops: &[(usize, Op)],
    at: usize,
    measured: &HashMap<usize, f64>,
    explain: &mut Vec<String>,
    n: usize,
) -> Option<usize> {
    let mut lo = at;
    while lo > 0 && one_to_one(&ops[lo - 1]) {
        lo -= 1;
    }
    let mut hi = at + 1;
    while hi < ops.len() && one_to_one(&ops[hi]) {
        hi += 1;
    }
    // The maps around the buffer, in order, each with its index in the plan and ratio.
    let maps: Vec<(usize, String, f64, bool)> = (lo..hi)
        .filter(|&k| k != at)
        .map(|k| {
            let (index, Op::Map(m)) = &ops[k] else {
                unreachable!("a map")
            };
            let meta = m.meta();
            match measured.get(index) {
                Some(r) => (k, meta.name, *r, true),
                None => (k, meta.name, meta.size_ratio.unwrap_or(1.0), false),
            }
        })
        .collect();
    if maps.is_empty() {
        return None;
    }
    // Relative size of a sample before map `j` (and after the last one at `maps.len()`).
    let mut size = Vec::with_capacity(maps.len() + 1);
    size.push(1.0f64);
    for (_, _, r, _) in &maps {
        size.push(size.last().copied().unwrap_or(1.0) * r.max(0.0));
    }
    let written = at - lo;
    // The smallest point; among equals the latest (more maps before it run on the workers
    // with the source's operators, fused where they can be).
    let best = (0..size.len())
        .rev()
        .min_by(|&a, &b| size[a].total_cmp(&size[b]))
        .unwrap_or(written);
    if best == written || size[best] > size[written] * MOVE_GAIN {
        return None;
    }
    let passed: Vec<&(usize, String, f64, bool)> = if best < written {
        maps[best..written].iter().collect()
    } else {
        maps[written..best].iter().collect()
    };
    let ratios: Vec<String> = maps
        .iter()
        .map(|(_, name, r, m)| {
            format!("{name} x{r:.2}{}", if *m { " measured" } else { " (hint)" })
        })
        .collect();
    let names: Vec<&str> = passed.iter().map(|(_, name, _, _)| name.as_str()).collect();
    explain.push(format!(
        "moved shuffle({n}) {} {}: samples are expected to be {:.2}x the size there against \
         {:.2}x where it was written ({}); the maps it passed keep every sample, so the same \
         samples come out in the same order",
        if best < written { "before" } else { "after" },
        names.join(", "),
        size[best],
        size[written],
        ratios.join(", ")
    ));
    // The index in `ops` once the buffer is removed.
    Some(lo + best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimize::test_ops::{filter, map, op_names, sized};

    fn names(placed: &Placed) -> Vec<String> {
        op_names(
            &placed
                .ops
                .iter()
                .map(|(_, op)| op.clone())
                .collect::<Vec<_>>(),
        )
    }

    fn facts(per_object: Option<bool>) -> Facts {
        Facts {
            per_object,
            ..Facts::default()
        }
    }

    #[test]
    fn over_objects_a_buffer_after_per_sample_operators_becomes_a_permutation() {
        let mut why = Vec::new();
        let ops = [
            sized("decode", 8.0),
            filter("f"),
            Op::Shuffle(64),
            Op::Take(5),
        ];
        let placed = place_shuffles(&ops, &facts(Some(true)), &mut why);
        assert!(placed.permute);
        assert_eq!(names(&placed), ["decode", "f", "take(5)"]);
        assert_eq!(why.len(), 1);
        assert!(
            why[0].contains("shuffle(64) became a seeded permutation"),
            "{why:?}"
        );
        // A second buffer right after it adds nothing to a full permutation.
        let mut why = Vec::new();
        let ops = [map("a"), Op::Shuffle(64), map("b"), Op::Shuffle(8)];
        let placed = place_shuffles(&ops, &facts(Some(true)), &mut why);
        assert!(placed.permute);
        assert_eq!(names(&placed), ["a", "b"]);
        assert!(why[1].starts_with("dropped shuffle(8)"), "{why:?}");
    }

    #[test]
    fn a_buffer_after_another_stage_or_over_records_is_no_permutation() {
        let mut why = Vec::new();
        let ops = [map("a"), Op::Take(9), Op::Shuffle(64)];
        let placed = place_shuffles(&ops, &facts(Some(true)), &mut why);
        assert!(!placed.permute);
        assert_eq!(names(&placed), ["a", "take(9)", "shuffle(64)"]);
        let placed = place_shuffles(&[map("a"), Op::Shuffle(64)], &facts(Some(false)), &mut why);
        assert!(!placed.permute);
        assert!(why.is_empty(), "{why:?}");
        // Before a run lists an automatically detected format, the plan says what it will do.
        let placed = place_shuffles(&[map("a"), Op::Shuffle(64)], &facts(None), &mut why);
        assert!(!placed.permute);
        assert!(
            why[0].contains("a run whose format holds one sample per object"),
            "{why:?}"
        );
    }

    #[test]
    fn over_records_a_buffer_moves_to_where_samples_are_smallest() {
        // Written after the transforms: a decode makes samples 8x, a float conversion 4x.
        let ops = [
            sized("decode", 8.0),
            map("crop"),
            sized("to_float", 4.0),
            Op::Shuffle(1000),
            Op::Batch {
                size: 4,
                drop_last: false,
                collate: Default::default(),
            },
        ];
        let mut why = Vec::new();
        let placed = place_shuffles(&ops, &facts(Some(false)), &mut why);
        assert!(!placed.permute);
        assert_eq!(
            names(&placed),
            ["shuffle(1000)", "decode", "crop", "to_float", "batch(4)"]
        );
        // Each operator keeps its index in the plan as written.
        let indices: Vec<usize> = placed.ops.iter().map(|(i, _)| *i).collect();
        assert_eq!(indices, [3, 0, 1, 2, 4]);
        assert_eq!(why.len(), 1);
        assert!(
            why[0].starts_with("moved shuffle(1000) before decode, crop, to_float"),
            "{why:?}"
        );
        assert!(
            why[0].contains("1.00x the size there against 32.00x"),
            "{why:?}"
        );
        assert!(why[0].contains("decode x8.00 (hint)"), "{why:?}");
        // Written before a map that shrinks samples: it moves after it.
        let ops = [Op::Shuffle(10), sized("crop", 0.25), sized("decode", 8.0)];
        let placed = place_shuffles(&ops, &facts(Some(false)), &mut Vec::new());
        assert_eq!(names(&placed), ["crop", "shuffle(10)", "decode"]);
    }

    #[test]
    fn a_buffer_stays_for_a_small_gain_and_never_crosses_a_filter_or_a_stage() {
        let mut why = Vec::new();
        let ops = [sized("a", 1.1), Op::Shuffle(10)];
        let placed = place_shuffles(&ops, &facts(Some(false)), &mut why);
        assert_eq!(names(&placed), ["a", "shuffle(10)"]);
        let ops = [
            sized("decode", 8.0),
            filter("f"),
            sized("grow", 2.0),
            Op::Shuffle(10),
        ];
        let placed = place_shuffles(&ops, &facts(Some(false)), &mut why);
        assert_eq!(names(&placed), ["decode", "f", "shuffle(10)", "grow"]);
        let ops = [
            sized("decode", 8.0),
            Op::Take(3),
            sized("grow", 2.0),
            Op::Shuffle(10),
        ];
        let placed = place_shuffles(&ops, &facts(Some(false)), &mut why);
        assert_eq!(names(&placed), ["decode", "take(3)", "shuffle(10)", "grow"]);
    }

    #[test]
    fn measured_ratios_win_over_hints() {
        // The hint says the map grows samples; the run measured that it shrinks them.
        let ops = [sized("decode", 8.0), Op::Shuffle(10)];
        let f = Facts {
            per_object: Some(false),
            measured_ratio: HashMap::from([(0, 0.5)]),
            ..Facts::default()
        };
        let mut why = Vec::new();
        let placed = place_shuffles(&ops, &f, &mut why);
        assert_eq!(names(&placed), ["decode", "shuffle(10)"]);
        assert!(why.is_empty(), "{why:?}");
        let f = Facts {
            per_object: Some(false),
            measured_ratio: HashMap::from([(0, 3.0)]),
            ..Facts::default()
        };
        let placed = place_shuffles(&ops, &f, &mut why);
        assert_eq!(names(&placed), ["shuffle(10)", "decode"]);
        assert!(why[0].contains("decode x3.00 measured"), "{why:?}");
    }
}
