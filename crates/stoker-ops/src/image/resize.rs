//! Resampling: separable convolution with per-output weights, PIL's arithmetic.
//!
//! For each output column (then row) the weights of the source pixels it covers are
//! computed once per call: the filter is centred on the output pixel's centre mapped into
//! the source box, and on a downscale its support widens by the scale factor, which is
//! the anti-aliasing PIL always does and torchvision's `antialias=True` reproduces. The
//! weights are normalised, turned into 22-bit fixed point, and applied to u8 samples
//! with i32 accumulators: a horizontal pass (only over the rows the vertical pass will
//! read) into a u8 intermediate, then a vertical pass; or, where Pillow 13 does (rows
//! shrinking by more than twice as many pixels as columns, [`vertical_first`]), the
//! vertical pass first. The source box may be fractional,
//! which is how the fused decode maps a DCT-scaled region onto the output exactly.

use std::mem::MaybeUninit;

use bytes::Bytes;
use stoker_core::{Error, Lease, Tensor};

use super::convert::{scatter_f32_into, scatter_into, Layout, Sink, Tables};
use super::geometry::Flip;
#[cfg(target_arch = "x86_64")]
use super::rgbx;
use super::scratch::Scratch;
use super::{hwc_tensor, ImageRef};

/// Interpolation filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Interpolation {
    /// The source pixel under the output pixel's centre (PIL's `NEAREST`, torchvision's
    /// `NEAREST_EXACT`).
    Nearest,
    /// Triangle filter (PIL's `BILINEAR`, torchvision's default).
    #[default]
    Bilinear,
    /// Keys cubic with a = -0.5 (PIL's `BICUBIC`).
    Bicubic,
    /// Lanczos with 3 lobes (PIL's `LANCZOS`).
    Lanczos,
    /// Box filter / area average (PIL's `BOX`).
    Box,
}

