//! The text and tabular operators of [`Builtin`]: tokenization (Hugging Face
//! `tokenizer.json`) and column transforms for recommendation features, from
//! `stoker_ops::{text, tabular}`. Each works per sample (before `batch`, on the workers)
//! and on a whole batch column at once (after `batch`).
//!
//! Kernels that are costly to build (a tokenizer read from its file, a vocabulary's hash
//! map) are built once per distinct operator and shared by every thread and run of the
//! process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use stoker_core::{Batch, DType, Error, Sample, Value};
use stoker_ops::tabular::{
    Bucketize, Clip, ColumnOp, Fill, FillNull, HashBucket, Log1p, Negative, Standardize,
    VocabLookup,
};
use stoker_ops::text::{PadSide, Tokenize, TokenizeParams};

use crate::ops::Builtin;

/// A fill value: a number, an integer or a string.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum FillValue {
    /// An integer.
    Int(i64),
    /// A number.
    Float(f64),
    /// A string.
    Str(String),
}

pub(crate) fn is_column_op(b: &Builtin) -> bool {
    matches!(
        b,
        Builtin::Tokenize { .. }
            | Builtin::FillNull { .. }
            | Builtin::Log1p { .. }
            | Builtin::Clip { .. }
            | Builtin::Standardize { .. }
            | Builtin::Bucketize { .. }
            | Builtin::HashBucket { .. }
            | Builtin::VocabLookup { .. }
    )
}

pub(crate) type Shared<T> = OnceLock<Mutex<HashMap<String, Arc<T>>>>;

/// The kernel for `b` from `cache`, built by `make` the first time.
pub(crate) fn cached<T>(
    cache: &'static Shared<T>,
    b: &Builtin,
    make: impl FnOnce() -> Result<T, Error>,
) -> Result<Arc<T>, Error> {
    let key = serde_json::to_string(b).expect("builtins serialise");
    let map = cache.get_or_init(Default::default);
    if let Some(k) = map.lock().expect("kernel cache").get(&key) {
        return Ok(k.clone());
    }
    let k = Arc::new(make()?);
    map.lock()
        .expect("kernel cache")
        .entry(key)
        .or_insert_with(|| k.clone());
    Ok(k)
}

fn tokenizer(b: &Builtin) -> Result<Arc<Tokenize>, Error> {
    static CACHE: Shared<Tokenize> = OnceLock::new();
    let Builtin::Tokenize {
        field,
        tokenizer,
        max_length,
        pad_to,
        pad_id,
        pad_side,
        add_special_tokens,
        bos_id,
        eos_id,
        ids_field,
        mask_field,
        dtype,
    } = b
    else {
        unreachable!("tokenizer() of a tokenize")
    };
    cached(&CACHE, b, || {
        let side = match pad_side.as_deref().unwrap_or("right") {
            "right" => PadSide::Right,
            "left" => PadSide::Left,
            s => {
                return Err(Error::invalid(format!(
                    "tokenize: pad_side {s:?} is not left or right"
                )))
            }
        };
        let dt = match dtype.as_deref().unwrap_or("int64") {
            "int64" => DType::I64,
            "int32" => DType::I32,
            d => {
                return Err(Error::invalid(format!(
                    "tokenize: dtype {d:?} is not int64 or int32"
                )))
            }
        };
        let params = TokenizeParams::new()
            .field(field.clone())
            .output_fields(
                ids_field.clone().unwrap_or_else(|| "input_ids".into()),
                mask_field
                    .clone()
                    .unwrap_or_else(|| "attention_mask".into()),
            )
            .max_length(*max_length)
            .pad_to(*pad_to)
            .pad_id(*pad_id)
            .pad_side(side)
            .add_special_tokens(*add_special_tokens)
            .bos_id(*bos_id)
            .eos_id(*eos_id)
            .dtype(dt);
        Tokenize::from_file(tokenizer, params)
    })
}

