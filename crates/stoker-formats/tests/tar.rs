//! The tar reader against shards written by webdataset's `TarWriter` and Python's
//! `tarfile`, and against what webdataset's reader makes of them
//! (`tests/fixtures/make_fixtures.py`).

mod common;

use std::path::PathBuf;

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::Value as Json;
use stoker_core::{Error, ErrorKind, Sample, Value};
use stoker_formats::tar::{base_plus_ext, Tar};
use stoker_formats::{Format, Input, RecordReader, ShardInfo};

fn fixture(name: &str) -> Bytes {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Bytes::from(std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

fn expected() -> Json {
    serde_json::from_slice(&fixture("expected.json")).unwrap()
}

/// `data` as a stream of `chunk`-byte chunks (one chunk for 0).
use common::chunked_bytes as cursor;

fn open(url: &str, data: &Bytes, chunk: usize) -> Box<dyn RecordReader> {
    Tar.open(
        &ShardInfo::new(url, url),
        Input::Stream(cursor(data, chunk)),
    )
    .unwrap()
}

/// Every result up to the end (an error is followed by what comes after it).
fn read_all(url: &str, data: &Bytes, chunk: usize) -> Vec<Result<Sample, Error>> {
    let mut r = open(url, data, chunk);
    let out = common::drain(&mut *r);
    assert_eq!(r.record(), out.len() as u64);
    out
}

fn samples(url: &str, data: &Bytes, chunk: usize) -> Vec<Sample> {
    read_all(url, data, chunk)
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A sample as webdataset's reader output is stored: `[name, value]` pairs, bytes as hex.
fn to_json(s: &Sample) -> Json {
    Json::Array(
        s.iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::Bytes(b) => Json::String(hex(b)),
                    Value::Str(s) => Json::String(s.to_string()),
                    other => panic!("unexpected {other:?}"),
                };
                Json::Array(vec![Json::String(k.to_string()), v])
            })
            .collect(),
    )
}

#[test]
fn shards_read_like_webdataset() {
    let exp = expected();
    let shards = exp["tar"]["shards"].as_object().unwrap();
    assert_eq!(shards.len(), 4);
    for (name, want) in shards {
        let got: Vec<Json> = samples(name, &fixture(name), 0)
            .iter()
            .map(to_json)
            .collect();
        assert_eq!(&Json::Array(got), want, "{name}");
    }
}

#[test]
fn names_split_like_webdataset() {
    let exp = expected();
    for case in exp["tar"]["base_plus_ext"].as_array().unwrap() {
        let name = case[0].as_str().unwrap();
        let want = case[1].as_str().map(|k| (k, case[2].as_str().unwrap()));
        assert_eq!(base_plus_ext(name), want, "{name:?}");
    }
}

#[test]
fn payloads_are_slices_of_the_chunks() {
    let data = fixture("wds.tar");
    let range = data.as_ptr_range();
    for s in samples("wds.tar", &data, 0) {
        for (k, v) in s.iter() {
            if let Value::Bytes(b) = v {
                assert!(
                    b.is_empty() || range.contains(&b.as_ptr()),
                    "{k} was copied"
                );
            }
        }
    }
}

#[test]
fn chunk_boundaries_do_not_matter() {
    for name in ["wds.tar", "gnu.tar", "ustar.tar", "pax.tar"] {
        let data = fixture(name);
        let whole = samples(name, &data, 0);
        for chunk in [1, 7, 512, 4096] {
            assert_eq!(
                samples(name, &data, chunk),
                whole,
                "{name} in {chunk}-byte chunks"
            );
        }
    }
}

#[test]
fn skip_then_next_equals_reading_on() {
    let data = fixture("wds.tar");
    let all = samples("wds.tar", &data, 0);
    for n in 0..=all.len() as u64 + 1 {
        for chunk in [0, 7] {
            let mut r = open("wds.tar", &data, chunk);
            r.skip(n).unwrap();
            assert_eq!(r.record(), n.min(all.len() as u64));
            let got = r.next().unwrap();
            assert_eq!(got.as_ref(), all.get(n as usize), "skip {n}");
        }
    }
}

/// The error of a corrupted shard: names object, offset and record; the shard ends.
fn shard_error(data: &Bytes, chunk: usize) -> (usize, Error) {
    let out = read_all("s3://b/bad.tar", data, chunk);
    let n = out.iter().position(Result::is_err).expect("an error");
    assert_eq!(n + 1, out.len(), "the error ends the shard");
    let e = out[n].clone().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Record);
    assert_eq!(e.object.as_deref(), Some("s3://b/bad.tar"));
    assert_eq!(e.stage.as_deref(), Some("tar"));
    assert_eq!(e.record, Some(n as u64));
    (n, e)
}

