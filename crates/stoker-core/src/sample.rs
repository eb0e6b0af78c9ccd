//! Samples and batches.
//!
//! A [`Sample`] is a record of named fields, each a [`Value`]; field names are shared
//! (`Arc<str>`), so a million samples with the same fields hold one copy of each name. A
//! [`Batch`] holds each field stacked across samples (see [`Collate`]).

use std::sync::Arc;

use bytes::Bytes;

use crate::error::Error;
use crate::tensor::{DType, Tensor};

/// One field's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Raw bytes (usually a zero-copy slice of what storage returned).
    Bytes(Bytes),
    /// A tensor.
    Tensor(Tensor),
    /// Text.
    Str(Arc<str>),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A list of values (a tf.Example feature list, a ragged field).
    List(Vec<Value>),
    /// No value (a null in Parquet, JSON or CSV).
    Null,
}

impl Value {
    /// The kind, for messages: `bytes`, `tensor`, `str`, `int`, `float`, `list`, `null`.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Bytes(_) => "bytes",
            Value::Tensor(_) => "tensor",
            Value::Str(_) => "str",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::List(_) => "list",
            Value::Null => "null",
        }
    }

    /// Approximate bytes held (for memory accounting).
    pub fn size_bytes(&self) -> usize {
        match self {
            Value::Bytes(b) => b.len(),
            Value::Tensor(t) => t.data().len(),
            Value::Str(s) => s.len(),
            Value::Int(_) | Value::Float(_) | Value::Null => 8,
            Value::List(l) => l.iter().map(Value::size_bytes).sum::<usize>() + 8,
        }
    }

    /// The bytes of a `Bytes` value, or the UTF-8 of a `Str`.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            Value::Str(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// The text of a `Str` value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer of an `Int` value.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Str(s.into())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(s.into())
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Value {
        Value::Int(i)
    }
}
impl From<f64> for Value {
    fn from(f: f64) -> Value {
        Value::Float(f)
    }
}
impl From<Bytes> for Value {
    fn from(b: Bytes) -> Value {
        Value::Bytes(b)
    }
}
impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Tensor(t)
    }
}

/// A record of named fields, in insertion order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    fields: Vec<(Arc<str>, Value)>,
}

impl Sample {
    /// An empty sample.
    pub fn new() -> Sample {
        Sample::default()
    }

    /// With room for `n` fields.
    pub fn with_capacity(n: usize) -> Sample {
        Sample {
            fields: Vec::with_capacity(n),
        }
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields
            .iter()
            .find(|(k, _)| &**k == name)
            .map(|(_, v)| v)
    }

    /// The value of `name`, mutably.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Value> {
        self.fields
            .iter_mut()
            .find(|(k, _)| &**k == name)
            .map(|(_, v)| v)
    }

    /// The value of `name`, or an operator error saying which fields there are.
    pub fn require(&self, name: &str) -> Result<&Value, Error> {
        self.get(name).ok_or_else(|| {
            Error::operator(format!(
                "no field {name:?} (fields: {})",
                self.names().collect::<Vec<_>>().join(", ")
            ))
        })
    }

    /// Sets `name` (replacing an existing value in place).
    pub fn insert(&mut self, name: impl Into<Arc<str>>, value: impl Into<Value>) {
        let name = name.into();
        let value = value.into();
        match self.fields.iter_mut().find(|(k, _)| *k == name) {
            Some((_, v)) => *v = value,
            None => self.fields.push((name, value)),
        }
    }

    /// Removes `name`, returning its value.
    pub fn remove(&mut self, name: &str) -> Option<Value> {
        let i = self.fields.iter().position(|(k, _)| &**k == name)?;
        Some(self.fields.remove(i).1)
    }

    /// Renames a field; false if it does not exist.
    pub fn rename(&mut self, from: &str, to: impl Into<Arc<str>>) -> bool {
        match self.fields.iter_mut().find(|(k, _)| &**k == from) {
            Some((k, _)) => {
                *k = to.into();
                true
            }
            None => false,
        }
    }

    /// Keeps only the fields for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.fields.retain(|(k, _)| keep(k));
    }

    /// Field names in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|(k, _)| &**k)
    }

    /// `(name, value)` pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Value)> {
        self.fields.iter().map(|(k, v)| (k, v))
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// No fields.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The sample's key (`__key__`), if it has one.
    pub fn key(&self) -> Option<&str> {
        self.get("__key__").and_then(Value::as_str)
    }

    /// Approximate bytes held.
    pub fn size_bytes(&self) -> usize {
        self.fields
            .iter()
            .map(|(k, v)| k.len() + v.size_bytes())
            .sum()
    }
}

