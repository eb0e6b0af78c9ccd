//! The image operators of [`Builtin`]: each turns its spec arguments into
//! a kernel of `stoker_ops::image` and applies it to one field of a sample.
//!
//! A kernel starts from its own defaults (`RandomResizedCrop::new`, `DecodeImage::default`,
//! `ToTensor::default`, ...) and takes only the arguments the spec gives: a default is
//! written once, in `stoker_ops`, never again here.
//!
//! A decode followed by a random resized crop of the same field is fused by the optimizer
//! ([`fuse`]) into one kernel that decodes only the crop's region at the smallest DCT
//! scale that still covers the output: the same crop box (the same draws from the same
//! generator), far fewer pixels decoded.
//!
//! Every operator here charges the buffers it allocates for a sample to the run's memory
//! budget before it allocates them ([`OpContext::reserve`]): a decode (or the fused
//! kernel) from the image's header, once it has checked the pixel limit; a resize or a
//! crop from the sizes of its input and box; the other kernels their outputs and
//! intermediates. So a decoded frame waits for room like any other sample's bytes, and
//! one that could never fit is an error naming its sample.

use std::sync::Arc;

use stoker_core::{DType, Error, OpMeta, Sample, Tensor, Value};
use stoker_ops::image::{
    CenterCrop, ColorJitter, ColorMode, DecodeImage, DecodeRandomResizedCrop, GaussianBlur,
    Grayscale, Interpolation, Layout, Pad, PaddingMode, RandomCrop, RandomFlip, RandomResizedCrop,
    Resize, ToTensor, DEFAULT_BLUR_SIGMA,
};

use super::{Builtin, OpContext, SampleOp};

/// An image size: one number (square) or `[height, width]`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum Size {
    /// Square.
    Square(usize),
    /// Height and width.
    HeightWidth([usize; 2]),
}

impl Size {
    fn hw(self) -> (usize, usize) {
        match self {
            Size::Square(n) => (n, n),
            Size::HeightWidth([h, w]) => (h, w),
        }
    }
}

/// `random_flip`'s probability when the spec gives none: the kernel's.
fn flip_p() -> f64 {
    RandomFlip::horizontal().p
}

/// `image_to_tensor`'s `scale` when the spec gives none: the kernel's.
fn to_tensor_scale() -> bool {
    ToTensor::default().scale
}

/// The probability of the operators that apply a kernel with probability `p` (as
/// torchvision's `RandomApply`; the kernels themselves always apply): always.
fn one() -> f64 {
    1.0
}

/// `grayscale`'s output channels when the spec gives none (the spec's choice: RGB
/// pipelines keep three channels).
fn three() -> usize {
    3
}

