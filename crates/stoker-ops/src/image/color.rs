//! Colour kernels with PIL's arithmetic (what torchvision runs on PIL images): blends in
//! single precision truncated to u8, luma in 16-bit fixed point, hue through PIL's
//! 8-bit HSV; and torchvision's Gaussian blur.

use stoker_core::rng::{permutation, Rng};
use stoker_core::{Error, Tensor};

use super::jpeg::luma;
use super::{hwc_tensor, ImageRef};

/// torchvision's `Grayscale` / PIL's `convert("L")`: `L = R*299/1000 + G*587/1000 +
/// B*114/1000` (in 16-bit fixed point, rounded), replicated to 3 channels if asked.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grayscale {
    /// 1 or 3.
    pub num_output_channels: usize,
}

impl Grayscale {
    /// Gray with `num_output_channels` (1 or 3).
    pub fn new(num_output_channels: usize) -> Grayscale {
        Grayscale {
            num_output_channels,
        }
    }

    /// Converts `image`.
    pub fn apply(&self, image: &Tensor) -> Result<Tensor, Error> {
        let img = ImageRef::from_tensor(image, "grayscale")?;
        let n = self.num_output_channels;
        if n != 1 && n != 3 {
            return Err(Error::invalid(format!(
                "grayscale: num_output_channels must be 1 or 3, got {n}"
            )));
        }
        let gray: Vec<u8> = if img.c >= 3 {
            img.data
                .chunks_exact(img.c)
                .map(|p| luma(p[0], p[1], p[2]))
                .collect()
        } else {
            img.data.chunks_exact(img.c).map(|p| p[0]).collect()
        };
        let out = if n == 1 {
            gray
        } else {
            gray.iter().flat_map(|&v| [v, v, v]).collect()
        };
        hwc_tensor(img.h, img.w, n, out)
    }
}

/// PIL's `Image.blend(a, b, alpha)`, elementwise: `a + alpha * (b - a)` in single
/// precision, truncated (and clamped when extrapolating).
#[inline]
fn blend(a: u8, b: u8, alpha: f32) -> u8 {
    let v = a as f32 + alpha * (b as f32 - a as f32);
    if v <= 0.0 {
        0
    } else if v >= 255.0 {
        255
    } else {
        v as u8
    }
}

fn check_rgb(img: &ImageRef<'_>, op: &str) -> Result<(), Error> {
    if img.c != 3 {
        return Err(Error::operator(format!(
            "{op}: expects an RGB image, got {} channel(s)",
            img.c
        )));
    }
    Ok(())
}

/// Brightness: blend with black.
pub(crate) fn adjust_brightness(px: &mut [u8], factor: f32) {
    let lut: Vec<u8> = (0..=255u8).map(|v| blend(0, v, factor)).collect();
    for v in px.iter_mut() {
        *v = lut[*v as usize];
    }
}

/// Contrast: blend with the mean gray level (PIL rounds the mean of `convert("L")`).
pub(crate) fn adjust_contrast(px: &mut [u8], c: usize, factor: f32) {
    let n = (px.len() / c) as f64;
    let sum: u64 = if c >= 3 {
        px.chunks_exact(c)
            .map(|p| luma(p[0], p[1], p[2]) as u64)
            .sum()
    } else {
        px.chunks_exact(c).map(|p| p[0] as u64).sum()
    };
    let mean = (sum as f64 / n + 0.5) as u8;
    let lut: Vec<u8> = (0..=255u8).map(|v| blend(mean, v, factor)).collect();
    for v in px.iter_mut() {
        *v = lut[*v as usize];
    }
}

/// Saturation: blend each pixel with its own gray level.
pub(crate) fn adjust_saturation(px: &mut [u8], c: usize, factor: f32) {
    if c < 3 {
        return;
    }
    for p in px.chunks_exact_mut(c) {
        let g = luma(p[0], p[1], p[2]);
        for v in &mut p[..3] {
            *v = blend(g, *v, factor);
        }
    }
}

