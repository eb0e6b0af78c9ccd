//! Crops, padding, flips and RandomResizedCrop's box sampling.

use stoker_core::rng::Rng;
use stoker_core::{Error, Tensor};

use super::resize::{Interpolation, Resize};
use super::{hwc_tensor, ImageRef};

/// A crop box in pixels: top-left corner (`top`, `left`) and size, torchvision's
/// `(i, j, h, w)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropBox {
    /// First row.
    pub top: usize,
    /// First column.
    pub left: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
}

impl CropBox {
    /// The box as a resample's source box `[x0, y0, x1, y1]`.
    pub(crate) fn source_box(self) -> [f64; 4] {
        [
            self.left as f64,
            self.top as f64,
            (self.left + self.width) as f64,
            (self.top + self.height) as f64,
        ]
    }
}

/// Cuts `b` out of `img` (must lie inside).
pub(crate) fn crop(img: ImageRef<'_>, b: CropBox) -> Result<Tensor, Error> {
    let c = img.c;
    let mut out = Vec::with_capacity(b.height * b.width * c);
    for y in b.top..b.top + b.height {
        out.extend_from_slice(&img.row(y)[b.left * c..(b.left + b.width) * c]);
    }
    hwc_tensor(b.height, b.width, c, out)
}

/// Python's `round()` (half to even), which torchvision's box arithmetic uses.
fn py_round(x: f64) -> f64 {
    x.round_ties_even()
}

/// Crops the centre `height` x `width` (torchvision's `CenterCrop`): offsets are
/// `round((H - h) / 2)`, and an image smaller than the crop is first padded with zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CenterCrop {
    /// Output height.
    pub height: usize,
    /// Output width.
    pub width: usize,
}

impl CenterCrop {
    /// A `height` x `width` centre crop.
    pub fn new(height: usize, width: usize) -> CenterCrop {
        CenterCrop { height, width }
    }

    /// Crops `image`.
    pub fn apply(&self, image: &Tensor) -> Result<Tensor, Error> {
        let img = ImageRef::from_tensor(image, "center_crop")?;
        if self.height == 0 || self.width == 0 {
            return Err(Error::invalid("center_crop: crop size must be positive"));
        }
        if self.height > img.h || self.width > img.w {
            let pl = self.width.saturating_sub(img.w) / 2;
            let pt = self.height.saturating_sub(img.h) / 2;
            let pr = self.width.saturating_sub(img.w).div_ceil(2);
            let pb = self.height.saturating_sub(img.h).div_ceil(2);
            let padded = Pad::new([pl, pt, pr, pb]).apply(image)?;
            return self.apply(&padded);
        }
        let top = py_round((img.h - self.height) as f64 / 2.0) as usize;
        let left = py_round((img.w - self.width) as f64 / 2.0) as usize;
        crop(
            img,
            CropBox {
                top,
                left,
                height: self.height,
                width: self.width,
            },
        )
    }
}

/// How [`Pad`] fills the border.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PaddingMode {
    /// A constant value per channel.
    #[default]
    Constant,
    /// Repeat the edge pixel.
    Edge,
    /// Mirror without repeating the edge (`[2 1 | 0 1 2 | 1 0]`).
    Reflect,
    /// Mirror repeating the edge (`[1 0 | 0 1 2 | 2 1]`).
    Symmetric,
}

/// Pads the border (torchvision's `Pad`): `padding` is `[left, top, right, bottom]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pad {
    /// `[left, top, right, bottom]` in pixels.
    pub padding: [usize; 4],
    /// Fill of [`PaddingMode::Constant`], per channel (the first value for gray).
    pub fill: [u8; 4],
    /// Border mode.
    pub mode: PaddingMode,
}

impl Pad {
    /// Zero padding of `[left, top, right, bottom]`.
    pub fn new(padding: [usize; 4]) -> Pad {
        Pad {
            padding,
            fill: [0; 4],
            mode: PaddingMode::Constant,
        }
    }

    /// Sets the fill value (all channels).
    pub fn fill(mut self, v: u8) -> Pad {
        self.fill = [v; 4];
        self
    }