/// The image operators a spec can name, with their arguments (one modality of
/// [`Builtin`]).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ImageOp {
    /// Decodes the JPEG, PNG or WebP bytes in `field` into a `uint8` `[H, W, C]` tensor.
    /// Followed by a `random_resized_crop` of the same field, the two run fused: only the
    /// crop's region is decoded, at the smallest DCT scale that covers the output.
    DecodeImage {
        /// The field.
        field: String,
        /// `rgb` (default; alpha dropped, gray replicated), `gray`, or `rgba` (alpha kept
        /// when the file has it).
        #[serde(default)]
        mode: Option<String>,
        /// Rotate/flip by the EXIF orientation tag (default off, as torchvision).
        #[serde(default)]
        exif_orientation: bool,
        /// Largest image accepted, in pixels (default 89,478,485, as PIL): checked from
        /// the header, before decoding.
        #[serde(default)]
        max_pixels: Option<u64>,
        /// Keep a JPEG whose data ends early, missing rows gray (default: an error).
        #[serde(default)]
        allow_truncated: bool,
    },
    /// torchvision's RandomResizedCrop: a random box (area fraction `scale`, aspect
    /// `ratio`) resized to `size`.
    RandomResizedCrop {
        /// The field (a decoded image).
        field: String,
        /// Output size: `n` or `[height, width]`.
        size: Size,
        /// Area fraction range (default `[0.08, 1.0]`).
        #[serde(default)]
        scale: Option<[f64; 2]>,
        /// Aspect ratio range (default `[3/4, 4/3]`).
        #[serde(default)]
        ratio: Option<[f64; 2]>,
        /// `nearest`, `bilinear` (default), `bicubic`, `lanczos`.
        #[serde(default)]
        interpolation: Option<String>,
        /// Anti-aliased downscale (default true).
        #[serde(default)]
        antialias: Option<bool>,
    },
    /// Resizes to `size` exactly.
    Resize {
        /// The field.
        field: String,
        /// `n` or `[height, width]`.
        size: Size,
        /// `nearest`, `bilinear` (default), `bicubic`, `lanczos`.
        #[serde(default)]
        interpolation: Option<String>,
        /// Anti-aliased downscale (default true).
        #[serde(default)]
        antialias: Option<bool>,
    },
    /// Cuts the centre `size` (padding with zeros when the image is smaller, as torchvision).
    CenterCrop {
        /// The field.
        field: String,
        /// `n` or `[height, width]`.
        size: Size,
    },
    /// A random `size` window, after optional padding.
    RandomCrop {
        /// The field.
        field: String,
        /// `n` or `[height, width]`.
        size: Size,
        /// Padding first: 1, 2 or 4 values, as torchvision.
        #[serde(default)]
        padding: Option<Vec<usize>>,
        /// Pad an image smaller than `size` up to it.
        #[serde(default)]
        pad_if_needed: bool,
        /// Fill value of constant padding.
        #[serde(default)]
        fill: u8,
        /// `constant` (default), `edge`, `reflect`, `symmetric`.
        #[serde(default)]
        padding_mode: Option<String>,
    },
    /// Pads the image: 1, 2 or 4 values, as torchvision.
    Pad {
        /// The field.
        field: String,
        /// The padding.
        padding: Vec<usize>,
        /// Fill value of constant padding.
        #[serde(default)]
        fill: u8,
        /// `constant` (default), `edge`, `reflect`, `symmetric`.
        #[serde(default)]
        padding_mode: Option<String>,
    },
    /// Mirrors the image with probability `p` (left-right, or top-bottom with `vertical`).
    RandomFlip {
        /// The field.
        field: String,
        /// Top-bottom instead of left-right.
        #[serde(default)]
        vertical: bool,
        /// Probability (default 0.5).
        #[serde(default = "flip_p")]
        p: f64,
    },
    /// torchvision's ColorJitter (factors drawn in `[max(0, 1 - x), 1 + x]`, hue in
    /// `[-hue, hue]`, the four in random order), applied with probability `p`.
    ColorJitter {
        /// The field.
        field: String,
        /// Brightness.
        #[serde(default)]
        brightness: f32,
        /// Contrast.
        #[serde(default)]
        contrast: f32,
        /// Saturation.
        #[serde(default)]
        saturation: f32,
        /// Hue (at most 0.5).
        #[serde(default)]
        hue: f32,
        /// Probability of applying it (default 1).
        #[serde(default = "one")]
        p: f64,
    },
    /// Converts to gray (ITU-R 601-2 luma), with 1 or 3 (default) output channels.
    Grayscale {
        /// The field.
        field: String,
        /// Output channels.
        #[serde(default = "three")]
        channels: usize,
    },
    /// Converts to gray with probability `p`, keeping the number of channels.
    RandomGrayscale {
        /// The field.
        field: String,
        /// Probability.
        p: f64,
    },
    /// Gaussian blur with a sigma drawn uniformly in `sigma`, with probability `p`.
    GaussianBlur {
        /// The field.
        field: String,
        /// Odd kernel size.
        kernel_size: usize,
        /// Sigma range (default `[0.1, 2.0]`).
        #[serde(default)]
        sigma: Option<[f32; 2]>,
        /// Probability (default 1).
        #[serde(default = "one")]
        p: f64,
    },
    /// A `uint8` image to a float tensor: scaled to `[0, 1]` (unless `scale = false`),
    /// normalized (`normalize = "imagenet"`, or `mean` and `std`), in `chw` (default) or
    /// `hwc` layout, as `float32` (default) or `float16`. torchvision's ToTensor +
    /// Normalize in one pass.
    ImageToTensor {
        /// The field.
        field: String,
        /// `imagenet` for ImageNet's mean and std.
        #[serde(default)]
        normalize: Option<String>,
        /// Per-channel mean (after scaling).
        #[serde(default)]
        mean: Option<Vec<f32>>,
        /// Per-channel standard deviation (after scaling).
        #[serde(default)]
        std: Option<Vec<f32>>,
        /// `float32` (default) or `float16`.
        #[serde(default)]
        dtype: Option<String>,
        /// `chw` (default) or `hwc`.
        #[serde(default)]
        layout: Option<String>,
        /// Divide by 255 first (default true).
        #[serde(default = "to_tensor_scale")]
        scale: bool,
    },
}

