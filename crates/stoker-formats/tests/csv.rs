//! CSV over chunked streams.

mod common;

use stoker_core::{ErrorKind, Sample, Value};
use stoker_formats::csv::Csv;
use stoker_formats::{Format, Input, RecordReader, ShardInfo};

const URL: &str = "s3://bucket/data.csv";

fn open_with(f: Csv, data: &[u8], chunk: usize) -> Box<dyn RecordReader> {
    let cursor = common::chunked(data, chunk);
    f.open(&ShardInfo::new("data.csv", URL), Input::Stream(cursor))
        .unwrap()
}

use common::drain;

fn rows(f: Csv, data: &[u8], chunk: usize) -> Vec<Sample> {
    drain(&mut *open_with(f, data, chunk))
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

fn s(v: &str) -> Value {
    Value::Str(v.into())
}

#[test]
fn header_names_and_inferred_types() {
    let text = b"id,score,name,note\n1,2.5,alice,\n-7,1e3,\"bob, jr.\",x\n";
    let got = rows(Csv::default(), text, 4096);
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[0].names().collect::<Vec<_>>(),
        ["id", "score", "name", "note"]
    );
    assert_eq!(got[0].get("id"), Some(&Value::Int(1)));
    assert_eq!(got[0].get("score"), Some(&Value::Float(2.5)));
    assert_eq!(got[0].get("name"), Some(&s("alice")));
    assert_eq!(got[0].get("note"), Some(&Value::Null));
    assert_eq!(got[1].get("id"), Some(&Value::Int(-7)));
    assert_eq!(got[1].get("score"), Some(&Value::Float(1000.0)));
    assert_eq!(got[1].get("name"), Some(&s("bob, jr.")));
    // One name per column, shared by every row.
    let name = |i: usize| got[i].iter().next().unwrap().0.clone();
    assert!(std::sync::Arc::ptr_eq(&name(0), &name(1)));

    let plain = Csv {
        infer_types: false,
        ..Csv::default()
    };
    let got = rows(plain, text, 4096);
    assert_eq!(got[0].get("id"), Some(&s("1")));
    assert_eq!(got[0].get("note"), Some(&s("")));
}

#[test]
fn quoted_fields_hold_delimiters_newlines_and_quotes() {
    let text =
        "a,b\r\n\"x, y\",\"line 1\r\nline 2\nline \"\"3\"\"\"\r\nplain,\"\"\r\n\"caf\u{e9}\",last";
    let got = rows(Csv::default(), text.as_bytes(), 4096);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].get("a"), Some(&s("x, y")));
    assert_eq!(got[0].get("b"), Some(&s("line 1\r\nline 2\nline \"3\"")));
    assert_eq!(got[1].get("a"), Some(&s("plain")));
    assert_eq!(got[1].get("b"), Some(&Value::Null));
    assert_eq!(got[2].get("a"), Some(&s("caf\u{e9}")));
    assert_eq!(got[2].get("b"), Some(&s("last")));
}

#[test]
fn no_header_tabs_and_a_bom() {
    let f = Csv {
        delimiter: b'\t',
        has_header: false,
        infer_types: true,
    };
    let got = rows(f, b"\xEF\xBB\xBF1\tx\t2.0\n3\ty\t\n", 4096);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].names().collect::<Vec<_>>(), ["c0", "c1", "c2"]);
    assert_eq!(got[0].get("c0"), Some(&Value::Int(1)));
    assert_eq!(got[0].get("c2"), Some(&Value::Float(2.0)));
    assert_eq!(got[1].get("c2"), Some(&Value::Null));

    let got = rows(Csv::default(), b"\xEF\xBB\xBFk,,k\n1,2,3\n", 4096);
    assert_eq!(got[0].names().collect::<Vec<_>>(), ["k", "c1", "c2"]);
}

fn big_text() -> Vec<u8> {
    let mut t = b"id,text,value\n".to_vec();
    for i in 0..300 {
        match i % 5 {
            0 => t.extend_from_slice(format!("{i},\"multi\nline, {i}\",{i}.25\r\n").as_bytes()),
            1 => t.extend_from_slice(format!("{i},\"say \"\"hi\"\"\",\n").as_bytes()),
            2 => t.extend_from_slice(format!("{i},caf\u{e9} {i},-{i}\n").as_bytes()),
            3 => t.extend_from_slice(format!("{i},{},1\n", "long ".repeat(i)).as_bytes()),
            _ => t.extend_from_slice(format!("{i},,-inf\n").as_bytes()),
        }
    }
    t.extend_from_slice(b"300,\"no newline at the end\",0");
    t
}

