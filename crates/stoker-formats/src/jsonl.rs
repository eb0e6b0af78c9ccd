//! JSON Lines: every non-empty line is one JSON object, one sample.
//!
//! The object's keys become fields (one shared `Arc<str>` per distinct key, looked up
//! without allocating), its values:
//!
//! | JSON | value |
//! |---|---|
//! | a number written without fraction or exponent that fits `i64` | `Int` |
//! | any other number (`1.0`, `1e3`, `2^64`) | `Float` |
//! | a string | `Str` |
//! | `true` / `false` | `Int` 1 / 0 |
//! | `null` | `Null` |
//! | a non-empty array of numbers | a 1-D `Tensor`: `int64` when all are `Int`, else `float64` |
//! | any other array (empty, mixed, nested) | `List` of the element values |
//! | an object (at any depth) | `Str` holding its compact JSON, keys in their order |
//!
//! Lines end with `\n` or `\r\n`; the last may have neither, and lines holding only
//! whitespace are skipped (they are not records). A UTF-8 byte order mark at the start of
//! the object is ignored. A line that is not a JSON object is an [`Error::record`] naming
//! the object, the line's byte offset and the record index; the next call goes on with the
//! next line. Of repeated keys in one object, the last wins.

use std::collections::HashSet;
use std::fmt::{self, Write as _};
use std::sync::Arc;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use stoker_core::{Error, Sample, Tensor, Value};

use crate::format::{locate, Format, RecordReader, ShardInfo};
use crate::input::{ChunkCursor, Input};

/// At most this many distinct keys are remembered (so that objects keyed by ids do not
/// grow the table forever); keys past it are allocated per row.
const MAX_NAMES: usize = 4096;

/// JSON Lines.
#[derive(Debug, Clone, Copy, Default)]
pub struct Jsonl;

impl Format for Jsonl {
    fn name(&self) -> &'static str {
        "jsonl"
    }

    fn open(&self, shard: &ShardInfo, input: Input) -> Result<Box<dyn RecordReader>, Error> {
        match input {
            Input::Stream(cursor) => Ok(Box::new(JsonlReader {
                shard: shard.clone(),
                cursor,
                record: 0,
                names: Names::default(),
            })),
            Input::Random(_) => Err(Error::invalid("jsonl reads a stream, not random access")
                .with_stage("jsonl")
                .with_object(shard.url.clone())),
        }
    }
}

struct JsonlReader {
    shard: ShardInfo,
    cursor: ChunkCursor,
    record: u64,
    names: Names,
}

impl RecordReader for JsonlReader {
    fn next(&mut self) -> Result<Option<Sample>, Error> {
        loop {
            let start = self.cursor.offset();
            let line = match self.cursor.read_until(b'\n') {
                Ok(Some(l)) => l,
                Ok(None) => return Ok(None),
                Err(e) => {
                    return Err(locate(e.into(), "jsonl", &self.shard, start, self.record));
                }
            };
            let mut body = &line[..];
            if let Some(b) = body.strip_suffix(b"\n") {
                body = b.strip_suffix(b"\r").unwrap_or(b);
            }
            if start == 0 {
                body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
            }
            if body.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let record = self.record;
            self.record += 1;
            let mut de = serde_json::Deserializer::from_slice(body);
            let parsed = RowSeed(&mut self.names)
                .deserialize(&mut de)
                .and_then(|s| de.end().map(|()| s));
            return match parsed {
                Ok(s) => Ok(Some(s)),
                Err(e) => Err(locate(
                    Error::record(format!("the line is not one JSON object: {e}")),
                    "jsonl",
                    &self.shard,
                    start,
                    record,
                )),
            };
        }
    }

    fn record(&self) -> u64 {
        self.record
    }
}

/// Field names seen so far.
#[derive(Default)]
struct Names {
    /// The previous row's keys in order: rows of one shape hit here first.
    prev: Vec<Arc<str>>,
    all: HashSet<Arc<str>>,
}

impl Names {
    fn intern(&mut self, pos: usize, key: &str) -> Arc<str> {
        if let Some(p) = self.prev.get(pos) {
            if &**p == key {
                return p.clone();
            }
        }
        let name = match self.all.get(key) {
            Some(n) => n.clone(),
            None => {
                let n: Arc<str> = key.into();
                if self.all.len() < MAX_NAMES {
                    self.all.insert(n.clone());
                }
                n
            }
        };
        if pos < self.prev.len() {
            self.prev[pos] = name.clone();
        } else if pos == self.prev.len() {
            self.prev.push(name.clone());
        }
        name
    }
}

/// A whole line: an object, as a sample.
struct RowSeed<'a>(&'a mut Names);