/// PIL's RGB -> HSV (all three as u8), as PIL computes it; [`rgb_to_hsv`] looks its hue
/// and saturation up instead.
fn rgb_to_hsv_exact(r: u8, g: u8, b: u8) -> (u8, u8, u8) {
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    if maxc == minc {
        return (0, 0, maxc);
    }
    let (rf, gf, bf) = (r as f32, g as f32, b as f32);
    let cr = (maxc - minc) as f32;
    let s = cr / maxc as f32;
    let rc = (maxc as f32 - rf) / cr;
    let gc = (maxc as f32 - gf) / cr;
    let bc = (maxc as f32 - bf) / cr;
    // Mixed single/double precision exactly as PIL's converter evaluates it.
    let h: f32 = if r == maxc {
        bc - gc
    } else if g == maxc {
        (2.0 + rc as f64 - bc as f64) as f32
    } else {
        (4.0 + gc as f64 - rc as f64) as f32
    };
    // `(h / 6 + 1) % 1` as PIL has it: the sum lies in [5/6, 2) (h in [-1, 5)), where
    // subtracting 1 is exact and equals the remainder (no fmod call).
    let x = h as f64 / 6.0 + 1.0;
    let h = (if x >= 1.0 { x - 1.0 } else { x }) as f32;
    let hu = ((h as f64 * 255.0) as i32).clamp(0, 255) as u8;
    let su = ((s as f64 * 255.0) as i32).clamp(0, 255) as u8;
    (hu, su, maxc)
}

/// PIL's 8-bit hue and saturation by table. With `cr = max - min`, the saturation depends
/// only on `(cr, max)`, and the hue only on which channel is the largest (the first of
/// r, g, b that is), which of the other two is the smallest, and `d = max - x` of the
/// remaining one (`x`): PIL's quotients are `d / cr`, and 1 for the smallest. Both tables
/// (384 KiB and 64 KiB) are filled once from [`rgb_to_hsv_exact`]: the hues from the colours
/// whose smallest channel is 0 (every other colour is one of them shifted, with the same
/// case, `cr` and `d`), the saturations from one colour per `(cr, max)`; a test checks every one of the 16.7M colours against PIL's arithmetic.
struct HsvTables {
    hue: Vec<u8>,
    sat: Vec<u8>,
}

static HSV: std::sync::LazyLock<HsvTables> = std::sync::LazyLock::new(|| {
    let mut t = HsvTables {
        hue: vec![0; 6 << 16],
        sat: vec![0; 1 << 16],
    };
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            for (r, g, bl) in [(0, a, b), (a, 0, b), (a, b, 0)] {
                let (maxc, minc) = (r.max(g).max(bl), r.min(g).min(bl));
                if maxc == minc {
                    continue;
                }
                t.hue[hue_index(r, g, bl, maxc, minc)] = rgb_to_hsv_exact(r, g, bl).0;
            }
        }
    }
    for maxc in 1..=255u8 {
        for cr in 1..=maxc {
            t.sat[(cr as usize) << 8 | maxc as usize] =
                rgb_to_hsv_exact(maxc, maxc - cr, maxc - cr).1;
        }
    }
    t
});

/// Where [`HsvTables::hue`] holds the hue of `(r, g, b)` (not gray).
#[inline]
fn hue_index(r: u8, g: u8, b: u8, maxc: u8, minc: u8) -> usize {
    let (case, other) = if r == maxc {
        if g == minc {
            (0, b)
        } else {
            (1, g)
        }
    } else if g == maxc {
        if r == minc {
            (2, b)
        } else {
            (3, r)
        }
    } else if g == minc {
        (4, r)
    } else {
        (5, g)
    };
    case << 16 | ((maxc - minc) as usize) << 8 | (maxc - other) as usize
}

/// PIL's RGB -> HSV (all three as u8), by table.
#[inline]
fn rgb_to_hsv_in(t: &HsvTables, r: u8, g: u8, b: u8) -> (u8, u8, u8) {
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    if maxc == minc {
        return (0, 0, maxc);
    }
    (
        t.hue[hue_index(r, g, b, maxc, minc)],
        t.sat[((maxc - minc) as usize) << 8 | maxc as usize],
        maxc,
    )
}

#[cfg(test)]
fn rgb_to_hsv(r: u8, g: u8, b: u8) -> (u8, u8, u8) {
    rgb_to_hsv_in(&HSV, r, g, b)
}

