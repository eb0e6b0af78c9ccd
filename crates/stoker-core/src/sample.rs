//! Samples and batches.
//!
//! A [`Sample`] is a record of named fields, each a [`Value`]; field names are shared
//! (`Arc<str>`), so a million samples with the same fields hold one copy of each name. A
//! [`Batch`] holds each field stacked across samples (see [`Collate`]).

use std::sync::Arc;

use bytes::Bytes;

use crate::error::Error;
use crate::slots::{BatchSlots, InSlots};
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

/// Stacks a batch's large tensor fields while its samples arrive, instead of all at once
/// when the batch is full: each sample's tensor is copied into the batch's buffer and
/// freed at once, so a batch being filled holds its bytes once, not twice (the samples'
/// tensors, then the stacked copy). [`Stacker::finish`] gives exactly the batch
/// [`Batch::collate`] gives. A field whose value in a later sample is not a tensor of the
/// first sample's dtype and shape (or is missing) is *spilled*: the values taken so far
/// are handed back to their samples as slices of the buffer, and the field is collated
/// as usual, with the usual result or error.
///
/// With [`BatchSlots`] ([`Stacker::with_slots`]), a batch whose first large tensor was
/// written into a batch buffer's first slot is stacked in that buffer: a sample's tensor
/// already in its slot costs nothing, one elsewhere is copied in.
#[derive(Debug, Default)]
pub struct Stacker {
    cols: Vec<Stacking>,
    pushed: usize,
    slots: Option<Arc<BatchSlots>>,
}

#[derive(Debug)]
struct Stacking {
    name: Arc<str>,
    dtype: DType,
    shape: Vec<usize>,
    dest: Dest,
    /// How many samples' values are in `dest` (the first `taken` pushed).
    taken: usize,
    spilled: bool,
}

/// Where a field's values are stacked.
#[derive(Debug)]
enum Dest {
    /// Alignment padding, then the values; and the padding's length (see
    /// [`crate::recycle::Recycler::take_aligned`]).
    Own(Vec<u8>, usize),
    /// In a batch buffer whose slots the samples' operators wrote.
    Slots(InSlots),
}

impl Dest {
    /// A buffer for `size` values like `first`, holding it.
    fn own(first: &[u8], size: usize) -> Dest {
        let (mut data, pad) = crate::recycle::GLOBAL.take_aligned(first.len() * size.max(1));
        data.extend_from_slice(first);
        Dest::Own(data, pad)
    }

    fn push(&mut self, v: &[u8]) {
        match self {
            Dest::Own(data, _) => data.extend_from_slice(v),
            Dest::Slots(s) => {
                if let Err((mut data, pad)) = s.push(v) {
                    data.extend_from_slice(v);
                    *self = Dest::Own(data, pad);
                }
            }
        }
    }

    fn finish(self) -> (Vec<u8>, usize) {
        match self {
            Dest::Own(data, pad) => (data, pad),
            Dest::Slots(s) => s.finish(),
        }
    }
}

/// Tensors smaller than this are left to [`Batch::collate`]: holding them twice costs
/// little.
pub const EAGER_STACK_MIN: usize = 64 << 10;

/// What a taken field holds until the batch is made (no allocation).
fn placeholder() -> Value {
    Value::List(Vec::new())
}

impl Stacker {
    /// A stacker for one batch (the first [`push`](Self::push) sizes its buffers).
    pub fn new() -> Stacker {
        Stacker::default()
    }

    /// A stacker that stacks in `slots`' buffers when the batch's samples were written
    /// there (see [`BatchSlots`]).
    pub fn with_slots(slots: Option<Arc<BatchSlots>>) -> Stacker {
        Stacker {
            slots,
            ..Stacker::default()
        }
    }

    /// This stacker, leaving an empty one for the next batch (with the same slots).
    pub fn take(&mut self) -> Stacker {
        let next = Stacker::with_slots(self.slots.clone());
        std::mem::replace(self, next)
    }

