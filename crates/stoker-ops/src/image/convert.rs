//! The last step of an image pipeline: to floats, normalised, in the layout the model
//! wants; plus plain layout and dtype conversions.

use std::mem::MaybeUninit;

use bytes::Bytes;
use half::f16;
use stoker_core::{DType, Error, Lease, Tensor};

use super::ImageRef;

/// Memory layout of an image tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// `[H, W, C]` (decoders' layout, NumPy/PIL).
    #[default]
    Hwc,
    /// `[C, H, W]` (PyTorch's).
    Chw,
}

/// torchvision's `ToTensor` + `Normalize` in one pass over a u8 image:
/// `out = (x / 255 - mean[c]) / std[c]` (or `(x - mean) / std` without the division),
/// as `f32` or `f16`, in `[C, H, W]` (default) or `[H, W, C]`. Computed through a
/// 256-entry table per channel, so it costs one lookup per sample; 3-channel f32
/// `[C, H, W]` on x86-64 with AVX2 computes the same operations 8 samples at a time (the
/// same bits as the table).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToTensor {
    /// Per-channel mean (one value applies to all channels); empty: 0.
    pub mean: Vec<f32>,
    /// Per-channel std (one value applies to all channels); empty: 1.
    pub std: Vec<f32>,
    /// Divide by 255 first.
    pub scale: bool,
    /// Output dtype: `F32` or `F16`.
    pub dtype: DType,
    /// Output layout.
    pub layout: Layout,
}

impl Default for ToTensor {
    fn default() -> ToTensor {
        ToTensor {
            mean: Vec::new(),
            std: Vec::new(),
            scale: true,
            dtype: DType::F32,
            layout: Layout::Chw,
        }
    }
}

impl ToTensor {
    /// ImageNet's mean and std (what torchvision recipes normalise with).
    pub fn imagenet() -> ToTensor {
        ToTensor::default().normalize(&[0.485, 0.456, 0.406], &[0.229, 0.224, 0.225])
    }

    /// Sets mean and std.
    pub fn normalize(mut self, mean: &[f32], std: &[f32]) -> ToTensor {
        self.mean = mean.to_vec();
        self.std = std.to_vec();
        self
    }

    /// Sets the output dtype (`F32` or `F16`).
    pub fn dtype(mut self, d: DType) -> ToTensor {
        self.dtype = d;
        self
    }

    /// Sets the layout.
    pub fn layout(mut self, l: Layout) -> ToTensor {
        self.layout = l;
        self
    }

    /// Sets whether to divide by 255.
    pub fn scale(mut self, on: bool) -> ToTensor {
        self.scale = on;
        self
    }

    fn per_channel(v: &[f32], c: usize, default: f32, what: &str) -> Result<Vec<f32>, Error> {
        match v.len() {
            0 => Ok(vec![default; c]),
            1 => Ok(vec![v[0]; c]),
            n if n == c => Ok(v.to_vec()),
            n => Err(Error::operator(format!(
                "to_tensor: {n} {what} values for a {c}-channel image"
            ))),
        }
    }

    /// The output shape for an `h` x `w` image of `c` channels.
    pub(crate) fn shape(&self, c: usize, h: usize, w: usize) -> Vec<usize> {
        match self.layout {
            Layout::Chw => vec![c, h, w],
            Layout::Hwc => vec![h, w, c],
        }
    }