impl<K: Into<Arc<str>>, V: Into<Value>> FromIterator<(K, V)> for Sample {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Sample {
        let mut s = Sample::new();
        for (k, v) in iter {
            s.insert(k, v);
        }
        s
    }
}

/// How a field is combined across the samples of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Collate {
    /// Tensors of one shape are stacked (leading batch axis); ints become an `int64`
    /// tensor, floats a `float64` tensor; anything else (bytes, text, lists, mixed kinds,
    /// tensors of different shapes) becomes a list. The default.
    #[default]
    Auto,
    /// Like `Auto`, but tensors of different shapes are an error instead of a list.
    Stack,
    /// Tensors of one rank and different shapes are padded to the largest with this value.
    Pad(f64),
    /// Always a list of the samples' values.
    List,
}

/// The collate policy of a batch stage: one default, with per-field overrides.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CollatePolicy {
    /// For fields without an override.
    pub default: Collate,
    /// Per-field overrides.
    pub fields: Vec<(String, Collate)>,
}

impl CollatePolicy {
    fn of(&self, field: &str) -> Collate {
        self.fields
            .iter()
            .find(|(f, _)| f == field)
            .map_or(self.default, |(_, c)| *c)
    }
}

/// Samples combined field by field.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    len: usize,
    fields: Vec<(Arc<str>, Value)>,
}

impl Batch {
    /// Collates `samples` under `policy`. Every sample must have the same field names.
    pub fn collate(samples: &[Sample], policy: &CollatePolicy) -> Result<Batch, Error> {
        let first = samples
            .first()
            .ok_or_else(|| Error::invalid("cannot collate an empty batch"))?;
        let mut fields = Vec::with_capacity(first.len());
        for (name, _) in first.iter() {
            let mut column = Vec::with_capacity(samples.len());
            for s in samples {
                let v = s.get(name).ok_or_else(|| {
                    Error::operator(format!(
                        "a sample{} has no field {name:?}, which the batch's first sample has \
                         (fields: {})",
                        s.key().map(|k| format!(" ({k})")).unwrap_or_default(),
                        s.names().collect::<Vec<_>>().join(", ")
                    ))
                    .with_stage("batch")
                })?;
                column.push(v);
            }
            let v = collate_column(name, &column, policy.of(name)).map_err(|e| {
                Error::operator(format!("field {name:?}: {}", e.message)).with_stage("batch")
            })?;
            fields.push((name.clone(), v));
        }
        Ok(Batch {
            len: samples.len(),
            fields,
        })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No samples (never true of a collated batch).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The column of `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields
            .iter()
            .find(|(k, _)| &**k == name)
            .map(|(_, v)| v)
    }

    /// `(name, column)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Value)> {
        self.fields.iter().map(|(k, v)| (k, v))
    }

    /// Sets the column `name` (replacing one of that name). A column holds one value per
    /// sample: a list of `len` values, or a tensor whose first dimension is `len`;
    /// anything else is an error.
    pub fn insert(&mut self, name: impl Into<Arc<str>>, column: Value) -> Result<(), Error> {
        let name = name.into();
        let rows = match &column {
            Value::List(l) => Some(l.len()),
            Value::Tensor(t) => t.shape().first().copied(),
            _ => None,
        };
        if rows != Some(self.len) {
            return Err(Error::invalid(format!(
                "column {name:?} must hold {} rows (a list, or a tensor with a leading batch \
                 axis), not a {}",
                self.len,
                column.kind()
            )));
        }
        match self.fields.iter_mut().find(|(k, _)| *k == name) {
            Some((_, v)) => *v = column,
            None => self.fields.push((name, column)),
        }
        Ok(())
    }

    /// Approximate bytes held.
    pub fn size_bytes(&self) -> usize {
        self.fields.iter().map(|(_, v)| v.size_bytes()).sum()
    }

    /// Splits back into samples (stacked tensors become per-sample views, zero-copy; ints
    /// and floats come back as `Int`/`Float`; padding stays).
    pub fn unbatch(&self) -> Result<Vec<Sample>, Error> {
        let mut out: Vec<Sample> = (0..self.len)
            .map(|_| Sample::with_capacity(self.fields.len()))
            .collect();
        for (name, col) in &self.fields {
            let values: Vec<Value> = match col {
                Value::List(l) if l.len() == self.len => l.clone(),
                Value::Tensor(t) if t.shape().first() == Some(&self.len) => {
                    let parts = t.unstack()?;
                    parts
                        .into_iter()
                        .map(|p| match (p.dtype(), p.shape().is_empty()) {
                            (DType::I64, true) => Value::Int(p.to_vec::<i64>().unwrap()[0]),
                            (DType::F64, true) => Value::Float(p.to_vec::<f64>().unwrap()[0]),
                            _ => Value::Tensor(p),
                        })
                        .collect()
                }
                other => {
                    return Err(Error::invalid(format!(
                        "column {name:?} ({}) does not have {} rows",
                        other.kind(),
                        self.len
                    )))
                }
            };
            for (s, v) in out.iter_mut().zip(values) {
                s.fields.push((name.clone(), v));
            }
        }
        Ok(out)
    }
}