    /// Sets the mode.
    pub fn mode(mut self, m: PaddingMode) -> Pad {
        self.mode = m;
        self
    }

    /// Pads `image`.
    pub fn apply(&self, image: &Tensor) -> Result<Tensor, Error> {
        let img = ImageRef::from_tensor(image, "pad")?;
        let [l, t, r, b] = self.padding;
        let (oh, ow, c) = (img.h + t + b, img.w + l + r, img.c);
        let mut out = Vec::with_capacity(oh * ow * c);
        // Source column of each output column (None: constant fill).
        let cols: Vec<Option<usize>> = (0..ow)
            .map(|x| self.source(x as isize - l as isize, img.w))
            .collect();
        for y in 0..oh {
            match self.source(y as isize - t as isize, img.h) {
                None => {
                    for _ in 0..ow {
                        out.extend_from_slice(&self.fill[..c]);
                    }
                }
                Some(sy) => {
                    let row = img.row(sy);
                    for col in &cols {
                        match col {
                            Some(sx) => out.extend_from_slice(&row[sx * c..(sx + 1) * c]),
                            None => out.extend_from_slice(&self.fill[..c]),
                        }
                    }
                }
            }
        }
        hwc_tensor(oh, ow, c, out)
    }

    /// The source index of position `i` (may be outside `0..n`) along an axis of size `n`.
    fn source(&self, i: isize, n: usize) -> Option<usize> {
        let n = n as isize;
        if (0..n).contains(&i) {
            return Some(i as usize);
        }
        Some(match self.mode {
            PaddingMode::Constant => return None,
            PaddingMode::Edge => i.clamp(0, n - 1) as usize,
            PaddingMode::Reflect => {
                if n == 1 {
                    0
                } else {
                    let p = 2 * (n - 1);
                    let m = i.rem_euclid(p);
                    (if m >= n { p - m } else { m }) as usize
                }
            }
            PaddingMode::Symmetric => {
                let p = 2 * n;
                let m = i.rem_euclid(p);
                (if m >= n { p - 1 - m } else { m }) as usize
            }
        })
    }
}

/// A random `height` x `width` crop (torchvision's `RandomCrop`), after optional padding.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RandomCrop {
    /// Output height.
    pub height: usize,
    /// Output width.
    pub width: usize,
    /// Padding applied first (`[left, top, right, bottom]`), if any.
    pub padding: Option<Pad>,
    /// Pad an image smaller than the crop (on both sides, by the missing amount).
    pub pad_if_needed: bool,
}

impl RandomCrop {
    /// A `height` x `width` random crop without padding.
    pub fn new(height: usize, width: usize) -> RandomCrop {
        RandomCrop {
            height,
            width,
            padding: None,
            pad_if_needed: false,
        }
    }

    /// Pads with `pad` first.
    pub fn padding(mut self, pad: Pad) -> RandomCrop {
        self.padding = Some(pad);
        self
    }

    /// Sets `pad_if_needed`.
    pub fn pad_if_needed(mut self, on: bool) -> RandomCrop {
        self.pad_if_needed = on;
        self
    }

    /// Crops `image` at an offset drawn from `rng`.
    pub fn apply(&self, image: &Tensor, rng: &mut Rng) -> Result<Tensor, Error> {
        let mut cur = match &self.padding {
            Some(p) => p.apply(image)?,
            None => image.clone(),
        };
        let img = ImageRef::from_tensor(&cur, "random_crop")?;
        if self.pad_if_needed && (img.w < self.width || img.h < self.height) {
            let dw = self.width.saturating_sub(img.w);
            let dh = self.height.saturating_sub(img.h);
            let base = self.padding.clone().unwrap_or_else(|| Pad::new([0; 4]));
            let p = Pad {
                padding: [dw, dh, dw, dh],
                ..base
            };
            cur = p.apply(&cur)?;
        }
        let img = ImageRef::from_tensor(&cur, "random_crop")?;
        if self.height > img.h || self.width > img.w || self.height == 0 || self.width == 0 {
            return Err(Error::operator(format!(
                "random_crop: crop {}x{} does not fit a {}x{} image",
                self.height, self.width, img.h, img.w
            )));
        }
        let top = rng.below((img.h - self.height + 1) as u64) as usize;
        let left = rng.below((img.w - self.width + 1) as u64) as usize;
        crop(
            img,
            CropBox {
                top,
                left,
                height: self.height,
                width: self.width,
            },
        )
    }
}

