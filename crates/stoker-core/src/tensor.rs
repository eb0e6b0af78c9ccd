//! Tensors: a dtype, a shape and one contiguous, row-major buffer of bytes.
//!
//! The buffer is a [`Bytes`], so a tensor can be a zero-copy view of what storage returned
//! (a raw `.npy` payload, a Parquet column) and can be handed to NumPy/DLPack without a copy.

use bytes::Bytes;

use crate::error::Error;

/// Element types of a [`Tensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// Unsigned 8-bit (images).
    U8,
    /// Signed 16-bit (audio).
    I16,
    /// Signed 32-bit.
    I32,
    /// Signed 64-bit (labels, token ids).
    I64,
    /// IEEE half precision (stored as raw 16-bit words).
    F16,
    /// bfloat16 (stored as raw 16-bit words).
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The NumPy-style name (`uint8`, `float32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    /// Parses a NumPy-style name (`uint8`, `u8`, `float32`, `f32`, ...).
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "uint8" | "u8" => DType::U8,
            "int16" | "i16" => DType::I16,
            "int32" | "i32" => DType::I32,
            "int64" | "i64" => DType::I64,
            "float16" | "f16" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "float32" | "f32" => DType::F32,
            "float64" | "f64" => DType::F64,
            _ => return None,
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Rust element types that map to a [`DType`].
pub trait Element: Copy + Send + Sync + 'static {
    /// Its dtype.
    const DTYPE: DType;
    /// Appends the little-endian bytes of `v` to `out`.
    fn extend_le(v: &[Self], out: &mut Vec<u8>);
    /// The value from little-endian bytes (`b.len() == size`).
    fn from_le(b: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            // Inlined (across crates too) and written so that the compiler makes a plain
            // copy of them on little-endian machines: a call per element cost the audio
            // operators a sixth of their time.
            #[inline]
            fn extend_le(v: &[Self], out: &mut Vec<u8>) {
                const N: usize = std::mem::size_of::<$t>();
                let start = out.len();
                out.resize(start + v.len() * N, 0);
                for (b, x) in out[start..].chunks_exact_mut(N).zip(v) {
                    b.copy_from_slice(&x.to_le_bytes());
                }
            }
            #[inline]
            fn from_le(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element size"))
            }
        }
    };
}
element!(u8, DType::U8);
element!(i16, DType::I16);
element!(i32, DType::I32);
element!(i64, DType::I64);
element!(f32, DType::F32);
element!(f64, DType::F64);

/// An n-dimensional array: dtype, shape, and a contiguous little-endian row-major buffer.
#[derive(Clone, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    data: Bytes,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({}, {:?})", self.dtype, self.shape)
    }
}

impl Tensor {
    /// A tensor over `data`, which must hold exactly `shape.product() * dtype.size()` bytes.
    pub fn new(dtype: DType, shape: Vec<usize>, data: Bytes) -> Result<Tensor, Error> {
        let want = shape
            .iter()
            .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::invalid(format!("tensor shape {shape:?} overflows")))?;
        if data.len() != want {
            return Err(Error::invalid(format!(
                "a {dtype} tensor of shape {shape:?} needs {want} bytes, got {}",
                data.len()
            )));
        }
        Ok(Tensor { dtype, shape, data })
    }

    /// A tensor holding a copy of `values`.
    pub fn from_slice<T: Element>(shape: Vec<usize>, values: &[T]) -> Result<Tensor, Error> {
        let mut out = Vec::new();
        T::extend_le(values, &mut out);
        Tensor::new(T::DTYPE, shape, Bytes::from(out))
    }

    /// A 0-d tensor.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor::from_slice(Vec::new(), &[v]).expect("scalar shape")
    }

    /// Its dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The raw buffer.
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// The elements as `T` (copied out of the little-endian buffer). `None` if the dtype
    /// is not `T`'s.
    pub fn to_vec<T: Element>(&self) -> Option<Vec<T>> {
        (T::DTYPE == self.dtype).then(|| {
            self.data
                .chunks_exact(self.dtype.size())
                .map(T::from_le)
                .collect()
        })
    }

    /// Stacks equal-shape, equal-dtype tensors along a new leading axis.
    pub fn stack(items: &[&Tensor]) -> Result<Tensor, Error> {
        let first = items
            .first()
            .ok_or_else(|| Error::invalid("cannot stack zero tensors"))?;
        let (mut data, pad) = crate::recycle::GLOBAL.take_aligned(first.data.len() * items.len());
        for t in items {
            if t.dtype != first.dtype || t.shape != first.shape {
                return Err(Error::invalid(format!(
                    "cannot stack a {} tensor of shape {:?} with a {} tensor of shape {:?} \
                     (collate with `pad` or `list` instead)",
                    first.dtype, first.shape, t.dtype, t.shape
                )));
            }
            data.extend_from_slice(&t.data);
        }
        let data = crate::recycle::freeze(data, pad);
        let mut shape = vec![items.len()];
        shape.extend_from_slice(&first.shape);
        Tensor::new(first.dtype, shape, data)
    }

    /// Stacks equal-rank, equal-dtype tensors of different shapes, padding each to the
    /// largest extent along every axis with `pad` (converted to the dtype).
    pub fn pad_stack(items: &[&Tensor], pad: f64) -> Result<Tensor, Error> {
        let first = items
            .first()
            .ok_or_else(|| Error::invalid("cannot stack zero tensors"))?;
        let rank = first.shape.len();
        let mut max = first.shape.clone();
        for t in items {
            if t.dtype != first.dtype || t.shape.len() != rank {
                return Err(Error::invalid(format!(
                    "cannot pad a {} tensor of shape {:?} with a {} tensor of shape {:?}",
                    first.dtype, first.shape, t.dtype, t.shape
                )));
            }
            for (m, &d) in max.iter_mut().zip(&t.shape) {
                *m = (*m).max(d);
            }
        }
        let es = first.dtype.size();
        let pad_bytes = pad_element(first.dtype, pad);
        let per_item: usize = max.iter().product::<usize>() * es;
        let (mut data, pad) = crate::recycle::GLOBAL.take_aligned(per_item * items.len());
        for t in items {
            let start = data.len();
            // Fill with the pad value, then copy each innermost row into place.
            for _ in 0..per_item / es {
                data.extend_from_slice(&pad_bytes[..es]);
            }
            if t.numel() == 0 {
                continue;
            }
            let row = t.shape.last().copied().unwrap_or(1) * es;
            let rows = t.numel() * es / row.max(1);
            let mut idx = vec![0usize; rank.saturating_sub(1)];
            for r in 0..rows {
                // Offset of this row in the padded layout.
                let mut off = 0usize;
                let mut stride = es;
                for axis in (0..rank).rev() {
                    let i = if axis == rank - 1 { 0 } else { idx[axis] };
                    off += i * stride;
                    stride *= max[axis];
                }
                data[start + off..start + off + row]
                    .copy_from_slice(&t.data[r * row..(r + 1) * row]);
                // Advance the multi-index over all axes but the last.
                for axis in (0..rank.saturating_sub(1)).rev() {
                    idx[axis] += 1;
                    if idx[axis] < t.shape[axis] {
                        break;
                    }
                    idx[axis] = 0;
                }
            }
        }
        let mut shape = vec![items.len()];
        shape.extend_from_slice(&max);
        Tensor::new(first.dtype, shape, crate::recycle::freeze(data, pad))
    }

    /// Splits along the leading axis (the inverse of [`Tensor::stack`]); zero-copy.
    pub fn unstack(&self) -> Result<Vec<Tensor>, Error> {
        let (&n, rest) = self
            .shape
            .split_first()
            .ok_or_else(|| Error::invalid("cannot unstack a 0-d tensor"))?;
        let each = rest.iter().product::<usize>() * self.dtype.size();
        (0..n)
            .map(|i| {
                Tensor::new(
                    self.dtype,
                    rest.to_vec(),
                    self.data.slice(i * each..(i + 1) * each),
                )
            })
            .collect()
    }
}

fn pad_element(dtype: DType, v: f64) -> [u8; 8] {
    let mut b = [0u8; 8];
    match dtype {
        DType::U8 => b[0] = v as u8,
        DType::I16 => b[..2].copy_from_slice(&(v as i16).to_le_bytes()),
        DType::I32 => b[..4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => b[..8].copy_from_slice(&(v as i64).to_le_bytes()),
        DType::F32 => b[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => b[..8].copy_from_slice(&v.to_le_bytes()),
        // Half types: only 0 is exact without a conversion crate; bf16 is the top half of f32.
        DType::BF16 => b[..2].copy_from_slice(&(((v as f32).to_bits() >> 16) as u16).to_le_bytes()),
        DType::F16 => b[..2].copy_from_slice(&f32_to_f16_bits(v as f32).to_le_bytes()),
    }
    b
}

/// IEEE half from single (round toward zero; enough for pad values).
fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let man = (b >> 13) & 0x3ff;
    if x == 0.0 {
        sign
    } else if exp >= 31 {
        sign | 0x7c00
    } else if exp <= 0 {
        sign
    } else {
        sign | ((exp as u16) << 10) | man as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_and_unstack_round_trip() {
        let a = Tensor::from_slice(vec![2], &[1i32, 2]).unwrap();
        let b = Tensor::from_slice(vec![2], &[3i32, 4]).unwrap();
        let s = Tensor::stack(&[&a, &b]).unwrap();
        assert_eq!(s.shape(), &[2, 2]);
        assert_eq!(s.to_vec::<i32>().unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(s.unstack().unwrap(), vec![a, b]);
    }

    #[test]
    fn stacking_different_shapes_says_so() {
        let a = Tensor::from_slice(vec![2], &[1u8, 2]).unwrap();
        let b = Tensor::from_slice(vec![3], &[1u8, 2, 3]).unwrap();
        let e = Tensor::stack(&[&a, &b]).unwrap_err().to_string();
        assert!(e.contains("[2]") && e.contains("[3]"), "{e}");
    }

    #[test]
    fn pad_stack_places_rows() {
        let a = Tensor::from_slice(vec![1, 2], &[1i64, 2]).unwrap();
        let b = Tensor::from_slice(vec![2, 1], &[3i64, 4]).unwrap();
        let s = Tensor::pad_stack(&[&a, &b], -1.0).unwrap();
        assert_eq!(s.shape(), &[2, 2, 2]);
        assert_eq!(s.to_vec::<i64>().unwrap(), vec![1, 2, -1, -1, 3, -1, 4, -1]);
    }

    #[test]
    fn wrong_length_is_an_error() {
        assert!(Tensor::new(DType::F32, vec![3], Bytes::from_static(&[0; 8])).is_err());
    }
}
