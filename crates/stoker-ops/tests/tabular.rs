//! Tabular kernels on hand-checked values, on both shapes a field takes (a sample's scalar
//! and a batch's column), their errors, and a few properties.

use std::io::Write;

use bytes::Bytes;
use proptest::prelude::*;
use stoker_core::{Batch, CollatePolicy, DType, ErrorKind, Sample, Tensor, Value};
use stoker_ops::tabular::{
    Bucketize, Clip, ColumnOp, Fill, FillNull, HashBucket, Log1p, Negative, Standardize,
    VocabLookup,
};

fn f32s(v: &Value) -> Vec<f32> {
    match v {
        Value::Tensor(t) => t.to_vec::<f32>().unwrap(),
        v => panic!("not a tensor: {v:?}"),
    }
}

fn i64s(v: &Value) -> Vec<i64> {
    match v {
        Value::Tensor(t) => {
            assert_eq!(t.dtype(), DType::I64);
            t.to_vec::<i64>().unwrap()
        }
        v => panic!("not a tensor: {v:?}"),
    }
}

fn list(vs: Vec<Value>) -> Value {
    Value::List(vs)
}

fn col_f64(v: &[f64]) -> Value {
    Value::Tensor(Tensor::from_slice(vec![v.len()], v).unwrap())
}

#[test]
fn fill_null_by_fill_kind() {
    let col = list(vec![
        Value::Int(3),
        Value::Null,
        Value::Float(f64::NAN),
        Value::Float(1.5),
    ]);
    let f = FillNull::new("x", Fill::Float(-1.0));
    assert_eq!(f32s(&f.apply(&col).unwrap()), vec![3.0, -1.0, -1.0, 1.5]);
    // NaN kept as a number when told so (then NaN comes out).
    let keep = FillNull::new("x", Fill::Float(-1.0)).nan_as_null(false);
    assert!(f32s(&keep.apply(&col).unwrap())[2].is_nan());
    // Ints and nulls with an int fill stay int64; a float in the column makes it float.
    let ints = list(vec![Value::Int(3), Value::Null]);
    let fi = FillNull::new("x", Fill::Int(0));
    assert_eq!(i64s(&fi.apply(&ints).unwrap()), vec![3, 0]);
    assert_eq!(f32s(&fi.apply(&col).unwrap()), vec![3.0, 0.0, 0.0, 1.5]);
    // Scalars: a sample's value.
    assert_eq!(fi.apply(&Value::Null).unwrap(), Value::Int(0));
    let f64_out = FillNull::new("x", Fill::Float(2.0))
        .dtype(DType::F64)
        .unwrap();
    assert_eq!(f64_out.apply(&Value::Null).unwrap(), Value::Float(2.0));
    assert_eq!(
        f.apply(&Value::Null).unwrap(),
        Value::Tensor(Tensor::scalar(-1.0f32))
    );
    // A float tensor column: only NaN to replace.
    assert_eq!(
        f32s(&f.apply(&col_f64(&[f64::NAN, 2.0])).unwrap()),
        vec![-1.0, 2.0]
    );
    // Strings.
    let fs = FillNull::new("c", Fill::Str("<missing>".into()));
    assert_eq!(
        fs.apply(&list(vec![Value::from("a"), Value::Null]))
            .unwrap(),
        list(vec![Value::from("a"), Value::from("<missing>")])
    );
    assert_eq!(fs.apply(&Value::Null).unwrap(), Value::from("<missing>"));
    // A string in a numeric fill is an error naming op, field, row.
    let e = f
        .apply(&list(vec![Value::Int(1), Value::from("oops")]))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Operator);
    assert_eq!(
        e.message,
        "fill_null: field 'x' row 1 is str, expected a number or null"
    );
    assert!(FillNull::new("x", Fill::Int(0)).dtype(DType::I32).is_err());
}

