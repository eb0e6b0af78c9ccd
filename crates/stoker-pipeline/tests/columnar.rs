//! The columnar path (Parquet row groups straight into batches) against the row path, over
//! files pyarrow wrote: `tests/fixtures/columnar/` (made by `make_columnar_fixtures.py`)
//! and stoker-formats' `table.snappy.parquet` (nulls, lists, timestamps, binary).
//!
//! Every spec runs twice, with `options.columnar` true and false, and must give the same
//! items, errors and skip counts; `--explain` must name the path. Resume is checked at every
//! stop point of several runs.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::{server, store_options, BUCKET};
use stoker_pipeline::{Item, Pipeline, PipelineSpec};

fn fixture(rel: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Puts the fixtures on the test server once: `col/rows/`, `col/mixed/`, `col/table/`,
/// and `col/broken/` (a.parquet with its middle bytes overwritten, so a row group fails to
/// decode; b.parquet whole; c.parquet with its footer cut off).
fn objects() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let s = server();
        for f in [
            "rows/a.parquet",
            "rows/b.parquet",
            "rows/c.parquet",
            "rows/d.parquet",
            "mixed/a.parquet",
            "mixed/b.parquet",
        ] {
            let body = fixture(&format!("tests/fixtures/columnar/{f}"));
            s.put_object(BUCKET, &format!("col/{f}"), &body).unwrap();
        }
        let table = fixture("../stoker-formats/tests/fixtures/table.snappy.parquet");
        s.put_object(BUCKET, "col/table/t.parquet", &table).unwrap();
        let mut a = fixture("tests/fixtures/columnar/rows/a.parquet");
        let mid = a.len() / 3;
        for b in &mut a[mid..mid + 400] {
            *b = 0xff;
        }
        s.put_object(BUCKET, "col/broken/a.parquet", &a).unwrap();
        let b = fixture("tests/fixtures/columnar/rows/b.parquet");
        s.put_object(BUCKET, "col/broken/b.parquet", &b).unwrap();
        let c = fixture("tests/fixtures/columnar/rows/d.parquet");
        s.put_object(BUCKET, "col/broken/c.parquet", &c[..c.len() - 10])
            .unwrap();
    });
}

/// A pipeline over `col/{prefix}` from a spec's extra lines (top-level keys, `[[ops]]`)
/// and `[options]` lines, on the columnar path or not.
fn pipeline(prefix: &str, spec: &str, options: &str, columnar: bool) -> Pipeline {
    objects();
    let text = format!(
        "source = \"s3://{BUCKET}/col/{prefix}/\"\nformat = \"parquet\"\n{spec}\n\
         [options]\nthreads = 2\ncolumnar = {columnar}\n{options}\n"
    );
    let spec: PipelineSpec = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    spec.build(store_options()).unwrap()
}

/// Everything a run gives: items, then the error that ended it, and the skip count.
fn outcome(p: &Pipeline, columnar: bool) -> (Vec<Result<Item, String>>, u64, Vec<String>) {
    let mut run = p.run().unwrap();
    assert_eq!(run.columnar(), columnar);
    let mut out = Vec::new();
    for r in run.by_ref() {
        let end = r.is_err();
        out.push(r.map_err(|e| e.to_string()));
        if end {
            break;
        }
    }
    let stats = run.stats();
    let skipped = stats
        .skipped_errors
        .iter()
        .map(|s| s.error.clone())
        .collect();
    (out, stats.skipped, skipped)
}

fn batch(size: usize, drop_last: bool, collate: &str) -> String {
    format!("[[ops]]\nop = \"batch\"\nsize = {size}\ndrop_last = {drop_last}\ncollate = \"{collate}\"\n")
}

/// The columnar path is taken, and gives what the row path gives.
fn same(prefix: &str, spec: &str, options: &str) -> (Vec<Result<Item, String>>, u64) {
    let cols = pipeline(prefix, spec, options, true);
    let rows = pipeline(prefix, spec, options, false);
    let explain = cols.explain();
    assert!(explain.contains("source (columnar"), "{spec}\n{explain}");
    assert!(rows.explain().contains("source (rows)"), "{spec}");
    let want = outcome(&rows, false);
    let got = outcome(&cols, true);
    assert_eq!(got.0.len(), want.0.len(), "{prefix} {spec} {options}");
    for (i, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
        assert_eq!(g, w, "{prefix} {spec} {options}: item {i}");
    }
    assert_eq!(
        (got.1, &got.2),
        (want.1, &want.2),
        "{prefix} {spec} {options}: skipped"
    );
    (want.0, want.1)
}

