//! Numeric transforms: fill nulls, log1p, clip, standardize, bucketize.

use stoker_core::{DType, Error, Value};

use super::cells::{self, Cell, Layout, Site};
use super::ColumnOp;

/// The numbers of `v` as f64: ints converted (exact below 2^53), nulls and NaN refused.
fn numbers(site: Site<'_>, v: &Value) -> Result<(Layout, Vec<f64>), Error> {
    let (layout, cells) = cells::read(v)?;
    let mut out = Vec::with_capacity(cells.len());
    for (row, c) in cells.iter().enumerate() {
        out.push(match *c {
            Cell::Int(i) => i as f64,
            Cell::Float(f) if f.is_nan() => {
                return Err(site.err(&layout, row, "is NaN (put fill_null before it)"))
            }
            Cell::Float(f) => f,
            Cell::Null => return Err(site.err(&layout, row, "is null (put fill_null before it)")),
            other => {
                return Err(site.err(
                    &layout,
                    row,
                    format!("is {}, expected a number", other.kind()),
                ))
            }
        });
    }
    Ok((layout, out))
}

/// The fill value of [`FillNull`].
#[derive(Debug, Clone, PartialEq)]
pub enum Fill {
    /// A number; the output is float (`dtype`), whatever the column held.
    Float(f64),
    /// An integer; the output is int64 when the column holds only ints and nulls, float
    /// (`dtype`) when it holds a float.
    Int(i64),
    /// A string, for categorical columns; the output is the column with nulls replaced
    /// (a list, or the scalar).
    Str(String),
}

/// Replaces nulls (and NaN, unless told not to) with a constant.
#[derive(Debug, Clone, PartialEq)]
pub struct FillNull {
    field: String,
    value: Fill,
    nan_as_null: bool,
    dtype: DType,
}

impl FillNull {
    /// Fills `field`'s nulls and NaN with `value`; float output is `float32`.
    pub fn new(field: impl Into<String>, value: Fill) -> FillNull {
        FillNull {
            field: field.into(),
            value,
            nan_as_null: true,
            dtype: DType::F32,
        }
    }
    /// Whether a float NaN counts as null (default true: Parquet and pandas often write
    /// missing floats as NaN).
    pub fn nan_as_null(mut self, yes: bool) -> Self {
        self.nan_as_null = yes;
        self
    }
    /// Sets the float output dtype (`float32` or `float64`).
    pub fn dtype(mut self, d: DType) -> Result<Self, Error> {
        self.dtype = cells::float_dtype("fill_null", d)?;
        Ok(self)
    }

    fn site(&self) -> Site<'_> {
        Site {
            op: "fill_null",
            field: &self.field,
        }
    }
}

impl ColumnOp for FillNull {
    fn name(&self) -> &'static str {
        "fill_null"
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn apply(&self, value: &Value) -> Result<Value, Error> {
        let dtype = self.dtype;
        if let Fill::Str(s) = &self.value {
            return Ok(match value {
                Value::Null => Value::from(s.as_str()),
                Value::List(items) => Value::List(
                    items
                        .iter()
                        .map(|v| match v {
                            Value::Null => Value::from(s.as_str()),
                            v => v.clone(),
                        })
                        .collect(),
                ),
                v => v.clone(),
            });
        }
        let (layout, cells) = cells::read(value)?;
        let is_null = |c: &Cell<'_>| match c {
            Cell::Null => true,
            Cell::Float(f) => self.nan_as_null && f.is_nan(),
            _ => false,
        };
        let all_int = cells.iter().all(|c| matches!(c, Cell::Int(_) | Cell::Null));
        if let (Fill::Int(fill), true) = (&self.value, all_int) {
            let out: Vec<i64> = cells
                .iter()
                .map(|c| match c {
                    Cell::Int(i) => *i,
                    _ => *fill,
                })
                .collect();
            return cells::ints(&layout, &out);
        }
        let fill = match self.value {
            Fill::Float(f) => f,
            Fill::Int(i) => i as f64,
            Fill::Str(_) => unreachable!("handled above"),
        };
        let mut out = Vec::with_capacity(cells.len());
        for (row, c) in cells.iter().enumerate() {
            out.push(match *c {
                c if is_null(&c) => fill,
                Cell::Int(i) => i as f64,
                Cell::Float(f) => f,
                other => {
                    return Err(self.site().err(
                        &layout,
                        row,
                        format!("is {}, expected a number or null", other.kind()),
                    ))
                }
            });
        }
        cells::floats(&layout, &out, dtype)
    }
}

/// What [`Log1p`] does with a negative number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Negative {
    /// An error naming the row (the default: a negative count is usually a data bug).
    #[default]
    Error,
    /// Clamp to 0 first, so the output is 0 (DLRM's Criteo preprocessing does this).
    Clamp,
}

/// `ln(1 + x)`, for counts and other heavy-tailed non-negative features.
#[derive(Debug, Clone, PartialEq)]
pub struct Log1p {
    field: String,
    negative: Negative,
    dtype: DType,
}

impl Log1p {
    /// `log1p` of `field`; negatives (any `x < 0`, including `-1 < x < 0`) are an error;
    /// output `float32`.
    pub fn new(field: impl Into<String>) -> Log1p {
        Log1p {
            field: field.into(),
            negative: Negative::Error,
            dtype: DType::F32,
        }
    }
    /// Sets the rule for negatives.
    pub fn negative(mut self, n: Negative) -> Self {
        self.negative = n;
        self
    }
    /// Sets the output dtype (`float32` or `float64`).
    pub fn dtype(mut self, d: DType) -> Result<Self, Error> {
        self.dtype = cells::float_dtype("log1p", d)?;
        Ok(self)
    }
}

