//! The tabular operators of [`Builtin`](super::Builtin): column transforms for
//! recommendation features (nulls, `log1p`, clipping, standardizing, buckets, hashing,
//! vocabularies), from `stoker_ops::tabular`. Each works per sample (before `batch`, on
//! the workers) and on a whole batch column at once (after `batch`).
//!
//! A vocabulary's hash map (read from its file, or built from the spec's list) is built
//! once per distinct operator and shared by every thread and run of the process (`cached`
//! in `ops.rs`); the other kernels are cheap to build per call.

use std::sync::{Arc, OnceLock};

use stoker_core::{Batch, Error, OpMeta, Sample, Value};
use stoker_ops::tabular::{
    Bucketize, Clip, ColumnOp as ColumnKernel, Fill, FillNull, HashBucket, Log1p, Negative,
    Standardize, VocabLookup,
};

use super::{cached, Shared};

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

/// The tabular operators a spec can name, with their arguments (one modality of
/// [`Builtin`](super::Builtin)).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ColumnOp {
    /// Replaces nulls (and NaN) in `field` with `value`.
    FillNull {
        /// The field.
        field: String,
        /// A number, an integer or a string.
        value: FillValue,
    },
    /// `ln(1 + x)` as float32; a negative value is an error, or 0 with `negative = "clamp"`.
    Log1p {
        /// The field.
        field: String,
        /// `error` (default) or `clamp`.
        #[serde(default)]
        negative: Option<String>,
    },
    /// Clips to `[min, max]`, as float32.
    Clip {
        /// The field.
        field: String,
        /// Lower bound.
        #[serde(default)]
        min: Option<f64>,
        /// Upper bound.
        #[serde(default)]
        max: Option<f64>,
    },
    /// `(x - mean) / std` with precomputed statistics, as float32.
    Standardize {
        /// The field.
        field: String,
        /// Mean.
        mean: f64,
        /// Standard deviation (positive).
        std: f64,
    },
    /// Bucket index (int64) among sorted `boundaries`, as `torch.bucketize(right=False)`.
    Bucketize {
        /// The field.
        field: String,
        /// Sorted boundaries.
        boundaries: Vec<f64>,
    },
    /// Hashes strings or integers into `buckets` buckets (int64): `xxh64(text, seed) %
    /// buckets`, integers hashed as their decimal text.
    HashBucket {
        /// The field.
        field: String,
        /// Number of buckets.
        buckets: u64,
        /// Hash seed (default 0).
        #[serde(default)]
        seed: u64,
    },
    /// Index (int64) of each value in a vocabulary; `oov_index` (default: its size) for
    /// values not in it.
    VocabLookup {
        /// The field.
        field: String,
        /// The vocabulary, in index order.
        #[serde(default)]
        vocab: Option<Vec<String>>,
        /// Or a file of one token per line.
        #[serde(default)]
        vocab_file: Option<String>,
        /// Index of unknown values.
        #[serde(default)]
        oov_index: Option<i64>,
    },
}

impl ColumnOp {
    /// The operators' names in a spec (their `op`), in the order of the variants.
    pub const NAMES: &'static [&'static str] = &[
        "fill_null",
        "log1p",
        "clip",
        "standardize",
        "bucketize",
        "hash_bucket",
        "vocab_lookup",
    ];

    /// The operator's name in plans and errors.
    pub fn name(&self) -> String {
        match self {
            ColumnOp::FillNull { field, .. } => format!("fill_null({field})"),
            ColumnOp::Log1p { field, .. } => format!("log1p({field})"),
            ColumnOp::Clip { field, .. } => format!("clip({field})"),
            ColumnOp::Standardize { field, .. } => format!("standardize({field})"),
            ColumnOp::Bucketize { field, .. } => format!("bucketize({field})"),
            ColumnOp::HashBucket { field, .. } => format!("hash_bucket({field})"),
            ColumnOp::VocabLookup { field, .. } => format!("vocab_lookup({field})"),
        }
    }

    /// The operator's declaration for the optimizer.
    pub(crate) fn meta(&self) -> OpMeta {
        OpMeta::new(self.name())
            .with_cost_ns(20.0)
            .with_size_ratio(1.0)
    }

    /// Checks the operator's arguments by building its kernel.
    pub fn validate(&self) -> Result<(), Error> {
        column_kernel(self).map(drop)
    }

    /// Applies the operator to one sample.
    pub(crate) fn apply(&self, mut s: Sample) -> Result<Sample, Error> {
        column_kernel(self)?.apply_sample(&mut s)?;
        Ok(s)
    }

    /// Applies the operator to a batch, column-wise.
    pub(crate) fn apply_batch(&self, mut batch: Batch) -> Result<Batch, Error> {
        let k = column_kernel(self)?;
        let col = batch
            .get(k.field())
            .ok_or_else(|| Error::operator(format!("{}: no field {:?}", k.name(), k.field())))?;
        let out = k.apply(col)?;
        batch.insert(k.field(), out)?;
        Ok(batch)
    }
}

fn vocab(b: &ColumnOp) -> Result<Arc<VocabLookup>, Error> {
    static CACHE: Shared<VocabLookup> = OnceLock::new();
    let ColumnOp::VocabLookup {
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
fn column_kernel(b: &ColumnOp) -> Result<Arc<dyn ColumnKernel + Send + Sync>, Error> {
    Ok(match b {
        ColumnOp::FillNull { field, value } => Arc::new(FillNull::new(
            field.clone(),
            match value {
                FillValue::Int(i) => Fill::Int(*i),
                FillValue::Float(x) => Fill::Float(*x),
                FillValue::Str(s) => Fill::Str(s.clone()),
            },
        )),
        ColumnOp::Log1p { field, negative } => {
            let mut k = Log1p::new(field.clone());
            if let Some(n) = negative {
                k = k.negative(match n.as_str() {
                    "error" => Negative::Error,
                    "clamp" => Negative::Clamp,
                    n => {
                        return Err(Error::invalid(format!(
                            "log1p: negative {n:?} is not error or clamp"
                        )))
                    }
                });
            }
            Arc::new(k)
        }
        ColumnOp::Clip { field, min, max } => Arc::new(Clip::new(field.clone(), *min, *max)?),
        ColumnOp::Standardize { field, mean, std } => {
            Arc::new(Standardize::new(field.clone(), *mean, *std)?)
        }
        ColumnOp::Bucketize { field, boundaries } => {
            Arc::new(Bucketize::new(field.clone(), boundaries.clone())?)
        }
        ColumnOp::HashBucket {
            field,
            buckets,
            seed,
        } => Arc::new(HashBucket::new(field.clone(), *buckets)?.seed(*seed)),
        ColumnOp::VocabLookup { .. } => {
            let v = vocab(b)?;
            Arc::new(SharedVocab(v))
        }
    })
}

/// A shared vocabulary as a column operator.
struct SharedVocab(Arc<VocabLookup>);

impl ColumnKernel for SharedVocab {
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