fn vocab(b: &Builtin) -> Result<Arc<VocabLookup>, Error> {
    static CACHE: Shared<VocabLookup> = OnceLock::new();
    let Builtin::VocabLookup {
        field,
        vocab,
        vocab_file,
        oov_index,
    } = b
    else {
        unreachable!("vocab() of a vocab_lookup")
    };
    cached(&CACHE, b, || {
        let v = match (vocab, vocab_file) {
            (Some(v), None) => VocabLookup::new(field.clone(), v)?,
            (None, Some(f)) => VocabLookup::from_file(field.clone(), f)?,
            _ => {
                return Err(Error::invalid(
                    "vocab_lookup: give exactly one of `vocab` (a list) and `vocab_file`",
                ))
            }
        };
        Ok(match oov_index {
            Some(i) => v.oov_index(*i),
            None => v,
        })
    })
}

/// The tabular kernel of `b`.
fn column_kernel(b: &Builtin) -> Result<Arc<dyn ColumnOp + Send + Sync>, Error> {
    Ok(match b {
        Builtin::FillNull { field, value } => Arc::new(FillNull::new(
            field.clone(),
            match value {
                FillValue::Int(i) => Fill::Int(*i),
                FillValue::Float(x) => Fill::Float(*x),
                FillValue::Str(s) => Fill::Str(s.clone()),
            },
        )),
        Builtin::Log1p { field, negative } => {
            let n = match negative.as_deref().unwrap_or("error") {
                "error" => Negative::Error,
                "clamp" => Negative::Clamp,
                n => {
                    return Err(Error::invalid(format!(
                        "log1p: negative {n:?} is not error or clamp"
                    )))
                }
            };
            Arc::new(Log1p::new(field.clone()).negative(n))
        }
        Builtin::Clip { field, min, max } => Arc::new(Clip::new(field.clone(), *min, *max)?),
        Builtin::Standardize { field, mean, std } => {
            Arc::new(Standardize::new(field.clone(), *mean, *std)?)
        }
        Builtin::Bucketize { field, boundaries } => {
            Arc::new(Bucketize::new(field.clone(), boundaries.clone())?)
        }
        Builtin::HashBucket {
            field,
            buckets,
            seed,
        } => Arc::new(HashBucket::new(field.clone(), *buckets)?.seed(*seed)),
        Builtin::VocabLookup { .. } => {
            let v = vocab(b)?;
            Arc::new(SharedVocab(v))
        }
        _ => unreachable!("column_kernel() of a tabular operator"),
    })
}

/// A shared vocabulary as a column operator.
struct SharedVocab(Arc<VocabLookup>);

impl ColumnOp for SharedVocab {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn field(&self) -> &str {
        self.0.field()
    }
    fn apply(&self, value: &Value) -> Result<Value, Error> {
        self.0.apply(value)
    }
}

/// Checks the operator's arguments by building its kernel.
pub(crate) fn validate(b: &Builtin) -> Result<(), Error> {
    match b {
        Builtin::Tokenize { .. } => tokenizer(b).map(drop),
        _ => column_kernel(b).map(drop),
    }
}

/// Applies the operator to one sample.
pub(crate) fn apply(b: &Builtin, mut s: Sample) -> Result<Sample, Error> {
    match b {
        Builtin::Tokenize { .. } => tokenizer(b)?.apply(&mut s)?,
        _ => column_kernel(b)?.apply_sample(&mut s)?,
    }
    Ok(s)
}

/// Applies the operator to a batch, column-wise.
pub(crate) fn apply_batch(b: &Builtin, mut batch: Batch) -> Result<Batch, Error> {
    match b {
        Builtin::Tokenize { field, .. } => {
            let t = tokenizer(b)?;
            let col = batch
                .get(field)
                .ok_or_else(|| Error::operator(format!("tokenize: no field {field:?}")))?;
            let out = t.encode_column(col)?;
            let p = t.params();
            batch.insert(p.ids_field.as_str(), Value::Tensor(out.input_ids))?;
            batch.insert(p.mask_field.as_str(), Value::Tensor(out.attention_mask))?;
        }
        _ => {
            let k = column_kernel(b)?;
            let col = batch.get(k.field()).ok_or_else(|| {
                Error::operator(format!("{}: no field {:?}", k.name(), k.field()))
            })?;
            let out = k.apply(col)?;
            batch.insert(k.field(), out)?;
        }
    }
    Ok(batch)
}