fn rows_in(items: &[Result<Item, String>]) -> usize {
    items
        .iter()
        .map(|r| r.as_ref().map_or(0, Item::samples))
        .sum()
}

#[test]
fn batches_are_those_of_the_row_path() {
    // 111 rows in 4 files, row groups of 10/23/1/16: batches that do and do not divide
    // them, span row groups and files, one batch of everything, batches of one.
    for (size, drop_last) in [(8, false), (8, true), (10, true), (7, false), (111, false)] {
        let (items, _) = same("rows", &batch(size, drop_last, "auto"), "");
        let full = 111 / size * size;
        let want = if drop_last || full == 111 { full } else { 111 };
        assert_eq!(rows_in(&items), want, "batch {size}");
        assert!(items.iter().all(|r| r.as_ref().unwrap().samples() <= size));
    }
    let (items, _) = same("rows", &batch(200, true, "auto"), "");
    assert!(items.is_empty());
    let (items, _) = same("rows", &batch(1, false, "auto"), "");
    assert_eq!(items.len(), 111);
    // Projection (in another order than the file's), other collate policies.
    let proj = "[format_options]\ncolumns = [\"maybe\", \"name\", \"id\", \"vec\"]\n";
    for collate in ["auto", "list", "pad"] {
        same("rows", &format!("{proj}{}", batch(9, false, collate)), "");
    }
    // `stack` cannot stack strings: the same error, from the first batch.
    let (items, _) = same("rows", &batch(9, false, "stack"), "");
    assert!(
        matches!(&items[0], Err(e) if e.contains("\"name\"")),
        "{items:?}"
    );
    // Shuffled shard order, two epochs, with and without a seed change.
    for seed in [1, 2] {
        let spec = format!(
            "shuffle_shards = true\nepochs = 2\nseed = {seed}\n{}",
            batch(12, false, "auto")
        );
        let (items, _) = same("rows", &spec, "");
        assert_eq!(rows_in(&items), 222);
    }
    // Nulls inside lists, timestamps, binary, booleans (stoker-formats' fixture).
    for size in [6, 10, 40] {
        same("table", &batch(size, false, "auto"), "");
    }
    // Operators after the batch see the same batches.
    let spec = format!("{}[[ops]]\nop = \"take\"\nn = 5\n", batch(8, false, "auto"));
    let (items, _) = same("rows", &spec, "");
    assert_eq!(items.len(), 5);
    let spec = format!("{}[[ops]]\nop = \"unbatch\"\n", batch(8, false, "auto"));
    let (items, _) = same("rows", &spec, "");
    assert_eq!(items.len(), 111);
}

#[test]
fn batches_hold_exactly_the_rows_read_one_at_a_time() {
    // Not only the same as the row path: the values themselves, row by row.
    let (items, _) = same("rows", &batch(8, false, "auto"), "");
    let samples: Vec<_> = pipeline("rows", "", "", true)
        .run()
        .unwrap()
        .map(|i| i.unwrap().into_sample().unwrap())
        .collect();
    let back: Vec<_> = items
        .into_iter()
        .flat_map(|i| i.unwrap().into_batch().unwrap().unbatch().unwrap())
        .collect();
    assert_eq!(back.len(), samples.len());
    for (i, (b, s)) in back.iter().zip(&samples).enumerate() {
        for (name, v) in s.iter() {
            let got = b.get(name).unwrap_or_else(|| panic!("row {i}: no {name}"));
            // A column holding a null becomes a list of values; others stack (and come
            // back as 0-d tensors of the same number, or as the same tensor).
            match (got, v) {
                (stoker_core::Value::Tensor(t), stoker_core::Value::Float(f)) => {
                    assert_eq!(t.to_vec::<f64>().unwrap(), vec![*f], "row {i} {name}")
                }
                _ => assert_eq!(got, v, "row {i} {name}"),
            }
        }
    }
    // Row 12 of a.parquet has a null name: its batch's `name` is a list with the null.
    assert!(back[12].get("name") == Some(&stoker_core::Value::Null));
}

