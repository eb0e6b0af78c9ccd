//! The image operators of [`Builtin`]: each turns its spec arguments into a kernel of
//! `stoker_ops::image` and applies it to one field of a sample.
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

use stoker_core::{DType, Error, Sample, Tensor, Value};
use stoker_ops::image::{
    CenterCrop, ColorJitter, ColorMode, DecodeImage, DecodeRandomResizedCrop, GaussianBlur,
    Grayscale, Interpolation, Layout, Pad, PaddingMode, RandomCrop, RandomFlip, RandomResizedCrop,
    Resize, ToTensor,
};

use crate::ops::{Builtin, OpContext, SampleOp};

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

pub(crate) fn half() -> f64 {
    0.5
}

pub(crate) fn one() -> f64 {
    1.0
}

pub(crate) fn three() -> usize {
    3
}

pub(crate) fn yes() -> bool {
    true
}

fn color_mode(mode: Option<&str>) -> Result<ColorMode, Error> {
    match mode.unwrap_or("rgb") {
        "rgb" => Ok(ColorMode::Rgb),
        "gray" | "grey" | "l" => Ok(ColorMode::Gray),
        "rgba" => Ok(ColorMode::RgbKeepAlpha),
        m => Err(Error::invalid(format!(
            "decode_image: mode {m:?} is not one of rgb, gray, rgba"
        ))),
    }
}

fn interpolation(op: &str, i: Option<&str>) -> Result<Interpolation, Error> {
    match i.unwrap_or("bilinear") {
        "nearest" => Ok(Interpolation::Nearest),
        "bilinear" => Ok(Interpolation::Bilinear),
        "bicubic" => Ok(Interpolation::Bicubic),
        "lanczos" => Ok(Interpolation::Lanczos),
        m => Err(Error::invalid(format!(
            "{op}: interpolation {m:?} is not one of nearest, bilinear, bicubic, lanczos"
        ))),
    }
}

