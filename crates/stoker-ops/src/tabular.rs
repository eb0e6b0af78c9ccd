//! Tabular kernels: the feature transforms of recommendation and tabular models.
//!
//! Every operator works on one field and on either shape the field takes in a pipeline:
//!
//! - one sample's value: a scalar (`Int`, `Float`, `Str`, `Bytes`, `Null`), or a list or
//!   tensor (a multi-valued feature), transformed element by element;
//! - a batch's column: what [`stoker_core::Batch`] made of the field, a tensor `[N]` (any
//!   integer or float dtype) when every sample had a number, or a `List` when some had a
//!   null or the values are strings.
//!
//! The output keeps the input's shape: a scalar stays a scalar, a tensor keeps its shape, a
//! list of `n` becomes a tensor `[n]`. Numeric features come out as `float32` (or `float64`
//! on request); a per-sample scalar is a 0-d tensor of that dtype (`Value::Float` for
//! `float64`), so collating a batch stacks them into `[N]` of the same dtype. Indices
//! (bucket, hash, vocabulary) come out as `int64` (`Value::Int` for a scalar).
//!
//! Nulls and NaN are never passed through silently: every operator except [`FillNull`]
//! refuses a null, and every numeric operator refuses NaN, with an error naming the
//! operator, the field and the row. Put a [`FillNull`] first (it replaces NaN as well by
//! default). Infinities are numbers: `clip` bounds them, the others pass them on.
//!
//! Each operator is a struct built from its parameters (checked once, at construction,
//! as [`stoker_core::ErrorKind::Invalid`] errors) that implements [`ColumnOp`].
//!
//! ```
//! use stoker_core::{Tensor, Value};
//! use stoker_ops::tabular::{Bucketize, ColumnOp, FillNull, Fill};
//! let fill = FillNull::new("age", Fill::Float(0.0));
//! let col = Value::List(vec![Value::Int(30), Value::Null, Value::Float(61.5)]);
//! let filled = fill.apply(&col).unwrap();
//! let Value::Tensor(t) = &filled else { unreachable!() };
//! assert_eq!(t.to_vec::<f32>().unwrap(), vec![30.0, 0.0, 61.5]);
//! let buckets = Bucketize::new("age", vec![18.0, 30.0, 65.0]).unwrap();
//! let Value::Tensor(b) = buckets.apply(&filled).unwrap() else { unreachable!() };
//! assert_eq!(b.to_vec::<i64>().unwrap(), vec![1, 0, 2]);
//! ```

mod categorical;
mod cells;
mod numeric;

pub use categorical::{HashBucket, VocabLookup};
pub use numeric::{Bucketize, Clip, Fill, FillNull, Log1p, Negative, Standardize};

use stoker_core::{Error, OpMeta, Sample, Value};

/// A tabular operator: one field, element by element.
pub trait ColumnOp {
    /// The operator's name, as in error messages (`log1p`, `hash_bucket`).
    fn name(&self) -> &'static str;

    /// The field it reads and writes.
    fn field(&self) -> &str;

    /// Transforms one sample's value or one batch column (see the module docs for
    /// shapes and dtypes).
    fn apply(&self, value: &Value) -> Result<Value, Error>;

    /// Replaces the field of `sample` with its transform.
    fn apply_sample(&self, sample: &mut Sample) -> Result<(), Error> {
        let v = sample.get(self.field()).ok_or_else(|| {
            Error::operator(format!("{}: no field '{}'", self.name(), self.field()))
        })?;
        let out = self.apply(v)?;
        sample.insert(self.field(), out);
        Ok(())
    }

    /// Deterministic and stateless.
    fn meta(&self) -> OpMeta {
        OpMeta::new(self.name())
    }
}
