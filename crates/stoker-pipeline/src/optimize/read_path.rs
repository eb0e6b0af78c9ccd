//! The read path of a format that decodes columns (Parquet): rows as samples, or columns
//! cut straight into the first batch (the columnar path, see `source`), when that gives
//! exactly what the row path gives.

use super::{Physical, TailOp};
use crate::ops::{Builtin, FieldOp};
use crate::plan::{FormatChoice, Pipeline};
use crate::source::Columnar;
use std::sync::Arc;

/// How the source reads a format that decodes columns (Parquet).
pub(crate) enum ReadPath {
    /// The format reads rows only: no choice to make.
    RowsOnly,
    /// Rows as samples, for this reason.
    Rows(String),
    /// Columns straight into the first batch.
    Columnar(Columnar),
}

/// The columnar path (see `source`) when it gives exactly what the row path gives: a
/// format that decodes columns, the shards read one at a time (no interleave, no
/// interleaved rank split, no sample cache), and a `batch` first, with at most `rename`/`select`/`drop`
/// before it (they only move names). Anything else that works per sample before the batch
/// (a map, a filter, a shuffle buffer, take/skip) needs the samples: the row path.
pub(crate) fn read_path(p: &Pipeline, ph: &Physical) -> ReadPath {
    let FormatChoice::Fixed(f) = &p.format else {
        return ReadPath::RowsOnly;
    };
    if !f.reads_columns() || matches!(p.source, crate::plan::Source::Memory(_)) {
        return ReadPath::RowsOnly;
    }
    let why = if !p.options.columnar {
        Some("the columnar path is turned off (options.columnar = false)".to_string())
    } else if p.cycle > 1 {
        Some(format!(
            "interleave = {} takes rows from {} shards in turn",
            p.cycle, p.cycle
        ))
    } else if p.rank.is_some_and(|r| r.splits())
        && !crate::split::choose(p).is_some_and(|(contiguous, _)| contiguous)
    {
        Some("the interleaved rank split deals rows out one round at a time".into())
    } else if p.cache {
        Some("cache keeps parsed samples".into())
    } else if let Some((_, op)) = ph.producer.iter().find(|(_, op)| {
        !matches!(
            op.as_builtin(),
            Some(Builtin::Fields(
                FieldOp::Rename { .. } | FieldOp::Select { .. } | FieldOp::Drop { .. }
            ))
        )
    }) {
        Some(format!(
            "{} runs on each sample before the batch",
            op.meta().name
        ))
    } else {
        match ph.tail.first() {
            None => Some("there is no batch: the pipeline yields samples".into()),
            Some(TailOp::Batch(size, drop_last, collate)) => {
                return ReadPath::Columnar(Columnar {
                    size: *size,
                    drop_last: *drop_last,
                    collate: Arc::new(collate.clone()),
                    ops: ph.producer.clone(),
                })
            }
            Some(t) => Some(format!(
                "{} comes before the batch and needs samples",
                t.name()
            )),
        }
    };
    ReadPath::Rows(why.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimize::optimize;
    use crate::optimize::test_ops::{builtin, map};
    use crate::plan::{Op, RunOptions};
    use serde_json::json;
    use stoker_formats::{jsonl::Jsonl, parquet::Parquet};
    use stoker_store::StoreOptions;

    fn parquet(ops: Vec<Op>) -> Pipeline {
        let mut p = Pipeline::from_url(
            "file:///data/",
            StoreOptions::default(),
            FormatChoice::Fixed(Arc::new(Parquet::default())),
        );
        p.ops = ops;
        p
    }

    fn batch(n: usize) -> Op {
        Op::Batch {
            size: n,
            drop_last: false,
            collate: Default::default(),
        }
    }

    fn path(p: &Pipeline) -> ReadPath {
        read_path(
            p,
            &optimize(&p.ops, &crate::optimize::Facts::of(p), &p.options.disable),
        )
    }

    fn why(p: &Pipeline) -> String {
        match path(p) {
            ReadPath::Rows(why) => why,
            ReadPath::RowsOnly => panic!("rows only"),
            ReadPath::Columnar(_) => panic!("columnar"),
        }
    }

    #[test]
    fn a_batch_first_reads_columns_into_it() {
        let rename = Op::Map(builtin(json!({"op": "rename", "from": "a", "to": "b"})));
        let ReadPath::Columnar(c) = path(&parquet(vec![rename, batch(16)])) else {
            panic!("the columnar path");
        };
        assert_eq!(c.size, 16);
        assert_eq!(
            c.ops.len(),
            1,
            "the renames run in the source, on each chunk's names"
        );
    }

    #[test]
    fn anything_per_sample_before_the_batch_reads_rows_and_says_why() {
        assert!(why(&parquet(vec![map("m"), batch(16)])).contains("m runs on each sample"));
        assert!(why(&parquet(vec![Op::Take(3), batch(16)])).contains("take(3) comes before"));
        assert!(why(&parquet(vec![])).contains("there is no batch"));
        let mut p = parquet(vec![batch(16)]);
        p.cycle = 2;
        assert!(why(&p).contains("interleave = 2"));
        let p = parquet(vec![batch(16)]).options(RunOptions::default().with_columnar(false));
        assert!(why(&p).contains("turned off"));
    }

    #[test]
    fn a_format_that_reads_rows_only_has_no_choice() {
        let mut p = Pipeline::from_url(
            "file:///data/",
            StoreOptions::default(),
            FormatChoice::Fixed(Arc::new(Jsonl)),
        );
        p.ops = vec![batch(16)];
        assert!(matches!(path(&p), ReadPath::RowsOnly));
        let mut p = Pipeline::from_samples(vec![]);
        p.ops = vec![batch(16)];
        assert!(matches!(path(&p), ReadPath::RowsOnly));
    }
}