#[test]
fn log1p_values_and_negatives() {
    let l = Log1p::new("clicks");
    let out = f32s(
        &l.apply(&list(vec![Value::Int(0), Value::Int(1), Value::Float(9.0)]))
            .unwrap(),
    );
    assert_eq!(out, vec![0.0, 2f32.ln(), 10f32.ln()]);
    let e = l.apply(&col_f64(&[1.0, -2.5])).unwrap_err();
    assert_eq!(
        e.message,
        "log1p: field 'clicks' row 1 is negative (-2.5); set negative = clamp to map negatives to 0"
    );
    let e = l.apply(&Value::Float(-0.5)).unwrap_err();
    assert!(
        e.message.starts_with("log1p: field 'clicks' is negative"),
        "{e}"
    );
    let c = Log1p::new("clicks").negative(Negative::Clamp);
    assert_eq!(
        f32s(&c.apply(&col_f64(&[-2.5, 3.0])).unwrap()),
        vec![0.0, 4f32.ln()]
    );
    // Per sample: a 0-d float32 tensor, so a batch of them stacks into float32 [N].
    assert_eq!(
        c.apply(&Value::Int(0)).unwrap(),
        Value::Tensor(Tensor::scalar(0f32))
    );
}

#[test]
fn nulls_nan_and_strings_are_refused_by_numeric_ops() {
    let ops: Vec<Box<dyn ColumnOp>> = vec![
        Box::new(Log1p::new("p")),
        Box::new(Clip::new("p", Some(0.0), None).unwrap()),
        Box::new(Standardize::new("p", 0.0, 1.0).unwrap()),
        Box::new(Bucketize::new("p", vec![0.0]).unwrap()),
    ];
    for op in &ops {
        let n = op.name();
        let cases = [
            (
                list(vec![Value::Int(1), Value::Null]),
                format!("{n}: field 'p' row 1 is null"),
            ),
            (
                col_f64(&[0.0, 1.0, f64::NAN]),
                format!("{n}: field 'p' row 2 is NaN"),
            ),
            (
                list(vec![Value::from("12")]),
                format!("{n}: field 'p' row 0 is str, expected a number"),
            ),
            (Value::Null, format!("{n}: field 'p' is null")),
            (
                Value::Bytes(Bytes::from_static(b"1")),
                format!("{n}: field 'p' is str"),
            ),
            (
                list(vec![list(vec![])]),
                format!("{n}: field 'p' row 0 is list"),
            ),
        ];
        for (v, want) in cases {
            let e = op.apply(&v).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Operator);
            assert!(e.message.starts_with(&want), "{} vs {want}", e.message);
        }
    }
}

#[test]
fn clip_and_standardize() {
    let c = Clip::new("x", Some(-1.0), Some(2.0)).unwrap();
    let col = col_f64(&[-5.0, 0.5, 7.0, f64::INFINITY, f64::NEG_INFINITY]);
    assert_eq!(
        f32s(&c.apply(&col).unwrap()),
        vec![-1.0, 0.5, 2.0, 2.0, -1.0]
    );
    let upper = Clip::new("x", None, Some(0.0)).unwrap();
    assert_eq!(
        f32s(&upper.apply(&col_f64(&[-5.0, 5.0])).unwrap()),
        vec![-5.0, 0.0]
    );
    assert!(Clip::new("x", Some(3.0), Some(2.0)).is_err());
    assert!(Clip::new("x", Some(f64::NAN), None).is_err());

    let s = Standardize::new("x", 10.0, 4.0).unwrap();
    // int16 input tensor, any shape: [2, 2].
    let t = Tensor::from_slice(vec![2, 2], &[10i16, 14, 2, 30]).unwrap();
    let Value::Tensor(out) = s.apply(&Value::Tensor(t)).unwrap() else {
        panic!()
    };
    assert_eq!(out.shape(), &[2, 2]);
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![0.0, 1.0, -2.0, 5.0]);
    let s64 = Standardize::new("x", 10.0, 4.0)
        .unwrap()
        .dtype(DType::F64)
        .unwrap();
    assert_eq!(s64.apply(&Value::Int(12)).unwrap(), Value::Float(0.5));
    for (m, sd) in [
        (0.0, 0.0),
        (0.0, -1.0),
        (f64::NAN, 1.0),
        (0.0, f64::INFINITY),
    ] {
        let e = Standardize::new("x", m, sd).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
    }
}