/// `out[i] = k[0] * taps[0][i] + k[1] * taps[1][i] + ...`, summed from 0.0 in tap order (the
/// sums of a loop over the taps for each output, bit for bit), a block of outputs at a time
/// held in registers across the taps (vectorized; a loop adding each tap to the whole row
/// instead spent its time loading and storing the row).
fn weighted_sum(out: &mut [f32], k: &[f32], taps: &[&[f32]]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { weighted_sum_avx2(out, k, taps) };
    }
    weighted_sum_lanes(out, k, taps)
}

/// [`weighted_sum_lanes`] compiled for AVX2: a block's 32 sums in four registers instead of
/// eight, the same multiplies and adds in the same order (no fused multiply-add), so the
/// same results.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn weighted_sum_avx2(out: &mut [f32], k: &[f32], taps: &[&[f32]]) {
    weighted_sum_lanes(out, k, taps)
}

#[inline(always)]
fn weighted_sum_lanes(out: &mut [f32], k: &[f32], taps: &[&[f32]]) {
    const BLOCK: usize = 32;
    let n = out.len();
    let mut i = 0;
    while i + BLOCK <= n {
        let mut a = [0f32; BLOCK];
        for (&kt, tap) in k.iter().zip(taps) {
            let v = &tap[i..i + BLOCK];
            for j in 0..BLOCK {
                a[j] += kt * v[j];
            }
        }
        out[i..i + BLOCK].copy_from_slice(&a);
        i += BLOCK;
    }
    for (j, o) in out.iter_mut().enumerate().skip(i) {
        let mut a = 0f32;
        for (&kt, tap) in k.iter().zip(taps) {
            a += kt * tap[j];
        }
        *o = a;
    }
}

/// `x.round_ties_even().clamp(0.0, 255.0) as u8` without a libm call (baseline x86-64
/// has no rounding instruction): clamped first (0 and 255 are whole, so the order does not
/// matter), then rounded to nearest even by adding and subtracting 1.5 x 2^23, exact for
/// magnitudes below 2^22 in the default rounding mode.
#[inline]
fn round_even_u8(x: f32) -> u8 {
    const MAGIC: f32 = 12_582_912.0;
    let c = x.clamp(0.0, 255.0);
    ((c + MAGIC) - MAGIC) as u8
}

/// `x.round() as i32` (half away from zero) without a libm call for the non-negative
/// values the HSV conversion gives: `x - trunc(x)` is exact there.
#[inline]
fn round_half_away(x: f32) -> i32 {
    if (0.0..1e9).contains(&x) {
        let t = x as i32;
        t + i32::from(x - t as f32 >= 0.5)
    } else {
        x.round() as i32
    }
}

/// PIL's HSV -> RGB.
#[inline]
fn hsv_to_rgb(h: u8, s: u8, v: u8) -> (u8, u8, u8) {
    if s == 0 {
        return (v, v, v);
    }
    let hf = h as f32 * 6.0 / 255.0;
    let sf = s as f32 / 255.0;
    let vf = v as f32;
    // hf >= 0: truncation is the floor (without a libm call on baseline x86-64).
    let i = hf as i32 as f32;
    let f = hf - i;
    let round = |x: f32| round_half_away(x).clamp(0, 255) as u8;
    let p = round(vf * (1.0 - sf));
    let q = round(vf * (1.0 - sf * f));
    let t = round(vf * (1.0 - sf * (1.0 - f)));
    match (i as i32) % 6 {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    }
}

/// Hue: torchvision's PIL path shifts PIL's 8-bit hue by `int32(factor * 255)` (truncated)
/// with wrap-around.
pub(crate) fn adjust_hue(px: &mut [u8], c: usize, factor: f32) {
    if c < 3 {
        return;
    }
    let shift = ((factor as f64 * 255.0) as i64).rem_euclid(256) as u8;
    let t = &*HSV;
    for p in px.chunks_exact_mut(c) {
        let (h, s, v) = rgb_to_hsv_in(t, p[0], p[1], p[2]);
        let (r, g, b) = hsv_to_rgb(h.wrapping_add(shift), s, v);
        p[0] = r;
        p[1] = g;
        p[2] = b;
    }
}