impl ColumnOp for Log1p {
    fn name(&self) -> &'static str {
        "log1p"
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn apply(&self, value: &Value) -> Result<Value, Error> {
        let dtype = self.dtype;
        let site = Site {
            op: "log1p",
            field: &self.field,
        };
        let (layout, mut xs) = numbers(site, value)?;
        for (row, x) in xs.iter_mut().enumerate() {
            if *x < 0.0 {
                match self.negative {
                    Negative::Error => {
                        return Err(site.err(
                            &layout,
                            row,
                            format!(
                                "is negative ({x}); set negative = clamp to map negatives to 0"
                            ),
                        ))
                    }
                    Negative::Clamp => *x = 0.0,
                }
            }
            *x = x.ln_1p();
        }
        cells::floats(&layout, &xs, dtype)
    }
}

/// Bounds values to `[min, max]` (either side optional).
#[derive(Debug, Clone, PartialEq)]
pub struct Clip {
    field: String,
    min: Option<f64>,
    max: Option<f64>,
    dtype: DType,
}

impl Clip {
    /// Clips `field` to `[min, max]`, output `float32`. Bounds must not be NaN and
    /// `min <= max`.
    pub fn new(
        field: impl Into<String>,
        min: Option<f64>,
        max: Option<f64>,
    ) -> Result<Clip, Error> {
        if min.is_some_and(f64::is_nan) || max.is_some_and(f64::is_nan) {
            return Err(Error::invalid("clip: a bound is NaN"));
        }
        if let (Some(lo), Some(hi)) = (min, max) {
            if lo > hi {
                return Err(Error::invalid(format!(
                    "clip: min {lo} is more than max {hi}"
                )));
            }
        }
        Ok(Clip {
            field: field.into(),
            min,
            max,
            dtype: DType::F32,
        })
    }
    /// Sets the output dtype (`float32` or `float64`).
    pub fn dtype(mut self, d: DType) -> Result<Self, Error> {
        self.dtype = cells::float_dtype("clip", d)?;
        Ok(self)
    }
}

impl ColumnOp for Clip {
    fn name(&self) -> &'static str {
        "clip"
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn apply(&self, value: &Value) -> Result<Value, Error> {
        let site = Site {
            op: "clip",
            field: &self.field,
        };
        let (layout, mut xs) = numbers(site, value)?;
        for x in &mut xs {
            if let Some(lo) = self.min {
                *x = x.max(lo);
            }
            if let Some(hi) = self.max {
                *x = x.min(hi);
            }
        }
        cells::floats(&layout, &xs, self.dtype)
    }
}

/// `(x - mean) / std` with precomputed statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct Standardize {
    field: String,
    mean: f64,
    std: f64,
    dtype: DType,
}

impl Standardize {
    /// Standardizes `field`, output `float32`. `mean` must be finite, `std` finite and
    /// positive. Computed in f64, then converted.
    pub fn new(field: impl Into<String>, mean: f64, std: f64) -> Result<Standardize, Error> {
        if !mean.is_finite() {
            return Err(Error::invalid(format!(
                "standardize: mean {mean} is not finite"
            )));
        }
        if !(std.is_finite() && std > 0.0) {
            return Err(Error::invalid(format!(
                "standardize: std {std} is not a finite positive number"
            )));
        }
        Ok(Standardize {
            field: field.into(),
            mean,
            std,
            dtype: DType::F32,
        })
    }
    /// Sets the output dtype (`float32` or `float64`).
    pub fn dtype(mut self, d: DType) -> Result<Self, Error> {
        self.dtype = cells::float_dtype("standardize", d)?;
        Ok(self)
    }
}

impl ColumnOp for Standardize {
    fn name(&self) -> &'static str {
        "standardize"
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn apply(&self, value: &Value) -> Result<Value, Error> {
        let site = Site {
            op: "standardize",
            field: &self.field,
        };
        let (layout, mut xs) = numbers(site, value)?;
        for x in &mut xs {
            *x = (*x - self.mean) / self.std;
        }
        cells::floats(&layout, &xs, self.dtype)
    }
}

/// The bucket of each value among sorted boundaries, as `torch.bucketize(x, boundaries,
/// right=False)`: index `i` such that `boundaries[i-1] < x <= boundaries[i]`, i.e. the
/// number of boundaries strictly less than `x`; in `0..=boundaries.len()`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucketize {
    field: String,
    boundaries: Vec<f64>,
}

impl Bucketize {
    /// Buckets of `field`; `boundaries` must be non-decreasing and free of NaN.
    pub fn new(field: impl Into<String>, boundaries: Vec<f64>) -> Result<Bucketize, Error> {
        if boundaries.iter().any(|b| b.is_nan()) {
            return Err(Error::invalid("bucketize: a boundary is NaN"));
        }
        if let Some(i) = boundaries.windows(2).position(|w| w[0] > w[1]) {
            return Err(Error::invalid(format!(
                "bucketize: boundaries are not sorted ({} before {})",
                boundaries[i],
                boundaries[i + 1]
            )));
        }
        Ok(Bucketize {
            field: field.into(),
            boundaries,
        })
    }

    /// The bucket of one number (not NaN).
    pub fn bucket(&self, x: f64) -> i64 {
        self.boundaries.partition_point(|&b| b < x) as i64
    }
}

impl ColumnOp for Bucketize {
    fn name(&self) -> &'static str {
        "bucketize"
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn apply(&self, value: &Value) -> Result<Value, Error> {
        let site = Site {
            op: "bucketize",
            field: &self.field,
        };
        let (layout, xs) = numbers(site, value)?;
        let out: Vec<i64> = xs.iter().map(|&x| self.bucket(x)).collect();
        cells::ints(&layout, &out)
    }
}
