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
