//! Text and tabular operators in pipelines: per sample on the workers, and column-wise
//! after a batch, with the same results. The kernels' parity is tested in stoker-ops.

use std::path::PathBuf;

use stoker_core::{DType, Sample, Tensor, Value};
use stoker_pipeline::{Builtin, ColumnOp, FillValue, Item, Pipeline, TextOp};

fn tokenizer_path() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../stoker-ops/tests/fixtures/text/minilm-tokenizer.json")
        .to_string_lossy()
        .into_owned()
}

fn texts() -> Pipeline {
    let t = [
        "Hello, world!",
        "Stoker keeps accelerators fed.",
        "",
        "ünïcödé and emoji 🚀",
        "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    ];
    Pipeline::from_samples(
        t.iter()
            .enumerate()
            .map(|(i, s)| {
                let mut x = Sample::new();
                x.insert("__key__", format!("t{i}"));
                x.insert("text", *s);
                x
            })
            .collect(),
    )
}

fn tokenize(pad_to: Option<usize>) -> Builtin {
    Builtin::Text(TextOp::Tokenize {
        field: "text".into(),
        tokenizer: tokenizer_path(),
        max_length: Some(12),
        pad_to,
        pad_id: 0,
        pad_side: None,
        add_special_tokens: true,
        bos_id: None,
        eos_id: None,
        ids_field: None,
        mask_field: None,
        dtype: None,
    })
}

fn i64s(t: &Tensor) -> Vec<i64> {
    assert_eq!(t.dtype(), DType::I64);
    t.data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn tensor(v: &Value) -> &Tensor {
    match v {
        Value::Tensor(t) => t,
        v => panic!("not a tensor: {v:?}"),
    }
}

#[test]
fn explain_says_a_limited_tokenize_encodes_only_the_prefix_it_keeps() {
    let e = texts().map(tokenize(Some(12))).explain();
    assert!(
        e.contains("tokenize(text) encodes only as much of a long text as the tokens it keeps"),
        "{e}"
    );
    // Without a limit there is nothing to cut.
    let mut unlimited = tokenize(None);
    if let Builtin::Text(TextOp::Tokenize { max_length, .. }) = &mut unlimited {
        *max_length = None;
    }
    assert!(!texts()
        .map(unlimited)
        .explain()
        .contains("tokenize(text) encodes"));
}

#[test]
fn tokenize_per_sample_and_per_batch_agree() {
    // Per sample, padded to 12, then batched: stacked [5, 12].
    let per_sample: Vec<Item> = texts()
        .map(tokenize(Some(12)))
        .batch(5, false)
        .run()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    // Batched first, tokenized column-wise.
    let per_batch: Vec<Item> = texts()
        .batch(5, false)
        .map(tokenize(Some(12)))
        .run()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let a = per_sample[0].clone().into_batch().unwrap();
    let b = per_batch[0].clone().into_batch().unwrap();
    for f in ["input_ids", "attention_mask"] {
        let (x, y) = (tensor(a.get(f).unwrap()), tensor(b.get(f).unwrap()));
        assert_eq!(x.shape(), &[5, 12], "{f}");
        assert_eq!(i64s(x), i64s(y), "{f}");
    }
    let ids = i64s(tensor(a.get("input_ids").unwrap()));
    // [CLS] ... [SEP] for BERT WordPiece: 101 first; the empty text is [CLS] [SEP] + pads.
    assert_eq!(ids[0], 101);
    assert_eq!(&ids[24..28], &[101, 102, 0, 0]);
    let mask = i64s(tensor(a.get("attention_mask").unwrap()));
    assert_eq!(&mask[24..28], &[1, 1, 0, 0]);
    // The long text is truncated to 12 tokens, the last one [SEP].
    assert_eq!(ids[48..60].last(), Some(&102));
    assert!(mask[48..60].iter().all(|m| *m == 1));
}

fn table() -> Pipeline {
    let rows: [(Option<f64>, &str); 6] = [
        (Some(1.0), "cat"),
        (None, "dog"),
        (Some(99.0), "cat"),
        (Some(-3.0), "emu"),
        (Some(0.5), "dog"),
        (Some(7.0), "yak"),
    ];
    Pipeline::from_samples(
        rows.iter()
            .enumerate()
            .map(|(i, (x, c))| {
                let mut s = Sample::new();
                s.insert("__key__", format!("r{i}"));
                s.insert("x", x.map_or(Value::Null, Value::Float));
                s.insert("c", *c);
                s
            })
            .collect(),
    )
}

fn tabular_ops(p: Pipeline) -> Pipeline {
    p.map(Builtin::Columns(ColumnOp::FillNull {
        field: "x".into(),
        value: FillValue::Float(2.0),
    }))
    .map(Builtin::Columns(ColumnOp::Clip {
        field: "x".into(),
        min: Some(0.0),
        max: Some(10.0),
    }))
    .map(Builtin::Columns(ColumnOp::Bucketize {
        field: "x".into(),
        boundaries: vec![1.0, 5.0],
    }))
    .map(Builtin::Columns(ColumnOp::VocabLookup {
        field: "c".into(),
        vocab: Some(vec!["cat".into(), "dog".into()]),
        vocab_file: None,
        oov_index: None,
    }))
}

#[test]
fn tabular_ops_per_sample_and_per_batch_agree() {
    let a = tabular_ops(table()).batch(6, false);
    let b = tabular_ops(table().batch(6, false));
    let a = a
        .run()
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .into_batch()
        .unwrap();
    let b = b
        .run()
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .into_batch()
        .unwrap();
    // x: fill 2 -> clip [0, 10] -> buckets of (-inf,1], (1,5], (5,inf).
    assert_eq!(i64s(tensor(a.get("x").unwrap())), vec![0, 1, 2, 0, 0, 2]);
    assert_eq!(i64s(tensor(b.get("x").unwrap())), vec![0, 1, 2, 0, 0, 2]);
    // c: cat 0, dog 1, anything else the vocabulary's size.
    assert_eq!(i64s(tensor(a.get("c").unwrap())), vec![0, 1, 0, 2, 1, 2]);
    assert_eq!(i64s(tensor(b.get("c").unwrap())), vec![0, 1, 0, 2, 1, 2]);
}

#[test]
fn a_null_names_the_operator_and_a_bad_argument_is_refused() {
    let p = table().map(Builtin::Columns(ColumnOp::Log1p {
        field: "x".into(),
        negative: None,
    }));
    let err = p
        .run()
        .unwrap()
        .find_map(|r| r.err())
        .expect("the null fails");
    let msg = err.to_string();
    assert!(msg.contains("log1p"), "{msg}");
    let bad = Builtin::Columns(ColumnOp::Standardize {
        field: "x".into(),
        mean: 0.0,
        std: 0.0,
    });
    assert!(bad.validate().is_err());
    let mut missing = tokenize(None);
    if let Builtin::Text(TextOp::Tokenize { tokenizer, .. }) = &mut missing {
        *tokenizer = "/nonexistent/tokenizer.json".into();
    }
    let msg = missing.validate().unwrap_err().to_string();
    assert!(msg.contains("/nonexistent/tokenizer.json"), "{msg}");
}

/// A `[rows, dim]` float32 table as `numpy.save` writes it: row `r` holds `r * 100 + j`.
fn npy_table(dir: &std::path::Path, rows: usize, dim: usize) -> String {
    let mut h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dim}), }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((h.len() as u16).to_le_bytes());
    out.extend(h.as_bytes());
    for r in 0..rows {
        for j in 0..dim {
            out.extend(((r * 100 + j) as f32).to_le_bytes());
        }
    }
    let p = dir.join("table.npy");
    std::fs::write(&p, out).unwrap();
    p.to_string_lossy().into_owned()
}