/// Which way to flip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flip {
    /// Mirror left-right.
    Horizontal,
    /// Mirror top-bottom.
    Vertical,
}

impl Flip {
    /// Flips `image`.
    pub fn apply(self, image: &Tensor) -> Result<Tensor, Error> {
        let img = ImageRef::from_tensor(image, "flip")?;
        let c = img.c;
        let mut out = Vec::with_capacity(img.data.len());
        match self {
            Flip::Horizontal => {
                out.resize(img.data.len(), 0);
                for (o, i) in out
                    .chunks_exact_mut(img.w * c)
                    .zip(img.data.chunks_exact(img.w * c))
                {
                    match c {
                        3 => {
                            for (d, s) in o.chunks_exact_mut(3).zip(i.chunks_exact(3).rev()) {
                                d.copy_from_slice(s);
                            }
                        }
                        1 => {
                            for (d, s) in o.iter_mut().zip(i.iter().rev()) {
                                *d = *s;
                            }
                        }
                        _ => {
                            for (d, s) in o.chunks_exact_mut(c).zip(i.chunks_exact(c).rev()) {
                                d.copy_from_slice(s);
                            }
                        }
                    }
                }
            }
            Flip::Vertical => {
                for y in (0..img.h).rev() {
                    out.extend_from_slice(img.row(y));
                }
            }
        }
        hwc_tensor(img.h, img.w, c, out)
    }
}

/// Flips with probability `p` (torchvision's `RandomHorizontalFlip` /
/// `RandomVerticalFlip`: flip when a uniform draw is below `p`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RandomFlip {
    /// Direction.
    pub flip: Flip,
    /// Probability of flipping.
    pub p: f64,
}

impl RandomFlip {
    /// Horizontal flip with probability 0.5.
    pub fn horizontal() -> RandomFlip {
        RandomFlip {
            flip: Flip::Horizontal,
            p: 0.5,
        }
    }

    /// Vertical flip with probability 0.5.
    pub fn vertical() -> RandomFlip {
        RandomFlip {
            flip: Flip::Vertical,
            p: 0.5,
        }
    }

    /// Sets the probability.
    pub fn p(mut self, p: f64) -> RandomFlip {
        self.p = p;
        self
    }

    /// Whether to flip (one draw).
    pub fn decide(&self, rng: &mut Rng) -> bool {
        rng.unit() < self.p
    }

    /// Flips `image` or returns it unchanged (no copy).
    pub fn apply(&self, image: &Tensor, rng: &mut Rng) -> Result<Tensor, Error> {
        if self.decide(rng) {
            self.flip.apply(image)
        } else {
            ImageRef::from_tensor(image, "random_flip")?;
            Ok(image.clone())
        }
    }
}

/// torchvision's `RandomResizedCrop`: a box covering a random `scale` fraction of the area
/// with a log-uniform aspect `ratio`, resized to `height` x `width`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RandomResizedCrop {
    /// Output height.
    pub height: usize,
    /// Output width.
    pub width: usize,
    /// Range of the box's area as a fraction of the image's (default 0.08..1).
    pub scale: (f64, f64),
    /// Range of the box's width/height (default 3/4..4/3).
    pub ratio: (f64, f64),
    /// Resampling filter (default bilinear).
    pub interpolation: Interpolation,
    /// Anti-aliased downscale (default on, as PIL).
    pub antialias: bool,
}

impl RandomResizedCrop {
    /// torchvision's defaults for a `height` x `width` output.
    pub fn new(height: usize, width: usize) -> RandomResizedCrop {
        RandomResizedCrop {
            height,
            width,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            interpolation: Interpolation::Bilinear,
            antialias: true,
        }
    }

    /// Sets the area fraction range.
    pub fn scale(mut self, lo: f64, hi: f64) -> RandomResizedCrop {
        self.scale = (lo, hi);
        self
    }

