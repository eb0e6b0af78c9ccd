//! Image kernels: decode, resize, crop, flip, colour, blur, normalise.
//!
//! An image is a `u8` [`Tensor`] of shape `[H, W, C]` (HWC, row-major, `C` = 1 for gray,
//! 3 for RGB, 4 for RGBA when alpha is kept). The final conversion ([`ToTensor`]) can
//! produce `[C, H, W]` and `f32`/`f16`. Every kernel is a parameter struct with an
//! `apply` method; random kernels also take the pipeline's per-sample
//! [`Rng`](stoker_core::rng::Rng), so a kernel's draws depend only on the seed and the
//! sample's position.
//!
//! # Parity with torchvision and PIL
//!
//! The kernels follow torchvision's transforms on PIL images, which is what most ImageNet
//! recipes run: the same random parameter draws (same algorithm, our generator), the same
//! geometry (crop boxes, sampling positions), and the same arithmetic where it is cheap
//! to match (PIL's fixed-point resampling with 22-bit weights and an 8-bit intermediate,
//! PIL's blend and grayscale formulas). `docs/ops.md` lists the measured tolerance of
//! each kernel against reference outputs that `tests/fixtures/image/make_fixtures.py`
//! produces with torchvision/PIL.
//!
//! # Why decode and crop are fused
//!
//! A RandomResizedCrop keeps on average ~half the image and then shrinks it to 224x224;
//! decoding all of a 500x400 JPEG at full resolution to throw most of it away is the
//! largest cost of an ImageNet pipeline. [`DecodeRandomResizedCrop`] draws the crop box
//! from the JPEG header alone (same draws as the unfused [`RandomResizedCrop`], so the
//! geometry is identical), asks libjpeg-turbo to decode only that region, and at the
//! smallest DCT scale (M/8) that still leaves at least the output size, then resamples
//! with a fractional source box so that the region maps exactly onto the output.
//!
//! # Fast paths
//!
//! Kernels work on `u8` with integer arithmetic where the reference does, use separable
//! filters with weights computed once per call (not per pixel), and allocate only their
//! output plus one scratch buffer. They never spawn threads: the pipeline parallelises
//! across samples.

use bytes::Bytes;
use stoker_core::{DType, Error, Tensor};

mod color;
pub(crate) mod convert;
mod decode;
mod fused;
mod geometry;
mod jpeg;
mod resize;
#[cfg(target_arch = "x86_64")]
mod rgbx;
mod scratch;

pub use color::{ColorJitter, GaussianBlur, Grayscale, DEFAULT_BLUR_SIGMA};
pub use convert::{ConvertDType, Layout, ToLayout, ToTensor};
pub use decode::{
    decode_image, decode_image_charged, image_info, ColorMode, DecodeImage, ImageFormat, ImageInfo,
    DEFAULT_MAX_PIXELS,
};
pub use fused::DecodeRandomResizedCrop;
pub use geometry::{
    CenterCrop, CropBox, Flip, Pad, PaddingMode, RandomCrop, RandomFlip, RandomResizedCrop,
};
pub use jpeg::{decode_jpeg, encode_jpeg, DctScale, JpegRegion};
pub use resize::{Interpolation, Resize};

/// A borrowed `[H, W, C]` u8 image.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ImageRef<'a> {
    pub data: &'a [u8],
    pub h: usize,
    pub w: usize,
    pub c: usize,
}

impl<'a> ImageRef<'a> {
    /// Views `t` as an HWC u8 image, or says why `op` cannot take it.
    pub fn from_tensor(t: &'a Tensor, op: &str) -> Result<ImageRef<'a>, Error> {
        if t.dtype() != DType::U8 {
            return Err(Error::operator(format!(
                "{op}: expects a uint8 image, got a {} tensor",
                t.dtype()
            )));
        }
        let (h, w, c) = match *t.shape() {
            [h, w, c] => (h, w, c),
            [h, w] => (h, w, 1),
            _ => {
                return Err(Error::operator(format!(
                    "{op}: expects an [H, W, C] image, got shape {:?}",
                    t.shape()
                )))
            }
        };
        if !(1..=4).contains(&c) {
            return Err(Error::operator(format!(
                "{op}: expects 1 to 4 channels (HWC layout), got shape {:?}",
                t.shape()
            )));
        }
        if h == 0 || w == 0 {
            return Err(Error::operator(format!(
                "{op}: empty image of shape {:?}",
                t.shape()
            )));
        }
        Ok(ImageRef {
            data: t.data(),
            h,
            w,
            c,
        })
    }

    /// One row of pixels.
    #[inline]
    pub fn row(&self, y: usize) -> &'a [u8] {
        let s = self.w * self.c;
        &self.data[y * s..(y + 1) * s]
    }
}

/// Wraps an owned HWC buffer as a tensor (no copy).
pub(crate) fn hwc_tensor(h: usize, w: usize, c: usize, data: Vec<u8>) -> Result<Tensor, Error> {
    Tensor::new(DType::U8, vec![h, w, c], Bytes::from(data))
}