impl ImageOp {
    /// The operators' names in a spec (their `op`), in the order of the variants.
    pub const NAMES: &'static [&'static str] = &[
        "decode_image",
        "random_resized_crop",
        "resize",
        "center_crop",
        "random_crop",
        "pad",
        "random_flip",
        "color_jitter",
        "grayscale",
        "random_grayscale",
        "gaussian_blur",
        "image_to_tensor",
    ];

    /// The operator's name in plans and errors.
    pub fn name(&self) -> String {
        match self {
            ImageOp::DecodeImage { field, .. } => format!("decode_image({field})"),
            ImageOp::RandomResizedCrop { field, .. } => format!("random_resized_crop({field})"),
            ImageOp::Resize { field, .. } => format!("resize({field})"),
            ImageOp::CenterCrop { field, .. } => format!("center_crop({field})"),
            ImageOp::RandomCrop { field, .. } => format!("random_crop({field})"),
            ImageOp::Pad { field, .. } => format!("pad({field})"),
            ImageOp::RandomFlip { field, .. } => format!("random_flip({field})"),
            ImageOp::ColorJitter { field, .. } => format!("color_jitter({field})"),
            ImageOp::Grayscale { field, .. } => format!("grayscale({field})"),
            ImageOp::RandomGrayscale { field, .. } => format!("random_grayscale({field})"),
            ImageOp::GaussianBlur { field, .. } => format!("gaussian_blur({field})"),
            ImageOp::ImageToTensor { field, .. } => format!("image_to_tensor({field})"),
        }
    }

    /// The operator's declaration for the optimizer.
    pub(crate) fn meta(&self) -> OpMeta {
        let m = OpMeta::new(self.name());
        match self {
            // Size hints, output bytes per input byte (the optimizer's start; a run measures
            // them): a JPEG decodes to about 8x its bytes; a float conversion makes each
            // byte 4 (float32) or 2 (float16); the colour operators, flips and blurs keep
            // the size. A crop or resize to a fixed size depends on its input: no hint.
            // Cost hints are for an ImageNet-sized image (about 440 x 430, 110 KB) on one
            // core of the development VM, as `stoker run` measured them (release build):
            // decode 3.1 ms, random resized crop 0.43 ms, flip 0.03 ms, float conversion
            // 0.33 ms, the fused decode and crop with both 3.2 ms in all.
            ImageOp::DecodeImage { .. } => m.with_cost_ns(3_000_000.0).with_size_ratio(8.0),
            ImageOp::RandomFlip { .. } => m.random().with_cost_ns(50_000.0).with_size_ratio(1.0),
            ImageOp::ColorJitter { .. }
            | ImageOp::RandomGrayscale { .. }
            | ImageOp::GaussianBlur { .. } => {
                m.random().with_cost_ns(500_000.0).with_size_ratio(1.0)
            }
            ImageOp::RandomResizedCrop { .. } | ImageOp::RandomCrop { .. } => {
                m.random().with_cost_ns(450_000.0)
            }
            ImageOp::ImageToTensor { dtype, .. } => {
                let bytes = if dtype.as_deref() == Some("float16") {
                    2.0
                } else {
                    4.0
                };
                m.with_cost_ns(300_000.0).with_size_ratio(bytes)
            }
            _ => m.with_cost_ns(200_000.0),
        }
    }

    /// Checks the operator's arguments (every kernel is built once, here, to see that it
    /// can be).
    pub fn validate(&self) -> Result<(), Error> {
        match self {
            ImageOp::DecodeImage { .. } => decoder(self).map(drop),
            ImageOp::RandomResizedCrop { .. } => rrc(self).map(drop),
            ImageOp::Resize {
                size,
                interpolation: i,
                ..
            } => {
                let (h, w) = size.hw();
                if h == 0 || w == 0 {
                    return Err(Error::invalid("resize: the size must not be empty"));
                }
                i.as_deref()
                    .map_or(Ok(()), |i| interpolation("resize", i).map(drop))
            }
            ImageOp::CenterCrop { size, .. } => {
                let (h, w) = size.hw();
                if h == 0 || w == 0 {
                    return Err(Error::invalid("center_crop: the size must not be empty"));
                }
                Ok(())
            }
            ImageOp::RandomCrop {
                padding: p,
                padding_mode: m,
                ..
            } => {
                if let Some(p) = p {
                    padding("random_crop", p)?;
                }
                m.as_deref()
                    .map_or(Ok(()), |m| padding_mode("random_crop", m).map(drop))
            }
            ImageOp::Pad {
                padding: p,
                padding_mode: m,
                ..
            } => {
                padding("pad", p)?;
                m.as_deref()
                    .map_or(Ok(()), |m| padding_mode("pad", m).map(drop))
            }
            ImageOp::RandomFlip { p, .. } => probability("random_flip", *p),
            ImageOp::ColorJitter {
                brightness,
                contrast,
                saturation,
                hue,
                p,
                ..
            } => {
                probability("color_jitter", *p)?;
                ColorJitter::new(*brightness, *contrast, *saturation, *hue).validate()
            }
            ImageOp::Grayscale { channels, .. } => match channels {
                1 | 3 => Ok(()),
                c => Err(Error::invalid(format!(
                    "grayscale: channels must be 1 or 3, not {c}"
                ))),
            },
            ImageOp::RandomGrayscale { p, .. } => probability("random_grayscale", *p),
            ImageOp::GaussianBlur {
                kernel_size,
                sigma,
                p,
                ..
            } => {
                probability("gaussian_blur", *p)?;
                let (lo, hi) = blur_sigma(*sigma);
                if *kernel_size == 0 || kernel_size % 2 == 0 || !(0.0 < lo && lo <= hi) {
                    return Err(Error::invalid(format!(
                        "gaussian_blur: kernel_size must be odd and positive and 0 < sigma[0] <= \
                         sigma[1] (got {kernel_size}, {:?})",
                        [lo, hi]
                    )));
                }
                Ok(())
            }
            ImageOp::ImageToTensor { .. } => to_tensor(self).map(drop),
        }
    }

    /// Applies the operator to one sample.
    pub(crate) fn apply(&self, mut s: Sample, ctx: &mut OpContext) -> Result<Sample, Error> {
        let b = self;
        let r = (|| -> Result<(), Error> {
            let (field, out): (&str, Tensor) = match b {
                ImageOp::DecodeImage { field, .. } => {
                    let data = encoded_field(&s, field, "decode_image")?;
                    let out = decoder(b)?.apply_charged(data, &mut |n| ctx.reserve(n))?;
                    (field, out)
                }
                ImageOp::RandomResizedCrop { field, .. } => {
                    let img = image_field(&s, field, "random_resized_crop")?;
                    let (rng, mut charger) = ctx.rng_and_charger();
                    let out = rrc(b)?.apply_charged(img, rng, &mut |n| charger.charge(n))?;
                    (field, out)
                }
                ImageOp::Resize {
                    field,
                    size,
                    interpolation: i,
                    antialias,
                } => {
                    let (h, w) = size.hw();
                    let mut r = Resize::new(h, w);
                    if let Some(i) = i {
                        r = r.interpolation(interpolation("resize", i)?);
                    }
                    if let Some(a) = antialias {
                        r = r.antialias(*a);
                    }
                    let img = image_field(&s, field, "resize")?;
                    (field, r.apply_charged(img, &mut |n| ctx.reserve(n))?)
                }
                ImageOp::CenterCrop { field, size } => {
                    let (h, w) = size.hw();
                    let img = image_field(&s, field, "center_crop")?;
                    ctx.reserve((h * w * channels(img)) as u64)?;
                    (field, CenterCrop::new(h, w).apply(img)?)
                }
                ImageOp::RandomCrop {
                    field,
                    size,
                    padding: p,
                    pad_if_needed,
                    fill,
                    padding_mode: m,
                } => {
                    let (h, w) = size.hw();
                    let mut c = RandomCrop::new(h, w).pad_if_needed(*pad_if_needed);
                    let pm = m
                        .as_deref()
                        .map(|m| padding_mode("random_crop", m))
                        .transpose()?;
                    if let Some(p) = p {
                        let mut pad = Pad::new(padding("random_crop", p)?).fill(*fill);
                        if let Some(pm) = pm {
                            pad = pad.mode(pm);
                        }
                        c = c.padding(pad);
                    }
                    let img = image_field(&s, field, "random_crop")?;
                    // The padded image (when padded) and the crop.
                    let [l, t, r, bt] = match p {
                        Some(p) => padding("random_crop", p)?,
                        None => [0; 4],
                    };
                    let sh = img.shape();
                    let (ih, iw) = (
                        sh.first().copied().unwrap_or(0),
                        sh.get(1).copied().unwrap_or(0),
                    );
                    let padded = (ih + t + bt).max(h) * (iw + l + r).max(w);
                    ctx.reserve(((padded + h * w) * channels(img)) as u64)?;
                    (field, c.apply(img, ctx.rng())?)
                }
                ImageOp::Pad {
                    field,
                    padding: p,
                    fill,
                    padding_mode: m,
                } => {
                    let mut pad = Pad::new(padding("pad", p)?).fill(*fill);
                    if let Some(m) = m {
                        pad = pad.mode(padding_mode("pad", m)?);
                    }
                    let img = image_field(&s, field, "pad")?;
                    let [l, t, r, bt] = padding("pad", p)?;
                    let sh = img.shape();
                    let (ih, iw) = (
                        sh.first().copied().unwrap_or(0),
                        sh.get(1).copied().unwrap_or(0),
                    );
                    ctx.reserve(((ih + t + bt) * (iw + l + r) * channels(img)) as u64)?;
                    (field, pad.apply(img)?)
                }
                ImageOp::RandomFlip { field, vertical, p } => {
                    let f = if *vertical {
                        RandomFlip::vertical()
                    } else {
                        RandomFlip::horizontal()
                    };
                    let img = image_field(&s, field, "random_flip")?;
                    ctx.reserve(bytes(img))?;
                    (field, f.p(*p).apply(img, ctx.rng())?)
                }
                ImageOp::ColorJitter {
                    field,
                    brightness,
                    contrast,
                    saturation,
                    hue,
                    p,
                } => {
                    let img = image_field(&s, field, "color_jitter")?;
                    // torchvision's RandomApply: one draw decides, then the jitter draws.
                    if ctx.rng().unit() >= *p {
                        return Ok(());
                    }
                    let j = ColorJitter::new(*brightness, *contrast, *saturation, *hue);
                    // Its output and one intermediate image per adjustment at most.
                    ctx.reserve(bytes(img) * 3)?;
                    (field, j.apply(img, ctx.rng())?)
                }
                ImageOp::Grayscale { field, channels } => {
                    let img = image_field(&s, field, "grayscale")?;
                    ctx.reserve(bytes(img) * 2)?;
                    (field, Grayscale::new(*channels).apply(img)?)
                }
                ImageOp::RandomGrayscale { field, p } => {
                    let img = image_field(&s, field, "random_grayscale")?;
                    if ctx.rng().unit() >= *p {
                        return Ok(());
                    }
                    // Keeps the channel count, as torchvision's RandomGrayscale.
                    let c = img.shape().get(2).copied().unwrap_or(1);
                    ctx.reserve(bytes(img) * 2)?;
                    (
                        field,
                        Grayscale::new(if c == 1 { 1 } else { 3 }).apply(img)?,
                    )
                }
                ImageOp::GaussianBlur {
                    field,
                    kernel_size,
                    sigma,
                    p,
                } => {
                    let img = image_field(&s, field, "gaussian_blur")?;
                    if ctx.rng().unit() >= *p {
                        return Ok(());
                    }
                    // An f32 intermediate image, its row accumulators and the output.
                    ctx.reserve(bytes(img) * 6)?;
                    let g = GaussianBlur::new(*kernel_size, blur_sigma(*sigma));
                    (field, g.apply(img, ctx.rng())?)
                }
                ImageOp::ImageToTensor { field, .. } => {
                    let img = image_field(&s, field, "image_to_tensor")?;
                    let t = to_tensor(b)?;
                    // Written into the batch's buffer when the executor has a slot for it (a
                    // buffer the sample then holds); else a tensor of its own, charged first.
                    let len = bytes(img) * t.dtype.size() as u64;
                    let mut slot = ctx.output_slot(len as usize);
                    if slot.as_ref().is_none_or(|l| l.len() as u64 != len) {
                        ctx.reserve(len)?;
                    }
                    (field, t.apply_into(img, &mut |_| slot.take())?)
                }
            };
            s.insert(field, out);
            Ok(())
        })();
        r.map(|()| s)
    }
}