/// torchvision's `ColorJitter`: brightness, contrast, saturation factors drawn uniformly
/// from `[max(0, 1 - x), 1 + x]`, hue from `[-x, x]` (`x <= 0.5`), applied in a random
/// order; a zero amount skips that adjustment. Expects RGB (gray images get brightness
/// and contrast only).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ColorJitter {
    /// Brightness factor range.
    pub brightness: Option<(f32, f32)>,
    /// Contrast factor range.
    pub contrast: Option<(f32, f32)>,
    /// Saturation factor range.
    pub saturation: Option<(f32, f32)>,
    /// Hue shift range (fractions of a turn, within -0.5..0.5).
    pub hue: Option<(f32, f32)>,
}

impl ColorJitter {
    /// Like `torchvision.transforms.ColorJitter(brightness, contrast, saturation, hue)`.
    pub fn new(brightness: f32, contrast: f32, saturation: f32, hue: f32) -> ColorJitter {
        let around_one = |x: f32| (x > 0.0).then(|| ((1.0 - x).max(0.0), 1.0 + x));
        ColorJitter {
            brightness: around_one(brightness),
            contrast: around_one(contrast),
            saturation: around_one(saturation),
            hue: (hue > 0.0).then_some((-hue, hue)),
        }
    }

    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), Error> {
        for (name, r) in [
            ("brightness", self.brightness),
            ("contrast", self.contrast),
            ("saturation", self.saturation),
        ] {
            if let Some((lo, hi)) = r {
                if !(lo >= 0.0 && lo <= hi && hi.is_finite()) {
                    return Err(Error::invalid(format!(
                        "color_jitter: {name} range {r:?} must satisfy 0 <= lo <= hi"
                    )));
                }
            }
        }
        if let Some((lo, hi)) = self.hue {
            if !(-0.5..=0.5).contains(&lo) || !(-0.5..=0.5).contains(&hi) || lo > hi {
                return Err(Error::invalid(format!(
                    "color_jitter: hue range {:?} must lie within [-0.5, 0.5]",
                    self.hue
                )));
            }
        }
        Ok(())
    }

    /// Draws torchvision's `get_params`: the order (a permutation of the four) and the
    /// factors. Order indices: 0 brightness, 1 contrast, 2 saturation, 3 hue.
    pub fn get_params(&self, rng: &mut Rng) -> ([usize; 4], [Option<f32>; 4]) {
        let perm = permutation(4, &[rng.next_u64()]);
        let order = [
            perm[0] as usize,
            perm[1] as usize,
            perm[2] as usize,
            perm[3] as usize,
        ];
        let mut draw = |r: Option<(f32, f32)>| r.map(|(lo, hi)| lo + (hi - lo) * rng.unit() as f32);
        let factors = [
            draw(self.brightness),
            draw(self.contrast),
            draw(self.saturation),
            draw(self.hue),
        ];
        (order, factors)
    }

    /// Applies the adjustments with explicit order and factors (no draws).
    pub fn apply_params(
        image: &Tensor,
        order: [usize; 4],
        factors: [Option<f32>; 4],
    ) -> Result<Tensor, Error> {
        let img = ImageRef::from_tensor(image, "color_jitter")?;
        if img.c != 1 && img.c != 3 {
            check_rgb(&img, "color_jitter")?;
        }
        let mut px = img.data.to_vec();
        for i in order {
            match (i, factors.get(i).copied().flatten()) {
                (0, Some(f)) => adjust_brightness(&mut px, f),
                (1, Some(f)) => adjust_contrast(&mut px, img.c, f),
                (2, Some(f)) => adjust_saturation(&mut px, img.c, f),
                (3, Some(f)) => adjust_hue(&mut px, img.c, f),
                _ => {}
            }
        }
        hwc_tensor(img.h, img.w, img.c, px)
    }

    /// Jitters `image` with factors and order drawn from `rng`.
    pub fn apply(&self, image: &Tensor, rng: &mut Rng) -> Result<Tensor, Error> {
        self.validate()?;
        let (order, factors) = self.get_params(rng);
        ColorJitter::apply_params(image, order, factors)
    }
}

/// torchvision's default sigma range of [`GaussianBlur`] (`sigma=(0.1, 2.0)`).
pub const DEFAULT_BLUR_SIGMA: (f32, f32) = (0.1, 2.0);