#[test]
fn bucketize_follows_torch_right_false() {
    // torch.bucketize(tensor([0, 1, 3, 4, 6, 9, 10]), tensor([1, 3, 5, 7, 9]))
    //   == tensor([0, 0, 1, 2, 3, 4, 5])
    let b = Bucketize::new("age", vec![1.0, 3.0, 5.0, 7.0, 9.0]).unwrap();
    let col = Value::Tensor(Tensor::from_slice(vec![7], &[0i64, 1, 3, 4, 6, 9, 10]).unwrap());
    assert_eq!(i64s(&b.apply(&col).unwrap()), vec![0, 0, 1, 2, 3, 4, 5]);
    assert_eq!(b.apply(&Value::Float(3.5)).unwrap(), Value::Int(2));
    // Equal boundaries are allowed (as torch): x == b goes to the first of them.
    let dup = Bucketize::new("x", vec![1.0, 1.0, 2.0]).unwrap();
    assert_eq!(dup.bucket(1.0), 0);
    assert_eq!(dup.bucket(1.5), 2);
    let e = Bucketize::new("x", vec![2.0, 1.0]).unwrap_err();
    assert!(e.message.contains("not sorted"), "{e}");
    assert!(Bucketize::new("x", vec![f64::NAN]).is_err());
    // No boundaries: one bucket.
    assert_eq!(Bucketize::new("x", vec![]).unwrap().bucket(5.0), 0);
}

#[test]
fn hash_bucket_is_xxh64_of_the_text() {
    // Python: xxhash.xxh64_intdigest(s.encode(), seed) % 1000.
    let h = HashBucket::new("user", 1000).unwrap();
    let col = list(vec![
        Value::from(""),
        Value::from("abc"),
        Value::from("user_42"),
        Value::from("caf\u{e9}"),
        Value::Int(123),
        Value::Int(-5),
        Value::Bytes(Bytes::from_static(b"abc")),
    ]);
    assert_eq!(
        i64s(&h.apply(&col).unwrap()),
        vec![921, 249, 111, 10, 749, 72, 249]
    );
    let h7 = HashBucket::new("user", 1000).unwrap().seed(7);
    assert_eq!(h7.apply(&Value::from("abc")).unwrap(), Value::Int(679));
    assert_eq!(h7.apply(&Value::Int(-5)).unwrap(), Value::Int(166));
    // An int64 tensor column hashes like the ints' text.
    let t = Value::Tensor(Tensor::from_slice(vec![2], &[123i64, -5]).unwrap());
    assert_eq!(i64s(&h.apply(&t).unwrap()), vec![749, 72]);
    let e = h.apply(&col_f64(&[1.0])).unwrap_err();
    assert_eq!(
        e.message,
        "hash_bucket: field 'user' row 0 is float, expected a string or an integer"
    );
    let e = h.apply(&Value::Null).unwrap_err();
    assert_eq!(
        e.message,
        "hash_bucket: field 'user' is null (put fill_null before it)"
    );
    assert!(HashBucket::new("x", 0).is_err());
}

