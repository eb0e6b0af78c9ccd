//! Decode + RandomResizedCrop in one step, decoding only the crop at a reduced DCT scale.
//!
//! 1. Read the JPEG header (dimensions, chroma subsampling).
//! 2. Draw the crop box with [`RandomResizedCrop::get_params`] on those dimensions: the
//!    same draws, hence the same box, as decoding fully and running the unfused crop.
//! 3. Pick the smallest scale 1/8, 1/4, 1/2 or 1 at which the box still measures at
//!    least the output size, so the final resize only ever shrinks (or keeps) and loses
//!    no detail the output could hold. `all_eighths(true)` allows every M/8 (M = 1..=8).
//!    Powers of two are the default because they are faster: libjpeg-turbo's 8x8 inverse
//!    DCT and its chroma upsampling are SIMD, while a 5/8, 6/8 or 7/8 decode runs plain-C
//!    IDCTs of 5x5-7x7 (luma) and 10x10-14x14 (4:2:0 chroma, which it upsamples inside
//!    the IDCT). On the 440x430 ImageNet-like files, whose 224 crops are nearly all
//!    decoded at 5/8-8/8, `stoker run` of the ImageNet pipeline took 6-7% less CPU with
//!    powers of two (median of 6 alternated runs, 3.24 s against 3.48 s for 2,000 images);
//!    an earlier measurement on another host had found all eighths ~5% faster. A crop
//!    decoded at full scale also gives exactly the unfused path's pixels.
//! 4. Decode only the box's rows and columns at that scale (the pixel-aligned hull of the
//!    scaled box; [`decode_jpeg`](super::decode_jpeg) decodes an iMCU-aligned superset
//!    and cuts it).
//! 5. Resample the box, mapped into the decoded region's coordinates (fractional, since
//!    M/8 scaling rarely lands on whole pixels), to the output size.
//!
//! 6. Optionally, in the same pass: a [`RandomFlip`] (the resample's weights are
//!    reversed along the flipped axis, so the mirrored image comes out directly) and a
//!    [`ToTensor`] (the last resample pass rounds each sample to u8 exactly as the resize
//!    does and writes its normalised value from a 256-entry table per channel straight
//!    into the `[C, H, W]` planes). The result is bit-identical to running
//!    `RandomFlip::apply` and `ToTensor::apply` on this op's u8 output, without the
//!    intermediate image, the flipped copy or the separate conversion pass.
//!
//! The decoded region goes into a reused per-thread buffer and the resample reads it in
//! place (no copy of the region, no fresh allocation): only the output is allocated.
//!
//! The pixels differ from the unfused path's because the IDCT's reduced-size output is a
//! different (box-like) low-pass filter than PIL's anti-aliased resample of full-size
//! pixels; `docs/ops.md` gives the measured difference. Non-JPEG input, lossless JPEG,
//! and images whose EXIF orientation is applied and not 1 take the unfused path.

use stoker_core::rng::Rng;
use stoker_core::{DType, Error, Lease, Tensor};

use super::convert::ToTensor;
use super::decode::{decode_image_charged, DecodeImage};
use super::geometry::{Flip, RandomFlip, RandomResizedCrop};
use super::jpeg::{self, DctScale, JpegRegion};
use super::resize::{resample_to_tensor, Interpolation, Output};
use super::scratch::Scratch;
use super::ImageRef;

/// Decode then RandomResizedCrop, fused (see the module docs), optionally followed by a
/// random flip and `ToTensor` in the same pass. Given the same `Rng` state it picks the
/// same crop box as `decode` followed by `crop.apply`, and its output is what the
/// separate kernels would produce with the same draws.
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
    /// Use every scale M/8; off (default): only 1/8, 1/4, 1/2 and 1.
    pub all_eighths: bool,
    /// A random flip of the crop (default none).
    pub flip: Option<RandomFlip>,
    /// Conversion of the (flipped) crop to float (default none: u8 `[H, W, C]` out).
    pub to_tensor: Option<ToTensor>,
}

impl DecodeRandomResizedCrop {
    /// Fuses `decode` and `crop`.
    pub fn new(decode: DecodeImage, crop: RandomResizedCrop) -> DecodeRandomResizedCrop {
        DecodeRandomResizedCrop {
            decode,
            crop,
            dct_scaling: true,
            all_eighths: false,
            flip: None,
            to_tensor: None,
        }
    }

    /// Adds a random flip after the crop: `flip.apply` fused in.
    pub fn flip(mut self, flip: RandomFlip) -> DecodeRandomResizedCrop {
        self.flip = Some(flip);
        self
    }