    /// The per-channel tables for a `c`-channel image: each u8 value's output, as the
    /// little-endian bytes of the output dtype. Checks mean, std and dtype.
    pub(crate) fn tables(&self, c: usize) -> Result<Tables, Error> {
        let mean = ToTensor::per_channel(&self.mean, c, 0.0, "mean")?;
        let std = ToTensor::per_channel(&self.std, c, 1.0, "std")?;
        if std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
            return Err(Error::invalid(format!(
                "to_tensor: std must be non-zero, got {std:?}"
            )));
        }
        let affine = Affine {
            scale: self.scale,
            mean,
            std,
        };
        let lut: Vec<[f32; 256]> = (0..c)
            .map(|ch| std::array::from_fn(|v| affine.apply(ch, v as u8)))
            .collect();
        match self.dtype {
            DType::F32 => Ok(Tables::F32(
                lut.iter().map(|t| t.map(f32::to_le_bytes)).collect(),
                affine,
            )),
            DType::F16 => Ok(Tables::F16(
                lut.iter()
                    .map(|t| t.map(|v| f16::from_f32(v).to_bits().to_le_bytes()))
                    .collect(),
            )),
            d => Err(Error::invalid(format!(
                "to_tensor: output dtype must be float32 or float16, got {d}"
            ))),
        }
    }

    /// Converts `image` (`[H, W, C]` u8).
    pub fn apply(&self, image: &Tensor) -> Result<Tensor, Error> {
        self.apply_into(image, &mut |_| None)
    }

    /// As [`apply`](Self::apply), writing the output into the memory `slot` gives for its
    /// length in bytes when it gives one (a batch slot, see [`stoker_core::BatchSlots`]):
    /// the same tensor, in that memory. `slot` is asked at most once.
    pub fn apply_into(
        &self,
        image: &Tensor,
        slot: &mut dyn FnMut(usize) -> Option<Lease>,
    ) -> Result<Tensor, Error> {
        let img = ImageRef::from_tensor(image, "to_tensor")?;
        let (h, w, c) = (img.h, img.w, img.c);
        let tables = self.tables(c)?;
        let len = img.data.len() * tables.size();
        let mut sink = Sink::new(slot(len), len);
        match &tables {
            Tables::F32(lut, affine) => {
                scatter_f32_into(img.data, c, self.layout, lut, affine, sink.dst())
            }
            Tables::F16(lut) => scatter_into(img.data, c, self.layout, lut, sink.dst()),
        }
        // SAFETY: both conversions write their output whole.
        Tensor::new(self.dtype, self.shape(c, h, w), unsafe { sink.done() })
    }
}

/// [`ToTensor`]'s lookup tables, one per channel, as output bytes.
#[derive(Debug)]
pub(crate) enum Tables {
    /// With the arithmetic the table was built by, for kernels that compute rather than
    /// look up (the same operations, so the same bits).
    F32(Vec<[[u8; 4]; 256]>, Affine),
    F16(Vec<[[u8; 2]; 256]>),
}

impl Tables {
    /// Bytes per output sample.
    pub(crate) fn size(&self) -> usize {
        match self {
            Tables::F32(..) => 4,
            Tables::F16(_) => 2,
        }
    }
}

/// `ToTensor`'s arithmetic per channel: `(x / 255 - mean) / std` in f32, or `(x - mean)
/// / std` without the scale.
#[derive(Debug, Clone)]
pub(crate) struct Affine {
    pub scale: bool,
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

impl Affine {
    /// Channel `ch`'s output for `v`.
    #[inline(always)]
    pub fn apply(&self, ch: usize, v: u8) -> f32 {
        let x = if self.scale {
            v as f32 / 255.0
        } else {
            v as f32
        };
        (x - self.mean[ch]) / self.std[ch]
    }
}

/// Where a conversion writes its output: a lease's memory (a batch slot, see
/// `stoker_core::BatchSlots`) when it has the output's length, else a new buffer. The
/// output is written whole, so neither is zeroed first (a fresh zeroed allocation of a
/// batch-sized tensor costs page faults and memory).
pub(crate) struct Sink {
    lease: Option<Lease>,
    vec: Vec<u8>,
    len: usize,
}

impl Sink {
    /// A sink for `len` bytes, into `lease` if it has that length.
    pub(crate) fn new(lease: Option<Lease>, len: usize) -> Sink {
        let lease = lease.filter(|l| l.len() == len);
        let vec = match lease {
            Some(_) => Vec::new(),
            None => Vec::with_capacity(len),
        };
        Sink { lease, vec, len }
    }

    /// The memory to write, `len` bytes.
    pub(crate) fn dst(&mut self) -> &mut [MaybeUninit<u8>] {
        match &mut self.lease {
            Some(l) => l.out(),
            None => &mut self.vec.spare_capacity_mut()[..self.len],
        }
    }