#[test]
fn vocab_lookup_from_list_and_file() {
    let v = VocabLookup::new("city", ["paris", "tokyo", "42"]).unwrap();
    let col = list(vec![
        Value::from("tokyo"),
        Value::from("lima"),
        Value::Int(42),
        Value::from("paris"),
    ]);
    assert_eq!(i64s(&v.apply(&col).unwrap()), vec![1, 3, 2, 0]);
    let v9 = v.clone().oov_index(-1);
    assert_eq!(v9.apply(&Value::from("lima")).unwrap(), Value::Int(-1));
    assert!(VocabLookup::new("c", ["a", "b", "a"])
        .unwrap_err()
        .message
        .contains("twice"));

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("vocab.txt");
    std::fs::File::create(&p)
        .unwrap()
        .write_all(b"paris\r\ntokyo\n42\n")
        .unwrap();
    let f = VocabLookup::from_file("city", &p).unwrap();
    assert_eq!(f.len(), 3);
    assert_eq!(i64s(&f.apply(&col).unwrap()), vec![1, 3, 2, 0]);
    std::fs::write(&p, "a\n\nb\n").unwrap();
    let e = VocabLookup::from_file("city", &p).unwrap_err();
    assert!(e.message.contains("line 2 is empty"), "{e}");
    let e = VocabLookup::from_file("city", dir.path().join("none.txt")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
}

#[test]
fn per_sample_outputs_collate_to_the_stated_dtypes() {
    let log = Log1p::new("price");
    let hash = HashBucket::new("user", 10).unwrap();
    let samples: Vec<Sample> = [(1.0, "a"), (3.0, "b")]
        .iter()
        .map(|(p, u)| {
            let mut s = Sample::new();
            s.insert("price", *p);
            s.insert("user", *u);
            log.apply_sample(&mut s).unwrap();
            hash.apply_sample(&mut s).unwrap();
            s
        })
        .collect();
    let b = Batch::collate(&samples, &CollatePolicy::default()).unwrap();
    match b.get("price").unwrap() {
        Value::Tensor(t) => assert_eq!((t.dtype(), t.shape()), (DType::F32, &[2][..])),
        v => panic!("{v:?}"),
    }
    match b.get("user").unwrap() {
        Value::Tensor(t) => assert_eq!((t.dtype(), t.shape()), (DType::I64, &[2][..])),
        v => panic!("{v:?}"),
    }
    let mut s = Sample::new();
    s.insert("other", 1i64);
    let e = log.apply_sample(&mut s).unwrap_err();
    assert_eq!(e.message, "log1p: no field 'price'");
}

proptest! {
    #[test]
    fn bucket_index_brackets_the_value(
        mut bounds in prop::collection::vec(-100i32..100, 0..12),
        x in -120i32..120,
    ) {
        bounds.sort();
        let b: Vec<f64> = bounds.iter().map(|&v| f64::from(v)).collect();
        let i = Bucketize::new("x", b.clone()).unwrap().bucket(f64::from(x)) as usize;
        let x = f64::from(x);
        prop_assert!(i <= b.len());
        prop_assert!(i == 0 || b[i - 1] < x);
        prop_assert!(i == b.len() || x <= b[i]);
    }

    #[test]
    fn hash_is_in_range_and_ints_hash_as_their_text(n in 1u64..10_000, i in any::<i64>(), seed in any::<u64>()) {
        let h = HashBucket::new("x", n).unwrap().seed(seed);
        let a = h.apply(&Value::Int(i)).unwrap();
        prop_assert_eq!(&a, &h.apply(&Value::from(i.to_string())).unwrap());
        let Value::Int(k) = a else { panic!() };
        prop_assert!((0..n as i64).contains(&k));
    }

    #[test]
    fn clip_stays_in_bounds_and_keeps_inner_values(
        xs in prop::collection::vec(-1e6f64..1e6, 1..50),
        lo in -1e3f64..0.0,
        hi in 0.0f64..1e3,
    ) {
        let c = Clip::new("x", Some(lo), Some(hi)).unwrap().dtype(DType::F64).unwrap();
        let Value::Tensor(t) = c.apply(&col_f64(&xs)).unwrap() else { panic!() };
        for (x, y) in xs.iter().zip(t.to_vec::<f64>().unwrap()) {
            prop_assert!(lo <= y && y <= hi);
            if lo <= *x && *x <= hi {
                prop_assert_eq!(*x, y);
            }
        }
    }
}