#[test]
fn structural_operators_before_the_batch() {
    let ops = "[[ops]]\nop = \"rename\"\nfrom = \"id\"\nto = \"key\"\n\
               [[ops]]\nop = \"select\"\nfields = [\"score\", \"key\", \"name\"]\n\
               [[ops]]\nop = \"drop\"\nfields = [\"score\"]\n";
    let (items, _) = same("rows", &format!("{ops}{}", batch(9, false, "auto")), "");
    let b = items[0].as_ref().unwrap().clone().into_batch().unwrap();
    let names: Vec<&str> = b.iter().map(|(n, _)| &**n).collect();
    assert_eq!(names, ["key", "name"]);
    // A rename onto an existing field: two fields of one name, as the samples have.
    let ops = "[[ops]]\nop = \"rename\"\nfrom = \"id\"\nto = \"small\"\n";
    same("rows", &format!("{ops}{}", batch(9, false, "auto")), "");
    // A rename of a field that is not there fails on every row: the same first error,
    // and with `skip` the same count (every row) and errors.
    let ops = "[[ops]]\nop = \"rename\"\nfrom = \"nope\"\nto = \"x\"\n";
    let spec = format!("{ops}{}", batch(9, false, "auto"));
    let (items, _) = same("rows", &spec, "");
    assert!(matches!(&items[0], Err(e) if e.contains("nope") && e.contains("record 0")));
    let (items, skipped) = same("rows", &spec, "errors = \"skip\"");
    assert!(items.is_empty());
    assert_eq!(skipped, 111);
}

#[test]
fn errors_are_those_of_the_row_path() {
    // A file without a column the batch's first rows have: the batch across the two
    // files fails, named as the row path names it.
    let (items, _) = same("mixed", &batch(4, false, "auto"), "");
    assert!(
        matches!(&items[1], Err(e) if e.contains("no field \"name\"")),
        "{items:?}"
    );
    let (items, skipped) = same("mixed", &batch(4, false, "auto"), "errors = \"skip\"");
    assert_eq!((items.len(), skipped), (2, 1));
    // A row group that does not decode, and a file whose footer is cut off.
    let (items, _) = same("broken", &batch(6, false, "auto"), "");
    let e = items.last().unwrap().as_ref().unwrap_err();
    assert!(
        e.contains("s3://pipe/col/broken/a.parquet") && e.contains("byte") && e.contains("parquet"),
        "{e}"
    );
    for (size, drop_last) in [(6, false), (5, true), (32, false)] {
        let (items, skipped) = same(
            "broken",
            &batch(size, drop_last, "auto"),
            "errors = \"skip\"",
        );
        assert!(skipped >= 2, "{skipped}");
        assert!(rows_in(&items) > 30, "{}", rows_in(&items));
    }
}

#[test]
fn explain_names_the_path_and_why() {
    let e = pipeline("rows", &batch(8, false, "auto"), "", true).explain();
    assert!(e.contains("source (columnar: batches of 8)"), "{e}");
    assert!(e.contains("because: columnar:"), "{e}");
    let ops = "[[ops]]\nop = \"select\"\nfields = [\"id\"]\n";
    let e = pipeline(
        "rows",
        &format!("{ops}{}", batch(8, false, "auto")),
        "",
        true,
    )
    .explain();
    assert!(
        e.contains("source (columnar: batches of 8, with map[select])"),
        "{e}"
    );
    assert!(!e.contains("workers:"), "{e}");
    let why = [
        (
            "interleave = 2\n",
            batch(8, false, "auto"),
            "interleave = 2",
        ),
        (
            "",
            format!(
                "[[ops]]\nop = \"shuffle\"\nbuffer = 10\n{}",
                batch(8, false, "auto")
            ),
            "shuffle(10) comes before the batch",
        ),
        (
            "",
            format!(
                "[[ops]]\nop = \"parse_int\"\nfield = \"name\"\n{}",
                batch(8, false, "auto")
            ),
            "runs on each sample before the batch",
        ),
        ("", String::new(), "there is no batch"),
        (
            "[rank]\nrank = 0\nworld = 2\nsplit = \"interleaved\"\n",
            batch(8, false, "auto"),
            "interleaved rank split",
        ),
    ];
    // The contiguous split (Parquet's default) keeps the columnar path.
    let e = pipeline(
        "rows",
        &format!("[rank]\nrank = 0\nworld = 2\n{}", batch(8, false, "auto")),
        "",
        true,
    )
    .explain();
    assert!(
        e.contains("source (columnar") && e.contains("rank split contiguous"),
        "{e}"
    );
    for (head, ops, reason) in why {
        let e = pipeline("rows", &format!("{head}{ops}"), "", true).explain();
        assert!(
            e.contains("source (rows)") && e.contains(reason),
            "{reason}: {e}"
        );
    }
    let e = pipeline("rows", &batch(8, false, "auto"), "", false).explain();
    assert!(
        e.contains("source (rows)") && e.contains("turned off"),
        "{e}"
    );
    // With interleave, the rows path still gives its own (interleaved) batches.
    let p = pipeline(
        "rows",
        &format!("interleave = 2\n{}", batch(8, false, "auto")),
        "",
        true,
    );
    let n: usize = p.run().unwrap().map(|i| i.unwrap().samples()).sum();
    assert_eq!(n, 111);
}

