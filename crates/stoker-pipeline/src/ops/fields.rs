//! The field operators of [`Builtin`](super::Builtin): renaming, selecting and dropping
//! fields, small conversions of one field (bytes to text, text to an integer, raw bytes
//! to a tensor), byte lengths and a filter on them, and a random integer. None needs a
//! kernel of `stoker_ops`: each is a few lines here. They are the cheapest operators, and
//! the only ones the columnar read path lets run before a batch (`rename`, `select`,
//! `drop`: see `optimize/read_path.rs`).

use bytes::Bytes;
use stoker_core::{DType, Error, OpMeta, Sample, Tensor, Value};

use super::OpContext;

/// The field operators a spec can name, with their arguments (one modality of
/// [`Builtin`](super::Builtin)).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum FieldOp {
    /// Renames field `from` to `to`.
    Rename {
        /// Old name.
        from: String,
        /// New name.
        to: String,
    },
    /// Keeps only `fields`.
    Select {
        /// Fields to keep.
        fields: Vec<String>,
    },
    /// Removes `fields`.
    Drop {
        /// Fields to remove.
        fields: Vec<String>,
    },
    /// Bytes to text (an error on invalid UTF-8).
    DecodeUtf8 {
        /// The field.
        field: String,
    },
    /// Text or bytes holding a decimal integer to an integer (`.cls` files).
    ParseInt {
        /// The field.
        field: String,
    },
    /// Raw little-endian bytes to a tensor (zero-copy), of `dtype` and `shape` (default:
    /// 1-D of whatever length the bytes give).
    ToTensor {
        /// The field.
        field: String,
        /// Element type (`uint8`, `float32`, ...).
        dtype: String,
        /// Shape; `None` for 1-D.
        #[serde(default)]
        shape: Option<Vec<usize>>,
    },
    /// Adds field `to` holding the byte length of `field`.
    Len {
        /// The field measured.
        field: String,
        /// The new field.
        to: String,
    },
    /// Keeps samples whose `field` has at least `min` (and at most `max`) bytes.
    FilterLen {
        /// The field measured.
        field: String,
        /// Smallest kept length.
        #[serde(default)]
        min: Option<usize>,
        /// Largest kept length.
        #[serde(default)]
        max: Option<usize>,
    },
    /// Adds field `to` with a random integer in `0..below` (a random operator, mostly for
    /// testing reproducibility).
    RandomInt {
        /// The new field.
        to: String,
        /// Exclusive bound.
        below: u64,
    },
}