    /// Samples pushed so far.
    pub fn pushed(&self) -> usize {
        self.pushed
    }

    /// Takes the stackable fields of the batch's next sample (`size`: the batch's size,
    /// for the buffer's capacity). The sample must then reach [`finish`](Self::finish), in
    /// push order, with the others.
    pub fn push(&mut self, sample: &mut Sample, size: usize, policy: &CollatePolicy) {
        let slot = self.pushed;
        self.pushed += 1;
        if slot == 0 {
            for (name, v) in sample.fields.iter_mut() {
                let Value::Tensor(t) = v else { continue };
                if t.data().len() < EAGER_STACK_MIN || policy.of(name) == Collate::List {
                    continue;
                }
                let in_slots = match &self.slots {
                    Some(s) if !self.cols.iter().any(|c| matches!(c.dest, Dest::Slots(_))) => {
                        s.start(t.data()).map(Dest::Slots)
                    }
                    _ => None,
                };
                self.cols.push(Stacking {
                    name: name.clone(),
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                    dest: in_slots.unwrap_or_else(|| Dest::own(t.data(), size)),
                    taken: 1,
                    spilled: false,
                });
                *v = placeholder();
            }
            if let Some(s) = &self.slots {
                if !self.cols.iter().any(|c| matches!(c.dest, Dest::Slots(_))) {
                    s.missed();
                }
            }
            return;
        }
        for c in self.cols.iter_mut().filter(|c| !c.spilled) {
            let fits = |v: &Value| matches!(v, Value::Tensor(t) if t.dtype() == c.dtype && t.shape() == c.shape.as_slice());
            match sample.get_mut(&c.name) {
                Some(v) if fits(v) => {
                    if let Value::Tensor(t) = std::mem::replace(v, placeholder()) {
                        c.dest.push(t.data());
                    }
                    c.taken += 1;
                }
                _ => c.spilled = true,
            }
        }
    }

    /// The batch of `samples` (those pushed, in order), as [`Batch::collate`] makes it.
    pub fn finish(self, samples: &mut [Sample], policy: &CollatePolicy) -> Result<Batch, Error> {
        assert_eq!(samples.len(), self.pushed, "every sample pushed, none more");
        let mut stacked = Vec::new();
        for c in self.cols {
            let (data, pad) = c.dest.finish();
            let n = (data.len() - pad) / c.taken.max(1);
            let data = crate::recycle::freeze(data, pad);
            if c.spilled {
                for (j, s) in samples.iter_mut().take(c.taken).enumerate() {
                    let t = Tensor::new(c.dtype, c.shape.clone(), data.slice(j * n..(j + 1) * n))?;
                    if let Some(v) = s.get_mut(&c.name) {
                        *v = Value::Tensor(t);
                    }
                }
            } else {
                let mut shape = vec![c.taken];
                shape.extend_from_slice(&c.shape);
                let t = Tensor::new(c.dtype, shape, data)?;
                stacked.push((c.name, t));
            }
        }
        Batch::collate_with(samples, policy, stacked)
    }
}

impl Batch {
    /// Collates `samples` under `policy`. Every sample must have the same field names.
    pub fn collate(samples: &[Sample], policy: &CollatePolicy) -> Result<Batch, Error> {
        Batch::collate_with(samples, policy, Vec::new())
    }