fn color_mode(mode: &str) -> Result<ColorMode, Error> {
    match mode {
        "rgb" => Ok(ColorMode::Rgb),
        "gray" | "grey" | "l" => Ok(ColorMode::Gray),
        "rgba" => Ok(ColorMode::RgbKeepAlpha),
        m => Err(Error::invalid(format!(
            "decode_image: mode {m:?} is not one of rgb, gray, rgba"
        ))),
    }
}

fn interpolation(op: &str, i: &str) -> Result<Interpolation, Error> {
    match i {
        "nearest" => Ok(Interpolation::Nearest),
        "bilinear" => Ok(Interpolation::Bilinear),
        "bicubic" => Ok(Interpolation::Bicubic),
        "lanczos" => Ok(Interpolation::Lanczos),
        m => Err(Error::invalid(format!(
            "{op}: interpolation {m:?} is not one of nearest, bilinear, bicubic, lanczos"
        ))),
    }
}

fn padding_mode(op: &str, m: &str) -> Result<PaddingMode, Error> {
    match m {
        "constant" => Ok(PaddingMode::Constant),
        "edge" => Ok(PaddingMode::Edge),
        "reflect" => Ok(PaddingMode::Reflect),
        "symmetric" => Ok(PaddingMode::Symmetric),
        m => Err(Error::invalid(format!(
            "{op}: padding_mode {m:?} is not one of constant, edge, reflect, symmetric"
        ))),
    }
}