impl Interpolation {
    fn support(self) -> f64 {
        match self {
            Interpolation::Nearest | Interpolation::Box => 0.5,
            Interpolation::Bilinear => 1.0,
            Interpolation::Bicubic => 2.0,
            Interpolation::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Interpolation::Nearest | Interpolation::Box => {
                if x > -0.5 && x <= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            Interpolation::Bilinear => (1.0 - x.abs()).max(0.0),
            Interpolation::Bicubic => {
                let a = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * a
                } else {
                    0.0
                }
            }
            Interpolation::Lanczos => {
                if x.abs() < 3.0 {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let px = x * std::f64::consts::PI;
        px.sin() / px
    }
}

/// Resizes an HWC u8 image to `height` x `width`, or so that its shorter side measures
/// `shorter_side` (torchvision's `Resize(int)`: the longer side becomes
/// `int(size * long / short)`, truncated).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Resize {
    /// Output height (ignored when `shorter_side` is set).
    pub height: usize,
    /// Output width (ignored when `shorter_side` is set).
    pub width: usize,
    /// Scale so that the shorter side has this length, keeping the aspect ratio.
    pub shorter_side: Option<usize>,
    /// Filter.
    pub interpolation: Interpolation,
    /// Widen the filter on downscale (PIL always does; torchvision's `antialias=True`).
    /// Off: the filter keeps its unit support (torchvision's `antialias=False`), which
    /// aliases on large downscales.
    pub antialias: bool,
}

impl Resize {
    /// Bilinear, anti-aliased resize to `height` x `width`.
    pub fn new(height: usize, width: usize) -> Resize {
        Resize {
            height,
            width,
            shorter_side: None,
            interpolation: Interpolation::Bilinear,
            antialias: true,
        }
    }

    /// Bilinear, anti-aliased resize of the shorter side to `size` (torchvision's
    /// `Resize(size)` with an int, as in the ImageNet eval transform `Resize(256)`).
    pub fn shorter_side(size: usize) -> Resize {
        Resize {
            shorter_side: Some(size),
            ..Resize::new(size, size)
        }
    }

    /// The output `(height, width)` for a `w` x `h` input.
    pub fn output_size(&self, w: usize, h: usize) -> (usize, usize) {
        match self.shorter_side {
            None => (self.height, self.width),
            Some(s) if w <= h => ((s as f64 * h as f64 / w as f64) as usize, s),
            Some(s) => (s, (s as f64 * w as f64 / h as f64) as usize),
        }
    }

    /// Sets the filter.
    pub fn interpolation(mut self, i: Interpolation) -> Resize {
        self.interpolation = i;
        self
    }

    /// Sets anti-aliasing.
    pub fn antialias(mut self, on: bool) -> Resize {
        self.antialias = on;
        self
    }

    /// Resizes `image` (`[H, W, C]` u8).
    pub fn apply(&self, image: &Tensor) -> Result<Tensor, Error> {
        self.apply_charged(image, &mut |_| Ok(()))
    }

    /// As [`apply`](Self::apply), calling `charge` with the bytes it is about to allocate
    /// (its passes' buffers and the output, an upper bound) before it allocates them; an
    /// error from `charge` is returned as it is, and nothing is allocated.
    pub fn apply_charged(
        &self,
        image: &Tensor,
        charge: &mut dyn FnMut(u64) -> Result<(), Error>,
    ) -> Result<Tensor, Error> {
        let img = ImageRef::from_tensor(image, "resize")?;
        let b = [0.0, 0.0, img.w as f64, img.h as f64];
        if self.shorter_side.is_some() {
            let (height, width) = self.output_size(img.w, img.h);
            let exact = Resize {
                height,
                width,
                shorter_side: None,
                ..self.clone()
            };
            return exact.apply_box_charged(img, b, "resize", charge);
        }
        self.apply_box_charged(img, b, "resize", charge)
    }

    /// [`apply_box`](Self::apply_box), charging its buffers first (see
    /// [`apply_charged`](Self::apply_charged)).
    pub(crate) fn apply_box_charged(
        &self,
        img: ImageRef<'_>,
        src_box: [f64; 4],
        op: &str,
        charge: &mut dyn FnMut(u64) -> Result<(), Error>,
    ) -> Result<Tensor, Error> {
        charge(self.bytes_for(img, src_box, 1))?;
        self.apply_box(img, src_box, op)
    }

    /// What resampling `src_box` of `img` to this size allocates at most, each output
    /// sample `out_bytes` bytes ([`resample_bytes`]).
    pub(crate) fn bytes_for(&self, img: ImageRef<'_>, src_box: [f64; 4], out_bytes: usize) -> u64 {
        resample_bytes(
            (img.w, img.h, img.c),
            src_box,
            (self.width, self.height),
            (self.interpolation, self.antialias),
            out_bytes,
        )
    }

    /// Resizes the (possibly fractional) source box `[x0, y0, x1, y1]` of `img`.
    pub(crate) fn apply_box(
        &self,
        img: ImageRef<'_>,
        src_box: [f64; 4],
        op: &str,
    ) -> Result<Tensor, Error> {
        if self.height == 0 || self.width == 0 {
            return Err(Error::invalid(format!(
                "{op}: output size {}x{} is empty",
                self.height, self.width
            )));
        }
        let [x0, y0, x1, y1] = src_box;
        let inside = x0 >= 0.0 && y0 >= 0.0 && x1 <= img.w as f64 && y1 <= img.h as f64;
        if !(inside && x1 > x0 && y1 > y0) {
            return Err(Error::invalid(format!(
                "{op}: source box {src_box:?} is outside a {}x{} image",
                img.w, img.h
            )));
        }
        let out = resample(
            img,
            src_box,
            self.width,
            self.height,
            self.interpolation,
            self.antialias,
        );
        hwc_tensor(self.height, self.width, img.c, out)
    }
}

/// Fixed-point precision of the weights (as PIL: 32 - 8 - 2 bits).
const PRECISION_BITS: u32 = 22;

/// The source span and weights of each output pixel along one axis.
struct Weights {
    /// (first source index, count) per output pixel.
    bounds: Vec<(usize, usize)>,
    /// `ksize` weights per output pixel.
    k: Vec<i32>,
    ksize: usize,
    /// The same weights as fixed-length windows of `ksize` taps that all lie inside the
    /// source (shifted left at the far edge, zero weights outside the span): a loop of
    /// known length without bounds checks. `None` when the source is shorter than
    /// `ksize`.
    fixed: Option<Vec<(usize, usize)>>,
}

fn weights(
    in_size: usize,
    in0: f64,
    in1: f64,
    out_size: usize,
    f: Interpolation,
    antialias: bool,
) -> Weights {
    let scale = (in1 - in0) / out_size as f64;
    let filterscale = if antialias { scale.max(1.0) } else { 1.0 };
    let support = f.support() * filterscale;
    let ksize = (support.ceil() as usize) * 2 + 1;
    let mut bounds = Vec::with_capacity(out_size);
    let mut k = vec![0i32; out_size * ksize];
    let mut w = vec![0f64; ksize];
    let ss = 1.0 / filterscale;
    // Only pixels the box overlaps take part: with an integer box this is exactly
    // cropping first and resizing the crop (torchvision's `resized_crop`).
    let lo = in0.floor().max(0.0);
    let hi = (in1.ceil() as usize).min(in_size);
    for xx in 0..out_size {
        let center = in0 + (xx as f64 + 0.5) * scale;
        let xmin = (center - support + 0.5).floor().max(lo) as usize;
        let xmax = ((center + support + 0.5).floor() as usize).min(hi);
        let n = xmax.saturating_sub(xmin).min(ksize);
        let mut total = 0.0;
        for (x, wx) in w.iter_mut().enumerate().take(n) {
            let v = f.weight((x as f64 + xmin as f64 - center + 0.5) * ss);
            *wx = v;
            total += v;
        }
        let row = &mut k[xx * ksize..(xx + 1) * ksize];
        for x in 0..n {
            let v = if total != 0.0 { w[x] / total } else { 0.0 };
            let fixed = v * (1u32 << PRECISION_BITS) as f64;
            row[x] = if fixed < 0.0 {
                (fixed - 0.5) as i32
            } else {
                (fixed + 0.5) as i32
            };
        }
        bounds.push((xmin, n));
    }
    let mut w = Weights {
        bounds,
        k,
        ksize,
        fixed: None,
    };
    w.fix(in_size);
    w
}

impl Weights {
    /// Builds `fixed`: (window start, offset of the first real tap in the window).
    fn fix(&mut self, in_size: usize) {
        if in_size < self.ksize {
            return;
        }
        let mut fixed = Vec::with_capacity(self.bounds.len());
        for (xx, &(xmin, n)) in self.bounds.iter().enumerate() {
            let start = xmin.min(in_size - self.ksize);
            let shift = xmin - start;
            let row = &mut self.k[xx * self.ksize..(xx + 1) * self.ksize];
            // Taps beyond `n` are already zero; move the real ones right by `shift`.
            row.copy_within(0..n, shift);
            row[..shift].fill(0);
            fixed.push((start, shift));
        }
        // The windows now carry their weights at `shift..shift + n`; record the new
        // layout so that the variable-length path still reads them right.
        for (b, &(_, shift)) in self.bounds.iter_mut().zip(&fixed) {
            b.0 -= shift;
            b.1 += shift;
        }
        self.fixed = Some(fixed);
    }
}

impl Weights {
    /// Weights that copy `n` source pixels unchanged (one tap of weight 1.0 each):
    /// the resample of an axis that needs none, in the same arithmetic.
    fn identity(n: usize) -> Weights {
        Weights {
            bounds: (0..n).map(|i| (i, 1)).collect(),
            k: vec![1 << PRECISION_BITS; n],
            ksize: 1,
            fixed: Some((0..n).map(|i| (i, 0)).collect()),
        }
    }

    /// Moves every source index by `off` (the box's axis starts `off` pixels into the
    /// buffer that is read).
    fn shift(&mut self, off: usize) {
        for b in &mut self.bounds {
            b.0 += off;
        }
        if let Some(f) = &mut self.fixed {
            for b in f {
                b.0 += off;
            }
        }
    }

    /// Reverses the order of the outputs: the resampled axis comes out mirrored, with
    /// each output sample computed exactly as before.
    fn reverse(&mut self) {
        self.bounds.reverse();
        if let Some(f) = &mut self.fixed {
            f.reverse();
        }
        let k: Vec<i32> = self
            .k
            .chunks_exact(self.ksize)
            .rev()
            .flatten()
            .copied()
            .collect();
        self.k = k;
    }
}

/// One output pixel of `C` channels from a window of `K` taps.
#[inline(always)]
fn window<const K: usize, const C: usize>(px: &[u8], k: &[i32], o: &mut [u8]) {
    let px = &px[..K * C];
    let k = &k[..K];
    let mut acc = [HALF; 4];
    for j in 0..K {
        for l in 0..C {
            acc[l] += px[j * C + l] as i32 * k[j];
        }
    }
    for l in 0..C {
        o[l] = clip8(acc[l]);
    }
}

#[inline(always)]
pub(super) fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

pub(super) const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// One output line of a vertical pass: `acc` (a whole row of samples) is set to the
/// rounding half, then row `first + j` of `src` times `k[j]` is added for each tap `j`.
/// Written to vectorise: each tap is a whole row times one weight.
#[inline(always)]
pub(super) fn sum_rows(acc: &mut [i32], src: ImageRef<'_>, first: usize, k: &[i32]) {
    acc.fill(HALF);
    for (j, &w) in k.iter().enumerate() {
        for (a, &p) in acc.iter_mut().zip(src.row(first + j)) {
            *a += p as i32 * w;
        }
    }
}

/// The passes are written so that the compiler vectorises them; on x86-64 they are also
/// compiled for AVX2 (8 lanes of 32-bit multiplies, which the SSE2 baseline lacks) and
/// picked at run time. Same arithmetic, same results.
macro_rules! dispatch {
    ($name:ident, $imp:path, $avx:ident, ($($arg:ident: $ty:ty),*)) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        fn $avx($($arg: $ty),*) {
            $imp($($arg),*)
        }

        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2, checked just above.
                return unsafe { $avx($($arg),*) };
            }
            $imp($($arg),*)
        }
    };
}

