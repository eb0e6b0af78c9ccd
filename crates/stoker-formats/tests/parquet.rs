//! Parquet against files pyarrow wrote (tests/fixtures, made by make_parquet_fixtures.py).

mod common;

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use stoker_core::{DType, Error, ErrorKind, Sample, Value};
use stoker_formats::parquet::Parquet;
use stoker_formats::{Access, Format, Input, RandomAccess, RecordReader, ShardInfo};

const URL: &str = "s3://bucket/table.parquet";

fn fixture(name: &str) -> Bytes {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .into()
}

fn expected() -> Vec<serde_json::Map<String, serde_json::Value>> {
    let text = fixture("table.expected.json");
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_object().unwrap().clone())
        .collect()
}

fn shard() -> ShardInfo {
    ShardInfo::new("table.parquet", URL)
}

fn open(
    file: Arc<dyn RandomAccess>,
    columns: Option<&[&str]>,
) -> Result<Box<dyn RecordReader>, Error> {
    let f = Parquet {
        columns: columns.map(|c| c.iter().map(|s| s.to_string()).collect()),
    };
    assert_eq!(f.access(), Access::Random);
    f.open(&shard(), Input::Random(file))
}

use common::drain;

fn read_all(file: Bytes, columns: Option<&[&str]>) -> Vec<Sample> {
    let mut r = open(Arc::new(file), columns).unwrap();
    drain(&mut *r).into_iter().map(Result::unwrap).collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Checks one decoded value against the expected JSON.
fn check(field: &str, got: &Value, want: &serde_json::Value, row: usize) {
    let ctx = format!("row {row}, field {field}: got {got:?}, want {want}");
    match (field, want) {
        (_, serde_json::Value::Null) => assert_eq!(got, &Value::Null, "{ctx}"),
        ("payload", w) => match got {
            Value::Bytes(b) => assert_eq!(&b[..], &hex(w.as_str().unwrap())[..], "{ctx}"),
            _ => panic!("{ctx}"),
        },
        ("vec", serde_json::Value::Array(items)) if items.iter().any(|v| v.is_null()) => {
            let want: Vec<Value> = items
                .iter()
                .map(|v| v.as_f64().map_or(Value::Null, Value::Float))
                .collect();
            assert_eq!(got, &Value::List(want), "{ctx}");
        }
        ("vec", serde_json::Value::Array(items)) => match got {
            Value::Tensor(t) => {
                assert_eq!(t.dtype(), DType::F32, "{ctx}");
                assert_eq!(t.shape(), &[items.len()], "{ctx}");
                let want: Vec<f32> = items.iter().map(|v| v.as_f64().unwrap() as f32).collect();
                assert_eq!(t.to_vec::<f32>().unwrap(), want, "{ctx}");
            }
            _ => panic!("{ctx}"),
        },
        (_, serde_json::Value::Bool(b)) => assert_eq!(got, &Value::Int(i64::from(*b)), "{ctx}"),
        (_, serde_json::Value::String(s)) => assert_eq!(got.as_str(), Some(s.as_str()), "{ctx}"),
        (_, serde_json::Value::Number(n)) if n.is_i64() => {
            assert_eq!(got, &Value::Int(n.as_i64().unwrap()), "{ctx}")
        }
        (_, serde_json::Value::Number(n)) => {
            assert_eq!(got, &Value::Float(n.as_f64().unwrap()), "{ctx}")
        }
        _ => panic!("{ctx}: unexpected expectation"),
    }
}

fn check_rows(rows: &[Sample], fields: &[&str]) {
    let want = expected();
    assert_eq!(rows.len(), want.len());
    for (i, (s, w)) in rows.iter().zip(&want).enumerate() {
        assert_eq!(s.names().collect::<Vec<_>>(), fields, "row {i}");
        for f in fields {
            check(f, s.get(f).unwrap(), &w[*f], i);
        }
    }
}

const ALL: &[&str] = &[
    "id", "small", "score", "name", "payload", "flag", "vec", "maybe", "ts",
];

#[test]
fn snappy_and_zstd_files_decode_to_the_expected_rows() {
    for name in ["table.snappy.parquet", "table.zstd.parquet"] {
        let rows = read_all(fixture(name), None);
        check_rows(&rows, ALL);
    }
}

#[test]
fn field_names_are_shared_and_binary_is_not_copied() {
    let rows = read_all(fixture("table.snappy.parquet"), None);
    let name = |i: usize| rows[i].iter().next().unwrap().0.clone();
    assert!(Arc::ptr_eq(&name(0), &name(1)));
    assert!(Arc::ptr_eq(&name(0), &name(39)));
    // Rows of one batch slice one decoded buffer.
    let p = |i: usize| match rows[i].get("payload").unwrap() {
        Value::Bytes(b) => b.as_ptr() as usize,
        v => panic!("{v:?}"),
    };
    assert_eq!(p(1) - p(0), 160);
    assert_eq!(p(2) - p(1), 160);
}

/// Random access that records what was read.
struct Counting {
    inner: Bytes,
    reads: Mutex<Vec<(u64, u64)>>,
}

impl RandomAccess for Counting {
    fn len(&self) -> u64 {
        self.inner.len() as u64
    }
    fn read_range(&self, start: u64, end: u64) -> io::Result<Bytes> {
        self.reads.lock().unwrap().push((start, end));
        self.inner.read_range(start, end)
    }
}

#[test]
fn projection_returns_and_reads_only_the_asked_columns() {
    let data = fixture("table.snappy.parquet");
    let len = data.len() as u64;
    let meta_len = u64::from(u32::from_le_bytes(
        data[data.len() - 8..data.len() - 4].try_into().unwrap(),
    ));
    let data_end = len - 8 - meta_len;
    let file = Arc::new(Counting {
        inner: data,
        reads: Mutex::new(Vec::new()),
    });
    let mut r = open(file.clone(), Some(&["small"])).unwrap();
    let rows: Vec<Sample> = drain(&mut *r).into_iter().map(Result::unwrap).collect();
    check_rows(&rows, &["small"]);

    let reads = file.reads.lock().unwrap().clone();
    let total: u64 = reads.iter().map(|(s, e)| e - s).sum();
    let column_bytes: u64 = reads
        .iter()
        .filter(|(s, _)| *s < data_end)
        .map(|(s, e)| e - s)
        .sum();
    // The footer, then one small chunk per row group; never the payload.
    assert_eq!(reads.len(), 2 + 4, "{reads:?}");
    assert!(
        total < len / 2,
        "read {total} of {len} bytes for one int column: {reads:?}"
    );
    assert!(
        column_bytes < data_end / 10,
        "read {column_bytes} of {data_end} column bytes: {reads:?}"
    );
    assert!(reads.iter().all(|(s, e)| e - s < 1024 || *s >= data_end));

    // Asked order, not file order.
    let rows = read_all(
        fixture("table.zstd.parquet"),
        Some(&["maybe", "name", "small"]),
    );
    check_rows(&rows, &["maybe", "name", "small"]);
}

#[test]
fn an_unknown_column_is_invalid_and_lists_the_columns() {
    let e = open(
        Arc::new(fixture("table.snappy.parquet")),
        Some(&["small", "nope"]),
    )
    .err()
    .unwrap();
    assert_eq!(e.kind, ErrorKind::Invalid);
    let msg = e.to_string();
    assert!(msg.contains("\"nope\""), "{msg}");
    for c in ALL {
        assert!(msg.contains(c), "{msg}");
    }
    assert_eq!(e.object.as_deref(), Some(URL));
}

#[test]
fn skip_equals_reading_and_dropping() {
    let data = fixture("table.snappy.parquet");
    let all = read_all(data.clone(), None);
    for n in [0u64, 1, 5, 9, 10, 11, 19, 20, 25, 39, 40, 41, 100] {
        let mut r = open(Arc::new(data.clone()), None).unwrap();
        r.skip(n).unwrap();
        assert_eq!(r.record(), n.min(40), "skip {n}");
        let rest: Vec<Sample> = drain(&mut *r).into_iter().map(Result::unwrap).collect();
        assert_eq!(rest, all[(n as usize).min(40)..], "skip {n}");
        assert_eq!(r.record(), 40);
    }
    // Skips between reads, inside an open row group and across several.
    for (a, n) in [
        (3usize, 4u64),
        (3, 7),
        (3, 8),
        (3, 30),
        (12, 3),
        (12, 20),
        (10, 1),
    ] {
        let mut r = open(Arc::new(data.clone()), None).unwrap();
        for want in &all[..a] {
            assert_eq!(&r.next().unwrap().unwrap(), want);
        }
        r.skip(n).unwrap();
        let from = (a + n as usize).min(40);
        assert_eq!(r.record(), from as u64, "read {a}, skip {n}");
        let rest: Vec<Sample> = drain(&mut *r).into_iter().map(Result::unwrap).collect();
        assert_eq!(rest, all[from..], "read {a}, skip {n}");
    }
}

#[test]
fn skipping_whole_row_groups_fetches_nothing_of_them() {
    let file = Arc::new(Counting {
        inner: fixture("table.snappy.parquet"),
        reads: Mutex::new(Vec::new()),
    });
    let mut r = open(file.clone(), None).unwrap();
    r.skip(35).unwrap();
    assert_eq!(drain(&mut *r).len(), 5);
    // Footer (2 reads) and the last row group's chunks (adjacent: one read).
    assert_eq!(file.reads.lock().unwrap().len(), 3);
}

fn err_of(data: Vec<u8>) -> Error {
    let e = open(Arc::new(Bytes::from(data)), None)
        .err()
        .expect("an error");
    assert_eq!(e.kind, ErrorKind::Record, "{e}");
    assert_eq!(e.object.as_deref(), Some(URL), "{e}");
    assert_eq!(e.stage.as_deref(), Some("parquet"), "{e}");
    e
}

#[test]
fn broken_footers_are_named() {
    let good = fixture("table.snappy.parquet").to_vec();
    let n = good.len();

    let mut bad = good.clone();
    bad[n - 1] = b'X';
    let e = err_of(bad).to_string();
    assert!(e.contains("PAR1") && e.contains(URL), "{e}");

    let e = err_of(good[..n - 100].to_vec()).to_string();
    assert!(e.contains("PAR1"), "{e}");

    let mut bad = good.clone();
    bad[n - 8..n - 4].copy_from_slice(&(n as u32).to_le_bytes());
    let e = err_of(bad).to_string();
    assert!(e.contains("metadata") && e.contains("truncated"), "{e}");

    let mut bad = good.clone();
    let meta_len = u32::from_le_bytes(good[n - 8..n - 4].try_into().unwrap()) as usize;
    for b in &mut bad[n - 8 - meta_len..n - 8 - meta_len + 40] {
        *b = 0xff;
    }
    let e = err_of(bad).to_string();
    assert!(e.contains("metadata"), "{e}");

    let e = err_of(b"PAR1".to_vec()).to_string();
    assert!(e.contains("too short"), "{e}");
}

#[test]
fn a_truncated_column_chunk_is_named_and_other_groups_still_read() {
    let good = fixture("table.snappy.parquet");
    let n = good.len();
    let meta_len = u32::from_le_bytes(good[n - 8..n - 4].try_into().unwrap()) as usize;
    let data_end = n - 8 - meta_len;
    // Cut 1000 bytes out of the last row group's data, keeping the footer.
    let mut cut = good[..data_end - 1000].to_vec();
    cut.extend_from_slice(&good[data_end..]);
    let mut r = open(Arc::new(Bytes::from(cut)), None).unwrap();
    let out = drain(&mut *r);
    let ok = out.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 30, "three intact row groups");
    let e = out.iter().find_map(|r| r.as_ref().err()).unwrap();
    assert_eq!(e.kind, ErrorKind::Record);
    assert_eq!(e.record, Some(30));
    let msg = e.to_string();
    assert!(
        msg.contains(URL) && msg.contains("row group 3") && msg.contains("truncated"),
        "{msg}"
    );
    assert_eq!(r.record(), 40);
}

