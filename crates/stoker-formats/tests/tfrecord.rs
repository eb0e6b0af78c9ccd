//! The TFRecord reader and writer against files written by `tf.io.TFRecordWriter`, and
//! against what TensorFlow reads from them (`tests/fixtures/make_fixtures.py`).

mod common;

use std::path::PathBuf;

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::Value as Json;
use stoker_core::{Error, ErrorKind, Sample, Tensor, Value};
use stoker_formats::tfrecord::{encode_example, write_record, FeatureValue, TfRecord};
use stoker_formats::{Format, Input, RecordReader, ShardInfo};

fn fixture(name: &str) -> Bytes {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Bytes::from(std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

fn expected() -> Json {
    serde_json::from_slice::<Json>(&fixture("expected.json")).unwrap()["tfrecord"].clone()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `data` as a stream of `chunk`-byte chunks (one chunk for 0).
use common::chunked_bytes as cursor;

const URL: &str = "s3://b/train-0.tfrecord";

fn open(parse: bool, data: &Bytes, chunk: usize) -> Box<dyn RecordReader> {
    TfRecord {
        parse_examples: parse,
    }
    .open(
        &ShardInfo::new("train-0.tfrecord", URL),
        Input::Stream(cursor(data, chunk)),
    )
    .unwrap()
}

/// Every result up to the end.
fn read_all(parse: bool, data: &Bytes, chunk: usize) -> Vec<Result<Sample, Error>> {
    let mut r = open(parse, data, chunk);
    let out = common::drain(&mut *r);
    assert_eq!(r.record(), out.len() as u64);
    assert!(r.next().unwrap().is_none());
    out
}

fn samples(parse: bool, data: &Bytes, chunk: usize) -> Vec<Sample> {
    read_all(parse, data, chunk)
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

fn raw_sample(d: &[u8]) -> Sample {
    [("data", Value::Bytes(Bytes::copy_from_slice(d)))]
        .into_iter()
        .collect()
}

/// A feature as `make_fixtures.py` stores it (`{"kind", "values"}`), as Stoker maps it.
fn expected_value(f: &Json) -> Value {
    let vals = f["values"].as_array().unwrap();
    match (f["kind"].as_str().unwrap(), vals.len()) {
        (_, 0) => Value::List(vec![]),
        ("bytes", 1) => Value::Bytes(unhex(vals[0].as_str().unwrap()).into()),
        ("bytes", _) => Value::List(
            vals.iter()
                .map(|v| Value::Bytes(unhex(v.as_str().unwrap()).into()))
                .collect(),
        ),
        ("float", 1) => Value::Float(vals[0].as_f64().unwrap()),
        ("float", n) => {
            let v: Vec<f32> = vals.iter().map(|v| v.as_f64().unwrap() as f32).collect();
            Value::Tensor(Tensor::from_slice(vec![n], &v).unwrap())
        }
        ("int64", 1) => Value::Int(vals[0].as_i64().unwrap()),
        ("int64", n) => {
            let v: Vec<i64> = vals.iter().map(|v| v.as_i64().unwrap()).collect();
            Value::Tensor(Tensor::from_slice(vec![n], &v).unwrap())
        }
        (k, _) => panic!("kind {k}"),
    }
}

fn feature_value(f: &Json) -> FeatureValue {
    let vals = f["values"].as_array().unwrap();
    match f["kind"].as_str().unwrap() {
        "bytes" => FeatureValue::Bytes(vals.iter().map(|v| unhex(v.as_str().unwrap())).collect()),
        "float" => FeatureValue::Float(vals.iter().map(|v| v.as_f64().unwrap() as f32).collect()),
        "int64" => FeatureValue::Int64(vals.iter().map(|v| v.as_i64().unwrap()).collect()),
        k => panic!("kind {k}"),
    }
}

#[test]
fn raw_records_read_like_tensorflow() {
    let exp = expected();
    let data = fixture("raw.tfrecord");
    let want: Vec<Sample> = exp["raw.tfrecord"]["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| raw_sample(&unhex(r.as_str().unwrap())))
        .collect();
    assert_eq!(want.len(), 4);
    assert_eq!(samples(false, &data, 0), want);
    // Zero-copy: the data is a slice of the chunk.
    let range = data.as_ptr_range();
    for s in samples(false, &data, 0) {
        let b = s.get("data").and_then(Value::as_bytes).unwrap();
        assert!(b.is_empty() || range.contains(&b.as_ptr()));
    }
}

#[test]
fn examples_decode_like_tensorflow() {
    let exp = expected();
    let data = fixture("examples.tfrecord");
    let got = samples(true, &data, 0);
    let want = exp["examples.tfrecord"]["examples"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    for (s, w) in got.iter().zip(want) {
        let w: Sample = w
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, f)| (k.as_str(), expected_value(f)))
            .collect();
        assert_eq!(s, &w);
        // Sorted by name.
        let names: Vec<&str> = s.names().collect();
        assert!(names.is_sorted(), "{names:?}");
    }
    // The raw records are TF's serialized Examples.
    let records: Vec<Sample> = exp["examples.tfrecord"]["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| raw_sample(&unhex(r.as_str().unwrap())))
        .collect();
    assert_eq!(samples(false, &data, 0), records);
}

#[test]
fn the_writer_reproduces_tensorflows_file() {
    let exp = expected();
    let mut out = Vec::new();
    for ex in exp["examples.tfrecord"]["written"].as_array().unwrap() {
        let features: Vec<(&str, FeatureValue)> = ex
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, f)| (k.as_str(), feature_value(f)))
            .collect();
        write_record(&mut out, &encode_example(&features));
    }
    assert_eq!(out, fixture("examples.tfrecord"));
    // So does the framing alone, for records that are not Examples.
    let mut raw = Vec::new();
    for r in exp["raw.tfrecord"]["records"].as_array().unwrap() {
        write_record(&mut raw, &unhex(r.as_str().unwrap()));
    }
    assert_eq!(raw, fixture("raw.tfrecord"));
}

#[test]
fn chunk_boundaries_do_not_matter() {
    for (name, parse) in [
        ("examples.tfrecord", true),
        ("examples.tfrecord", false),
        ("raw.tfrecord", false),
    ] {
        let data = fixture(name);
        let whole = samples(parse, &data, 0);
        for chunk in [1, 7, 512, 4096] {
            assert_eq!(
                samples(parse, &data, chunk),
                whole,
                "{name} in {chunk}-byte chunks"
            );
        }
    }
}

#[test]
fn skip_then_next_equals_reading_on() {
    for parse in [false, true] {
        let data = fixture("examples.tfrecord");
        let all = samples(parse, &data, 0);
        for n in 0..=all.len() as u64 + 1 {
            let mut r = open(parse, &data, 3);
            r.skip(n).unwrap();
            assert_eq!(r.record(), n.min(all.len() as u64));
            assert_eq!(r.next().unwrap().as_ref(), all.get(n as usize), "skip {n}");
        }
    }
}

/// Offsets of the records of `data`.
fn record_offsets(data: &[u8]) -> Vec<usize> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < data.len() {
        out.push(at);
        at += 16 + u64::from_le_bytes(data[at..at + 8].try_into().unwrap()) as usize;
    }
    out
}

fn check_error(e: &Error, record: u64, offset: usize, says: &str) {
    assert_eq!(e.kind, ErrorKind::Record);
    assert_eq!(e.object.as_deref(), Some(URL));
    assert_eq!(e.stage.as_deref(), Some("tfrecord"));
    assert_eq!(e.record, Some(record));
    assert_eq!(e.offset, Some(offset as u64));
    assert!(e.message.contains(says), "{e}");
}

#[test]
fn a_bad_length_crc_ends_the_object() {
    let mut data = fixture("raw.tfrecord").to_vec();
    let at = record_offsets(&data)[2];
    data[at + 9] ^= 1;
    let out = read_all(false, &Bytes::from(data), 0);
    assert_eq!(out.len(), 3);
    assert!(out[0].is_ok() && out[1].is_ok());
    let e = out[2].as_ref().unwrap_err();
    check_error(e, 2, at, "bad CRC of the record length");
    assert_eq!(
        e.to_string(),
        format!(
            "bad record in tfrecord, {URL} record 2 at byte {at}: {}",
            e.message
        )
    );
}

#[test]
fn a_bad_data_crc_fails_that_record_only() {
    let clean = fixture("examples.tfrecord");
    let offsets = record_offsets(&clean);
    for (which, byte) in [(1, 12 + 5), (0, 12 + 0x40 + 1), (3, 12)] {
        // A flipped data byte, or (for the empty last record) a flipped data CRC byte.
        let mut data = clean.to_vec();
        data[offsets[which] + byte] ^= 0x10;
        let data = Bytes::from(data);
        for parse in [false, true] {
            let want = samples(parse, &clean, 0);
            for chunk in [0, 7] {
                let out = read_all(parse, &data, chunk);
                assert_eq!(out.len(), want.len());
                for (i, (r, w)) in out.iter().zip(&want).enumerate() {
                    if i == which {
                        check_error(
                            r.as_ref().unwrap_err(),
                            i as u64,
                            offsets[i],
                            "bad CRC of the record data",
                        );
                    } else {
                        assert_eq!(r.as_ref().unwrap(), w);
                    }
                }
            }
        }
    }
}

#[test]
fn a_truncated_record_ends_the_object() {
    let data = fixture("raw.tfrecord");
    let offsets = record_offsets(&data);
    for (cut, what) in [
        (offsets[2] + 5, "of 12 header bytes"),
        (offsets[2] + 12 + 100, "truncated record of 512 bytes"),
        (data.len() - 2, "truncated record of 7 bytes"),
    ] {
        let out = read_all(false, &data.slice(..cut), 7);
        let n = out.len() - 1;
        assert!(out[..n].iter().all(Result::is_ok));
        check_error(out[n].as_ref().unwrap_err(), n as u64, offsets[n], what);
    }
}

#[test]
fn a_malformed_example_fails_that_record_only() {
    // raw.tfrecord: "not an example", "", 512 bytes 0..255, "\x0a\x05trunc".
    let out = read_all(true, &fixture("raw.tfrecord"), 0);
    let offsets = record_offsets(&fixture("raw.tfrecord"));
    assert_eq!(out.len(), 4);
    for i in [0, 2, 3] {
        check_error(
            out[i].as_ref().unwrap_err(),
            i as u64,
            offsets[i],
            "malformed tf.train.Example",
        );
    }
    assert_eq!(out[1].as_ref().unwrap(), &Sample::new());
}

fn feature_strategy() -> impl Strategy<Value = FeatureValue> {
    prop_oneof![
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4)
            .prop_map(FeatureValue::Bytes),
        proptest::collection::vec(any::<f32>().prop_filter("NaN", |f| !f.is_nan()), 0..6)
            .prop_map(FeatureValue::Float),
        proptest::collection::vec(any::<i64>(), 0..6).prop_map(FeatureValue::Int64),
    ]
}

fn as_value(f: &FeatureValue) -> Value {
    match f {
        FeatureValue::Bytes(v) if v.len() == 1 => Value::Bytes(v[0].clone().into()),
        FeatureValue::Bytes(v) if !v.is_empty() => {
            Value::List(v.iter().map(|b| Value::Bytes(b.clone().into())).collect())
        }
        FeatureValue::Float(v) if v.len() == 1 => Value::Float(f64::from(v[0])),
        FeatureValue::Float(v) if !v.is_empty() => {
            Value::Tensor(Tensor::from_slice(vec![v.len()], v).unwrap())
        }
        FeatureValue::Int64(v) if v.len() == 1 => Value::Int(v[0]),
        FeatureValue::Int64(v) if !v.is_empty() => {
            Value::Tensor(Tensor::from_slice(vec![v.len()], v).unwrap())
        }
        _ => Value::List(vec![]),
    }
}

proptest! {
    #[test]
    fn written_examples_read_back(
        examples in proptest::collection::vec(
            proptest::collection::btree_map("[a-z_/]{0,12}", feature_strategy(), 0..5),
            0..5,
        ),
        chunk in 1usize..300,
    ) {
        let mut file = Vec::new();
        for ex in &examples {
            let features: Vec<(&str, FeatureValue)> =
                ex.iter().rev().map(|(k, v)| (k.as_str(), v.clone())).collect();
            write_record(&mut file, &encode_example(&features));
        }
        let got = samples(true, &Bytes::from(file), chunk);
        prop_assert_eq!(got.len(), examples.len());
        for (s, ex) in got.iter().zip(&examples) {
            let want: Sample = ex.iter().map(|(k, v)| (k.as_str(), as_value(v))).collect();
            prop_assert_eq!(s, &want);
        }
    }
}