    /// [`collate`](Self::collate), with the columns in `stacked` already made.
    fn collate_with(
        samples: &[Sample],
        policy: &CollatePolicy,
        mut stacked: Vec<(Arc<str>, Tensor)>,
    ) -> Result<Batch, Error> {
        let first = samples
            .first()
            .ok_or_else(|| Error::invalid("cannot collate an empty batch"))?;
        let mut fields = Vec::with_capacity(first.len());
        for (name, _) in first.iter() {
            if let Some(i) = stacked.iter().position(|(n, _)| n == name) {
                let (n, t) = stacked.swap_remove(i);
                fields.push((n, Value::Tensor(t)));
                continue;
            }
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

    /// A batch of `len` samples with no columns yet, to add with [`Batch::insert`] (an
    /// operator that makes a batch's columns anew, such as a Python function on batches).
    pub fn with_rows(len: usize) -> Batch {
        Batch {
            len,
            fields: Vec::new(),
        }
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

/// One field's values over consecutive rows, as a columnar format decodes them.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// Integers without nulls: row `i` is `Value::Int(v[i])`.
    Ints(Vec<i64>),
    /// Floats without nulls: row `i` is `Value::Float(v[i])`.
    Floats(Vec<f64>),
    /// Any values, one per row.
    Values(Vec<Value>),
}

impl Column {
    /// Rows.
    pub fn len(&self) -> usize {
        match self {
            Column::Ints(v) => v.len(),
            Column::Floats(v) => v.len(),
            Column::Values(v) => v.len(),
        }
    }

    /// No rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row `i` as a value.
    pub fn value(&self, i: usize) -> Value {
        match self {
            Column::Ints(v) => Value::Int(v[i]),
            Column::Floats(v) => Value::Float(v[i]),
            Column::Values(v) => v[i].clone(),
        }
    }

    /// Moves the first `n` rows out.
    fn take_front(&mut self, n: usize) -> Column {
        match self {
            Column::Ints(v) => Column::Ints(v.drain(..n).collect()),
            Column::Floats(v) => Column::Floats(v.drain(..n).collect()),
            Column::Values(v) => Column::Values(v.drain(..n).collect()),
        }
    }

    fn into_values(self) -> Vec<Value> {
        match self {
            Column::Ints(v) => v.into_iter().map(Value::Int).collect(),
            Column::Floats(v) => v.into_iter().map(Value::Float).collect(),
            Column::Values(v) => v,
        }
    }

    fn size_bytes(&self) -> usize {
        match self {
            Column::Ints(v) => v.len() * 8,
            Column::Floats(v) => v.len() * 8,
            Column::Values(v) => v.iter().map(Value::size_bytes).sum(),
        }
    }
}

/// Consecutive rows held as named columns: what a columnar format (Parquet) decodes,
/// before any row becomes a [`Sample`]. Row `i` is the sample with field `names[k]` set to
/// `columns[k]`'s row `i`, in that order ([`Columns::row`]); [`Batch::from_columns`]
/// collates such rows without making those samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Columns {
    /// Field names, in the rows' field order.
    pub names: Vec<Arc<str>>,
    /// One column per name, each of `len` rows.
    pub columns: Vec<Column>,
    len: usize,
}

impl Columns {
    /// Columns of equal length (an error otherwise).
    pub fn new(names: Vec<Arc<str>>, columns: Vec<Column>) -> Result<Columns, Error> {
        let len = columns.first().map_or(0, Column::len);
        if names.len() != columns.len() || columns.iter().any(|c| c.len() != len) {
            return Err(Error::invalid(format!(
                "{} names for {} columns of {:?} rows",
                names.len(),
                columns.len(),
                columns.iter().map(Column::len).collect::<Vec<_>>()
            )));
        }
        Ok(Columns {
            names,
            columns,
            len,
        })
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The column of `name` (the first of that name, as [`Sample::get`] finds it).
    pub fn get(&self, name: &str) -> Option<&Column> {
        self.names
            .iter()
            .position(|n| &**n == name)
            .map(|i| &self.columns[i])
    }

    /// Row `i` as a sample.
    pub fn row(&self, i: usize) -> Sample {
        Sample {
            fields: self
                .names
                .iter()
                .zip(&self.columns)
                .map(|(n, c)| (n.clone(), c.value(i)))
                .collect(),
        }
    }

    /// Moves the first `n` rows (at most all of them) out.
    pub fn take_front(&mut self, n: usize) -> Columns {
        let n = n.min(self.len);
        self.len -= n;
        Columns {
            names: self.names.clone(),
            columns: self.columns.iter_mut().map(|c| c.take_front(n)).collect(),
            len: n,
        }
    }

    /// Approximate bytes held.
    pub fn size_bytes(&self) -> usize {
        self.columns.iter().map(Column::size_bytes).sum()
    }
}

impl Batch {
    /// Collates the rows of `parts`, in order, exactly as [`Batch::collate`] collates the
    /// same rows as samples ([`Columns::row`]): same columns, values, dtypes and errors,
    /// without making a sample per row. Integer and float columns without nulls are
    /// concatenated straight into tensors; anything else goes through the per-value rules.
    pub fn from_columns(parts: Vec<Columns>, policy: &CollatePolicy) -> Result<Batch, Error> {
        let len: usize = parts.iter().map(Columns::len).sum();
        let parts: Vec<Columns> = parts.into_iter().filter(|p| !p.is_empty()).collect();
        let first = parts
            .first()
            .ok_or_else(|| Error::invalid("cannot collate an empty batch"))?;
        let names = first.names.clone();
        // Which column of each part every output field reads (the first of its name),
        // checked before anything is moved, in the order `collate` meets a missing field.
        let mut picks: Vec<Vec<usize>> = Vec::with_capacity(names.len());
        for name in &names {
            let mut pick = Vec::with_capacity(parts.len());
            for p in &parts {
                match p.names.iter().position(|n| n == name) {
                    Some(i) => pick.push(i),
                    None => {
                        let s = p.row(0);
                        return Err(Error::operator(format!(
                            "a sample{} has no field {name:?}, which the batch's first sample \
                             has (fields: {})",
                            s.key().map(|k| format!(" ({k})")).unwrap_or_default(),
                            s.names().collect::<Vec<_>>().join(", ")
                        ))
                        .with_stage("batch"));
                    }
                }
            }
            picks.push(pick);
        }
        // A column read by two fields (duplicate names) is cloned; others are moved.
        let mut uses: Vec<Vec<usize>> = parts.iter().map(|p| vec![0; p.columns.len()]).collect();
        for pick in &picks {
            for (k, &i) in pick.iter().enumerate() {
                uses[k][i] += 1;
            }
        }
        let mut parts = parts;
        let mut fields = Vec::with_capacity(names.len());
        for (name, pick) in names.iter().zip(&picks) {
            let cols: Vec<Column> = pick
                .iter()
                .enumerate()
                .map(|(k, &i)| {
                    uses[k][i] -= 1;
                    if uses[k][i] == 0 {
                        std::mem::replace(&mut parts[k].columns[i], Column::Values(Vec::new()))
                    } else {
                        parts[k].columns[i].clone()
                    }
                })
                .collect();
            let v = collate_parts(name, cols, len, policy.of(name)).map_err(|e| {
                Error::operator(format!("field {name:?}: {}", e.message)).with_stage("batch")
            })?;
            fields.push((name.clone(), v));
        }
        Ok(Batch { len, fields })
    }
}

/// One field of a batch from its parts (see [`Batch::from_columns`]).
fn collate_parts(name: &str, cols: Vec<Column>, len: usize, how: Collate) -> Result<Value, Error> {
    if how != Collate::List {
        if cols.iter().all(|c| matches!(c, Column::Ints(_))) {
            let mut v = Vec::with_capacity(len);
            for c in &cols {
                if let Column::Ints(x) = c {
                    v.extend_from_slice(x);
                }
            }
            return Ok(Value::Tensor(Tensor::from_slice(vec![v.len()], &v)?));
        }
        if cols.iter().all(|c| matches!(c, Column::Floats(_))) {
            let mut v = Vec::with_capacity(len);
            for c in &cols {
                if let Column::Floats(x) = c {
                    v.extend_from_slice(x);
                }
            }
            return Ok(Value::Tensor(Tensor::from_slice(vec![v.len()], &v)?));
        }
    }
    let mut values = Vec::with_capacity(len);
    for c in cols {
        values.extend(c.into_values());
    }
    if how == Collate::List {
        return Ok(Value::List(values));
    }
    // The per-value rules; where they make a list of the values, it is these values
    // moved, not a copy.
    let kinds = |f: fn(&Value) -> bool| values.iter().all(f);
    let numeric = kinds(|v| matches!(v, Value::Int(_)))
        || kinds(|v| matches!(v, Value::Float(_)))
        || kinds(|v| matches!(v, Value::Tensor(_)));
    if numeric || how == Collate::Stack {
        let refs: Vec<&Value> = values.iter().collect();
        return collate_column(name, &refs, how);
    }
    Ok(Value::List(values))
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

    /// The batch a [`Stacker`] makes of `samples` (as the batch stage feeds it).
    fn eager(samples: &[Sample], size: usize, policy: &CollatePolicy) -> Result<Batch, Error> {
        let mut samples = samples.to_vec();
        let mut st = Stacker::new();
        for s in &mut samples {
            st.push(s, size, policy);
        }
        assert_eq!(st.pushed(), samples.len());
        st.finish(&mut samples, policy)
    }

    #[test]
    fn eager_stacking_makes_the_batch_collate_makes() {
        let big = EAGER_STACK_MIN / 4 + 3; // f32 elements: above the threshold
        let policies = [
            CollatePolicy::default(),
            CollatePolicy {
                default: Collate::Stack,
                fields: vec![],
            },
            CollatePolicy {
                default: Collate::Pad(-1.0),
                fields: vec![],
            },
            CollatePolicy {
                default: Collate::Auto,
                fields: vec![("x".into(), Collate::List)],
            },
        ];
        // Each case: the samples of one batch.
        let mut cases: Vec<Vec<Sample>> = Vec::new();
        cases.push((0..5).map(|i| sample(i, big)).collect());
        // Another shape at slot 3: spilled after three were taken.
        cases.push((0..5).map(|i| sample(i, big + (i == 3) as usize)).collect());
        // Another kind, another dtype, a missing field at slot 2.
        let mut c: Vec<Sample> = (0..4).map(|i| sample(i, big)).collect();
        c[2].insert("x", 7i64);
        cases.push(c);
        let mut c: Vec<Sample> = (0..4).map(|i| sample(i, big)).collect();
        c[2].insert(
            "x",
            Tensor::from_slice(vec![big], &vec![2.0f64; big]).unwrap(),
        );
        cases.push(c);
        let mut c: Vec<Sample> = (0..4).map(|i| sample(i, big)).collect();
        c[2].remove("x");
        cases.push(c);
        // Small tensors are left to collate; one sample alone.
        cases.push((0..4).map(|i| sample(i, 8)).collect());
        cases.push(vec![sample(9, big)]);
        for (n, case) in cases.iter().enumerate() {
            for p in &policies {
                let want = Batch::collate(case, p);
                // A last, short batch (size 8) and a full one.
                for size in [case.len(), 8] {
                    let got = eager(case, size, p);
                    match (&want, &got) {
                        (Ok(a), Ok(b)) => assert_eq!(a, b, "case {n}, {p:?}"),
                        (Err(a), Err(b)) => assert_eq!(a.message, b.message, "case {n}, {p:?}"),
                        _ => panic!("case {n}, {p:?}: {want:?} against {got:?}"),
                    }
                }
            }
        }
        // The eager path did stack the first case (one buffer, not a list).
        let b = eager(&cases[0], 5, &policies[0]).unwrap();
        match b.get("x") {
            Some(Value::Tensor(t)) => assert_eq!(t.shape(), &[5, big]),
            other => panic!("{other:?}"),
        }
    }

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

    fn cols(names: &[&str], columns: Vec<Column>) -> Columns {
        Columns::new(
            names.iter().map(|n| Arc::<str>::from(*n)).collect(),
            columns,
        )
        .unwrap()
    }

    fn rows_of(parts: &[Columns]) -> Vec<Sample> {
        parts
            .iter()
            .flat_map(|p| (0..p.len()).map(move |i| p.row(i)))
            .collect()
    }

    /// `from_columns` against `collate` of the same rows, under several policies.
    fn same_as_rows(parts: Vec<Columns>) {
        let policies = [
            CollatePolicy::default(),
            CollatePolicy {
                default: Collate::List,
                fields: vec![],
            },
            CollatePolicy {
                default: Collate::Stack,
                fields: vec![],
            },
            CollatePolicy {
                default: Collate::Pad(-1.0),
                fields: vec![("s".into(), Collate::List)],
            },
        ];
        let rows = rows_of(&parts);
        for p in &policies {
            let want = Batch::collate(&rows, p).map_err(|e| e.to_string());
            let got = Batch::from_columns(parts.clone(), p).map_err(|e| e.to_string());
            assert_eq!(got, want, "{p:?}");
        }
    }

    #[test]
    fn columns_collate_like_rows() {
        let ints = |v: &[i64]| Column::Ints(v.to_vec());
        let floats = |v: &[f64]| Column::Floats(v.to_vec());
        let vals = |v: Vec<Value>| Column::Values(v);
        // Plain numbers, split across parts.
        same_as_rows(vec![
            cols(&["a", "f"], vec![ints(&[1, 2]), floats(&[0.5, 1.5])]),
            cols(&["a", "f"], vec![ints(&[3]), floats(&[2.5])]),
        ]);
        // A null among the ints in one part; strings; a float part after an int one.
        same_as_rows(vec![
            cols(
                &["a", "s", "x"],
                vec![
                    ints(&[1, 2]),
                    vals(vec!["p".into(), "q".into()]),
                    ints(&[1, 2]),
                ],
            ),
            cols(
                &["a", "s", "x"],
                vec![
                    vals(vec![Value::Null, Value::Int(4)]),
                    vals(vec!["r".into(), Value::Null]),
                    floats(&[1.0, 2.0]),
                ],
            ),
        ]);
        // Tensors of one shape, and ragged ones.
        let t = |n: usize| Value::Tensor(Tensor::from_slice(vec![n], &vec![1.0f32; n]).unwrap());
        same_as_rows(vec![cols(&["v"], vec![vals(vec![t(2), t(2)])])]);
        same_as_rows(vec![
            cols(&["v"], vec![vals(vec![t(2)])]),
            cols(&["v"], vec![vals(vec![t(3)])]),
        ]);
        // A later part without a field, and one with an extra field.
        same_as_rows(vec![
            cols(&["a", "b"], vec![ints(&[1]), ints(&[2])]),
            cols(&["a"], vec![ints(&[3])]),
        ]);
        same_as_rows(vec![
            cols(&["a"], vec![ints(&[1])]),
            cols(&["b", "a"], vec![ints(&[3]), ints(&[2])]),
        ]);
        // Duplicate names (a rename onto an existing field): the first wins, as in `get`.
        same_as_rows(vec![cols(&["a", "a"], vec![ints(&[1]), ints(&[2])])]);
        // take_front splits without changing the rows.
        let mut c = cols(
            &["a", "s"],
            vec![ints(&[1, 2, 3]), vals(vec!["x".into(); 3])],
        );
        let front = c.take_front(2);
        assert_eq!((front.len(), c.len()), (2, 1));
        assert_eq!(
            rows_of(&[front, c]),
            rows_of(&[cols(
                &["a", "s"],
                vec![ints(&[1, 2, 3]), vals(vec!["x".into(); 3])]
            )])
        );
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