#[test]
fn a_corrupt_page_fails_its_row_group_only() {
    let good = fixture("table.snappy.parquet");
    let meta = parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(&good)
        .unwrap();
    let col = meta.row_group(1).column(3); // "name"
    let start = col
        .dictionary_page_offset()
        .unwrap_or(col.data_page_offset()) as usize;
    let end = start + col.compressed_size() as usize;
    let mut bad = good.to_vec();
    for b in &mut bad[start..end] {
        *b = 0;
    }
    let mut r = open(Arc::new(Bytes::from(bad)), None).unwrap();
    let out = drain(&mut *r);
    let errs: Vec<&Error> = out.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].record, Some(10));
    assert!(errs[0].to_string().contains("row group 1"), "{}", errs[0]);
    let ok: Vec<Sample> = out.into_iter().filter_map(Result::ok).collect();
    let all = read_all(good, None);
    assert_eq!(ok[..10], all[..10]);
    assert_eq!(ok[10..], all[20..]);
}

#[test]
fn a_stream_is_refused() {
    let e = Parquet::default()
        .open(
            &shard(),
            Input::Stream(stoker_formats::ChunkCursor::from_bytes(Bytes::new())),
        )
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::Invalid);
}

/// A file the `parquet` crate writes, for types pyarrow's fixture does not cover.
fn written_by_arrow_rs() -> Bytes {
    use arrow_array::builder::{FixedSizeListBuilder, Int16Builder, ListBuilder, StringBuilder};
    use arrow_array::types::Int32Type;
    use arrow_array::{
        ArrayRef, DictionaryArray, Int32Array, Int64Array, RecordBatch, StructArray, UInt64Array,
    };
    use arrow_schema::{DataType, Field};

    let mut words = ListBuilder::new(StringBuilder::new());
    words.values().append_value("a");
    words.values().append_value("b");
    words.append(true);
    words.append(false);
    words.append(true);
    let mut pairs = FixedSizeListBuilder::new(Int16Builder::new(), 2);
    for (x, y) in [(1, 2), (3, 4), (5, 6)] {
        pairs.values().append_value(x);
        pairs.values().append_value(y);
        pairs.append(true);
    }
    let cat: DictionaryArray<Int32Type> =
        vec![Some("cat"), None, Some("cat")].into_iter().collect();
    let st = StructArray::from(vec![(
        Arc::new(Field::new("a", DataType::Int32, false)),
        Arc::new(Int32Array::from(vec![1, 2, 3])) as ArrayRef,
    )]);
    let batch = RecordBatch::try_from_iter(vec![
        ("i", Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef),
        (
            "u",
            Arc::new(UInt64Array::from(vec![0, u64::MAX, 7])) as ArrayRef,
        ),
        ("cat", Arc::new(cat) as ArrayRef),
        ("words", Arc::new(words.finish()) as ArrayRef),
        ("pairs", Arc::new(pairs.finish()) as ArrayRef),
        ("st", Arc::new(st) as ArrayRef),
    ])
    .unwrap();
    let mut out = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    out.into()
}