/// torchvision's padding forms: one value (all sides), two (left/right, top/bottom), or
/// four (left, top, right, bottom).
fn padding(op: &str, p: &[usize]) -> Result<[usize; 4], Error> {
    match *p {
        [a] => Ok([a, a, a, a]),
        [lr, tb] => Ok([lr, tb, lr, tb]),
        [l, t, r, b] => Ok([l, t, r, b]),
        _ => Err(Error::invalid(format!(
            "{op}: padding takes 1, 2 or 4 values, not {}",
            p.len()
        ))),
    }
}

fn probability(op: &str, p: f64) -> Result<(), Error> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{op}: p must be in [0, 1], not {p}"
        )))
    }
}

/// `gaussian_blur`'s sigma range: the spec's, or the kernel's default.
fn blur_sigma(sigma: Option<[f32; 2]>) -> (f32, f32) {
    sigma.map_or(DEFAULT_BLUR_SIGMA, |[lo, hi]| (lo, hi))
}

fn decoder(b: &ImageOp) -> Result<DecodeImage, Error> {
    let ImageOp::DecodeImage {
        mode,
        exif_orientation,
        max_pixels,
        allow_truncated,
        ..
    } = b
    else {
        unreachable!("decoder() of a decode_image")
    };
    let mut d = DecodeImage::default();
    if let Some(m) = mode {
        d = d.mode(color_mode(m)?);
    }
    d = d
        .apply_exif_orientation(*exif_orientation)
        .allow_truncated(*allow_truncated);
    if let Some(m) = max_pixels {
        d = d.max_pixels(*m);
    }
    Ok(d)
}

