//! `explain`: the logical plan, the physical plan the passes made of it, and each pass's
//! reasons, as text.

use super::{
    op_name, optimize, par_runs, producer_name, read_path, Facts, ReadPath, TailOp, INLINE_NS,
};
use crate::plan::{FormatChoice, Pipeline};

/// Describes the plan the optimizer produces for `p` (stage names and its reasons), from
/// what the pipeline tells before a run.
pub fn explain(p: &Pipeline) -> String {
    explain_with(p, &Facts::of(p))
}

/// [`explain`] with what a run knows (`facts`: the format it listed, what it measured).
pub(crate) fn explain_with(p: &Pipeline, facts: &Facts) -> String {
    let mut ph = optimize(&p.ops, facts, &p.options.disable);
    let mut s = String::from("logical:\n");
    for op in &p.ops {
        s.push_str(&format!("  {}\n", op_name(op)));
    }
    if matches!(p.format, FormatChoice::Auto(_)) {
        ph.explain.push(
            "format auto: a run picks the format from the listed objects' extensions, then \
             its plan (the columnar path, the rank split) follows that format"
                .into(),
        );
    }
    match read_path(p, &ph) {
        ReadPath::RowsOnly if ph.permute => {
            s.push_str("physical:\n  source (the epoch's objects in a seeded permutation)\n")
        }
        ReadPath::RowsOnly => s.push_str("physical:\n  source\n"),
        ReadPath::Rows(why) => {
            s.push_str("physical:\n  source (rows)\n");
            ph.explain.push(format!(
                "rows: each row becomes a sample, because {why} (the columnar path needs \
                 a batch first, at most rename/select/drop before it, and one shard at a \
                 time)"
            ));
        }
        ReadPath::Columnar(c) => {
            s.push_str(&format!(
                "physical:\n  source (columnar: batches of {}{})\n",
                c.size,
                if c.ops.is_empty() {
                    String::new()
                } else {
                    format!(", with {}", producer_name(&c.ops))
                }
            ));
            ph.explain.push(format!(
                "columnar: the source cuts decoded columns into batches of {} across row \
                 groups and files and the workers collate them, with no sample per row \
                 (the same batches as the row path)",
                c.size
            ));
            ph.producer.clear();
        }
    }
    if !ph.producer.is_empty() {
        s.push_str(&format!("  workers: {}\n", producer_name(&ph.producer)));
    }
    if let Some((_, why)) = crate::split::choose(p) {
        ph.explain.push(why);
    }
    let runs = par_runs(&ph.tail);
    let mut k = 0;
    while k < ph.tail.len() {
        let Some(ops) = &runs[k] else {
            s.push_str(&format!("  {}\n", ph.tail[k].name()));
            k += 1;
            continue;
        };
        let order = if p.options.deterministic {
            "in order"
        } else {
            "as they finish"
        };
        s.push_str(&format!("  workers: {} ({order})\n", producer_name(ops)));
        let after = ph.tail[..k]
            .iter()
            .rev()
            .find(|t| !matches!(t, TailOp::Map(..)))
            .map_or_else(String::new, TailOp::name);
        ph.explain.push(
            format!(
                "{} after {after} runs on the workers too, several items at once, while the \
             stages before it go on; its results go on {}",
                producer_name(ops),
                if p.options.deterministic {
                    "in the order its items came (deterministic)"
                } else {
                    "as they finish (deterministic = false)"
                }
            ) + &format!(
                "; while it costs less than handing an item over (under {} us an item, measured), \
             it runs on the tail thread instead",
                INLINE_NS / 1000
            ),
        );
        k += ops.len();
    }
    s.push_str(&format!("  prefetch({})\n", ph.prefetch));
    for r in &ph.explain {
        s.push_str(&format!("  because: {r}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimize::test_ops::{builtin, filter, map};
    use crate::plan::Op;
    use serde_json::json;

    fn lines(s: &str) -> Vec<&str> {
        s.lines().collect()
    }

    #[test]
    fn it_shows_the_logical_plan_the_physical_plan_and_every_reason() {
        let mut p = Pipeline::from_samples(vec![]);
        p.ops = vec![
            Op::Shuffle(8),
            map("m"),
            Op::Batch {
                size: 4,
                drop_last: true,
                collate: Default::default(),
            },
            filter("f"),
        ];
        let e = explain(&p);
        assert_eq!(
            lines(&e),
            [
                "logical:",
                "  shuffle(8)",
                "  m",
                "  batch(4)",
                "  f",
                "physical:",
                "  source (the epoch's objects in a seeded permutation)",
                "  workers: map[m]",
                "  batch(4, drop_last)",
                "  workers: map[f] (in order)",
                "  prefetch(4)",
                "  because: shuffle(8) became a seeded permutation of the epoch's objects at \
                 the source (each sample is one object): the same samples every epoch in a \
                 uniformly random order, with no buffer of 8 samples to hold and the first \
                 sample at once",
                "  because: added prefetch(4) at the end",
                &format!(
                    "  because: map[f] after batch(4, drop_last) runs on the workers too, \
                     several items at once, while the stages before it go on; its results \
                     go on in the order its items came (deterministic); while it costs less \
                     than handing an item over (under {} us an item, measured), it runs on \
                     the tail thread instead",
                    INLINE_NS / 1000
                ),
            ]
        );
    }

    #[test]
    fn fused_kernels_and_an_automatic_format_are_explained() {
        let mut p = Pipeline::from_url(
            "file:///data/",
            Default::default(),
            FormatChoice::Auto(Default::default()),
        );
        p.ops = vec![
            Op::Map(builtin(json!({"op": "decode_image", "field": "jpg"}))),
            Op::Map(builtin(
                json!({"op": "random_resized_crop", "field": "jpg", "size": 224}),
            )),
        ];
        let e = explain(&p);
        assert!(
            e.contains("  workers: map[decode_image+random_resized_crop(jpg)]\n"),
            "{e}"
        );
        assert!(e.contains("run as one kernel"), "{e}");
        assert!(e.contains("format auto: a run picks the format"), "{e}");
    }
}
