//! Decode + RandomResizedCrop in one step, decoding only the crop at a reduced DCT scale.
//!
//! 1. Read the JPEG header (dimensions, chroma subsampling).
//! 2. Draw the crop box with [`RandomResizedCrop::get_params`] on those dimensions: the
//!    same draws, hence the same box, as decoding fully and running the unfused crop.
//! 3. Pick the smallest scale M/8 (M = 1..=8) at which the box still measures at least
//!    the output size, so the final resize only ever shrinks (or keeps) and loses no
//!    detail the output could hold. (libjpeg-turbo's 1/8, 1/4 and 1/2 inverse DCTs are
//!    SIMD, its 3/8, 5/8, 6/8 and 7/8 ones plain C; on ImageNet-sized files using all of
//!    them was still measured ~5% faster per image than powers of two only, because the
//!    resize that follows gets smaller. `all_eighths(false)` restricts to powers of two.)
//! 4. Decode only the box's rows and columns at that scale (the pixel-aligned hull of the
//!    scaled box; [`decode_jpeg`](super::decode_jpeg) decodes an iMCU-aligned superset
//!    and cuts it).
//! 5. Resample the box, mapped into the decoded region's coordinates (fractional, since
//!    M/8 scaling rarely lands on whole pixels), to the output size.
//!
//! The pixels differ from the unfused path's because the IDCT's reduced-size output is a
//! different (box-like) low-pass filter than PIL's anti-aliased resample of full-size
//! pixels; `docs/ops.md` gives the measured difference. Non-JPEG input, lossless JPEG,
//! and images whose EXIF orientation is applied and not 1 take the unfused path.

use stoker_core::rng::Rng;
use stoker_core::{Error, Tensor};

use super::decode::{decode_image, DecodeImage};
use super::geometry::RandomResizedCrop;
use super::jpeg::{self, DctScale, JpegRegion};
use super::ImageRef;

/// Decode then RandomResizedCrop, fused (see the module docs). Given the same `Rng`
/// state it picks the same crop box as `decode` followed by `crop.apply`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DecodeRandomResizedCrop {
    /// Decoder options.
    pub decode: DecodeImage,
    /// The crop.
    pub crop: RandomResizedCrop,
    /// Use DCT-domain downscaling (on by default). Off: decode the region at full size
    /// (pixels then match the unfused path exactly).
    pub dct_scaling: bool,
    /// Use every scale M/8 (default); off: only 1/8, 1/4, 1/2 and 1.
    pub all_eighths: bool,
}

impl DecodeRandomResizedCrop {
    /// Fuses `decode` and `crop`.
    pub fn new(decode: DecodeImage, crop: RandomResizedCrop) -> DecodeRandomResizedCrop {
        DecodeRandomResizedCrop {
            decode,
            crop,
            dct_scaling: true,
            all_eighths: true,
        }
    }

    /// Sets whether every M/8 scale may be used, not only 1/8, 1/4, 1/2.
    pub fn all_eighths(mut self, on: bool) -> DecodeRandomResizedCrop {
        self.all_eighths = on;
        self
    }

    /// Sets whether DCT scaling is used.
    pub fn dct_scaling(mut self, on: bool) -> DecodeRandomResizedCrop {
        self.dct_scaling = on;
        self
    }

    /// The scale M/8 this op decodes a `crop_w` x `crop_h` box at.
    pub fn choose_scale(&self, crop_w: usize, crop_h: usize) -> DctScale {
        if !self.dct_scaling {
            return DctScale::FULL;
        }
        (1..=8u8)
            .filter(|m| self.all_eighths || m.is_power_of_two())
            .find(|&m| {
                crop_w * m as usize >= self.crop.width * 8
                    && crop_h * m as usize >= self.crop.height * 8
            })
            .and_then(DctScale::new)
            .unwrap_or(DctScale::FULL)
    }

    /// Decodes `data` and crops it, drawing the box from `rng`.
    pub fn apply(&self, data: &[u8], rng: &mut Rng) -> Result<Tensor, Error> {
        self.crop.validate()?;
        let markers = if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(jpeg::scan_markers(data))
        } else {
            None
        };
        let fused = match markers {
            Some(m) => !(self.decode.apply_exif_orientation && m.orientation.unwrap_or(1) != 1),
            None => false,
        };
        if !fused {
            let full = decode_image(data, &self.decode)?;
            return self.crop.apply(&full, rng);
        }
        let markers = markers.unwrap_or_default();
        let header = jpeg::read_header(data)?;
        jpeg::check_pixels(&header, self.decode.max_pixels)?;
        if header.lossless {
            let full = decode_image(data, &self.decode)?;
            return self.crop.apply(&full, rng);
        }
        let b = self.crop.get_params(header.width, header.height, rng);
        let scale = self.choose_scale(b.width, b.height);
        let f = scale.factor();
        // The box in scaled coordinates.
        let bx = [
            b.left as f64 * f,
            b.top as f64 * f,
            (b.left + b.width) as f64 * f,
            (b.top + b.height) as f64 * f,
        ];
        let (sw, sh) = (scale.scaled(header.width), scale.scaled(header.height));
        let x0 = bx[0].floor() as usize;
        let y0 = bx[1].floor() as usize;
        let x1 = (bx[2].ceil() as usize).clamp(x0 + 1, sw);
        let y1 = (bx[3].ceil() as usize).clamp(y0 + 1, sh);
        let want = JpegRegion {
            x: x0,
            y: y0,
            w: x1 - x0,
            h: y1 - y0,
        };
        let (region, got) =
            jpeg::decode_with_header(data, &header, &markers, &self.decode, scale, Some(want))
                .map_err(|e| {
                    let msg = e
                        .message
                        .replacen("decode_jpeg", "decode_random_resized_crop", 1);
                    stoker_core::Error { message: msg, ..e }
                })?;
        let img = ImageRef::from_tensor(&region, "decode_random_resized_crop")?;
        let rel = [
            (bx[0] - got.x as f64).max(0.0),
            (bx[1] - got.y as f64).max(0.0),
            (bx[2] - got.x as f64).min(img.w as f64),
            (bx[3] - got.y as f64).min(img.h as f64),
        ];
        self.crop
            .resize()
            .apply_box(img, rel, "decode_random_resized_crop")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_is_the_smallest_that_covers_the_output() {
        let op =
            DecodeRandomResizedCrop::new(DecodeImage::default(), RandomResizedCrop::new(224, 224));
        assert_eq!(op.choose_scale(448, 448).eighths(), 4);
        assert_eq!(op.choose_scale(447, 2000).eighths(), 5);
        assert_eq!(
            op.clone()
                .all_eighths(false)
                .choose_scale(447, 2000)
                .eighths(),
            8
        );
        assert_eq!(op.choose_scale(2000, 1792).eighths(), 1);
        assert_eq!(op.choose_scale(100, 100).eighths(), 8);
        assert_eq!(op.dct_scaling(false).choose_scale(2000, 2000).eighths(), 8);
    }
}