fn collate_column(name: &str, col: &[&Value], how: Collate) -> Result<Value, Error> {
    let list = || Value::List(col.iter().map(|v| (*v).clone()).collect());
    if how == Collate::List {
        return Ok(list());
    }
    if col.iter().all(|v| matches!(v, Value::Int(_))) {
        let v: Vec<i64> = col.iter().map(|v| v.as_int().unwrap()).collect();
        return Ok(Value::Tensor(Tensor::from_slice(vec![v.len()], &v)?));
    }
    if col.iter().all(|v| matches!(v, Value::Float(_))) {
        let v: Vec<f64> = col
            .iter()
            .map(|v| match v {
                Value::Float(f) => *f,
                _ => unreachable!(),
            })
            .collect();
        return Ok(Value::Tensor(Tensor::from_slice(vec![v.len()], &v)?));
    }
    if col.iter().all(|v| matches!(v, Value::Tensor(_))) {
        let ts: Vec<&Tensor> = col
            .iter()
            .map(|v| match v {
                Value::Tensor(t) => t,
                _ => unreachable!(),
            })
            .collect();
        let same = ts
            .iter()
            .all(|t| t.shape() == ts[0].shape() && t.dtype() == ts[0].dtype());
        return match how {
            _ if same => Ok(Value::Tensor(Tensor::stack(&ts)?)),
            Collate::Pad(p) => Ok(Value::Tensor(Tensor::pad_stack(&ts, p)?)),
            Collate::Stack => Err(Tensor::stack(&ts).unwrap_err()),
            _ => Ok(list()),
        };
    }
    if how == Collate::Stack {
        return Err(Error::invalid(format!(
            "field {name:?} mixes {} and {} values, which cannot be stacked",
            col[0].kind(),
            col.iter()
                .find(|v| v.kind() != col[0].kind())
                .map_or("other", |v| v.kind())
        )));
    }
    Ok(list())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(i: i64, len: usize) -> Sample {
        let mut s = Sample::new();
        s.insert("__key__", format!("k{i}"));
        s.insert("label", i);
        s.insert(
            "x",
            Tensor::from_slice(vec![len], &vec![i as f32; len]).unwrap(),
        );
        s
    }

    #[test]
    fn auto_collate_stacks_and_lists() {
        let b = Batch::collate(&[sample(1, 3), sample(2, 3)], &CollatePolicy::default()).unwrap();
        assert_eq!(b.len(), 2);
        match b.get("label").unwrap() {
            Value::Tensor(t) => assert_eq!(t.to_vec::<i64>().unwrap(), vec![1, 2]),
            v => panic!("{v:?}"),
        }
        match b.get("x").unwrap() {
            Value::Tensor(t) => assert_eq!(t.shape(), &[2, 3]),
            v => panic!("{v:?}"),
        }
        assert!(matches!(b.get("__key__").unwrap(), Value::List(l) if l.len() == 2));
        let back = b.unbatch().unwrap();
        assert_eq!(back, vec![sample(1, 3), sample(2, 3)]);
    }

    #[test]
    fn ragged_tensors_follow_the_policy() {
        let s = [sample(1, 2), sample(2, 3)];
        let auto = Batch::collate(&s, &CollatePolicy::default()).unwrap();
        assert!(matches!(auto.get("x").unwrap(), Value::List(_)));
        let strict = CollatePolicy {
            default: Collate::Stack,
            fields: vec![("__key__".into(), Collate::List)],
        };
        let e = Batch::collate(&s, &strict).unwrap_err().to_string();
        assert!(e.contains("\"x\"") && e.contains("batch"), "{e}");
        let pad = CollatePolicy {
            default: Collate::Pad(0.0),
            fields: vec![],
        };
        match Batch::collate(&s, &pad).unwrap().get("x").unwrap() {
            Value::Tensor(t) => {
                assert_eq!(t.to_vec::<f32>().unwrap(), vec![1., 1., 0., 2., 2., 2.])
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_missing_field_is_named() {
        let mut b = sample(2, 3);
        b.remove("label");
        let e = Batch::collate(&[sample(1, 3), b], &CollatePolicy::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("label") && e.contains("k2"), "{e}");
    }
}
