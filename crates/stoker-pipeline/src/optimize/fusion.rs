//! Fusion: adjacent operators that have one fused kernel run as it (today: decode, then a
//! random resized crop of the same field, with the flip and the float conversion after it,
//! as one region-decoding kernel; see `ops::image::fuse`), on the workers' producer and in
//! each run of maps in the tail (a parallel stage). The fused operator draws from the same
//! generators as the operators it replaces, so results do not change.

use super::{Physical, TailOp};
use crate::ops::SampleOp;
use std::sync::Arc;

/// The producer's and the tail's runs of operators with a fused kernel replaced by it,
/// each with its reason, and a reason when the producer then has several operators (one
/// worker stage).
pub(crate) fn fuse(mut ph: Physical) -> Physical {
    let producer = std::mem::take(&mut ph.producer);
    ph.producer = match ph.cache {
        // Nothing fuses across the cache point: the operators before it fill the cache.
        Some(c) => {
            let mut tail = producer;
            let head = tail.drain(..c.after.min(tail.len())).collect();
            let mut fused = fuse_kernels(head, &mut ph.explain);
            let after = fused.len();
            fused.extend(fuse_kernels(tail, &mut ph.explain));
            if let Some(c) = ph.cache.as_mut() {
                c.after = after;
            }
            fused
        }
        None => fuse_kernels(producer, &mut ph.explain),
    };
    let mut tail = Vec::with_capacity(ph.tail.len());
    let mut run: Vec<(usize, Arc<dyn SampleOp>)> = Vec::new();
    for t in std::mem::take(&mut ph.tail) {
        match t {
            TailOp::Map(i, op) => run.push((i, op)),
            other => {
                let fused = fuse_kernels(std::mem::take(&mut run), &mut ph.explain);
                tail.extend(fused.into_iter().map(|(i, op)| TailOp::Map(i, op)));
                tail.push(other);
            }
        }
    }
    let fused = fuse_kernels(run, &mut ph.explain);
    tail.extend(fused.into_iter().map(|(i, op)| TailOp::Map(i, op)));
    ph.tail = tail;
    if ph.producer.len() > 1 {
        ph.explain.push(format!(
            "fused {} per-sample operators into one worker stage",
            ph.producer.len()
        ));
    }
    // A tokenize with a limit fuses with its truncation inside its kernel.
    let tail_ops = ph.tail.iter().filter_map(|t| match t {
        TailOp::Map(_, op) => Some(op),
        _ => None,
    });
    let notes: Vec<String> = ph
        .producer
        .iter()
        .map(|(_, op)| op)
        .chain(tail_ops)
        .filter_map(|op| match op.as_builtin() {
            Some(crate::ops::Builtin::Text(t)) => t.prefix_note(),
            _ => None,
        })
        .collect();
    ph.explain.extend(notes);
    ph
}

/// `ops` with their fused kernels (see [`fuse_kernels`]), without the reasons: for the
/// cache pass, which compares costs with and without fusion.
pub(crate) fn fused(ops: Vec<(usize, Arc<dyn SampleOp>)>) -> Vec<(usize, Arc<dyn SampleOp>)> {
    fuse_kernels(ops, &mut Vec::new())
}

/// Replaces runs of adjacent operators that have a fused kernel (a decode then a random
/// resized crop of the same field, with the flip and float conversion after it) by it. The
/// fused operator draws from the same generators as the operators it replaces (see
/// `ops::image::fuse`), so results do not change.
fn fuse_kernels(
    ops: Vec<(usize, Arc<dyn SampleOp>)>,
    explain: &mut Vec<String>,
) -> Vec<(usize, Arc<dyn SampleOp>)> {
    let mut out: Vec<(usize, Arc<dyn SampleOp>)> = Vec::with_capacity(ops.len());
    let mut k = 0;
    while k < ops.len() {
        match crate::ops::fuse(&ops[k..]) {
            Some((n, index, fused)) => {
                let names: Vec<String> =
                    ops[k..k + n].iter().map(|(_, op)| op.meta().name).collect();
                explain.push(format!(
                    "{} run as one kernel: only the crop's region is decoded, at the \
                     smallest DCT scale that covers the output",
                    names.join(", ")
                ));
                out.push((index, fused));
                k += n;
            }
            None => {
                out.push(ops[k].clone());
                k += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimize::placement::place;
    use crate::optimize::test_ops::{builtin, map, producer_names};
    use crate::plan::Op;
    use serde_json::json;

    fn image_ops(crop_field: &str) -> Vec<Op> {
        vec![
            Op::Map(builtin(json!({"op": "decode_image", "field": "jpg"}))),
            Op::Map(builtin(
                json!({"op": "random_resized_crop", "field": crop_field, "size": 224}),
            )),
            Op::Map(builtin(json!({"op": "random_flip", "field": crop_field}))),
        ]
    }

    #[test]
    fn a_decode_then_a_crop_of_the_same_field_become_one_kernel() {
        let ph = fuse(place(&image_ops("jpg")));
        assert_eq!(ph.producer.len(), 1);
        assert_eq!(
            producer_names(&ph),
            ["decode_image+random_resized_crop+random_flip(jpg)"]
        );
        // It runs under the crop's index, whose generator picks the box.
        assert_eq!(ph.producer[0].0, 1);
        assert!(
            ph.explain[0].contains("run as one kernel"),
            "{:?}",
            ph.explain
        );
        assert_eq!(ph.explain.len(), 1, "one worker stage: no second reason");
    }

    #[test]
    fn operators_on_another_field_are_left_apart() {
        let ph = fuse(place(&image_ops("other")));
        assert_eq!(ph.producer.len(), 3);
        assert!(ph.explain.iter().all(|r| !r.contains("one kernel")));
        assert_eq!(
            ph.explain,
            ["fused 3 per-sample operators into one worker stage"]
        );
    }

    #[test]
    fn a_kernel_in_the_tail_is_fused_too() {
        let mut ops = vec![Op::Shuffle(16)];
        ops.extend(image_ops("jpg"));
        ops.push(Op::Batch {
            size: 4,
            drop_last: false,
            collate: Default::default(),
        });
        let ph = fuse(place(&ops));
        assert!(ph.producer.is_empty());
        assert_eq!(
            crate::optimize::test_ops::tail_names(&ph),
            [
                "shuffle(16)",
                "map[decode_image+random_resized_crop+random_flip(jpg)]",
                "batch(4)"
            ]
        );
        // Under the crop's index in the logical plan.
        assert!(matches!(ph.tail[1], TailOp::Map(2, _)));
        assert!(
            ph.explain[0].contains("run as one kernel"),
            "{:?}",
            ph.explain
        );
    }

    #[test]
    fn what_follows_a_fused_kernel_stays_after_it() {
        let mut ops = image_ops("jpg");
        ops.push(map("after"));
        let ph = fuse(place(&ops));
        assert_eq!(producer_names(&ph).len(), 2);
        assert_eq!(producer_names(&ph)[1], "after");
        assert_eq!(ph.producer[1].0, 3);
    }
}