dispatch!(horizontal_direct, horizontal_impl, horizontal_avx2,
    (src: ImageRef<'_>, y0: usize, y1: usize, wt: &Weights, out_w: usize, out: &mut Vec<u8>));
dispatch!(vertical, vertical_impl, vertical_avx2,
    (src: ImageRef<'_>, wt: &Weights, out_h: usize, out: &mut Vec<u8>));
dispatch!(columns, columns_impl, columns_avx2,
    (t: ImageRef<'_>, wt: &Weights, out_w: usize, out: &mut Vec<u8>));
dispatch!(vertical_f32, vertical_lut_impl::<4>, vertical_f32_avx2,
    (src: ImageRef<'_>, wt: &Weights, lut: &[[[u8; 4]; 256]], layout: Layout, out: &mut [MaybeUninit<u8>]));
dispatch!(vertical_f16, vertical_lut_impl::<2>, vertical_f16_avx2,
    (src: ImageRef<'_>, wt: &Weights, lut: &[[[u8; 2]; 256]], layout: Layout, out: &mut [MaybeUninit<u8>]));

/// Horizontal pass over rows `y0..y1` of `src` into a `(y1 - y0) x out_w` buffer.
///
/// A horizontal filter over interleaved channels does not vectorise, a vertical one does
/// (each tap is a whole row times one weight). For images of any size the rows are
/// therefore transposed, filtered vertically, and transposed back: the same sums in the
/// same order, so the same bytes, in about half the time.
fn horizontal(
    src: ImageRef<'_>,
    y0: usize,
    y1: usize,
    wt: &Weights,
    out_w: usize,
    out: &mut Vec<u8>,
) {
    let rows = y1 - y0;
    if rows < 8 || src.w < 8 {
        return horizontal_direct(src, y0, y1, wt, out_w, out);
    }
    let c = src.c;
    // Only the columns the weights read: a crop's, not the whole image's. (The bounds
    // run right to left when the output is mirrored.)
    let x0 = wt.bounds.iter().map(|b| b.0).min().unwrap_or(0);
    let x1 = wt
        .bounds
        .iter()
        .map(|b| b.0 + b.1)
        .max()
        .unwrap_or(src.w)
        .max(x0 + 1);
    let mut t = Scratch::take();
    #[cfg(target_arch = "x86_64")]
    let rgbx = c == 3 && std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let rgbx = false;
    if rgbx {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe {
            rgbx::transpose_rgb_to_rgbx(src, (y0, y1), (x0, x1), &mut t)
        };
    } else {
        transpose_cols(src, y0, y1, x0, x1, &mut t);
    }
    let shifted;
    let wt = if x0 == 0 {
        wt
    } else {
        shifted = Weights {
            bounds: wt.bounds.iter().map(|&(s, n)| (s - x0, n)).collect(),
            k: wt.k.clone(),
            ksize: wt.ksize,
            fixed: None,
        };
        &shifted
    };
    if rgbx {
        let t = ImageRef {
            data: &t,
            h: x1 - x0,
            w: rows,
            c: 4,
        };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU supports AVX2 (`rgbx`).
        unsafe {
            rgbx::columns_rgbx_to_rgb(t, &wt.bounds, (&wt.k, wt.ksize), out_w, out)
        };
        return;
    }
    let t = ImageRef {
        data: &t,
        h: x1 - x0,
        w: rows,
        c,
    };
    columns(t, wt, out_w, out);
}

/// The horizontal filter run as a vertical one over the transposed tile `t` (one row per
/// source column, `t.w` pixels each): output column `xx` is the weighted sum of `t`'s
/// rows, rounded, and is written straight into column `xx` of `out` (`t.w` rows of
/// `out_w` pixels), which transposes it back.
#[inline(always)]
fn columns_impl(t: ImageRef<'_>, wt: &Weights, out_w: usize, out: &mut Vec<u8>) {
    let (rows, c) = (t.w, t.c);
    let stride = rows * c;
    assert_eq!(wt.bounds.len(), out_w);
    // Every byte is written below.
    out.resize(rows * out_w * c, 0);
    let mut acc = vec![0i32; stride];
    let mut col = vec![0u8; stride];
    for (xx, &(xmin, n)) in wt.bounds.iter().enumerate() {
        sum_rows(&mut acc, t, xmin, &wt.k[xx * wt.ksize..xx * wt.ksize + n]);
        for (o, &a) in col.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
        if c == 3 {
            let dst = out.as_mut_ptr();
            for (r, px) in col.chunks_exact(3).enumerate() {
                // SAFETY: r < rows and xx < out_w, so the 3 bytes at
                // (r * out_w + xx) * 3 lie inside `out` (rows * out_w * 3 bytes).
                unsafe {
                    std::ptr::copy_nonoverlapping(px.as_ptr(), dst.add((r * out_w + xx) * 3), 3)
                };
            }
        } else {
            for (r, px) in col.chunks_exact(c).enumerate() {
                let d = (r * out_w + xx) * c;
                out[d..d + c].copy_from_slice(px);
            }
        }
    }
}

/// Rows `y0..y1`, columns `x0..x1` of `src` with the axes swapped (pixels of `c` bytes),
/// in cache-sized tiles: the result has `x1 - x0` rows of `y1 - y0` pixels.
fn transpose_cols(
    src: ImageRef<'_>,
    y0: usize,
    y1: usize,
    x0: usize,
    x1: usize,
    out: &mut Vec<u8>,
) {
    let (w, c) = (src.w, src.c);
    let h = y1 - y0;
    // Every byte is written below.
    out.resize((x1 - x0) * h * c, 0);
    assert!(y1 <= src.h && x1 <= w && src.data.len() >= src.h * w * c);
    let (sp, dp) = (src.data.as_ptr(), out.as_mut_ptr());
    const T: usize = 16;
    for by in (y0..y1).step_by(T) {
        for bx in (x0..x1).step_by(T) {
            for y in by..(by + T).min(y1) {
                let row = &src.data[y * w * c..(y + 1) * w * c];
                let yy = y - y0;
                let xs = bx..(bx + T).min(x1);
                match c {
                    3 => {
                        for x in xs {
                            // SAFETY: y < y1 <= src.h and x < x1 <= w (asserted above):
                            // the source pixel is inside `src.data`; x - x0 < x1 - x0 and
                            // yy < h: the destination is inside `out`.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    sp.add((y * w + x) * 3),
                                    dp.add(((x - x0) * h + yy) * 3),
                                    3,
                                )
                            };
                        }
                    }
                    1 => {
                        for x in xs {
                            out[(x - x0) * h + yy] = row[x];
                        }
                    }
                    _ => {
                        for x in xs {
                            let d = ((x - x0) * h + yy) * c;
                            out[d..d + c].copy_from_slice(&row[x * c..x * c + c]);
                        }
                    }
                }
            }
        }
    }
}

#[inline(always)]
fn horizontal_impl(
    src: ImageRef<'_>,
    y0: usize,
    y1: usize,
    wt: &Weights,
    out_w: usize,
    out: &mut Vec<u8>,
) {
    out.resize((y1 - y0) * out_w * src.c, 0);
    if let Some(fixed) = &wt.fixed {
        macro_rules! fixed_pass {
            ($k:literal, $c:literal) => {{
                for (orow, y) in out.chunks_exact_mut(out_w * $c).zip(y0..y1) {
                    let row = src.row(y);
                    for ((o, &(start, _)), k) in orow
                        .chunks_exact_mut($c)
                        .zip(fixed)
                        .zip(wt.k.chunks_exact($k))
                    {
                        window::<$k, $c>(&row[start * $c..], k, o);
                    }
                }
                return;
            }};
        }
        match (wt.ksize, src.c) {
            (3, 3) => fixed_pass!(3, 3),
            (5, 3) => fixed_pass!(5, 3),
            (7, 3) => fixed_pass!(7, 3),
            (9, 3) => fixed_pass!(9, 3),
            (3, 1) => fixed_pass!(3, 1),
            (5, 1) => fixed_pass!(5, 1),
            (7, 1) => fixed_pass!(7, 1),
            (9, 1) => fixed_pass!(9, 1),
            _ => {}
        }
    }
    let c = src.c;
    for (oy, y) in (y0..y1).enumerate() {
        let row = src.row(y);
        let orow = &mut out[oy * out_w * c..(oy + 1) * out_w * c];
        for (xx, &(xmin, n)) in wt.bounds.iter().enumerate() {
            let k = &wt.k[xx * wt.ksize..xx * wt.ksize + n];
            let px = &row[xmin * c..(xmin + n) * c];
            let o = &mut orow[xx * c..(xx + 1) * c];
            match c {
                3 => {
                    // Four lanes (the fourth idle) so that one vector multiply-add
                    // serves a pixel.
                    let mut acc = [HALF; 4];
                    for (p, &w) in px.chunks_exact(3).zip(k) {
                        let v = [p[0] as i32, p[1] as i32, p[2] as i32, 0];
                        for l in 0..4 {
                            acc[l] += v[l] * w;
                        }
                    }
                    o[0] = clip8(acc[0]);
                    o[1] = clip8(acc[1]);
                    o[2] = clip8(acc[2]);
                }
                1 => {
                    let mut a = HALF;
                    for (&p, &w) in px.iter().zip(k) {
                        a += p as i32 * w;
                    }
                    o[0] = clip8(a);
                }
                _ => {
                    let mut acc = [HALF; 4];
                    for (p, &w) in px.chunks_exact(c).zip(k) {
                        for ch in 0..c {
                            acc[ch] += p[ch] as i32 * w;
                        }
                    }
                    for ch in 0..c {
                        o[ch] = clip8(acc[ch]);
                    }
                }
            }
        }
    }
}

/// Vertical pass: `src` rows are already offset so that bounds index into them.
#[inline(always)]
fn vertical_impl(src: ImageRef<'_>, wt: &Weights, out_h: usize, out: &mut Vec<u8>) {
    let stride = src.w * src.c;
    out.resize(out_h * stride, 0);
    let mut acc = vec![0i32; stride];
    for (yy, &(ymin, n)) in wt.bounds.iter().enumerate() {
        sum_rows(&mut acc, src, ymin, &wt.k[yy * wt.ksize..yy * wt.ksize + n]);
        for (o, &a) in out[yy * stride..(yy + 1) * stride].iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
}

/// The vertical pass of a fused resize + `ToTensor`: each output sample, rounded to u8
/// exactly as [`vertical_impl`] does, is written as its channel's table entry (`N`
/// bytes) into `[C, H, W]` planes or `[H, W, C]` pixels. Output row `yy` uses
/// `wt.bounds[yy]`, so reversed weights flip the image vertically.
#[inline(always)]
fn vertical_lut_impl<const N: usize>(
    src: ImageRef<'_>,
    wt: &Weights,
    lut: &[[[u8; N]; 256]],
    layout: Layout,
    out: &mut [MaybeUninit<u8>],
) {
    let (w, c) = (src.w, src.c);
    let stride = w * c;
    let out_h = wt.bounds.len();
    let plane = out_h * w * N;
    // Every byte of `out` is written below: each output row of each plane (or of
    // pixels), whole.
    assert_eq!(out.len(), out_h * stride * N);
    assert!(lut.len() >= c);
    let mut acc = vec![0i32; stride];
    let mut row8 = vec![0u8; stride];
    for (yy, &(ymin, n)) in wt.bounds.iter().enumerate() {
        sum_rows(&mut acc, src, ymin, &wt.k[yy * wt.ksize..yy * wt.ksize + n]);
        // Round to u8 first (vectorised), then look up (one load and one store each).
        for (o, &a) in row8.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
        match layout {
            Layout::Chw => {
                for (ch, t) in lut.iter().enumerate().take(c) {
                    let o = &mut out[ch * plane + yy * w * N..ch * plane + (yy + 1) * w * N];
                    for (o, px) in o.chunks_exact_mut(N).zip(row8.chunks_exact(c)) {
                        put(o, &t[px[ch] as usize]);
                    }
                }
            }
            Layout::Hwc => {
                let o = &mut out[yy * stride * N..(yy + 1) * stride * N];
                for (o, px) in o.chunks_exact_mut(c * N).zip(row8.chunks_exact(c)) {
                    for ((o, &v), t) in o.chunks_exact_mut(N).zip(px).zip(lut) {
                        put(o, &t[v as usize]);
                    }
                }
            }
        }
    }
}

fn nearest(src: ImageRef<'_>, b: [f64; 4], out_w: usize, out_h: usize) -> Vec<u8> {
    let c = src.c;
    let sx = (b[2] - b[0]) / out_w as f64;
    let sy = (b[3] - b[1]) / out_h as f64;
    let xs: Vec<usize> = (0..out_w)
        .map(|x| ((b[0] + (x as f64 + 0.5) * sx).floor().max(0.0) as usize).min(src.w - 1))
        .collect();
    let mut out = Vec::with_capacity(out_w * out_h * c);
    for y in 0..out_h {
        let syy = ((b[1] + (y as f64 + 0.5) * sy).floor().max(0.0) as usize).min(src.h - 1);
        let row = src.row(syy);
        for &x in &xs {
            out.extend_from_slice(&row[x * c..(x + 1) * c]);
        }
    }
    out
}

/// Whether Pillow (13 and later) resamples box `b` to `out_w` x `out_h` with the vertical
/// pass first: when the rows shrink by more than twice as many pixels as the columns do
/// (so the horizontal pass runs over fewer rows). The box is the image resized, as in
/// torchvision's crop-then-resize. Each pass rounds and clips to u8, so the order shows
/// in the result (up to 10-14 levels with bicubic or Lanczos, 1-2 with bilinear).
fn vertical_first(b: [f64; 4], out_w: usize, out_h: usize) -> bool {
    let rows = (b[3] - b[1]) - out_h as f64;
    let cols = (b[2] - b[0]) - out_w as f64;
    rows > 0.0 && rows > 2.0 * cols
}

/// The vertical pass over every column of `src`, then the horizontal pass over its
/// `out_h` rows into `out`: Pillow's order where [`vertical_first`] holds.
fn rows_then_columns(
    src: ImageRef<'_>,
    wv: &Weights,
    wh: &Weights,
    (out_w, out_h): (usize, usize),
    out: &mut Vec<u8>,
) {
    let mut mid = Scratch::take();
    vertical(src, wv, out_h, &mut mid);
    let mid_ref = ImageRef {
        data: &mid,
        h: out_h,
        w: src.w,
        c: src.c,
    };
    horizontal(mid_ref, 0, out_h, wh, out_w, out);
}

/// Resamples box `b` of `src` to `out_w` x `out_h`.
pub(crate) fn resample(
    src: ImageRef<'_>,
    b: [f64; 4],
    out_w: usize,
    out_h: usize,
    f: Interpolation,
    antialias: bool,
) -> Vec<u8> {
    if f == Interpolation::Nearest {
        return nearest(src, b, out_w, out_h);
    }
    let need_h = out_w != src.w || b[0] != 0.0 || b[2] != src.w as f64;
    let need_v = out_h != src.h || b[1] != 0.0 || b[3] != src.h as f64;
    let mut out = Vec::new();
    match (need_h, need_v) {
        (false, false) => out = src.data.to_vec(),
        (true, false) => {
            let wh = weights(src.w, b[0], b[2], out_w, f, antialias);
            horizontal(src, 0, src.h, &wh, out_w, &mut out);
        }
        (false, true) => {
            let wv = weights(src.h, b[1], b[3], out_h, f, antialias);
            vertical(src, &wv, out_h, &mut out);
        }
        (true, true) if vertical_first(b, out_w, out_h) => {
            let wh = weights(src.w, b[0], b[2], out_w, f, antialias);
            let wv = weights(src.h, b[1], b[3], out_h, f, antialias);
            rows_then_columns(src, &wv, &wh, (out_w, out_h), &mut out);
        }
        (true, true) => {
            let wh = weights(src.w, b[0], b[2], out_w, f, antialias);
            let mut wv = weights(src.h, b[1], b[3], out_h, f, antialias);
            // Only the rows the vertical pass reads go through the horizontal pass.
            let first = wv.bounds.first().map_or(0, |b| b.0);
            let last = wv.bounds.last().map_or(0, |b| b.0 + b.1);
            for bd in &mut wv.bounds {
                bd.0 -= first;
            }
            let mut mid = Scratch::take();
            horizontal(src, first, last.max(first + 1), &wh, out_w, &mut mid);
            let mid_ref = ImageRef {
                data: &mid,
                h: last.max(first + 1) - first,
                w: out_w,
                c: src.c,
            };
            vertical(mid_ref, &wv, out_h, &mut out);
        }
    }
    out
}

/// An upper bound of the bytes [`resample`] (or [`resample_to_tensor`]) allocates to
/// resample box `b` of a `w` x `h` image of `c` channels to `out_w` x `out_h`, its output
/// included, each output sample `out_bytes` bytes (1 for u8, a `ToTensor` table's size
/// otherwise): the filter weights, the transposed tile of the horizontal pass (as RGBX),
/// the intermediate image and the passes' row accumulators, over whichever pass order is
/// the larger. A kernel charges it to the memory budget before it resamples (see
/// `stoker_pipeline::OpContext::reserve`). It is computed from sizes alone, a few
/// multiplications.
pub(crate) fn resample_bytes(
    (w, h, c): (usize, usize, usize),
    b: [f64; 4],
    (out_w, out_h): (usize, usize),
    (f, antialias): (Interpolation, bool),
    out_bytes: usize,
) -> u64 {
    let (w, h, c) = (w as u64, h as u64, c as u64);
    let (ow, oh) = (out_w as u64, out_h as u64);
    let out = ow * oh * c * out_bytes as u64;
    if f == Interpolation::Nearest {
        return out + ow * 8;
    }
    // The source columns and rows the weights read: the box, rounded out, in the image.
    let span = |lo: f64, hi: f64, n: u64| ((hi.ceil() - lo.floor()).max(1.0) as u64 + 1).min(n);
    let (sx, sy) = (span(b[0], b[2], w), span(b[1], b[3], h));
    // Weights (taps, bounds, fixed windows; a shifted copy in the horizontal pass).
    let taps = |len: f64, o: u64| {
        let scale = len / o.max(1) as f64;
        let fs = if antialias { scale.max(1.0) } else { 1.0 };
        (f.support() * fs).ceil() as u64 * 2 + 1
    };
    let weights = 2 * ow * (taps(b[2] - b[0], ow) * 4 + 32) + oh * (taps(b[3] - b[1], oh) * 4 + 32);
    // The horizontal pass over `rows` rows: the transposed tile (RGBX at most 4 bytes a
    // pixel), its accumulators, and its output.
    let horizontal = |rows: u64| sx * rows * c.max(4) + rows * c * 5 + rows * ow * c;
    // The vertical pass over `cols` columns: its accumulators (and a u8 row).
    let vertical = |cols: u64| cols * c * 5;
    let columns_first = horizontal(sy) + vertical(ow);
    let rows_first = oh * w * c + vertical(w) + horizontal(oh);
    // The u8 image a `ToTensor` output is converted from.
    let px = if out_bytes > 1 { ow * oh * c } else { 0 };
    weights + columns_first.max(rows_first) + px + out
}

/// Writes `v` into `o` (`MaybeUninit::write_copy_of_slice` needs Rust 1.93).
#[inline(always)]
fn put<const N: usize>(o: &mut [MaybeUninit<u8>], v: &[u8; N]) {
    for (o, &b) in o.iter_mut().zip(v) {
        o.write(b);
    }
}

/// What [`resample_to_tensor`] writes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Output<'a> {
    /// u8 `[H, W, C]`, as [`resample`].
    U8,
    /// Each sample through its channel's `ToTensor` table, in this layout.
    Tables(&'a Tables, Layout),
}

/// Resize, optional flip, and `ToTensor` in one kernel: the box `b` of the `size.0` x
/// `size.1` image that starts at `origin` in `src` (a decoded superset of it) is resampled
/// to `out_w` x `out_h` by the separable filter, mirrored by reversing one axis's
/// weights, and the vertical pass writes each sample through its channel's table
/// straight into the output layout (or, for [`Output::U8`], writes u8). Every sample is rounded to u8 as [`resample`]
/// rounds it, so the result is bit-identical to `resample`, then `Flip::apply`, then
/// `ToTensor::apply`, without the intermediate u8 image, the flipped copy or the
/// separate conversion pass. Not for `Nearest` (the caller runs the separate kernels).
///
/// A table output goes into `target` when it is given with the output's length (a batch
/// slot); otherwise, and always for [`Output::U8`], into a new buffer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn resample_to_tensor(
    src: ImageRef<'_>,
    origin: (usize, usize),
    size: (usize, usize),
    b: [f64; 4],
    (out_w, out_h): (usize, usize),
    (f, antialias): (Interpolation, bool),
    flip: Option<Flip>,
    output: Output<'_>,
    target: Option<Lease>,
) -> Bytes {
    debug_assert!(f != Interpolation::Nearest);
    let need_h = out_w != size.0 || b[0] != 0.0 || b[2] != size.0 as f64;
    let need_v = out_h != size.1 || b[1] != 0.0 || b[3] != size.1 as f64;
    let mut wh = if need_h {
        weights(size.0, b[0], b[2], out_w, f, antialias)
    } else {
        Weights::identity(out_w)
    };
    let mut wv = if need_v {
        weights(size.1, b[1], b[3], out_h, f, antialias)
    } else {
        Weights::identity(out_h)
    };
    wh.shift(origin.0);
    wv.shift(origin.1);
    match flip {
        Some(Flip::Horizontal) => wh.reverse(),
        Some(Flip::Vertical) => wv.reverse(),
        None => {}
    }
    if need_h && need_v && vertical_first(b, out_w, out_h) {
        // Pillow's order here: rows first (over every column of `src`), then columns into
        // u8, then the tables.
        return match output {
            Output::U8 => {
                let mut px = Vec::new();
                rows_then_columns(src, &wv, &wh, (out_w, out_h), &mut px);
                Bytes::from(px)
            }
            // The u8 image is only read by the conversion: a reused buffer.
            Output::Tables(tables, layout) => {
                let mut px = Scratch::take();
                rows_then_columns(src, &wv, &wh, (out_w, out_h), &mut px);
                let mut sink = Sink::new(target, px.len() * tables.size());
                match tables {
                    Tables::F32(lut, affine) => {
                        scatter_f32_into(&px, src.c, layout, lut, affine, sink.dst())
                    }
                    Tables::F16(lut) => scatter_into(&px, src.c, layout, lut, sink.dst()),
                }
                // SAFETY: both conversions write their output whole.
                unsafe { sink.done() }
            }
        };
    }
    // Only the rows the vertical pass reads go through the horizontal pass.
    let first = wv.bounds.iter().map(|b| b.0).min().unwrap_or(0);
    let last = wv.bounds.iter().map(|b| b.0 + b.1).max().unwrap_or(0);
    let last = last.max(first + 1);
    for bd in &mut wv.bounds {
        bd.0 -= first;
    }
    let mut mid = Scratch::take();
    horizontal(src, first, last, &wh, out_w, &mut mid);
    let mid_ref = ImageRef {
        data: &mid,
        h: last - first,
        w: out_w,
        c: src.c,
    };
    let n = out_w * out_h * src.c;
    let tables = match output {
        Output::U8 => {
            let mut out = Vec::new();
            vertical(mid_ref, &wv, out_h, &mut out);
            return Bytes::from(out);
        }
        Output::Tables(tables, layout) => (tables, layout),
    };
    let mut sink = Sink::new(target, n * tables.0.size());
    match tables {
        #[cfg(target_arch = "x86_64")]
        (Tables::F32(_, affine), Layout::Chw)
            if src.c == 3 && std::arch::is_x86_feature_detected!("avx2") =>
        {
            // SAFETY: the CPU supports AVX2, checked just above.
            unsafe {
                rgbx::vertical_chw_f32(mid_ref, &wv.bounds, (&wv.k, wv.ksize), affine, sink.dst())
            };
        }
        (Tables::F32(lut, _), layout) => vertical_f32(mid_ref, &wv, lut, layout, sink.dst()),
        (Tables::F16(lut), layout) => vertical_f16(mid_ref, &wv, lut, layout, sink.dst()),
    }
    // SAFETY: every pass writes its output whole (each asserts the length and writes
    // every row of every plane, or of pixels, whole).
    unsafe { sink.done() }
}

#[cfg(test)]
mod tests;
