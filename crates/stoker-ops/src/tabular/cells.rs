//! Reading a value as cells and writing cells back in the input's shape.

use stoker_core::{DType, Error, Tensor, Value};

/// One element of a field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Cell<'a> {
    Null,
    Int(i64),
    Float(f64),
    /// A `Str` or `Bytes` value.
    Text(&'a [u8]),
    /// Something that is not a scalar (kind, for the message).
    Other(&'static str),
}

impl Cell<'_> {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Cell::Null => "null",
            Cell::Int(_) => "int",
            Cell::Float(_) => "float",
            Cell::Text(_) => "str",
            Cell::Other(k) => k,
        }
    }
}

/// The shape the output takes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Layout {
    /// A scalar value.
    Scalar,
    /// A tensor (from a tensor, or `[n]` from a list).
    Shape(Vec<usize>),
}

/// Where an error is: the op, the field, and the row when the value has rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Site<'a> {
    pub op: &'static str,
    pub field: &'a str,
}

impl Site<'_> {
    pub(crate) fn err(&self, layout: &Layout, row: usize, what: impl std::fmt::Display) -> Error {
        let at = match layout {
            Layout::Scalar => String::new(),
            Layout::Shape(_) => format!(" row {row}"),
        };
        Error::operator(format!("{}: field '{}'{at} {what}", self.op, self.field))
    }
}

/// The cells of `v`, in row-major order.
pub(crate) fn read(v: &Value) -> Result<(Layout, Vec<Cell<'_>>), Error> {
    Ok(match v {
        Value::List(items) => (
            Layout::Shape(vec![items.len()]),
            items.iter().map(scalar).collect(),
        ),
        Value::Tensor(t) if !t.shape().is_empty() => {
            (Layout::Shape(t.shape().to_vec()), tensor_cells(t))
        }
        other => (Layout::Scalar, vec![scalar(other)]),
    })
}

fn scalar(v: &Value) -> Cell<'_> {
    match v {
        Value::Null => Cell::Null,
        Value::Int(i) => Cell::Int(*i),
        Value::Float(f) => Cell::Float(*f),
        Value::Str(s) => Cell::Text(s.as_bytes()),
        Value::Bytes(b) => Cell::Text(b),
        Value::Tensor(t) if t.shape().is_empty() => tensor_cells(t)[0],
        Value::Tensor(_) => Cell::Other("tensor"),
        Value::List(_) => Cell::Other("list"),
    }
}

fn tensor_cells(t: &Tensor) -> Vec<Cell<'static>> {
    let d = t.data();
    match t.dtype() {
        DType::U8 => d.iter().map(|&x| Cell::Int(x.into())).collect(),
        DType::I16 => d
            .chunks_exact(2)
            .map(|c| Cell::Int(i16::from_le_bytes([c[0], c[1]]).into()))
            .collect(),
        DType::I32 => d
            .chunks_exact(4)
            .map(|c| Cell::Int(i32::from_le_bytes(c.try_into().unwrap()).into()))
            .collect(),
        DType::I64 => d
            .chunks_exact(8)
            .map(|c| Cell::Int(i64::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        DType::F32 => d
            .chunks_exact(4)
            .map(|c| Cell::Float(f32::from_le_bytes(c.try_into().unwrap()).into()))
            .collect(),
        DType::F64 => d
            .chunks_exact(8)
            .map(|c| Cell::Float(f64::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        DType::F16 => d
            .chunks_exact(2)
            .map(|c| Cell::Float(f16_to_f32(u16::from_le_bytes([c[0], c[1]])).into()))
            .collect(),
        DType::BF16 => d
            .chunks_exact(2)
            .map(|c| {
                Cell::Float(
                    f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16).into(),
                )
            })
            .collect(),
    }
}

/// IEEE half to single (exact: every half is a single).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: m * 2^-24.
            let v = m as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Float output in `dtype` (`F32` or `F64`) and the input's layout.
pub(crate) fn floats(layout: &Layout, values: &[f64], dtype: DType) -> Result<Value, Error> {
    Ok(match (layout, dtype) {
        (Layout::Scalar, DType::F64) => Value::Float(values[0]),
        (Layout::Scalar, _) => Value::Tensor(Tensor::scalar(values[0] as f32)),
        (Layout::Shape(s), DType::F64) => Value::Tensor(Tensor::from_slice(s.clone(), values)?),
        (Layout::Shape(s), _) => {
            let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
            Value::Tensor(Tensor::from_slice(s.clone(), &v)?)
        }
    })
}

/// int64 output in the input's layout.
pub(crate) fn ints(layout: &Layout, values: &[i64]) -> Result<Value, Error> {
    Ok(match layout {
        Layout::Scalar => Value::Int(values[0]),
        Layout::Shape(s) => Value::Tensor(Tensor::from_slice(s.clone(), values)?),
    })
}

/// Checks a float output dtype parameter.
pub(crate) fn float_dtype(op: &str, dtype: DType) -> Result<DType, Error> {
    match dtype {
        DType::F32 | DType::F64 => Ok(dtype),
        d => Err(Error::invalid(format!(
            "{op}: dtype must be float32 or float64, not {d}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_floats_decode() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
    }

    #[test]
    fn every_dtype_reads() {
        let t = Tensor::from_slice(vec![2], &[-3i16, 7]).unwrap();
        let v = Value::Tensor(t);
        let (l, c) = read(&v).unwrap();
        assert_eq!(l, Layout::Shape(vec![2]));
        assert_eq!(c, vec![Cell::Int(-3), Cell::Int(7)]);
        let bf = Tensor::new(DType::BF16, vec![1], bytes::Bytes::from(vec![0x80, 0x3f])).unwrap();
        assert_eq!(read(&Value::Tensor(bf)).unwrap().1, vec![Cell::Float(1.0)]);
        let v = Value::Tensor(Tensor::scalar(2.5f32));
        let (l, c) = read(&v).unwrap();
        assert_eq!((l, c), (Layout::Scalar, vec![Cell::Float(2.5)]));
    }
}