#[test]
fn a_truncated_member_is_an_error() {
    let data = fixture("wds.tar");
    // train/0003.seg.png: header at 9216, 440 bytes of payload at 9728.
    let cut = data.slice(..9728 + 100);
    for chunk in [0, 7] {
        let (n, e) = shard_error(&cut, chunk);
        assert_eq!(n, 2);
        assert_eq!(e.offset, Some(9216));
        assert!(e.message.contains("train/0003.seg.png"), "{e}");
        assert!(e.message.contains("truncated"), "{e}");
    }
}

#[test]
fn a_truncated_header_is_an_error() {
    let data = fixture("wds.tar");
    let cut = data.slice(..8192 + 100);
    let (n, e) = shard_error(&cut, 0);
    assert_eq!(n, 2);
    assert_eq!(e.offset, Some(8192));
    assert!(e.to_string().contains("truncated tar"), "{e}");
}

#[test]
fn a_bad_checksum_is_an_error() {
    let mut data = fixture("wds.tar").to_vec();
    data[8192 + 3] ^= 0x20; // the name of train/0003.jpg's header
    let (n, e) = shard_error(&Bytes::from(data), 0);
    assert_eq!(n, 2);
    assert_eq!(e.offset, Some(8192));
    assert!(e.message.contains("checksum"), "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "bad record in tar, s3://b/bad.tar record 2 at byte 8192: {}",
            e.message
        )
    );
}

#[test]
fn a_bad_size_field_is_an_error() {
    let mut t = TarOut::default();
    t.member("a.txt", b"x");
    let mut data = t.finish();
    data[124..136].copy_from_slice(b"0000000x001\0");
    set_checksum(&mut data[..512]);
    let (n, e) = shard_error(&Bytes::from(data), 0);
    assert_eq!((n, e.offset), (0, Some(0)));
    assert!(e.message.contains("size"), "{e}");
}

#[test]
fn an_empty_object_is_not_a_tar() {
    let (_, e) = shard_error(&Bytes::new(), 0);
    assert!(e.message.contains("empty"), "{e}");
    // An archive with no members is fine, and so is one that ends without zero blocks.
    assert!(samples("t", &Bytes::from(vec![0u8; 1024]), 0).is_empty());
    let mut t = TarOut::default();
    t.member("a.txt", b"x");
    let data = Bytes::from(t.finish());
    assert_eq!(samples("t", &data.slice(..1024), 0).len(), 1);
    assert_eq!(samples("t", &data.slice(..513), 0).len(), 1);
}

#[test]
fn a_duplicate_field_fails_that_sample_only() {
    let mut t = TarOut::default();
    t.member("a.txt", b"1");
    t.member("a.TXT", b"2");
    t.member("a.cls", b"3");
    t.member("b.txt", b"4");
    let data = Bytes::from(t.finish());
    let out = read_all("s3://b/dup.tar", &data, 0);
    assert_eq!(out.len(), 2);
    let e = out[0].clone().unwrap_err();
    assert_eq!((e.record, e.offset), (Some(0), Some(1024)));
    assert!(e.message.contains("duplicate field \"txt\""), "{e}");
    let s = out[1].as_ref().unwrap();
    assert_eq!(s.key(), Some("b"));
    assert_eq!(s.get("txt").and_then(Value::as_bytes), Some(&b"4"[..]));
    // Skipping counts the failed sample as one record too.
    let mut r = open("t", &data, 0);
    r.skip(1).unwrap();
    assert_eq!(r.next().unwrap().unwrap().key(), Some("b"));
}

#[test]
fn gnu_long_names_and_base256_sizes() {
    let long = format!("{}/k.seg.PNG", "d".repeat(150));
    let mut t = TarOut {
        base256: true,
        ..TarOut::default()
    };
    t.member(&long, b"long");
    t.member("k2.txt", &[7u8; 1000]);
    let data = Bytes::from(t.finish());
    for chunk in [0, 1, 100] {
        let s = samples("t", &data, chunk);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].key(), Some(&long[..long.len() - 8]));
        assert_eq!(
            s[0].get("seg.png").and_then(Value::as_bytes),
            Some(&b"long"[..])
        );
        assert_eq!(
            s[1].get("txt").and_then(Value::as_bytes),
            Some(&[7u8; 1000][..])
        );
    }
}