fn rrc(b: &ImageOp) -> Result<RandomResizedCrop, Error> {
    let ImageOp::RandomResizedCrop {
        size,
        scale,
        ratio,
        interpolation: interp,
        antialias,
        ..
    } = b
    else {
        unreachable!("rrc() of a random_resized_crop")
    };
    let (h, w) = size.hw();
    let mut c = RandomResizedCrop::new(h, w);
    if let Some([lo, hi]) = *scale {
        c = c.scale(lo, hi);
    }
    if let Some([lo, hi]) = *ratio {
        c = c.ratio(lo, hi);
    }
    let ((slo, shi), (rlo, rhi)) = (c.scale, c.ratio);
    if !(0.0 < slo && slo <= shi && shi <= 1.0 && 0.0 < rlo && rlo <= rhi) || h == 0 || w == 0 {
        return Err(Error::invalid(format!(
            "random_resized_crop: need 0 < scale[0] <= scale[1] <= 1, 0 < ratio[0] <= ratio[1] \
             and a non-empty size (got scale {:?}, ratio {:?}, size {h}x{w})",
            [slo, shi],
            [rlo, rhi]
        )));
    }
    if let Some(i) = interp {
        c = c.interpolation(interpolation("random_resized_crop", i)?);
    }
    if let Some(a) = antialias {
        c.antialias = *a;
    }
    Ok(c)
}