impl<'de> DeserializeSeed<'de> for RowSeed<'_> {
    type Value = Sample;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Sample, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RowSeed<'_> {
    type Value = Sample;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Sample, A::Error> {
        let mut s = Sample::with_capacity(self.0.prev.len());
        let mut pos = 0;
        while let Some(name) = map.next_key_seed(KeySeed(&mut *self.0, pos))? {
            let v = map.next_value_seed(ValueSeed)?;
            s.insert(name, v);
            pos += 1;
        }
        Ok(s)
    }
}

/// A key, interned.
struct KeySeed<'a>(&'a mut Names, usize);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Arc<str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Arc<str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Arc<str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: serde::de::Error>(self, k: &str) -> Result<Arc<str>, E> {
        Ok(self.0.intern(self.1, k))
    }
}

/// Any JSON value, as a [`Value`].
struct ValueSeed;

impl<'de> DeserializeSeed<'de> for ValueSeed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Int(i64::from(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::Float(v as f64), Value::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.into()))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element_seed(ValueSeed)? {
            items.push(v);
        }
        Ok(array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        let mut out = String::new();
        Compact(&mut out).visit_map(map)?;
        Ok(Value::Str(out.into()))
    }
}

/// An array: a tensor when every element is a number.
fn array(items: Vec<Value>) -> Value {
    if items.is_empty() {
        return Value::List(items);
    }
    let mut floats = false;
    for v in &items {
        match v {
            Value::Int(_) => {}
            Value::Float(_) => floats = true,
            _ => return Value::List(items),
        }
    }
    let n = items.len();
    let t = if floats {
        let v: Vec<f64> = items
            .iter()
            .map(|v| match v {
                Value::Int(i) => *i as f64,
                Value::Float(f) => *f,
                _ => unreachable!("numbers only"),
            })
            .collect();
        Tensor::from_slice(vec![n], &v)
    } else {
        let v: Vec<i64> = items.iter().filter_map(Value::as_int).collect();
        Tensor::from_slice(vec![n], &v)
    };
    t.map_or(Value::List(items), Value::Tensor)
}

/// Writes a JSON value back out compactly (no whitespace), keys in their order.
struct Compact<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for Compact<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Compact<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.0.push_str(if v { "true" } else { "false" });
        Ok(())
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        let _ = write!(self.0, "{v}");
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        let _ = write!(self.0, "{v}");
        Ok(())
    }
    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        match serde_json::Number::from_f64(v) {
            Some(n) => {
                let _ = write!(self.0, "{n}");
            }
            None => self.0.push_str("null"),
        }
        Ok(())
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        quote(self.0, v);
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.push_str("null");
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.push('[');
        let mut first = true;
        loop {
            let mark = self.0.len();
            if !first {
                self.0.push(',');
            }
            if seq.next_element_seed(Compact(&mut *self.0))?.is_none() {
                self.0.truncate(mark);
                break;
            }
            first = false;
        }
        self.0.push(']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.0.push('{');
        let mut first = true;
        while let Some(k) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !first {
                self.0.push(',');
            }
            first = false;
            quote(self.0, &k);
            self.0.push(':');
            map.next_value_seed(Compact(&mut *self.0))?;
        }
        self.0.push('}');
        Ok(())
    }
}

/// Appends `s` as a JSON string.
fn quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn read_all(text: &'static str) -> Vec<Result<Sample, Error>> {
        let shard = ShardInfo::new("a.jsonl", "mem://a.jsonl");
        let mut r = Jsonl
            .open(
                &shard,
                Input::Stream(ChunkCursor::from_bytes(Bytes::from_static(text.as_bytes()))),
            )
            .unwrap();
        let mut out = Vec::new();
        loop {
            match r.next() {
                Ok(Some(s)) => out.push(Ok(s)),
                Ok(None) => break,
                Err(e) => out.push(Err(e)),
            }
        }
        out
    }

    #[test]
    fn nested_objects_become_compact_json_in_order() {
        let rows = read_all("{\"o\": {\"z\": [1, 2.5, \"q\\\"\"], \"a\": {\"b\": null}}}\n");
        let s = rows[0].as_ref().unwrap();
        assert_eq!(
            s.get("o").and_then(Value::as_str),
            Some(r#"{"z":[1,2.5,"q\""],"a":{"b":null}}"#)
        );
    }

    #[test]
    fn field_names_are_shared_across_rows() {
        let rows = read_all("{\"a\":1,\"b\":2}\n{\"b\":3,\"a\":4}\n{\"a\":5}\n");
        let name = |i: usize, f: &str| {
            let s: &Sample = rows[i].as_ref().unwrap();
            s.iter().find(|(k, _)| &***k == f).unwrap().0.clone()
        };
        assert!(Arc::ptr_eq(&name(0, "a"), &name(1, "a")));
        assert!(Arc::ptr_eq(&name(0, "b"), &name(1, "b")));
        assert!(Arc::ptr_eq(&name(0, "a"), &name(2, "a")));
    }
}