#[test]
fn other_types_map_or_are_refused_by_name() {
    let data = written_by_arrow_rs();
    let e = open(Arc::new(data.clone()), None).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Invalid);
    let msg = e.to_string();
    assert!(msg.contains("\"st\"") && msg.contains("Struct"), "{msg}");

    let rows = read_all(data.clone(), Some(&["i", "cat", "words", "pairs"]));
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].get("cat").and_then(Value::as_str), Some("cat"));
    assert_eq!(rows[1].get("cat"), Some(&Value::Null));
    assert_eq!(
        rows[0].get("words"),
        Some(&Value::List(vec!["a".into(), "b".into()]))
    );
    assert_eq!(rows[1].get("words"), Some(&Value::Null));
    assert_eq!(rows[2].get("words"), Some(&Value::List(vec![])));
    match rows[2].get("pairs").unwrap() {
        Value::Tensor(t) => {
            assert_eq!(t.dtype(), DType::I16);
            assert_eq!(t.to_vec::<i16>().unwrap(), vec![5, 6]);
        }
        v => panic!("{v:?}"),
    }

    // A uint64 past i64::MAX fails its batch, naming the column.
    let mut r = open(Arc::new(data), Some(&["u"])).unwrap();
    let e = r.next().err().unwrap();
    assert_eq!(e.kind, ErrorKind::Record);
    assert!(e.to_string().contains("\"u\""), "{e}");
    assert!(r.next().unwrap().is_none());
    assert_eq!(r.record(), 3);
}