    /// The output's bytes, wherever they were written.
    ///
    /// # Safety
    /// Every byte of [`dst`](Self::dst) must have been written.
    pub(crate) unsafe fn done(mut self) -> Bytes {
        match self.lease {
            // SAFETY: the caller wrote the lease's memory whole.
            Some(l) => unsafe { l.into_bytes() },
            None => {
                // SAFETY: the caller wrote all `len` bytes of the spare capacity.
                unsafe { self.vec.set_len(self.len) };
                Bytes::from(self.vec)
            }
        }
    }
}

/// [`scatter_f32_into`] into a new buffer (for tests).
#[cfg(test)]
pub(crate) fn scatter_f32(
    px: &[u8],
    c: usize,
    layout: Layout,
    lut: &[[[u8; 4]; 256]],
    affine: &Affine,
) -> Bytes {
    let mut sink = Sink::new(None, px.len() * 4);
    scatter_f32_into(px, c, layout, lut, affine, sink.dst());
    // SAFETY: `scatter_f32_into` writes its output whole.
    unsafe { sink.done() }
}

/// [`scatter_into`] with f32 outputs, on x86-64 with AVX2 computing 3-channel `[C, H, W]`
/// planes 8 pixels at a time (the same bits): into `dst` (`px.len() * 4` bytes), written
/// whole.
pub(crate) fn scatter_f32_into(
    px: &[u8],
    c: usize,
    layout: Layout,
    lut: &[[[u8; 4]; 256]],
    affine: &Affine,
    dst: &mut [MaybeUninit<u8>],
) {
    #[cfg(target_arch = "x86_64")]
    if c == 3 && layout == Layout::Chw && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { super::rgbx::scatter_chw_f32(px, affine, dst) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = affine;
    scatter_into(px, c, layout, lut, dst)
}

/// [`scatter_into`] into a new buffer (for tests).
#[cfg(test)]
pub(crate) fn scatter<const N: usize>(
    px: &[u8],
    c: usize,
    layout: Layout,
    lut: &[[[u8; N]; 256]],
) -> Bytes {
    let mut sink = Sink::new(None, px.len() * N);
    scatter_into(px, c, layout, lut, sink.dst());
    // SAFETY: `scatter_into` writes its output whole.
    unsafe { sink.done() }
}

/// Maps every u8 sample through its channel's table of `N`-byte outputs, writing planes
/// (CHW) or interleaved pixels (HWC) into `dst` (`px.len() * N` bytes), written whole.
pub(crate) fn scatter_into<const N: usize>(
    px: &[u8],
    c: usize,
    layout: Layout,
    lut: &[[[u8; N]; 256]],
    dst: &mut [MaybeUninit<u8>],
) {
    let n = px.len() / c;
    // Every byte of `dst` is written below: `c` planes of `n` samples of `N` bytes, or
    // `px.len()` samples of `N` bytes.
    assert_eq!(dst.len(), px.len() * N);
    let put = |o: &mut [MaybeUninit<u8>], v: &[u8; N]| {
        for (o, &b) in o.iter_mut().zip(v) {
            o.write(b);
        }
    };
    match layout {
        Layout::Chw => {
            for (ch, plane) in dst.chunks_exact_mut(n * N).enumerate() {
                let t = &lut[ch];
                for (o, p) in plane.chunks_exact_mut(N).zip(px.chunks_exact(c)) {
                    put(o, &t[p[ch] as usize]);
                }
            }
        }
        Layout::Hwc => {
            for (i, (o, &v)) in dst.chunks_exact_mut(N).zip(px).enumerate() {
                put(o, &lut[i % c][v as usize]);
            }
        }
    }
}

/// Converts between `[H, W, C]` and `[C, H, W]` (any dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToLayout {
    /// Layout of the input.
    pub from: Layout,
    /// Layout of the output.
    pub to: Layout,
}

impl ToLayout {
    /// Converts `t`; a no-op (no copy) when `from == to`.
    pub fn apply(&self, t: &Tensor) -> Result<Tensor, Error> {
        let [a, b, c] = *t.shape() else {
            return Err(Error::operator(format!(
                "to_layout: expects a 3-d tensor, got shape {:?}",
                t.shape()
            )));
        };
        if self.from == self.to {
            return Ok(t.clone());
        }
        let es = t.dtype().size();
        let src = t.data();
        let mut out = vec![0u8; src.len()];
        // Move element (i, j, k) of [a, b, c] to the transposed position.
        let hwc_to_chw = self.from == Layout::Hwc;
        let shape = if hwc_to_chw {
            // HWC [h, w, c] -> CHW [c, h, w].
            vec![c, a, b]
        } else {
            // CHW [c, h, w] -> HWC [h, w, c].
            vec![b, c, a]
        };
        let idx = |i: usize, j: usize, k: usize| {
            if hwc_to_chw {
                (k * a + i) * b + j
            } else {
                (j * c + k) * a + i
            }
        };
        let mut s = 0;
        for i in 0..a {
            for j in 0..b {
                for k in 0..c {
                    let d = idx(i, j, k) * es;
                    out[d..d + es].copy_from_slice(&src[s..s + es]);
                    s += es;
                }
            }
        }
        Tensor::new(t.dtype(), shape, Bytes::from(out))
    }
}

/// Converts the element type among `U8`, `F16` and `F32`: u8 -> float optionally divides
/// by 255 (torchvision's `ConvertImageDtype`); float -> u8 multiplies by 255 when
/// `scale` is set, then rounds to nearest and saturates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConvertDType {
    /// Target dtype.
    pub to: DType,
    /// Map u8 0..=255 to float 0..=1 (and back).
    pub scale: bool,
}

