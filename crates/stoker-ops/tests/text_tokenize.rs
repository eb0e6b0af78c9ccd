//! [`Tokenize`]: parameters, shapes and errors (parity itself is `text_parity.rs`).

use std::path::PathBuf;

use bytes::Bytes;
use stoker_core::{Batch, CollatePolicy, DType, ErrorKind, Sample, Value};
use stoker_ops::text::{PadSide, Tokenize, TokenizeParams};

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/text/{name}-tokenizer.json"))
}

fn bert(p: TokenizeParams) -> Tokenize {
    Tokenize::from_file(path("minilm"), p).unwrap()
}

fn ids(t: &stoker_core::Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap()
}

#[test]
fn bert_template_truncation_and_padding() {
    // "hello, world!" -> [CLS] hello , world ! [SEP]
    let full = bert(TokenizeParams::new());
    let out = full.encode(&Value::from("Hello, world!")).unwrap();
    assert_eq!(ids(&out.input_ids), vec![101, 7592, 1010, 2088, 999, 102]);
    // max_length counts the template: [CLS] hello , [SEP].
    let cut = bert(TokenizeParams::new().max_length(Some(4)));
    let out = cut.encode(&Value::from("Hello, world!")).unwrap();
    assert_eq!(ids(&out.input_ids), vec![101, 7592, 1010, 102]);
    // Right and left padding.
    let pad = bert(TokenizeParams::new().pad_to(Some(8)).pad_id(0));
    let out = pad.encode(&Value::from("Hello, world!")).unwrap();
    assert_eq!(
        ids(&out.input_ids),
        vec![101, 7592, 1010, 2088, 999, 102, 0, 0]
    );
    assert_eq!(ids(&out.attention_mask), vec![1, 1, 1, 1, 1, 1, 0, 0]);
    assert_eq!(out.lengths, vec![6]);
    let left = bert(
        TokenizeParams::new()
            .pad_to(Some(8))
            .pad_side(PadSide::Left),
    );
    let out = left.encode(&Value::from("Hello, world!")).unwrap();
    assert_eq!(
        ids(&out.input_ids),
        vec![0, 0, 101, 7592, 1010, 2088, 999, 102]
    );
    assert_eq!(ids(&out.attention_mask), vec![0, 0, 1, 1, 1, 1, 1, 1]);
    // pad_to alone truncates to pad_to, so the shape is always [pad_to].
    let short = bert(TokenizeParams::new().pad_to(Some(3)));
    let out = short.encode(&Value::from("Hello, world!")).unwrap();
    assert_eq!(ids(&out.input_ids), vec![101, 7592, 102]);
}

#[test]
fn gpt2_explicit_bos_and_eos() {
    let eot = 50256;
    let t = Tokenize::from_file(
        path("gpt2"),
        TokenizeParams::new()
            .bos_id(Some(eot))
            .eos_id(Some(eot))
            .max_length(Some(4))
            .dtype(DType::I32),
    )
    .unwrap();
    assert_eq!(t.token_to_id("<|endoftext|>"), Some(eot));
    assert_eq!(t.vocab_size(), 50257);
    // "Hello, world!" is 15496 11 995 0; two ids of room between BOS and EOS.
    let out = t.encode(&Value::from("Hello, world!")).unwrap();
    assert_eq!(out.input_ids.dtype(), DType::I32);
    assert_eq!(
        out.input_ids.to_vec::<i32>().unwrap(),
        vec![50256, 15496, 11, 50256]
    );
    assert_eq!(t.encode_ids(&Value::from("")).unwrap(), vec![eot, eot]);
}

#[test]
fn a_sample_gets_stackable_fields() {
    let t = bert(TokenizeParams::new().field("caption").pad_to(Some(10)));
    let samples: Vec<Sample> = ["a cat", "a very long caption about a dog and a ball", ""]
        .iter()
        .map(|c| {
            let mut s = Sample::new();
            s.insert("caption", *c);
            t.apply(&mut s).unwrap();
            s
        })
        .collect();
    let b = Batch::collate(&samples, &CollatePolicy::default()).unwrap();
    match b.get("input_ids").unwrap() {
        Value::Tensor(x) => assert_eq!(x.shape(), &[3, 10]),
        v => panic!("{v:?}"),
    }
    match b.get("attention_mask").unwrap() {
        Value::Tensor(x) => assert_eq!(ids(x)[20..], [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]),
        v => panic!("{v:?}"),
    }
}