impl FieldOp {
    /// The operators' names in a spec (their `op`), in the order of the variants.
    pub const NAMES: &'static [&'static str] = &[
        "rename",
        "select",
        "drop",
        "decode_utf8",
        "parse_int",
        "to_tensor",
        "len",
        "filter_len",
        "random_int",
    ];

    /// The operator's name in plans and errors.
    pub fn name(&self) -> String {
        match self {
            FieldOp::Rename { from, to } => format!("rename({from}->{to})"),
            FieldOp::Select { .. } => "select".into(),
            FieldOp::Drop { .. } => "drop".into(),
            FieldOp::DecodeUtf8 { field } => format!("decode_utf8({field})"),
            FieldOp::ParseInt { field } => format!("parse_int({field})"),
            FieldOp::ToTensor { field, .. } => format!("to_tensor({field})"),
            FieldOp::Len { field, .. } => format!("len({field})"),
            FieldOp::FilterLen { field, .. } => format!("filter_len({field})"),
            FieldOp::RandomInt { to, .. } => format!("random_int({to})"),
        }
    }

    /// The operator's declaration for the optimizer.
    pub(crate) fn meta(&self) -> OpMeta {
        let m = OpMeta::new(self.name());
        match self {
            FieldOp::RandomInt { .. } => m.random().with_cost_ns(20.0),
            FieldOp::DecodeUtf8 { .. } => m.with_cost_ns(100.0).with_size_ratio(1.0),
            FieldOp::FilterLen { .. } => m.filter().with_cost_ns(10.0).with_size_ratio(1.0),
            _ => m.with_cost_ns(20.0).with_size_ratio(1.0),
        }
    }

    /// Checks arguments that can be checked before running.
    pub fn validate(&self) -> Result<(), Error> {
        match self {
            FieldOp::ToTensor { dtype, .. } if DType::parse(dtype).is_none() => Err(
                Error::invalid(format!("to_tensor: unknown dtype {dtype:?}")),
            ),
            FieldOp::RandomInt { below: 0, .. } => {
                Err(Error::invalid("random_int: `below` must be at least 1"))
            }
            _ => Ok(()),
        }
    }

    /// Applies the operator to one sample; `Ok(None)` drops it (`filter_len`).
    pub(crate) fn apply(
        &self,
        mut s: Sample,
        ctx: &mut OpContext,
    ) -> Result<Option<Sample>, Error> {
        match self {
            FieldOp::Rename { from, to } => {
                s.require(from)?;
                s.rename(from, to.as_str());
            }
            FieldOp::Select { fields } => {
                for f in fields {
                    s.require(f)?;
                }
                s.retain(|n| fields.iter().any(|f| f == n));
            }
            FieldOp::Drop { fields } => s.retain(|n| !fields.iter().any(|f| f == n)),
            FieldOp::DecodeUtf8 { field } => {
                let v = take_field(&mut s, field)?;
                let text = match v {
                    Value::Bytes(b) => match std::str::from_utf8(&b) {
                        Ok(t) => Value::Str(t.into()),
                        Err(e) => {
                            return Err(Error::operator(format!(
                                "field {field:?} is not UTF-8: {e}"
                            )))
                        }
                    },
                    Value::Str(t) => Value::Str(t),
                    other => {
                        return Err(Error::operator(format!(
                            "field {field:?} is {}, not bytes",
                            other.kind()
                        )))
                    }
                };
                s.insert(field.as_str(), text);
            }
            FieldOp::ParseInt { field } => {
                let v = take_field(&mut s, field)?;
                let parsed = match &v {
                    Value::Int(i) => Some(*i),
                    other => other
                        .as_bytes()
                        .and_then(|b| std::str::from_utf8(b).ok())
                        .and_then(|t| t.trim().parse::<i64>().ok()),
                };
                let i = parsed
                    .ok_or_else(|| Error::operator(format!("field {field:?} is not an integer")))?;
                s.insert(field.as_str(), i);
            }
            FieldOp::ToTensor {
                field,
                dtype,
                shape,
            } => {
                let dt = DType::parse(dtype)
                    .ok_or_else(|| Error::invalid(format!("unknown dtype {dtype:?}")))?;
                let v = take_field(&mut s, field)?;
                let b: Bytes = match v {
                    Value::Bytes(b) => b,
                    other => {
                        return Err(Error::operator(format!(
                            "field {field:?} is {}, not bytes",
                            other.kind()
                        )))
                    }
                };
                let shape = shape.clone().unwrap_or_else(|| vec![b.len() / dt.size()]);
                s.insert(
                    field.as_str(),
                    Tensor::new(dt, shape, b)
                        .map_err(|e| Error::operator(format!("field {field:?}: {}", e.message)))?,
                );
            }
            FieldOp::Len { field, to } => {
                let n = s.require(field)?.size_bytes();
                s.insert(to.as_str(), n as i64);
            }
            FieldOp::FilterLen { field, min, max } => {
                let n = s.require(field)?.size_bytes();
                if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
                    return Ok(None);
                }
            }
            FieldOp::RandomInt { to, below } => {
                let v = ctx.rng().below(*below) as i64;
                s.insert(to.as_str(), v);
            }
        }
        Ok(Some(s))
    }
}

fn take_field(s: &mut Sample, field: &str) -> Result<Value, Error> {
    s.require(field)?;
    Ok(s.remove(field).expect("present"))
}
