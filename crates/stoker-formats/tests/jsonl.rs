//! JSON Lines over chunked streams.

mod common;

use stoker_core::{DType, ErrorKind, Sample, Value};
use stoker_formats::jsonl::Jsonl;
use stoker_formats::{Format, Input, RecordReader, ShardInfo};

const URL: &str = "s3://bucket/data.jsonl";

use common::{chunked as cursor, drain};

fn open(data: &[u8], chunk: usize) -> Box<dyn RecordReader> {
    Jsonl
        .open(
            &ShardInfo::new("data.jsonl", URL),
            Input::Stream(cursor(data, chunk)),
        )
        .unwrap()
}

fn tensor<T: stoker_core::Element>(v: &Value) -> (DType, Vec<T>) {
    match v {
        Value::Tensor(t) => {
            assert_eq!(t.shape(), &[t.numel()]);
            (t.dtype(), t.to_vec::<T>().unwrap())
        }
        v => panic!("not a tensor: {v:?}"),
    }
}

#[test]
fn values_map_to_the_data_model() {
    let text = br#"{"i": -3, "big": 18446744073709551615, "f": 1.5, "whole": 2.0, "e": 1e3, "s": "h\u00e9\n", "t": true, "n": null, "ints": [1, 2, 3], "mixed": [1, 2.5], "strs": ["a", 1], "empty": [], "nested": [[1, 2], [3]], "obj": {"b": 1, "a": [true, null]}}"#;
    let mut r = open(text, 4096);
    let s = r.next().unwrap().unwrap();
    assert_eq!(s.get("i"), Some(&Value::Int(-3)));
    assert_eq!(s.get("big"), Some(&Value::Float(18446744073709551615.0)));
    assert_eq!(s.get("f"), Some(&Value::Float(1.5)));
    assert_eq!(s.get("whole"), Some(&Value::Float(2.0)));
    assert_eq!(s.get("e"), Some(&Value::Float(1000.0)));
    assert_eq!(s.get("s").and_then(Value::as_str), Some("hé\n"));
    assert_eq!(s.get("t"), Some(&Value::Int(1)));
    assert_eq!(s.get("n"), Some(&Value::Null));
    assert_eq!(
        tensor::<i64>(s.get("ints").unwrap()),
        (DType::I64, vec![1, 2, 3])
    );
    assert_eq!(
        tensor::<f64>(s.get("mixed").unwrap()),
        (DType::F64, vec![1.0, 2.5])
    );
    assert_eq!(
        s.get("strs"),
        Some(&Value::List(vec!["a".into(), Value::Int(1)]))
    );
    assert_eq!(s.get("empty"), Some(&Value::List(vec![])));
    match s.get("nested").unwrap() {
        Value::List(l) => {
            assert_eq!(l.len(), 2);
            assert_eq!(tensor::<i64>(&l[1]), (DType::I64, vec![3]));
        }
        v => panic!("{v:?}"),
    }
    assert_eq!(
        s.get("obj").and_then(Value::as_str),
        Some(r#"{"b":1,"a":[true,null]}"#)
    );
    assert_eq!(
        s.names().collect::<Vec<_>>(),
        [
            "i", "big", "f", "whole", "e", "s", "t", "n", "ints", "mixed", "strs", "empty",
            "nested", "obj"
        ]
    );
    assert!(r.next().unwrap().is_none());
    assert_eq!(r.record(), 1);
}

fn sample_text() -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(b"\xEF\xBB\xBF{\"a\": 1, \"b\": \"x\"}\r\n");
    t.extend_from_slice(b"\n   \r\n");
    for i in 0..50 {
        t.extend_from_slice(
            format!(
                "{{\"a\": {i}, \"b\": \"r\u{e9}w {i} with \\\"quotes\\\" and \\n\", \"v\": [{i}.5, 2], \"o\": {{\"k\": [{i}]}}}}\n"
            )
            .as_bytes(),
        );
    }
    t.extend_from_slice(b"{\"a\": -1, \"last\": \"no newline\"}");
    t
}

#[test]
fn chunk_boundaries_do_not_matter() {
    let text = sample_text();
    let reference: Vec<Sample> = drain(&mut *open(&text, 4096))
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(reference.len(), 52);
    assert_eq!(reference[0].get("a"), Some(&Value::Int(1)));
    assert_eq!(reference[0].names().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(
        reference[51].get("last").and_then(Value::as_str),
        Some("no newline")
    );
    assert_eq!(
        reference[3].get("b").and_then(Value::as_str),
        Some("r\u{e9}w 2 with \"quotes\" and \n")
    );
    assert_eq!(
        reference[3].get("o").and_then(Value::as_str),
        Some(r#"{"k":[2]}"#)
    );
    for chunk in [1, 3, 7, text.len()] {
        let got: Vec<Sample> = drain(&mut *open(&text, chunk))
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(got, reference, "chunks of {chunk}");
    }
}

#[test]
fn a_bad_line_names_offset_and_record_and_reading_goes_on() {
    let text = b"{\"a\":1}\nnot json\n[1,2]\n{\"a\":2} trailing\n\n{\"a\":3}\n";
    for chunk in [1, 3, 4096] {
        let mut r = open(text, chunk);
        let out = drain(&mut *r);
        assert_eq!(out.len(), 5, "chunks of {chunk}");
        assert_eq!(out[0].as_ref().unwrap().get("a"), Some(&Value::Int(1)));
        let errs: Vec<(u64, u64)> = out[1..4]
            .iter()
            .map(|r| {
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.kind, ErrorKind::Record);
                assert_eq!(e.object.as_deref(), Some(URL));
                assert_eq!(e.stage.as_deref(), Some("jsonl"));
                (e.offset.unwrap(), e.record.unwrap())
            })
            .collect();
        assert_eq!(errs, [(8, 1), (17, 2), (23, 3)]);
        let msg = out[1].as_ref().unwrap_err().to_string();
        assert!(
            msg.contains(URL) && msg.contains("record 1") && msg.contains("byte 8"),
            "{msg}"
        );
        assert!(out[2]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("JSON object"));
        assert_eq!(out[4].as_ref().unwrap().get("a"), Some(&Value::Int(3)));
        assert_eq!(r.record(), 5);
    }
}

#[test]
fn skip_drops_records() {
    let text = sample_text();
    let all: Vec<Sample> = drain(&mut *open(&text, 4096))
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let mut r = open(&text, 5);
    r.skip(10).unwrap();
    assert_eq!(r.record(), 10);
    assert_eq!(r.next().unwrap().unwrap(), all[10]);
}