    /// Adds the conversion to float after the crop (and flip): `to_tensor.apply` fused in.
    pub fn to_tensor(mut self, to_tensor: ToTensor) -> DecodeRandomResizedCrop {
        self.to_tensor = Some(to_tensor);
        self
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

    /// Decodes `data`, crops it, and runs the flip and conversion if set, drawing
    /// everything from `rng` in the separate kernels' order (the box, then the flip):
    /// the same output as `crop.apply(&decoded, rng)`, then `flip.apply(_, rng)`, then
    /// `to_tensor.apply(_)`.
    pub fn apply(&self, data: &[u8], rng: &mut Rng) -> Result<Tensor, Error> {
        self.run(data, rng, None, None, &mut |_| Ok(()))
    }

    /// As [`apply`](Self::apply), but the flip's draw comes from `flip_rng`: for a
    /// pipeline where the crop and the flip are separate operators with a generator
    /// each. The box is drawn from `crop_rng`, then (unless the decode or the crop
    /// fails first) the flip decision from `flip_rng`, one draw, as
    /// `RandomFlip::apply` draws. Without a flip set, `flip_rng` is not used.
    pub fn apply_chain(
        &self,
        data: &[u8],
        crop_rng: &mut Rng,
        flip_rng: &mut Rng,
    ) -> Result<Tensor, Error> {
        self.run(data, crop_rng, Some(flip_rng), None, &mut |_| Ok(()))
    }

    /// As [`apply_chain`](Self::apply_chain) (or [`apply`](Self::apply) without
    /// `flip_rng`), writing a converted tensor into the memory `slot` gives for its length
    /// in bytes when it gives one (a batch slot, see [`stoker_core::BatchSlots`]). The
    /// result is the same either way; only where its bytes live differs. `slot` is asked
    /// at most once, and only when the fused pass writes a `ToTensor` output.
    ///
    /// `charge` is called with the bytes the kernel is about to allocate before it
    /// allocates them (upper bounds: once the header is read and the box drawn, the
    /// decoded region, libjpeg's own buffers, the resample's passes and the output; on the
    /// unfused path the whole frame first, then the crop's); an error from it is returned
    /// as it is. Calls add up.
    pub fn apply_into(
        &self,
        data: &[u8],
        crop_rng: &mut Rng,
        flip_rng: Option<&mut Rng>,
        slot: &mut dyn FnMut(usize) -> Option<Lease>,
        charge: &mut dyn FnMut(u64) -> Result<(), Error>,
    ) -> Result<Tensor, Error> {
        self.run(data, crop_rng, flip_rng, Some(slot), charge)
    }

    /// The flip to apply, drawn from `flip_rng` or else `rng`.
    fn decide_flip(&self, rng: &mut Rng, flip_rng: Option<&mut Rng>) -> Option<Flip> {
        let f = self.flip.as_ref()?;
        f.decide(flip_rng.unwrap_or(rng)).then_some(f.flip)
    }

    /// Decode, crop, flip, convert as separate kernels.
    fn unfused(
        &self,
        data: &[u8],
        rng: &mut Rng,
        flip_rng: Option<&mut Rng>,
        charge: &mut dyn FnMut(u64) -> Result<(), Error>,
    ) -> Result<Tensor, Error> {
        let full = decode_image_charged(data, &self.decode, charge)?;
        let cropped = self.crop.apply_charged(&full, rng, charge)?;
        drop(full);
        self.finish(cropped, self.decide_flip(rng, flip_rng), charge)
    }

    /// Flip and convert a u8 crop with the separate kernels (charging their outputs).
    fn finish(
        &self,
        cropped: Tensor,
        flip: Option<Flip>,
        charge: &mut dyn FnMut(u64) -> Result<(), Error>,
    ) -> Result<Tensor, Error> {
        let flipped = match flip {
            Some(f) => {
                charge(cropped.data().len() as u64)?;
                f.apply(&cropped)?
            }
            None => cropped,
        };
        match &self.to_tensor {
            Some(t) => {
                charge((flipped.data().len() * t.dtype.size()) as u64)?;
                t.apply(&flipped)
            }
            None => Ok(flipped),
        }
    }

    fn run(
        &self,
        data: &[u8],
        rng: &mut Rng,
        flip_rng: Option<&mut Rng>,
        slot: Option<&mut dyn FnMut(usize) -> Option<Lease>>,
        charge: &mut dyn FnMut(u64) -> Result<(), Error>,
    ) -> Result<Tensor, Error> {
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
            return self.unfused(data, rng, flip_rng, charge);
        }
        let markers = markers.unwrap_or_default();
        let header = jpeg::read_header(data)?;
        jpeg::check_pixels(&header, self.decode.max_pixels)?;
        if header.lossless {
            return self.unfused(data, rng, flip_rng, charge);
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
        // What the decode and the resample will allocate, charged before either does.
        let (w, h) = (self.crop.width, self.crop.height);
        let c = if self.decode.mode == super::ColorMode::Gray {
            1
        } else {
            3
        };
        let (_, superset) = jpeg::regions(&header, scale, Some(want))?;
        let out_bytes = self.to_tensor.as_ref().map_or(1, |t| t.dtype.size());
        let resample = if self.crop.interpolation == Interpolation::Nearest {
            // The cut region and the separate kernels' outputs.
            (want.w * want.h * c + w * h * c * (2 + out_bytes)) as u64
        } else {
            super::resize::resample_bytes(
                (superset.w, superset.h, c),
                [
                    bx[0] - x0 as f64,
                    bx[1] - y0 as f64,
                    bx[2] - x0 as f64,
                    bx[3] - y0 as f64,
                ],
                (w, h),
                (self.crop.interpolation, self.crop.antialias),
                out_bytes,
            )
        };
        charge(
            jpeg::decode_bytes(&header, &markers, &self.decode, scale, Some(want), false)?
                + resample,
        )?;
        let mut buf = Scratch::take();
        let (got, held, c) = jpeg::decode_region_into(
            data,
            &header,
            &markers,
            &self.decode,
            scale,
            Some(want),
            &mut buf,
        )
        .map_err(|e| {
            let msg = e
                .message
                .replacen("decode_jpeg", "decode_random_resized_crop", 1);
            stoker_core::Error { message: msg, ..e }
        })?;
        let flip = self.decide_flip(rng, flip_rng);
        // `buf` holds `held`, a superset of the region `got`; the box is in `got`'s
        // coordinates and the resample reads `got` in place.
        let img = ImageRef {
            data: &buf,
            h: held.h,
            w: held.w,
            c,
        };
        let origin = (got.x - held.x, got.y - held.y);
        let rel = [
            (bx[0] - got.x as f64).max(0.0),
            (bx[1] - got.y as f64).max(0.0),
            (bx[2] - got.x as f64).min(got.w as f64),
            (bx[3] - got.y as f64).min(got.h as f64),
        ];
        let [rx0, ry0, rx1, ry1] = rel;
        if !(rx1 > rx0 && ry1 > ry0) {
            return Err(Error::invalid(format!(
                "decode_random_resized_crop: source box {rel:?} is outside a {}x{} image",
                got.w, got.h
            )));
        }
        if self.crop.interpolation == Interpolation::Nearest {
            // Nearest has no fused pass: cut the region and run the separate kernels.
            let mut cut = Vec::with_capacity(got.w * got.h * c);
            for y in origin.1..origin.1 + got.h {
                let row = &buf[(y * held.w + origin.0) * c..];
                cut.extend_from_slice(&row[..got.w * c]);
            }
            let region = super::hwc_tensor(got.h, got.w, c, cut)?;
            let cropped = self.crop.resize().apply_box(
                ImageRef::from_tensor(&region, "decode_random_resized_crop")?,
                rel,
                "decode_random_resized_crop",
            )?;
            // (Charged with the region above.)
            return self.finish(cropped, flip, &mut |_| Ok(()));
        }
        let tables;
        let mut lease = None;
        let output = match &self.to_tensor {
            Some(t) => {
                tables = t.tables(c)?;
                lease = slot.and_then(|s| s(c * h * w * tables.size()));
                Output::Tables(&tables, t.layout)
            }
            None => Output::U8,
        };
        let out = resample_to_tensor(
            img,
            origin,
            (got.w, got.h),
            rel,
            (w, h),
            (self.crop.interpolation, self.crop.antialias),
            flip,
            output,
            lease,
        );
        match &self.to_tensor {
            Some(t) => Tensor::new(t.dtype, t.shape(c, h, w), out),
            None => Tensor::new(DType::U8, vec![h, w, c], out),
        }
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
        assert_eq!(op.choose_scale(447, 2000).eighths(), 8);
        assert_eq!(op.choose_scale(896, 900).eighths(), 2);
        let every = op.clone().all_eighths(true);
        assert_eq!(every.choose_scale(447, 2000).eighths(), 5);
        assert_eq!(every.choose_scale(896, 900).eighths(), 2);
        assert_eq!(every.choose_scale(895, 900).eighths(), 3);
        assert_eq!(op.choose_scale(2000, 1792).eighths(), 1);
        assert_eq!(op.choose_scale(100, 100).eighths(), 8);
        assert_eq!(op.dct_scaling(false).choose_scale(2000, 2000).eighths(), 8);
    }
}