#[test]
fn a_dictionary_page_missing_is_an_error_not_a_panic() {
    // Found by fuzz/ (target parquet): two bytes of a page header swapped make a
    // dictionary-encoded page with no dictionary, on which the parquet crate panics.
    let mut data = fixture("table.zstd.parquet").to_vec();
    data.swap(15052, 15053);
    let file: Arc<dyn RandomAccess> = Arc::new(Bytes::from(data));
    let mut r = Parquet::default()
        .open(&shard(), Input::Random(file))
        .unwrap();
    let mut errors = Vec::new();
    for _ in 0..100_000 {
        match r.next() {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => errors.push(e),
        }
    }
    assert!(!errors.is_empty(), "the damaged page went unnoticed");
    let e = &errors[0];
    assert_eq!(e.kind, ErrorKind::Record);
    assert!(e.to_string().contains("malformed data"), "{e}");
}

#[test]
fn definition_levels_past_their_page_are_an_error_not_a_panic() {
    // Found by fuzz/ (target parquet, saved as a fixture): a page whose definition levels
    // run past its data, on which arrow-buffer panics ("offset + len out of bounds").
    let file: Arc<dyn RandomAccess> = Arc::new(fixture("fuzz-bad-def-levels.parquet"));
    for columnar in [false, true] {
        let p = Parquet::default();
        let mut errors = 0;
        if columnar {
            let mut c = p
                .open_columns(&shard(), Input::Random(file.clone()))
                .unwrap();
            for _ in 0..100_000 {
                match c.next_columns(1000) {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => errors += 1,
                }
            }
        } else {
            let mut r = p.open(&shard(), Input::Random(file.clone())).unwrap();
            for _ in 0..100_000 {
                match r.next() {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => errors += 1,
                }
            }
        }
        assert!(
            errors > 0,
            "columnar {columnar}: the damaged page went unnoticed"
        );
    }
}