#[test]
fn pax_sizes_and_skipped_members() {
    let mut t = TarOut::default();
    // A PAX size overrides the header's; a directory, a symlink and a FIFO are skipped.
    t.raw_header(
        "ignored.txt",
        999,
        b'x',
        Some(b"10 size=3\n16 path=p/q.txt\n".to_vec()),
    );
    t.data(b"abc");
    t.raw_header("p/", 0, b'5', None);
    t.raw_header("p/q.jpg", 0, b'2', None);
    t.raw_header("p/fifo.x", 0, b'6', None);
    t.member("p/q.cls", b"1");
    let data = Bytes::from(t.finish());
    let s = samples("t", &data, 0);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].key(), Some("p/q"));
    assert_eq!(
        s[0].names().collect::<Vec<_>>(),
        ["__key__", "__url__", "txt", "cls"]
    );
    assert_eq!(s[0].get("txt").and_then(Value::as_bytes), Some(&b"abc"[..]));
}

/// A minimal ustar writer (GNU long names past 100 bytes).
#[derive(Default)]
struct TarOut {
    out: Vec<u8>,
    /// Write sizes in GNU base-256 rather than octal.
    base256: bool,
}

fn set_checksum(h: &mut [u8]) {
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

impl TarOut {
    fn header(&mut self, name: &[u8], size: u64, typeflag: u8) {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name);
        h[100..108].copy_from_slice(b"0000644\0");
        h[108..116].copy_from_slice(b"0000000\0");
        h[116..124].copy_from_slice(b"0000000\0");
        if self.base256 {
            h[124] = 0x80;
            h[128..136].copy_from_slice(&size.to_be_bytes());
        } else {
            h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        }
        h[136..148].copy_from_slice(b"14533241400\0");
        h[156] = typeflag;
        h[257..265].copy_from_slice(b"ustar\x0000");
        set_checksum(&mut h);
        self.out.extend_from_slice(&h);
    }

    fn data(&mut self, d: &[u8]) {
        self.out.extend_from_slice(d);
        self.out.resize(self.out.len().next_multiple_of(512), 0);
    }

    fn raw_header(&mut self, name: &str, size: u64, typeflag: u8, ext: Option<Vec<u8>>) {
        if let Some(e) = ext {
            self.header(b"PaxHeader", e.len() as u64, typeflag);
            self.data(&e);
            self.header(name.as_bytes(), size, b'0');
        } else {
            self.header(name.as_bytes(), size, typeflag);
        }
    }

    fn member(&mut self, name: &str, data: &[u8]) {
        if name.len() > 100 {
            self.header(b"././@LongLink", name.len() as u64 + 1, b'L');
            let mut n = name.as_bytes().to_vec();
            n.push(0);
            self.data(&n);
            self.header(&name.as_bytes()[..100], data.len() as u64, b'0');
        } else {
            self.header(name.as_bytes(), data.len() as u64, b'0');
        }
        self.data(data);
    }

    fn finish(mut self) -> Vec<u8> {
        self.out.extend_from_slice(&[0u8; 1024]);
        self.out
    }
}

type Fields = Vec<(String, Vec<u8>)>;

fn sample_strategy() -> impl Strategy<Value = (String, Fields)> {
    let key = "[a-z0-9]{1,6}(/[a-z0-9._]{1,8}){0,2}/[a-z0-9_-]{1,12}";
    let fields = proptest::collection::btree_map(
        "[a-z]{1,4}(\\.[a-z0-9]{1,3})?",
        proptest::collection::vec(any::<u8>(), 0..1500),
        1..4,
    );
    (key, fields).prop_map(|(k, f)| (k, f.into_iter().collect()))
}

proptest! {
    #[test]
    fn random_samples_read_back(
        samples_in in proptest::collection::vec(sample_strategy(), 0..6),
        chunk in 1usize..2000,
        base256 in any::<bool>(),
    ) {
        // Consecutive samples need distinct keys to stay apart.
        let mut want: Vec<(String, Fields)> = Vec::new();
        for (k, f) in samples_in {
            if want.last().is_none_or(|(last, _)| *last != k) {
                want.push((k, f));
            }
        }
        let mut t = TarOut { base256, ..TarOut::default() };
        for (k, fields) in &want {
            for (f, d) in fields {
                t.member(&format!("{k}.{f}"), d);
            }
        }
        let data = Bytes::from(t.finish());
        let got = samples("s3://b/p.tar", &data, chunk);
        prop_assert_eq!(got.len(), want.len());
        for (s, (k, fields)) in got.iter().zip(&want) {
            prop_assert_eq!(s.key(), Some(k.as_str()));
            prop_assert_eq!(s.get("__url__").and_then(Value::as_str), Some("s3://b/p.tar"));
            prop_assert_eq!(s.len(), fields.len() + 2);
            for (f, d) in fields {
                prop_assert_eq!(s.get(f).and_then(Value::as_bytes), Some(&d[..]));
            }
        }
    }
}