    /// Sets the aspect-ratio range.
    pub fn ratio(mut self, lo: f64, hi: f64) -> RandomResizedCrop {
        self.ratio = (lo, hi);
        self
    }

    /// Sets the filter.
    pub fn interpolation(mut self, i: Interpolation) -> RandomResizedCrop {
        self.interpolation = i;
        self
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), Error> {
        let (s0, s1) = self.scale;
        let (r0, r1) = self.ratio;
        if self.height == 0 || self.width == 0 {
            return Err(Error::invalid(
                "random_resized_crop: output size must be positive",
            ));
        }
        if !(s0 > 0.0 && s0 <= s1 && r0 > 0.0 && r0 <= r1 && s1.is_finite() && r1.is_finite()) {
            return Err(Error::invalid(format!(
                "random_resized_crop: need 0 < scale.0 <= scale.1 and 0 < ratio.0 <= ratio.1, \
                 got scale {:?} ratio {:?}",
                self.scale, self.ratio
            )));
        }
        Ok(())
    }

    /// Draws the crop box for a `width` x `height` image: torchvision's `get_params`
    /// (10 attempts of area-uniform, log-ratio-uniform boxes with Python's rounding;
    /// then a centred box with the ratio clamped into range).
    pub fn get_params(&self, width: usize, height: usize, rng: &mut Rng) -> CropBox {
        let area = (width * height) as f64;
        let (lr0, lr1) = (self.ratio.0.ln(), self.ratio.1.ln());
        for _ in 0..10 {
            let target = area * (self.scale.0 + (self.scale.1 - self.scale.0) * rng.unit());
            let aspect = (lr0 + (lr1 - lr0) * rng.unit()).exp();
            let w = py_round((target * aspect).sqrt());
            let h = py_round((target / aspect).sqrt());
            if w > 0.0 && h > 0.0 && w <= width as f64 && h <= height as f64 {
                let (w, h) = (w as usize, h as usize);
                let top = rng.below((height - h + 1) as u64) as usize;
                let left = rng.below((width - w + 1) as u64) as usize;
                return CropBox {
                    top,
                    left,
                    height: h,
                    width: w,
                };
            }
        }
        let in_ratio = width as f64 / height as f64;
        let (w, h) = if in_ratio < self.ratio.0 {
            (width, py_round(width as f64 / self.ratio.0) as usize)
        } else if in_ratio > self.ratio.1 {
            (py_round(height as f64 * self.ratio.1) as usize, height)
        } else {
            (width, height)
        };
        let (w, h) = (w.clamp(1, width), h.clamp(1, height));
        CropBox {
            top: (height - h) / 2,
            left: (width - w) / 2,
            height: h,
            width: w,
        }
    }

    /// The resize step this crop ends with.
    pub(crate) fn resize(&self) -> Resize {
        Resize {
            height: self.height,
            width: self.width,
            shorter_side: None,
            interpolation: self.interpolation,
            antialias: self.antialias,
        }
    }

    /// Crops `image` at a box drawn from `rng` and resizes it.
    pub fn apply(&self, image: &Tensor, rng: &mut Rng) -> Result<Tensor, Error> {
        self.apply_charged(image, rng, &mut |_| Ok(()))
    }

    /// As [`apply`](Self::apply), calling `charge` with the bytes the resize of the drawn
    /// box will allocate (an upper bound, its output included) before it allocates them;
    /// an error from `charge` is returned as it is.
    pub fn apply_charged(
        &self,
        image: &Tensor,
        rng: &mut Rng,
        charge: &mut dyn FnMut(u64) -> Result<(), Error>,
    ) -> Result<Tensor, Error> {
        self.validate()?;
        let img = ImageRef::from_tensor(image, "random_resized_crop")?;
        let b = self.get_params(img.w, img.h, rng);
        self.resize()
            .apply_box_charged(img, b.source_box(), "random_resized_crop", charge)
    }