#[test]
fn chunk_boundaries_do_not_matter() {
    let text = big_text();
    let reference = rows(Csv::default(), &text, 4096);
    assert_eq!(reference.len(), 301);
    assert_eq!(reference[5].get("text"), Some(&s("multi\nline, 5")));
    assert_eq!(reference[5].get("value"), Some(&Value::Float(5.25)));
    assert_eq!(reference[6].get("text"), Some(&s("say \"hi\"")));
    assert_eq!(reference[7].get("value"), Some(&Value::Int(-7)));
    assert_eq!(
        reference[300].get("text"),
        Some(&s("no newline at the end"))
    );
    for chunk in [1, 3, 7, 1000, text.len()] {
        assert!(
            rows(Csv::default(), &text, chunk) == reference,
            "chunks of {chunk}"
        );
    }
}

#[test]
fn a_row_with_the_wrong_field_count_is_an_error_and_reading_goes_on() {
    let text = b"a,b\n1,2\n3\n4,5,6\n\"7\",8\n";
    for chunk in [1, 3, 4096] {
        let mut r = open_with(Csv::default(), text, chunk);
        let out = drain(&mut *r);
        assert_eq!(out.len(), 4, "chunks of {chunk}");
        assert_eq!(out[0].as_ref().unwrap().get("b"), Some(&Value::Int(2)));
        let e = out[1].as_ref().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Record);
        assert_eq!((e.offset, e.record), (Some(8), Some(1)));
        let msg = e.to_string();
        assert!(
            msg.contains(URL) && msg.contains("1 fields") && msg.contains("header has 2"),
            "{msg}"
        );
        let e = out[2].as_ref().unwrap_err();
        assert_eq!((e.offset, e.record), (Some(10), Some(2)));
        assert_eq!(out[3].as_ref().unwrap().get("a"), Some(&Value::Int(7)));
        assert_eq!(r.record(), 4);
    }
}

#[test]
fn offsets_count_crlf_line_ends() {
    let text = b"a,b\r\n1,2\r\n3\r\n\r\n4,5\r\n6\r\n";
    for chunk in [1, 2, 4096] {
        let out = drain(&mut *open_with(Csv::default(), text, chunk));
        let errs: Vec<(Option<u64>, Option<u64>)> = out
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| (e.offset, e.record)))
            .collect();
        assert_eq!(
            errs,
            [(Some(10), Some(1)), (Some(20), Some(3))],
            "chunks of {chunk}"
        );
        assert_eq!(out[2].as_ref().unwrap().get("b"), Some(&Value::Int(5)));
    }
}

#[test]
fn skip_drops_rows() {
    let text = big_text();
    let all = rows(Csv::default(), &text, 4096);
    let mut r = open_with(Csv::default(), &text, 13);
    r.skip(100).unwrap();
    assert_eq!(r.record(), 100);
    assert_eq!(r.next().unwrap().unwrap(), all[100]);
}

#[test]
fn an_unterminated_quote_is_an_error_naming_its_offset() {
    // Issue 23: a quote that never closes used to take the rest of the object as one field,
    // silently (200,002 rows read as 2 samples, none skipped).
    let mut text = b"id,text\n1,ok\n2,\"never closed\n".to_vec();
    let open = text.iter().position(|&b| b == b'"').unwrap() as u64;
    for i in 3..2000 {
        text.extend_from_slice(format!("{i},row {i}\n").as_bytes());
    }
    for chunk in [1, 7, 4096, text.len()] {
        let mut r = open_with(Csv::default(), &text, chunk);
        let out = drain(&mut *r);
        assert_eq!(out.len(), 2, "chunks of {chunk}");
        assert_eq!(out[0].as_ref().unwrap().get("text"), Some(&s("ok")));
        let e = out[1].as_ref().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Record);
        assert_eq!((e.offset, e.record), (Some(open), Some(1)));
        let msg = e.to_string();
        assert!(
            msg.contains(URL)
                && msg.contains("unterminated quote")
                && msg.contains(&format!("byte {open} (line 3)")),
            "{msg}"
        );
        // The failed row counts as one record, and the object ends there.
        assert_eq!(r.record(), 2);
        assert!(r.next().unwrap().is_none());
    }
    // Counting records agrees with reading them.
    let shard = ShardInfo::new("data.csv", URL);
    let n = Csv::default()
        .count_records(&shard, Input::Stream(common::chunked(&text, 100)))
        .unwrap();
    assert_eq!(n, 2);

    // In the header, and at the very end of the object, too.
    for (text, at) in [(&b"a,\"b\n1,2\n"[..], 2), (&b"a,b\n1,\""[..], 6)] {
        let out = drain(&mut *open_with(Csv::default(), text, 3));
        let e = out.last().unwrap().as_ref().unwrap_err();
        assert_eq!(e.offset, Some(at), "{e}");
    }
    // A closing quote as the last byte, doubled quotes and quotes inside unquoted fields
    // are fine.
    let got = rows(Csv::default(), b"a,b\nx\"y,\"p\"\"q\"\n1,\"end\"", 2);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].get("a"), Some(&s("x\"y")));
    assert_eq!(got[0].get("b"), Some(&s("p\"q")));
    assert_eq!(got[1].get("b"), Some(&s("end")));
}