fn to_tensor(b: &ImageOp) -> Result<ToTensor, Error> {
    let ImageOp::ImageToTensor {
        normalize,
        mean,
        std,
        dtype,
        layout,
        scale,
        ..
    } = b
    else {
        unreachable!("to_tensor() of an image_to_tensor")
    };
    let mut t = ToTensor::default().scale(*scale);
    match normalize.as_deref() {
        None => {}
        Some("imagenet") => {
            let imagenet = ToTensor::imagenet();
            t = t.normalize(&imagenet.mean, &imagenet.std);
        }
        Some(n) => {
            return Err(Error::invalid(format!(
                "image_to_tensor: normalize {n:?} is not `imagenet` (give mean and std instead)"
            )))
        }
    }
    match (mean, std) {
        (Some(m), Some(s)) => {
            if s.contains(&0.0) || m.is_empty() || m.len() != s.len() {
                return Err(Error::invalid(
                    "image_to_tensor: mean and std need the same, non-zero number of values, and no \
                     std of 0",
                ));
            }
            t = t.normalize(m, s);
        }
        (None, None) => {}
        _ => {
            return Err(Error::invalid(
                "image_to_tensor: give both mean and std, or neither",
            ))
        }
    }
    if let Some(d) = dtype {
        t = t.dtype(match d.as_str() {
            "float32" | "f32" => DType::F32,
            "float16" | "f16" => DType::F16,
            d => {
                return Err(Error::invalid(format!(
                    "image_to_tensor: dtype {d:?} is not float32 or float16"
                )))
            }
        });
    }
    if let Some(l) = layout {
        t = t.layout(match l.as_str() {
            "chw" => Layout::Chw,
            "hwc" => Layout::Hwc,
            l => {
                return Err(Error::invalid(format!(
                    "image_to_tensor: layout {l:?} is not chw or hwc"
                )))
            }
        });
    }
    Ok(t)
}

fn image_field<'a>(s: &'a Sample, field: &str, op: &str) -> Result<&'a Tensor, Error> {
    match s.require(field)? {
        Value::Tensor(t) => Ok(t),
        other => Err(Error::operator(format!(
            "{op}: field {field:?} is {}, not a decoded image (decode_image first)",
            other.kind()
        ))),
    }
}