fn padding_mode(op: &str, m: Option<&str>) -> Result<PaddingMode, Error> {
    match m.unwrap_or("constant") {
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

fn decoder(b: &Builtin) -> Result<DecodeImage, Error> {
    let Builtin::DecodeImage {
        mode,
        exif_orientation,
        max_pixels,
        allow_truncated,
        ..
    } = b
    else {
        unreachable!("decoder() of a decode_image")
    };
    let mut d = DecodeImage::default()
        .mode(color_mode(mode.as_deref())?)
        .apply_exif_orientation(*exif_orientation)
        .allow_truncated(*allow_truncated);
    if let Some(m) = max_pixels {
        d = d.max_pixels(*m);
    }
    Ok(d)
}

fn rrc(b: &Builtin) -> Result<RandomResizedCrop, Error> {
    let Builtin::RandomResizedCrop {
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
    let [slo, shi] = scale.unwrap_or([0.08, 1.0]);
    let [rlo, rhi] = ratio.unwrap_or([3.0 / 4.0, 4.0 / 3.0]);
    if !(0.0 < slo && slo <= shi && shi <= 1.0 && 0.0 < rlo && rlo <= rhi) || h == 0 || w == 0 {
        return Err(Error::invalid(format!(
            "random_resized_crop: need 0 < scale[0] <= scale[1] <= 1, 0 < ratio[0] <= ratio[1] \
             and a non-empty size (got scale {:?}, ratio {:?}, size {h}x{w})",
            [slo, shi],
            [rlo, rhi]
        )));
    }
    let mut c = RandomResizedCrop::new(h, w)
        .scale(slo, shi)
        .ratio(rlo, rhi)
        .interpolation(interpolation("random_resized_crop", interp.as_deref())?);
    c.antialias = antialias.unwrap_or(true);
    Ok(c)
}

fn to_tensor(b: &Builtin) -> Result<ToTensor, Error> {
    let Builtin::ImageToTensor {
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
            t = t.normalize(&[0.485, 0.456, 0.406], &[0.229, 0.224, 0.225]);
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
    let dt = match dtype.as_deref().unwrap_or("float32") {
        "float32" | "f32" => DType::F32,
        "float16" | "f16" => DType::F16,
        d => {
            return Err(Error::invalid(format!(
                "image_to_tensor: dtype {d:?} is not float32 or float16"
            )))
        }
    };
    let l = match layout.as_deref().unwrap_or("chw") {
        "chw" => Layout::Chw,
        "hwc" => Layout::Hwc,
        l => {
            return Err(Error::invalid(format!(
                "image_to_tensor: layout {l:?} is not chw or hwc"
            )))
        }
    };
    Ok(t.dtype(dt).layout(l))
}

/// Checks an image operator's arguments (every kernel is built once, here, to see that it
/// can be).
pub(crate) fn validate(b: &Builtin) -> Result<(), Error> {
    match b {
        Builtin::DecodeImage { .. } => decoder(b).map(drop),
        Builtin::RandomResizedCrop { .. } => rrc(b).map(drop),
        Builtin::Resize {
            size,
            interpolation: i,
            ..
        } => {
            let (h, w) = size.hw();
            if h == 0 || w == 0 {
                return Err(Error::invalid("resize: the size must not be empty"));
            }
            interpolation("resize", i.as_deref()).map(drop)
        }
        Builtin::CenterCrop { size, .. } => {
            let (h, w) = size.hw();
            if h == 0 || w == 0 {
                return Err(Error::invalid("center_crop: the size must not be empty"));
            }
            Ok(())
        }
        Builtin::RandomCrop {
            padding: p,
            padding_mode: m,
            ..
        } => {
            if let Some(p) = p {
                padding("random_crop", p)?;
            }
            padding_mode("random_crop", m.as_deref()).map(drop)
        }
        Builtin::Pad {
            padding: p,
            padding_mode: m,
            ..
        } => {
            padding("pad", p)?;
            padding_mode("pad", m.as_deref()).map(drop)
        }
        Builtin::RandomFlip { p, .. } => probability("random_flip", *p),
        Builtin::ColorJitter {
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
        Builtin::Grayscale { channels, .. } => match channels {
            1 | 3 => Ok(()),
            c => Err(Error::invalid(format!(
                "grayscale: channels must be 1 or 3, not {c}"
            ))),
        },
        Builtin::RandomGrayscale { p, .. } => probability("random_grayscale", *p),
        Builtin::GaussianBlur {
            kernel_size,
            sigma,
            p,
            ..
        } => {
            probability("gaussian_blur", *p)?;
            let [lo, hi] = sigma.unwrap_or([0.1, 2.0]);
            if *kernel_size == 0 || kernel_size % 2 == 0 || !(0.0 < lo && lo <= hi) {
                return Err(Error::invalid(format!(
                    "gaussian_blur: kernel_size must be odd and positive and 0 < sigma[0] <= \
                     sigma[1] (got {kernel_size}, {:?})",
                    [lo, hi]
                )));
            }
            Ok(())
        }
        Builtin::ImageToTensor { .. } => to_tensor(b).map(drop),
        _ => Ok(()),
    }
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

/// Applies an image operator; `None` when `b` is not one.
pub(crate) fn apply(
    b: &Builtin,
    mut s: Sample,
    ctx: &mut OpContext,
) -> Option<Result<Sample, Error>> {
    let r = (|| -> Result<(), Error> {
        let (field, out): (&str, Tensor) = match b {
            Builtin::DecodeImage { field, .. } => {
                let data = encoded_field(&s, field, "decode_image")?;
                let out = decoder(b)?.apply_charged(data, &mut |n| ctx.reserve(n))?;
                (field, out)
            }
            Builtin::RandomResizedCrop { field, .. } => {
                let img = image_field(&s, field, "random_resized_crop")?;
                let (rng, mut charger) = ctx.rng_and_charger();
                let out = rrc(b)?.apply_charged(img, rng, &mut |n| charger.charge(n))?;
                (field, out)
            }
            Builtin::Resize {
                field,
                size,
                interpolation: i,
                antialias,
            } => {
                let (h, w) = size.hw();
                let mut r = Resize::new(h, w).interpolation(interpolation("resize", i.as_deref())?);
                r.antialias = antialias.unwrap_or(true);
                let img = image_field(&s, field, "resize")?;
                (field, r.apply_charged(img, &mut |n| ctx.reserve(n))?)
            }
            Builtin::CenterCrop { field, size } => {
                let (h, w) = size.hw();
                let img = image_field(&s, field, "center_crop")?;
                ctx.reserve((h * w * channels(img)) as u64)?;
                (field, CenterCrop::new(h, w).apply(img)?)
            }
            Builtin::RandomCrop {
                field,
                size,
                padding: p,
                pad_if_needed,
                fill,
                padding_mode: m,
            } => {
                let (h, w) = size.hw();
                let mut c = RandomCrop::new(h, w).pad_if_needed(*pad_if_needed);
                let pm = padding_mode("random_crop", m.as_deref())?;
                if let Some(p) = p {
                    c = c.padding(Pad::new(padding("random_crop", p)?).fill(*fill).mode(pm));
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
            Builtin::Pad {
                field,
                padding: p,
                fill,
                padding_mode: m,
            } => {
                let pad = Pad::new(padding("pad", p)?)
                    .fill(*fill)
                    .mode(padding_mode("pad", m.as_deref())?);
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
            Builtin::RandomFlip { field, vertical, p } => {
                let f = if *vertical {
                    RandomFlip::vertical()
                } else {
                    RandomFlip::horizontal()
                };
                let img = image_field(&s, field, "random_flip")?;
                ctx.reserve(bytes(img))?;
                (field, f.p(*p).apply(img, ctx.rng())?)
            }
            Builtin::ColorJitter {
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
            Builtin::Grayscale { field, channels } => {
                let img = image_field(&s, field, "grayscale")?;
                ctx.reserve(bytes(img) * 2)?;
                (field, Grayscale::new(*channels).apply(img)?)
            }
            Builtin::RandomGrayscale { field, p } => {
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
            Builtin::GaussianBlur {
                field,
                kernel_size,
                sigma,
                p,
            } => {
                let img = image_field(&s, field, "gaussian_blur")?;
                if ctx.rng().unit() >= *p {
                    return Ok(());
                }
                let [lo, hi] = sigma.unwrap_or([0.1, 2.0]);
                // An f32 intermediate image, its row accumulators and the output.
                ctx.reserve(bytes(img) * 6)?;
                let g = GaussianBlur::new(*kernel_size, (lo, hi));
                (field, g.apply(img, ctx.rng())?)
            }
            Builtin::ImageToTensor { field, .. } => {
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
            _ => unreachable!("apply() of an image operator"),
        };
        s.insert(field, out);
        Ok(())
    })();
    Some(r.map(|()| s))
}

/// Whether `b` is one of this module's operators.
pub(crate) fn is_image_op(b: &Builtin) -> bool {
    matches!(
        b,
        Builtin::DecodeImage { .. }
            | Builtin::RandomResizedCrop { .. }
            | Builtin::Resize { .. }
            | Builtin::CenterCrop { .. }
            | Builtin::RandomCrop { .. }
            | Builtin::Pad { .. }
            | Builtin::RandomFlip { .. }
            | Builtin::ColorJitter { .. }
            | Builtin::Grayscale { .. }
            | Builtin::RandomGrayscale { .. }
            | Builtin::GaussianBlur { .. }
            | Builtin::ImageToTensor { .. }
    )
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
    fn meta(&self) -> stoker_core::OpMeta {
        stoker_core::OpMeta::new(self.name.clone())
            .random()
            .with_cost_ns(2_000_000.0)
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
    let b = |k: usize| ops.get(k).and_then(|(_, op)| op.as_builtin());
    let (first, second) = (b(0)?, b(1)?);
    let (Builtin::DecodeImage { field, .. }, Builtin::RandomResizedCrop { field: f2, .. }) =
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
    if let Some(Builtin::RandomFlip {
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
    if let Some(t @ Builtin::ImageToTensor { field: f4, .. }) = b(n) {
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