/// torchvision's `GaussianBlur`: sigma drawn uniformly from `sigma`, a normalised 1-D
/// kernel of `kernel_size` taps (odd) at positions `-(k-1)/2 ..= (k-1)/2`, reflect
/// padding, single-precision convolution (rows then columns), rounded to u8.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct GaussianBlur {
    /// Kernel size along x (odd, positive).
    pub kernel_x: usize,
    /// Kernel size along y (odd, positive).
    pub kernel_y: usize,
    /// Sigma range (torchvision's default [`DEFAULT_BLUR_SIGMA`], 0.1..2.0).
    pub sigma: (f32, f32),
}

impl GaussianBlur {
    /// A square `kernel_size` blur with sigma drawn from `sigma`.
    pub fn new(kernel_size: usize, sigma: (f32, f32)) -> GaussianBlur {
        GaussianBlur {
            kernel_x: kernel_size,
            kernel_y: kernel_size,
            sigma,
        }
    }

    fn kernel(size: usize, sigma: f32) -> Vec<f32> {
        let half = (size as f32 - 1.0) * 0.5;
        let pdf: Vec<f32> = (0..size)
            .map(|i| {
                let x = if size == 1 {
                    0.0
                } else {
                    -half + i as f32 * (2.0 * half) / (size as f32 - 1.0)
                };
                (-0.5 * (x / sigma) * (x / sigma)).exp()
            })
            .collect();
        let sum: f32 = pdf.iter().sum();
        pdf.into_iter().map(|v| v / sum).collect()
    }