#[test]
fn a_column_without_pad_to_pads_to_its_longest_row() {
    let t = bert(TokenizeParams::new().pad_id(7));
    let col = Value::List(vec![Value::from("a"), Value::from("a b c")]);
    let out = t.encode_column(&col).unwrap();
    assert_eq!(out.input_ids.shape(), &[2, 5]);
    assert_eq!(ids(&out.input_ids)[..5], [101, 1037, 102, 7, 7]);
    assert_eq!(out.lengths, vec![3, 5]);
}

#[test]
fn invalid_utf8_is_named_with_its_offset() {
    let t = bert(TokenizeParams::new());
    let mut bad = b"0123456789abcdefg".to_vec();
    bad.push(0xff);
    let e = t
        .encode(&Value::Bytes(Bytes::from(bad.clone())))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Operator);
    assert_eq!(
        e.message,
        "tokenize: field 'text' is not valid UTF-8 at byte 17"
    );
    let col = Value::List(vec![Value::from("ok"), Value::Bytes(Bytes::from(bad))]);
    let e = t.encode_column(&col).unwrap_err().to_string();
    assert!(e.contains("row 1") && e.contains("byte 17"), "{e}");
}

#[test]
fn wrong_kinds_are_errors_not_panics() {
    let t = bert(TokenizeParams::new().field("body"));
    for v in [Value::Int(3), Value::Null, Value::List(vec![])] {
        let e = t.encode(&v).unwrap_err().to_string();
        assert!(
            e.contains("tokenize: field 'body' is") && e.contains(v.kind()),
            "{e}"
        );
    }
    let e = t.encode_column(&Value::from("not a column")).unwrap_err();
    assert!(e.message.contains("list of texts"), "{e}");
    let mut s = Sample::new();
    s.insert("text", "x");
    let e = t.apply(&mut s).unwrap_err();
    assert!(e.message.contains("no field 'body'"), "{e}");
}

#[test]
fn bad_parameters_are_refused_at_construction() {
    let refuse = |p: TokenizeParams, what: &str| {
        let e = Tokenize::from_file(path("minilm"), p).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.message.contains(what), "{}", e.message);
    };
    refuse(TokenizeParams::new().dtype(DType::F32), "int32 or int64");
    refuse(
        TokenizeParams::new().max_length(Some(9)).pad_to(Some(8)),
        "more than pad_to",
    );
    // [CLS] + [SEP] + BOS need 3.
    refuse(
        TokenizeParams::new().max_length(Some(2)).bos_id(Some(1)),
        "no room",
    );
    let e = Tokenize::from_file("/nonexistent/tokenizer.json", TokenizeParams::new()).unwrap_err();
    assert!(e.message.contains("/nonexistent/tokenizer.json"), "{e}");
    let e = Tokenize::from_json(b"{not json", TokenizeParams::new()).unwrap_err();
    assert!(e.message.starts_with("tokenize: cannot load"), "{e}");
    // Without the template a limit below its size is fine (the ids are cut as Python
    // cuts them: the first max_length).
    let t = bert(
        TokenizeParams::new()
            .add_special_tokens(false)
            .max_length(Some(1)),
    );
    assert_eq!(
        t.encode_ids(&Value::from("hello world")).unwrap(),
        vec![7592]
    );
    let t = bert(
        TokenizeParams::new()
            .add_special_tokens(false)
            .max_length(Some(0)),
    );
    assert_eq!(
        t.encode_ids(&Value::from("hello world")).unwrap(),
        Vec::<u32>::new()
    );
    // Exactly the template: every text becomes [CLS] [SEP].
    let t = bert(TokenizeParams::new().max_length(Some(2)));
    assert_eq!(
        t.encode_ids(&Value::from("many words here")).unwrap(),
        vec![101, 102]
    );
}
