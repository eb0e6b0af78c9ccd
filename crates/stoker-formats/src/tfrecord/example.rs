//! `tf.train.Example`: a hand-written decoder and encoder for the few messages involved.
//!
//! ```text
//! Example   { Features features = 1; }
//! Features  { map<string, Feature> feature = 1; }
//! Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//!                          Int64List int64_list = 3; } }
//! BytesList { repeated bytes value = 1; }
//! FloatList { repeated float value = 1 [packed = true]; }
//! Int64List { repeated int64 value = 1 [packed = true]; }
//! ```
//!
//! Decoding follows protobuf's rules: unknown fields are skipped, repeated scalars are
//! accepted packed or not, a message field seen twice is merged, a map key seen twice
//! keeps its last value, and the last `kind` set wins.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use stoker_core::{DType, Error, Sample, Tensor, Value};

use crate::tar::Interner;

/// The values of one feature, for [`encode_example`].
#[derive(Debug, Clone, PartialEq)]
pub enum FeatureValue {
    /// A `BytesList`.
    Bytes(Vec<Vec<u8>>),
    /// A `FloatList`.
    Float(Vec<f32>),
    /// An `Int64List`.
    Int64(Vec<i64>),
}

/// Serializes a `tf.train.Example` with `features`, byte for byte as TensorFlow does with
/// deterministic serialization (`SerializeToString(deterministic=True)`, which sorts map
/// entries by key; TensorFlow's C++ writers iterate the map in an unspecified order, so
/// only deterministic output can be reproduced). Features are written sorted by name;
/// give each name once. Repeated numbers are packed and every map entry carries both its
/// key and value, as protobuf writes them. No features gives the empty Example (zero
/// bytes), as `tf.train.Example().SerializeToString()` does.
///
/// Read back with [`TfRecord::parse_examples`](super::TfRecord::parse_examples), a
/// feature with one value becomes `Bytes`, `Float` (the `f32` widened) or `Int`; with
/// several, a `List` of `Bytes`, a 1-D `f32` tensor or a 1-D `i64` tensor; with none (or
/// no kind set), an empty `List`. Fields come sorted by name.
pub fn encode_example(features: &[(&str, FeatureValue)]) -> Vec<u8> {
    if features.is_empty() {
        return Vec::new();
    }
    let mut sorted: Vec<&(&str, FeatureValue)> = features.iter().collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let entry_len = |(name, v): &(&str, FeatureValue)| {
        let f = feature_len(v);
        field_len(name.len()) + field_len(f)
    };
    let features_len: usize = sorted.iter().map(|e| field_len(entry_len(e))).sum();
    let mut out = Vec::with_capacity(field_len(features_len));
    put_tag_len(&mut out, 1, features_len); // Example.features
    for e in sorted {
        let (name, v) = e;
        put_tag_len(&mut out, 1, entry_len(e)); // Features.feature (a map entry)
        put_tag_len(&mut out, 1, name.len()); // key
        out.extend_from_slice(name.as_bytes());
        put_tag_len(&mut out, 2, feature_len(v)); // value: Feature
        match v {
            FeatureValue::Bytes(vs) => {
                put_tag_len(&mut out, 1, vs.iter().map(|b| field_len(b.len())).sum());
                for b in vs {
                    put_tag_len(&mut out, 1, b.len());
                    out.extend_from_slice(b);
                }
            }
            FeatureValue::Float(vs) => {
                put_tag_len(&mut out, 2, list_len(v));
                if !vs.is_empty() {
                    put_tag_len(&mut out, 1, 4 * vs.len());
                    for f in vs {
                        out.extend_from_slice(&f.to_le_bytes());
                    }
                }
            }
            FeatureValue::Int64(vs) => {
                put_tag_len(&mut out, 3, list_len(v));
                if !vs.is_empty() {
                    put_tag_len(&mut out, 1, vs.iter().map(|&i| varint_len(i as u64)).sum());
                    for &i in vs {
                        put_varint(&mut out, i as u64);
                    }
                }
            }
        }
    }
    out
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A length-delimited field of `len` bytes, tag included (tags here are one byte).
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_tag_len(out: &mut Vec<u8>, field: u8, len: usize) {
    out.push(field << 3 | 2);
    put_varint(out, len as u64);
}

/// The body of a BytesList / FloatList / Int64List.
fn list_len(v: &FeatureValue) -> usize {
    match v {
        FeatureValue::Bytes(vs) => vs.iter().map(|b| field_len(b.len())).sum(),
        FeatureValue::Float(vs) if vs.is_empty() => 0,
        FeatureValue::Float(vs) => field_len(4 * vs.len()),
        FeatureValue::Int64(vs) if vs.is_empty() => 0,
        FeatureValue::Int64(vs) => field_len(vs.iter().map(|&i| varint_len(i as u64)).sum()),
    }
}

/// The body of a Feature.
fn feature_len(v: &FeatureValue) -> usize {
    field_len(list_len(v))
}

/// A protobuf reader over `buf[pos..end]`.
struct Pb<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

fn malformed(what: impl std::fmt::Display) -> Error {
    Error::record(format!("malformed tf.train.Example: {what}"))
}

impl<'a> Pb<'a> {
    fn new(buf: &'a [u8], r: Range<usize>) -> Pb<'a> {
        Pb {
            buf,
            pos: r.start,
            end: r.end,
        }
    }

    fn more(&self) -> bool {
        self.pos < self.end
    }

    fn varint(&mut self) -> Result<u64, Error> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let Some(&b) = self.buf[..self.end].get(self.pos) else {
                return Err(malformed(format!("varint cut short at byte {}", self.pos)));
            };
            self.pos += 1;
            v |= u64::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(malformed(format!(
            "varint longer than 10 bytes at byte {}",
            self.pos
        )))
    }

    /// The next field's number and wire type.
    fn key(&mut self) -> Result<(u64, u8), Error> {
        let k = self.varint()?;
        Ok((k >> 3, (k & 7) as u8))
    }

    fn take(&mut self, n: usize) -> Result<Range<usize>, Error> {
        let start = self.pos;
        if n > self.end - start {
            return Err(malformed(format!(
                "a field of {n} bytes at byte {start} runs past its message"
            )));
        }
        self.pos += n;
        Ok(start..self.pos)
    }

    fn len_delimited(&mut self) -> Result<Range<usize>, Error> {
        let n = self.varint()?;
        self.take(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn skip(&mut self, wire: u8) -> Result<(), Error> {
        match wire {
            VARINT => self.varint().map(drop),
            I64 => self.take(8).map(drop),
            LEN => self.len_delimited().map(drop),
            I32 => self.take(4).map(drop),
            w => Err(malformed(format!(
                "unsupported wire type {w} at byte {}",
                self.pos
            ))),
        }
    }

    /// A field known to be length-delimited.
    fn expect_len(&mut self, wire: u8, what: &str) -> Result<Range<usize>, Error> {
        if wire != LEN {
            return Err(malformed(format!("{what} has wire type {wire}")));
        }
        self.len_delimited()
    }
}

/// One map entry: its name and its Feature's kind, with the list bodies of that kind.
struct Entry {
    name: Range<usize>,
    /// 0 (no kind), 1 bytes, 2 float, 3 int64.
    kind: u64,
    /// Indices into `Decoder::parts`.
    parts: Range<usize>,
}

/// Decodes Examples, reusing its buffers from record to record.
#[derive(Default)]
pub(crate) struct Decoder {
    entries: Vec<Entry>,
    parts: Vec<Range<usize>>,
    ints: Vec<i64>,
    floats: Vec<f32>,
    names: Interner,
}

impl Decoder {
    /// The sample of one serialized Example.
    pub(crate) fn decode(&mut self, data: &Bytes) -> Result<Sample, Error> {
        self.entries.clear();
        self.parts.clear();
        let buf = &data[..];
        let mut ex = Pb::new(buf, 0..buf.len());
        while ex.more() {
            match ex.key()? {
                (1, w) => {
                    let r = ex.expect_len(w, "Example.features")?;
                    self.features(buf, r)?;
                }
                (_, w) => ex.skip(w)?,
            }
        }
        // Sorted by name, the last entry of a name winning (sort_by is stable).
        self.entries
            .sort_by(|a, b| buf[a.name.clone()].cmp(&buf[b.name.clone()]));
        let mut s = Sample::with_capacity(self.entries.len());
        for i in 0..self.entries.len() {
            let e = &self.entries[i];
            if self
                .entries
                .get(i + 1)
                .is_some_and(|n| buf[n.name.clone()] == buf[e.name.clone()])
            {
                continue;
            }
            let name = std::str::from_utf8(&buf[e.name.clone()])
                .map_err(|_| malformed("a feature name that is not UTF-8"))?;
            let name: Arc<str> = self.names.get(name);
            let value = self.value(data, i)?;
            s.insert(name, value);
        }
        Ok(s)
    }

    fn features(&mut self, buf: &[u8], r: Range<usize>) -> Result<(), Error> {
        let mut fs = Pb::new(buf, r);
        while fs.more() {
            match fs.key()? {
                (1, w) => {
                    let r = fs.expect_len(w, "Features.feature")?;
                    let mut entry = Pb::new(buf, r);
                    let mut name = 0..0;
                    let start = self.parts.len();
                    let mut kind = 0;
                    while entry.more() {
                        match entry.key()? {
                            (1, w) => name = entry.expect_len(w, "a feature name")?,
                            (2, w) => {
                                // A repeated value field is merged into one Feature.
                                let r = entry.expect_len(w, "a Feature")?;
                                kind = self.feature(buf, r, kind, start)?;
                            }
                            (_, w) => entry.skip(w)?,
                        }
                    }
                    let parts = start..self.parts.len();
                    self.entries.push(Entry { name, kind, parts });
                }
                (_, w) => fs.skip(w)?,
            }
        }
        Ok(())
    }

    /// Reads a Feature into `kind` and the parts from `start` on.
    fn feature(
        &mut self,
        buf: &[u8],
        r: Range<usize>,
        mut kind: u64,
        start: usize,
    ) -> Result<u64, Error> {
        let mut f = Pb::new(buf, r);
        while f.more() {
            match f.key()? {
                (k @ 1..=3, w) => {
                    let r = f.expect_len(w, "a Feature's list")?;
                    if k != kind {
                        // Another member of the oneof replaces the previous one.
                        self.parts.truncate(start);
                        kind = k;
                    }
                    self.parts.push(r);
                }
                (_, w) => f.skip(w)?,
            }
        }
        Ok(kind)
    }

    fn value(&mut self, data: &Bytes, i: usize) -> Result<Value, Error> {
        let buf = &data[..];
        let e = &self.entries[i];
        let parts = &self.parts[e.parts.clone()];
        match e.kind {
            1 => {
                let mut vs = Vec::new();
                for p in parts {
                    let mut l = Pb::new(buf, p.clone());
                    while l.more() {
                        match l.key()? {
                            (1, w) => {
                                let r = l.expect_len(w, "a BytesList value")?;
                                vs.push(Value::Bytes(data.slice(r)));
                            }
                            (_, w) => l.skip(w)?,
                        }
                    }
                }
                Ok(match vs.len() {
                    1 => vs.pop().expect("one value"),
                    _ => Value::List(vs),
                })
            }
            2 => {
                self.floats.clear();
                let mut packed = None;
                let mut runs = 0;
                for p in parts {
                    let mut l = Pb::new(buf, p.clone());
                    while l.more() {
                        match l.key()? {
                            (1, LEN) => {
                                let r = l.len_delimited()?;
                                if r.len() % 4 != 0 {
                                    return Err(malformed(format!(
                                        "packed floats of {} bytes",
                                        r.len()
                                    )));
                                }
                                self.floats.extend(
                                    buf[r.clone()]
                                        .chunks_exact(4)
                                        .map(|c| f32::from_le_bytes(c.try_into().expect("4"))),
                                );
                                packed = Some(r);
                                runs += 1;
                            }
                            (1, I32) => {
                                let r = l.take(4)?;
                                self.floats
                                    .push(f32::from_le_bytes(buf[r].try_into().expect("4")));
                                runs += 2;
                            }
                            (1, w) => return Err(malformed(format!("a float with wire type {w}"))),
                            (_, w) => l.skip(w)?,
                        }
                    }
                }
                Ok(match (self.floats.len(), packed) {
                    (0, _) => Value::List(Vec::new()),
                    (1, _) => Value::Float(f64::from(self.floats[0])),
                    // One packed run: the tensor is a slice of the record.
                    (n, Some(r)) if runs == 1 => {
                        Value::Tensor(Tensor::new(DType::F32, vec![n], data.slice(r))?)
                    }
                    (n, _) => Value::Tensor(Tensor::from_slice(vec![n], &self.floats)?),
                })
            }
            3 => {
                self.ints.clear();
                for p in parts {
                    let mut l = Pb::new(buf, p.clone());
                    while l.more() {
                        match l.key()? {
                            (1, LEN) => {
                                let r = l.len_delimited()?;
                                let mut v = Pb::new(buf, r);
                                while v.more() {
                                    self.ints.push(v.varint()? as i64);
                                }
                            }
                            (1, VARINT) => self.ints.push(l.varint()? as i64),
                            (1, w) => {
                                return Err(malformed(format!("an int64 with wire type {w}")))
                            }
                            (_, w) => l.skip(w)?,
                        }
                    }
                }
                Ok(match self.ints.len() {
                    0 => Value::List(Vec::new()),
                    1 => Value::Int(self.ints[0]),
                    n => Value::Tensor(Tensor::from_slice(vec![n], &self.ints)?),
                })
            }
            _ => Ok(Value::List(Vec::new())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(b: &[u8]) -> Result<Sample, Error> {
        Decoder::default().decode(&Bytes::copy_from_slice(b))
    }

    #[test]
    fn varint_lengths() {
        for v in [0u64, 1, 127, 128, 16383, 16384, u64::MAX, 1 << 63] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            assert_eq!(Pb::new(&out, 0..out.len()).varint().unwrap(), v);
        }
    }

    /// Hand-encoded: unpacked floats and ints, a kind-less feature, an unknown field,
    /// a repeated key (last wins), a Feature merged from two fields, and oneof switching.
    #[test]
    fn protobuf_rules() {
        let feature = |kind: u8, body: &[u8]| {
            let mut f = vec![kind << 3 | 2, body.len() as u8];
            f.extend_from_slice(body);
            f
        };
        let floats = feature(2, &[0x0d, 0, 0, 0x80, 0x3f, 0x0d, 0, 0, 0, 0x40]); // 1.0, 2.0
        let ints = feature(3, &[0x08, 0x05, 0x08, 0x7f, 0x0a, 0x01, 0x03]); // 5, 127, [3]
        let bytes_a = feature(1, &[0x0a, 0x01, b'a']);
        let bytes_b = feature(1, &[0x0a, 0x01, b'b']);
        let entry = |name: &str, value: &[u8]| {
            let mut e = vec![0x0a, name.len() as u8];
            e.extend_from_slice(name.as_bytes());
            e.extend_from_slice(&[0x12, value.len() as u8]);
            e.extend_from_slice(value);
            let mut out = vec![0x0a, e.len() as u8];
            out.extend(e);
            out
        };
        let mut features = Vec::new();
        features.extend(entry("f", &floats));
        features.extend(entry("i", &ints));
        features.extend(entry("none", &[]));
        features.extend(entry("dup", &bytes_a));
        features.extend(entry("dup", &[bytes_b.clone(), bytes_a.clone()].concat()));
        features.extend(entry("switch", &[bytes_b.clone(), ints.clone()].concat()));
        features.extend_from_slice(&[0x10, 0x01]); // unknown varint field
        let mut ex = vec![0x0a, features.len() as u8];
        ex.extend(features);
        ex.extend_from_slice(&[0x1a, 0x00]); // unknown field of the Example
        let s = decode(&ex).unwrap();
        assert_eq!(
            s.names().collect::<Vec<_>>(),
            ["dup", "f", "i", "none", "switch"]
        );
        assert_eq!(
            s.get("f"),
            Some(&Value::Tensor(
                Tensor::from_slice(vec![2], &[1.0f32, 2.0]).unwrap()
            ))
        );
        let i = Value::Tensor(Tensor::from_slice(vec![3], &[5i64, 127, 3]).unwrap());
        assert_eq!(s.get("i"), Some(&i));
        assert_eq!(s.get("switch"), Some(&i));
        assert_eq!(s.get("none"), Some(&Value::List(vec![])));
        assert_eq!(
            s.get("dup"),
            Some(&Value::List(vec![
                Value::Bytes(Bytes::from_static(b"b")),
                Value::Bytes(Bytes::from_static(b"a"))
            ]))
        );
    }

    #[test]
    fn malformed_protos_are_record_errors() {
        for bad in [
            &[0x0a, 0x05, 0x0a][..],   // runs past the record
            &[0x0a, 0x02, 0x0b, 0x00], // group wire type
            &[0x0a],                   // key without a value
            &[
                0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
            &[
                0x0a, 0x09, 0x0a, 0x07, 0x0a, 0x01, 0xff, 0x12, 0x02, 0x12, 0x00,
            ], // name not UTF-8
            &[
                0x0a, 0x0b, 0x0a, 0x09, 0x0a, 0x01, b'x', 0x12, 0x04, 0x12, 0x02, 0x0a, 0x01,
            ],
        ] {
            let e = decode(bad).unwrap_err();
            assert_eq!(e.kind, stoker_core::ErrorKind::Record, "{bad:?}");
            assert!(e.message.starts_with("malformed tf.train.Example"), "{e}");
        }
    }
}