    /// Blurs `image` with sigma drawn from `rng`.
    pub fn apply(&self, image: &Tensor, rng: &mut Rng) -> Result<Tensor, Error> {
        let (lo, hi) = self.sigma;
        if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
            return Err(Error::invalid(format!(
                "gaussian_blur: sigma range {:?} must satisfy 0 < lo <= hi",
                self.sigma
            )));
        }
        let s = lo + (hi - lo) * rng.unit() as f32;
        self.apply_sigma(image, s)
    }

    /// Blurs `image` with a given sigma (both axes).
    pub fn apply_sigma(&self, image: &Tensor, sigma: f32) -> Result<Tensor, Error> {
        let img = ImageRef::from_tensor(image, "gaussian_blur")?;
        for k in [self.kernel_x, self.kernel_y] {
            if k == 0 || k % 2 == 0 {
                return Err(Error::invalid(format!(
                    "gaussian_blur: kernel size must be odd and positive, got {k}"
                )));
            }
        }
        if sigma.is_nan() || sigma <= 0.0 {
            return Err(Error::invalid(format!(
                "gaussian_blur: sigma must be positive, got {sigma}"
            )));
        }
        let (h, w, c) = (img.h, img.w, img.c);
        let kx = GaussianBlur::kernel(self.kernel_x, sigma);
        let ky = GaussianBlur::kernel(self.kernel_y, sigma);
        let reflect = |i: isize, n: usize| -> usize {
            let n = n as isize;
            if n == 1 {
                return 0;
            }
            let p = 2 * (n - 1);
            let m = i.rem_euclid(p);
            (if m >= n { p - m } else { m }) as usize
        };
        // Rows: f32 intermediate. Each row is padded once (reflected, as f32); each tap
        // is then the padded row shifted, and the output row their weighted sum.
        let rx = self.kernel_x / 2;
        let stride = w * c;
        let src: Vec<usize> = (0..w + 2 * rx)
            .map(|x| reflect(x as isize - rx as isize, w))
            .collect();
        let mut padded = vec![0f32; (w + 2 * rx) * c];
        let mut mid = vec![0f32; h * stride];
        for y in 0..h {
            let row = img.row(y);
            for (px, &sx) in padded.chunks_exact_mut(c).zip(&src) {
                for (p, &v) in px.iter_mut().zip(&row[sx * c..sx * c + c]) {
                    *p = v as f32;
                }
            }
            let taps: Vec<&[f32]> = (0..kx.len())
                .map(|t| &padded[t * c..t * c + stride])
                .collect();
            weighted_sum(&mut mid[y * stride..(y + 1) * stride], &kx, &taps);
        }
        // Columns, accumulated a row at a time.
        let ry = (self.kernel_y / 2) as isize;
        let mut out = vec![0u8; h * stride];
        let mut acc = vec![0f32; stride];
        for y in 0..h {
            let taps: Vec<&[f32]> = (0..ky.len())
                .map(|t| {
                    let sy = reflect(y as isize + t as isize - ry, h);
                    &mid[sy * stride..(sy + 1) * stride]
                })
                .collect();
            weighted_sum(&mut acc, &ky, &taps);
            for (o, &a) in out[y * stride..(y + 1) * stride].iter_mut().zip(&acc) {
                *o = round_even_u8(a);
            }
        }
        hwc_tensor(h, w, c, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsv_round_trips_closely() {
        let mut worst = 0;
        for r in (0..=255u8).step_by(5) {
            for g in (0..=255u8).step_by(5) {
                for b in (0..=255u8).step_by(5) {
                    let (h, s, v) = rgb_to_hsv(r, g, b);
                    let (r2, g2, b2) = hsv_to_rgb(h, s, v);
                    for (a, b) in [(r, r2), (g, g2), (b, b2)] {
                        worst = worst.max((a as i32 - b as i32).abs());
                    }
                }
            }
        }
        // 8-bit hue and saturation lose precision; PIL's round trip is just as lossy.
        assert!(worst <= 8, "{worst}");
    }

    /// PIL's conversions as first written (fmod, floor and round from libm): the faster
    /// forms above must give the same bytes for every input.
    fn rgb_to_hsv_reference(r: u8, g: u8, b: u8) -> (u8, u8, u8) {
        let maxc = r.max(g).max(b);
        let minc = r.min(g).min(b);
        if maxc == minc {
            return (0, 0, maxc);
        }
        let (rf, gf, bf) = (r as f32, g as f32, b as f32);
        let cr = (maxc - minc) as f32;
        let s = cr / maxc as f32;
        let rc = (maxc as f32 - rf) / cr;
        let gc = (maxc as f32 - gf) / cr;
        let bc = (maxc as f32 - bf) / cr;
        let h: f32 = if r == maxc {
            bc - gc
        } else if g == maxc {
            (2.0 + rc as f64 - bc as f64) as f32
        } else {
            (4.0 + gc as f64 - rc as f64) as f32
        };
        let h = ((h as f64 / 6.0 + 1.0) % 1.0) as f32;
        let hu = ((h as f64 * 255.0) as i32).clamp(0, 255) as u8;
        let su = ((s as f64 * 255.0) as i32).clamp(0, 255) as u8;
        (hu, su, maxc)
    }

    fn hsv_to_rgb_reference(h: u8, s: u8, v: u8) -> (u8, u8, u8) {
        if s == 0 {
            return (v, v, v);
        }
        let hf = h as f32 * 6.0 / 255.0;
        let sf = s as f32 / 255.0;
        let vf = v as f32;
        let i = hf.floor();
        let f = hf - i;
        let round = |x: f32| (x.round() as i32).clamp(0, 255) as u8;
        let p = round(vf * (1.0 - sf));
        let q = round(vf * (1.0 - sf * f));
        let t = round(vf * (1.0 - sf * (1.0 - f)));
        match (i as i32) % 6 {
            0 => (v, t, p),
            1 => (q, v, p),
            2 => (p, v, t),
            3 => (p, q, v),
            4 => (t, p, v),
            _ => (v, p, q),
        }
    }

    #[test]
    fn hsv_conversions_equal_pils_for_every_input() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                for c in 0..=255u8 {
                    let want = rgb_to_hsv_reference(a, b, c);
                    assert_eq!(rgb_to_hsv(a, b, c), want);
                    assert_eq!(rgb_to_hsv_exact(a, b, c), want);
                    assert_eq!(hsv_to_rgb(a, b, c), hsv_to_rgb_reference(a, b, c));
                }
            }
        }
        for x in [
            0.0f32,
            0.49999997,
            0.5,
            1.5,
            2.5,
            254.5,
            255.49998,
            1e9,
            -0.5,
            f32::NAN,
        ] {
            assert_eq!(round_half_away(x), x.round() as i32, "{x}");
        }
        // Every 1/4096 from -3 to 260, and each half's neighbours.
        let even = |x: f32| x.round_ties_even().clamp(0.0, 255.0) as u8;
        for k in 0..263 * 4096 {
            let x = -3.0 + k as f32 / 4096.0;
            assert_eq!(round_even_u8(x), even(x), "{x}");
            if k % 2048 == 0 {
                for y in [x.next_down(), x.next_up()] {
                    assert_eq!(round_even_u8(y), even(y), "{y}");
                }
            }
        }
    }

    /// The blur pixel by pixel, tap by tap: the vectorized rows must give the same bytes.
    fn blur_reference(
        px: &[u8],
        (h, w, c): (usize, usize, usize),
        k: usize,
        sigma: f32,
    ) -> Vec<u8> {
        let kern = GaussianBlur::kernel(k, sigma);
        let r = (k / 2) as isize;
        let reflect = |i: isize, n: usize| -> usize {
            let n = n as isize;
            if n == 1 {
                return 0;
            }
            let p = 2 * (n - 1);
            let m = i.rem_euclid(p);
            (if m >= n { p - m } else { m }) as usize
        };
        let mut mid = vec![0f32; h * w * c];
        for y in 0..h {
            for x in 0..w {
                for ch in 0..c {
                    let mut acc = 0f32;
                    for (t, &kt) in kern.iter().enumerate() {
                        let sx = reflect(x as isize + t as isize - r, w);
                        acc += kt * px[(y * w + sx) * c + ch] as f32;
                    }
                    mid[(y * w + x) * c + ch] = acc;
                }
            }
        }
        let mut out = vec![0u8; h * w * c];
        for y in 0..h {
            for i in 0..w * c {
                let mut acc = 0f32;
                for (t, &kt) in kern.iter().enumerate() {
                    let sy = reflect(y as isize + t as isize - r, h);
                    acc += kt * mid[sy * w * c + i];
                }
                out[y * w * c + i] = acc.round_ties_even().clamp(0.0, 255.0) as u8;
            }
        }
        out
    }

    #[test]
    fn the_blur_equals_the_pixel_by_pixel_sums() {
        let mut rng = Rng::from_words(&[7]);
        for (h, w, c, k) in [
            (1, 1, 3, 11),
            (3, 2, 1, 5),
            (7, 13, 3, 11),
            (40, 31, 3, 11),
            (9, 64, 4, 3),
        ] {
            let px: Vec<u8> = (0..h * w * c).map(|_| rng.next_u64() as u8).collect();
            let t = hwc_tensor(h, w, c, px.clone()).unwrap();
            for sigma in [0.1, 0.7, 2.0] {
                let got = GaussianBlur::new(k, (sigma, sigma))
                    .apply_sigma(&t, sigma)
                    .unwrap();
                let want = hwc_tensor(h, w, c, blur_reference(&px, (h, w, c), k, sigma)).unwrap();
                assert_eq!(got, want, "{h}x{w}x{c} k {k} sigma {sigma}");
            }
        }
    }

    #[test]
    fn blend_truncates_and_clamps() {
        assert_eq!(blend(0, 255, 0.5), 127);
        assert_eq!(blend(0, 200, 2.0), 255);
        assert_eq!(blend(100, 0, 2.0), 0);
    }

    #[test]
    fn identity_jitter_and_blur_keep_pixels() {
        let px: Vec<u8> = (0..5 * 7 * 3).map(|v| (v * 7 % 256) as u8).collect();
        let t = hwc_tensor(5, 7, 3, px).unwrap();
        let same =
            ColorJitter::apply_params(&t, [0, 1, 2, 3], [Some(1.0), Some(1.0), Some(1.0), None])
                .unwrap();
        assert_eq!(same, t);
        let b = GaussianBlur::new(1, (1.0, 1.0))
            .apply_sigma(&t, 1.0)
            .unwrap();
        assert_eq!(b, t);
        let flat = hwc_tensor(4, 4, 1, vec![90; 16]).unwrap();
        let b = GaussianBlur::new(3, (1.0, 1.0))
            .apply_sigma(&flat, 1.5)
            .unwrap();
        assert_eq!(b, flat);
    }
}