    /// Crops box `b` of `image` and resizes it, without drawing (torchvision's
    /// `resized_crop`).
    pub fn apply_with_box(&self, image: &Tensor, b: CropBox) -> Result<Tensor, Error> {
        let img = ImageRef::from_tensor(image, "resized_crop")?;
        if b.height == 0 || b.width == 0 || b.top + b.height > img.h || b.left + b.width > img.w {
            return Err(Error::operator(format!(
                "resized_crop: box {b:?} is outside a {}x{} image",
                img.w, img.h
            )));
        }
        self.apply_box(img, b)
    }

    /// Crops `b` of `img` and resizes it (no draws).
    pub(crate) fn apply_box(&self, img: ImageRef<'_>, b: CropBox) -> Result<Tensor, Error> {
        self.resize()
            .apply_box(img, b.source_box(), "random_resized_crop")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(h: usize, w: usize, c: usize) -> Tensor {
        hwc_tensor(h, w, c, (0..h * w * c).map(|v| v as u8).collect()).unwrap()
    }

    #[test]
    fn rrc_boxes_fit_and_cover_the_scale_range() {
        let rrc = RandomResizedCrop::new(224, 224);
        let mut rng = Rng::from_words(&[1]);
        let mut min_area: f64 = 1.0;
        let mut max_area: f64 = 0.0;
        for _ in 0..2000 {
            let b = rrc.get_params(500, 375, &mut rng);
            assert!(b.top + b.height <= 375 && b.left + b.width <= 500);
            assert!(b.height > 0 && b.width > 0);
            let a = (b.width * b.height) as f64 / (500.0 * 375.0);
            min_area = min_area.min(a);
            max_area = max_area.max(a);
        }
        assert!(min_area < 0.1 && max_area > 0.9, "{min_area} {max_area}");
    }

    #[test]
    fn rrc_falls_back_to_a_clamped_centre_box() {
        // A 1000x10 strip: no box with ratio in [3/4, 4/3] covering >= 8% fits, so after
        // 10 attempts the fallback keeps the full height and width = round(10 * 4/3).
        let rrc = RandomResizedCrop::new(8, 8);
        let mut rng = Rng::from_words(&[2]);
        let b = rrc.get_params(1000, 10, &mut rng);
        assert_eq!(
            b,
            CropBox {
                top: 0,
                left: (1000 - 13) / 2,
                height: 10,
                width: 13
            }
        );
    }

    #[test]
    fn pad_modes() {
        let img = hwc_tensor(1, 3, 1, vec![0, 1, 2]).unwrap();
        let row = |m| {
            Pad::new([2, 0, 2, 0])
                .mode(m)
                .fill(9)
                .apply(&img)
                .unwrap()
                .data()
                .to_vec()
        };
        assert_eq!(row(PaddingMode::Constant), vec![9, 9, 0, 1, 2, 9, 9]);
        assert_eq!(row(PaddingMode::Edge), vec![0, 0, 0, 1, 2, 2, 2]);
        assert_eq!(row(PaddingMode::Reflect), vec![2, 1, 0, 1, 2, 1, 0]);
        assert_eq!(row(PaddingMode::Symmetric), vec![1, 0, 0, 1, 2, 2, 1]);
    }

    #[test]
    fn flips_and_crops() {
        let img = t(2, 3, 2);
        let h = Flip::Horizontal.apply(&img).unwrap();
        assert_eq!(h.data()[..6], [4, 5, 2, 3, 0, 1]);
        let v = Flip::Vertical.apply(&img).unwrap();
        assert_eq!(v.data()[..6], [6, 7, 8, 9, 10, 11]);
        let c = CenterCrop::new(1, 1).apply(&t(3, 3, 1)).unwrap();
        assert_eq!(c.data()[..], [4]);
        // Larger than the image: zero padded around it.
        let c = CenterCrop::new(3, 3).apply(&t(1, 1, 1)).unwrap();
        assert_eq!(c.data()[..], [0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let mut rng = Rng::from_words(&[3]);
        let r = RandomCrop::new(4, 4)
            .pad_if_needed(true)
            .apply(&t(2, 2, 1), &mut rng)
            .unwrap();
        assert_eq!(r.shape(), &[4, 4, 1]);
        assert!(RandomCrop::new(4, 4).apply(&t(2, 2, 1), &mut rng).is_err());
    }
}
