//! Batch forms: per-sample operators written just before a `batch` that declare a batch
//! form ([`OpMeta::batch_form`](stoker_core::OpMeta::batch_form): applied to the batch, they
//! give the batch of what they give each sample, and never drop) run after the batch
//! instead, once per batch. For a Python function that works on arrays (a lookup in a
//! table, a normalization), one call and one conversion per batch replace one per sample:
//! the overhead of crossing into Python is paid once per batch. The operators keep their
//! indices (their generators' and their profiles'), and run as a parallel stage after the
//! batch. The outputs are the same by the operator's declaration.

use crate::plan::Op;

/// `ops` (each with its index in the logical plan) with every run of batch-form maps that
/// ends at a `batch` moved after it; a reason for each move goes to `explain`.
pub(crate) fn place_batch_forms(
    ops: Vec<(usize, Op)>,
    explain: &mut Vec<String>,
) -> Vec<(usize, Op)> {
    let mut out = Vec::with_capacity(ops.len());
    let mut run: Vec<(usize, Op)> = Vec::new();
    for (i, op) in ops {
        match &op {
            Op::Map(m) if m.meta().batch_form => run.push((i, op)),
            Op::Batch { size, .. } if !run.is_empty() => {
                let names: Vec<String> = run.iter().map(|(_, o)| super::op_name(o)).collect();
                explain.push(format!(
                    "moved {} after batch({size}): {} a batch form, so {} once per batch of \
                     {size} instead of on each sample (one call where there were {size})",
                    names.join(", "),
                    if run.len() == 1 {
                        "it declares"
                    } else {
                        "they declare"
                    },
                    if run.len() == 1 {
                        "it runs"
                    } else {
                        "they run"
                    },
                ));
                out.push((i, op));
                out.append(&mut run);
            }
            _ => {
                out.append(&mut run);
                out.push((i, op));
            }
        }
    }
    out.append(&mut run);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::FnOp;
    use std::sync::Arc;
    use stoker_core::{CollatePolicy, OpMeta};

    fn map(name: &str, batch: bool) -> Op {
        let m = OpMeta::new(name);
        let m = if batch { m.with_batch_form() } else { m };
        Op::Map(Arc::new(FnOp::new(m, |s, _| Ok(Some(s)))))
    }

    fn batch() -> Op {
        Op::Batch {
            size: 8,
            drop_last: false,
            collate: CollatePolicy::default(),
        }
    }

    fn names(ops: &[(usize, Op)]) -> Vec<String> {
        ops.iter()
            .map(|(i, o)| format!("{i}:{}", super::super::op_name(o)))
            .collect()
    }

    #[test]
    fn batch_form_maps_just_before_a_batch_move_after_it_keeping_their_indices() {
        let ops = vec![
            map("a", false),
            map("b", true),
            map("c", true),
            batch(),
            map("d", true),
        ];
        let mut why = Vec::new();
        let out = place_batch_forms(ops.into_iter().enumerate().collect(), &mut why);
        assert_eq!(names(&out), ["0:a", "3:batch(8)", "1:b", "2:c", "4:d"]);
        assert_eq!(why.len(), 1);
        assert!(
            why[0].starts_with("moved b, c after batch(8): they declare"),
            "{why:?}"
        );
    }

    #[test]
    fn a_map_without_a_batch_form_between_keeps_them_apart() {
        let ops = vec![map("b", true), map("a", false), batch()];
        let mut why = Vec::new();
        let out = place_batch_forms(ops.into_iter().enumerate().collect(), &mut why);
        assert_eq!(names(&out), ["0:b", "1:a", "2:batch(8)"]);
        assert!(why.is_empty());
        // No batch at all: nothing moves.
        let ops = vec![map("b", true), Op::Shuffle(4)];
        let out = place_batch_forms(ops.into_iter().enumerate().collect(), &mut why);
        assert_eq!(names(&out), ["0:b", "1:shuffle(4)"]);
    }
}