impl ConvertDType {
    /// Converts to `to`, scaling between 0..=255 and 0..=1 when `scale`.
    pub fn new(to: DType, scale: bool) -> ConvertDType {
        ConvertDType { to, scale }
    }

    /// Converts `t` (any shape).
    pub fn apply(&self, t: &Tensor) -> Result<Tensor, Error> {
        let from = t.dtype();
        if from == self.to {
            return Ok(t.clone());
        }
        let k = if self.scale { 255.0f32 } else { 1.0 };
        let vals: Vec<f32> = match from {
            DType::U8 => t.data().iter().map(|&v| v as f32 / k).collect(),
            DType::F32 => t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::F16 => t
                .data()
                .chunks_exact(2)
                .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
            d => {
                return Err(Error::operator(format!(
                    "convert_dtype: from {d} is not supported (uint8, float16, float32)"
                )))
            }
        };
        let data: Vec<u8> = match self.to {
            DType::U8 => {
                let m = if from == DType::U8 { 1.0 } else { k };
                vals.iter()
                    .map(|&v| (v * m).round().clamp(0.0, 255.0) as u8)
                    .collect()
            }
            DType::F32 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F16 => vals
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
            d => {
                return Err(Error::operator(format!(
                    "convert_dtype: to {d} is not supported (uint8, float16, float32)"
                )))
            }
        };
        Tensor::new(self.to, t.shape().to_vec(), Bytes::from(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::hwc_tensor;

    #[test]
    fn to_tensor_normalises_into_chw() {
        let t = hwc_tensor(1, 2, 3, vec![0, 255, 51, 255, 0, 102]).unwrap();
        let o = ToTensor::default()
            .normalize(&[0.5], &[0.5])
            .apply(&t)
            .unwrap();
        assert_eq!(o.shape(), &[3, 1, 2]);
        let v = o.to_vec::<f32>().unwrap();
        let want = [-1.0, 1.0, 1.0, -1.0, -0.6, -0.2];
        for (a, b) in v.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{v:?}");
        }
        let h = ToTensor::default().dtype(DType::F16).apply(&t).unwrap();
        assert_eq!(h.dtype(), DType::F16);
        assert_eq!(h.data().len(), 12);
    }

    #[test]
    fn layouts_round_trip() {
        let t = hwc_tensor(2, 3, 2, (0..12).collect()).unwrap();
        let chw = ToLayout {
            from: Layout::Hwc,
            to: Layout::Chw,
        }
        .apply(&t)
        .unwrap();
        assert_eq!(chw.shape(), &[2, 2, 3]);
        assert_eq!(chw.data()[..6], [0, 2, 4, 6, 8, 10]);
        let back = ToLayout {
            from: Layout::Chw,
            to: Layout::Hwc,
        }
        .apply(&chw)
        .unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn dtype_round_trip() {
        let t = hwc_tensor(1, 4, 1, vec![0, 1, 128, 255]).unwrap();
        for to in [DType::F32, DType::F16] {
            let f = ConvertDType::new(to, true).apply(&t).unwrap();
            let back = ConvertDType::new(DType::U8, true).apply(&f).unwrap();
            assert_eq!(back, t, "{to}");
        }
    }
}