/// An image tensor's bytes.
fn bytes(img: &Tensor) -> u64 {
    img.data().len() as u64
}

/// An `[H, W, C]` image's channels (1 for a 2-D one).
fn channels(img: &Tensor) -> usize {
    img.shape().get(2).copied().unwrap_or(1)
}

fn encoded_field<'a>(s: &'a Sample, field: &str, op: &str) -> Result<&'a [u8], Error> {
    match s.require(field)? {
        Value::Bytes(b) => Ok(b),
        other => Err(Error::operator(format!(
            "{op}: field {field:?} is {}, not encoded image bytes",
            other.kind()
        ))),
    }
}
/// Decode and random resized crop of one field, in one kernel, with the flip and the
/// conversion to float that follow it when there are.
#[derive(Debug)]
pub(crate) struct FusedDecodeCrop {
    field: String,
    kernel: DecodeRandomResizedCrop,
    /// The random flip's operator index (its generator).
    flip_op: Option<usize>,
    name: String,
}

impl SampleOp for FusedDecodeCrop {
    fn meta(&self) -> OpMeta {
        OpMeta::new(self.name.clone())
            .random()
            .with_cost_ns(2_800_000.0)
    }

    fn apply(&self, mut s: Sample, ctx: &mut OpContext) -> Result<Option<Sample>, Error> {
        let data = encoded_field(&s, &self.field, &self.name)?;
        let mut flip = self.flip_op.map(|j| ctx.for_op(j));
        let mut slot = ctx.take_output_slot();
        let (rng, mut charger) = ctx.rng_and_charger();
        let out = self.kernel.apply_into(
            data,
            rng,
            flip.as_mut().map(OpContext::rng),
            &mut slot,
            &mut |n| charger.charge(n),
        )?;
        s.insert(self.field.as_str(), out);
        Ok(Some(s))
    }
}

/// The fused kernel for the operators at the start of `ops` (operator index, operator):
/// a decode then a random resized crop of one field, and then, when they follow on the
/// same field, a random flip and an `image_to_tensor`. Returns how many operators it
/// replaces and the index it runs under: the crop's, whose generator picks the box, while
/// the flip draws from its own operator's, so results equal the unfused operators'.
pub(crate) fn fuse(
    ops: &[(usize, Arc<dyn SampleOp>)],
) -> Option<(usize, usize, Arc<dyn SampleOp>)> {
    let b = |k: usize| match ops.get(k)?.1.as_builtin()? {
        Builtin::Image(op) => Some(op),
        _ => None,
    };
    let (first, second) = (b(0)?, b(1)?);
    let (ImageOp::DecodeImage { field, .. }, ImageOp::RandomResizedCrop { field: f2, .. }) =
        (first, second)
    else {
        return None;
    };
    if field != f2 {
        return None;
    }
    let mut kernel = DecodeRandomResizedCrop::new(decoder(first).ok()?, rrc(second).ok()?);
    let mut n = 2;
    let mut names = vec!["decode_image", "random_resized_crop"];
    let mut flip_op = None;
    if let Some(ImageOp::RandomFlip {
        field: f3,
        vertical,
        p,
    }) = b(n)
    {
        if f3 == field && probability("random_flip", *p).is_ok() {
            let f = if *vertical {
                RandomFlip::vertical()
            } else {
                RandomFlip::horizontal()
            };
            kernel = kernel.flip(f.p(*p));
            flip_op = Some(ops[n].0);
            names.push("random_flip");
            n += 1;
        }
    }
    if let Some(t @ ImageOp::ImageToTensor { field: f4, .. }) = b(n) {
        if f4 == field {
            if let Ok(t) = to_tensor(t) {
                kernel = kernel.to_tensor(t);
                names.push("image_to_tensor");
                n += 1;
            }
        }
    }
    let op = FusedDecodeCrop {
        field: field.clone(),
        kernel,
        flip_op,
        name: format!("{}({field})", names.join("+")),
    };
    Some((n, ops[1].0, Arc::new(op)))
}