/// Stops a run after every `k` items, resumes from the state (through JSON), stops the
/// resumed run again after 2 more, resumes again: the items are those the whole run gives.
fn resumes_exactly(prefix: &str, spec: &str, options: &str) {
    let p = pipeline(prefix, spec, options, true);
    assert!(p.run().unwrap().columnar(), "{spec}");
    let full: Vec<Item> = p.run().unwrap().map(Result::unwrap).collect();
    assert!(full.len() >= 4, "{spec}");
    for k in 0..=full.len() {
        let mut run = p.run().unwrap();
        let head: Vec<Item> = run.by_ref().take(k).map(Result::unwrap).collect();
        assert_eq!(head, full[..k], "{spec}: first {k}");
        let state =
            stoker_pipeline::PipelineState::from_json(&run.state().unwrap().to_json()).unwrap();
        drop(run);
        let mut again = p.resume(&state).unwrap();
        let mid: Vec<Item> = again.by_ref().take(2).map(Result::unwrap).collect();
        let state = again.state().unwrap();
        drop(again);
        let tail: Vec<Item> = p.resume(&state).unwrap().map(Result::unwrap).collect();
        let rest: Vec<Item> = mid.into_iter().chain(tail).collect();
        assert_eq!(rest.len(), full.len() - k, "{spec}: resumed after {k}");
        assert_eq!(rest, full[k..], "{spec}: resumed after {k}");
    }
}

#[test]
fn resume_is_exact_at_every_batch() {
    resumes_exactly(
        "rows",
        &format!(
            "shuffle_shards = true\nepochs = 2\nseed = 5\n{}",
            batch(7, false, "auto")
        ),
        "",
    );
    let ops = "[[ops]]\nop = \"rename\"\nfrom = \"id\"\nto = \"key\"\n";
    resumes_exactly("rows", &format!("{ops}{}", batch(16, true, "auto")), "");
    resumes_exactly("broken", &batch(9, false, "auto"), "errors = \"skip\"");
}

#[test]
fn resume_is_exact_with_a_shuffle_of_batches_and_unbatch() {
    // A buffered batch is made again from its rows (read one at a time, collated as the
    // row path does), with the structural operators the source applied.
    let shuffle = |n: usize| format!("[[ops]]\nop = \"shuffle\"\nbuffer = {n}\n");
    let rename = "[[ops]]\nop = \"rename\"\nfrom = \"id\"\nto = \"key\"\n";
    resumes_exactly(
        "rows",
        &format!(
            "shuffle_shards = true\nepochs = 2\nseed = 3\n{rename}{}{}",
            batch(7, false, "auto"),
            shuffle(4)
        ),
        "",
    );
    resumes_exactly(
        "rows",
        &format!(
            "epochs = 2\nseed = 4\n{rename}{}[[ops]]\nop = \"unbatch\"\n{}{}",
            batch(6, false, "auto"),
            shuffle(9),
            batch(20, false, "auto")
        ),
        "",
    );
}

mod property {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Any batch size, `drop_last`, shard order and projection: the columnar batches
        /// are the row path's, and a run stopped at a random batch resumes exactly.
        #[test]
        fn same_batches_and_exact_resume(
            size in 1usize..48,
            drop_last in any::<bool>(),
            shuffle in any::<bool>(),
            seed in 0u64..1000,
            project in any::<bool>(),
            stop in 0.0f64..1.0,
        ) {
            let proj = if project {
                "[format_options]\ncolumns = [\"name\", \"maybe\", \"score\"]\n"
            } else {
                ""
            };
            let spec = format!(
                "shuffle_shards = {shuffle}\nseed = {seed}\n{proj}{}",
                batch(size, drop_last, "auto")
            );
            let (full, _) = same("rows", &spec, "");
            let full: Vec<Item> = full.into_iter().map(Result::unwrap).collect();
            let p = pipeline("rows", &spec, "", true);
            let k = ((full.len() as f64) * stop) as usize;
            let mut run = p.run().unwrap();
            let head: Vec<Item> = run.by_ref().take(k).map(Result::unwrap).collect();
            prop_assert_eq!(&head[..], &full[..k]);
            let state = run.state().unwrap();
            drop(run);
            let rest: Vec<Item> = p.resume(&state).unwrap().map(Result::unwrap).collect();
            prop_assert_eq!(&rest[..], &full[k..]);
        }
    }
}