fn embedding(table: &str, to: Option<&str>) -> Builtin {
    Builtin::Text(TextOp::Embedding {
        field: "input_ids".into(),
        table: table.into(),
        to: to.map(Into::into),
    })
}

fn f32s(t: &Tensor) -> Vec<f32> {
    assert_eq!(t.dtype(), DType::F32);
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn batches(p: Pipeline) -> Vec<stoker_core::Batch> {
    p.run()
        .unwrap()
        .map(|i| i.unwrap().into_batch().unwrap())
        .collect()
}

#[test]
fn embedding_rows_per_sample_into_the_batch_and_per_batch_agree() {
    let dir = tempfile::tempdir().unwrap();
    // The MiniLM vocabulary has 30,522 ids.
    let t = npy_table(dir.path(), 30_522, 4);
    let text = |n: usize| {
        Pipeline::from_samples(
            (0..n)
                .map(|i| {
                    let mut x = Sample::new();
                    x.insert("text", format!("sample number {i} says hello"));
                    x
                })
                .collect(),
        )
        .map(tokenize(Some(12)))
    };
    // Last before the batch: written into the batch's slots, on the workers.
    let before = batches(
        text(10)
            .map(embedding(&t, Some("emb")))
            .batch(4, false)
            .options(stoker_pipeline::RunOptions::default().with_threads(2)),
    );
    // After it: one lookup of the [N, 12] ids.
    let after = batches(text(10).batch(4, false).map(embedding(&t, Some("emb"))));
    assert_eq!(before.len(), 3);
    for (a, b) in before.iter().zip(&after) {
        let (x, y) = (tensor(a.get("emb").unwrap()), tensor(b.get("emb").unwrap()));
        assert_eq!(x.shape()[1..], [12, 4]);
        assert_eq!(x.shape(), y.shape());
        assert_eq!(f32s(x), f32s(y));
        // Each row is the table's row of its id.
        let ids = i64s(tensor(a.get("input_ids").unwrap()));
        let rows = f32s(x);
        for (k, id) in ids.iter().enumerate() {
            assert_eq!(rows[k * 4 + 3], (*id * 100 + 3) as f32, "id {id}");
        }
    }
    // Unpadded ids of different lengths, batched: a list of rows either way.
    let ragged = |after: bool| {
        let p = Pipeline::from_samples(
            ["a", "a b c", "a b"]
                .iter()
                .map(|s| {
                    let mut x = Sample::new();
                    x.insert("text", *s);
                    x
                })
                .collect(),
        )
        .map(tokenize(None));
        let p = if after {
            p.batch(3, false).map(embedding(&t, None))
        } else {
            p.map(embedding(&t, None)).batch(3, false)
        };
        match batches(p)[0].get("input_ids").unwrap() {
            Value::List(v) => v.iter().map(|r| f32s(tensor(r))).collect::<Vec<_>>(),
            v => panic!("{v:?}"),
        }
    };
    assert_eq!(ragged(false), ragged(true));
    assert_eq!(ragged(false)[1].len(), 5 * 4);
}

#[test]
fn an_id_outside_the_table_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    // 100 rows: BERT's [CLS] is 101.
    let t = npy_table(dir.path(), 100, 2);
    let p = texts().map(tokenize(None)).map(embedding(&t, None));
    let err = p.run().unwrap().find_map(Result::err).unwrap().to_string();
    assert!(err.contains("embedding(input_ids)"), "{err}");
    assert!(err.contains("id 101 (at 0 of"), "{err}");
    assert!(err.contains("of 100 rows"), "{err}");
    // A table that is not there is refused before the run.
    let missing = texts().map(embedding("/nonexistent/t.npy", None));
    let err = missing.run().err().unwrap().to_string();
    assert!(err.contains("/nonexistent/t.npy"), "{err}");
}
