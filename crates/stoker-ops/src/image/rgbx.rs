//! AVX2 kernels for 3-channel images (x86-64 only; the callers check for AVX2 at run
//! time and fall back to the scalar passes).
//!
//! **Transposes of the horizontal pass.**
//! The horizontal filter runs as a vertical one over a transposed tile (see
//! `resize::horizontal`). With 3-byte pixels both transposes were scalar 3-byte moves,
//! about a third of the resampling time of a fused crop on ImageNet-sized files. Here
//! the tile holds 4-byte pixels (RGB and a zero), so that 8 x 8 blocks of pixels
//! transpose in registers as 32-bit lanes: RGB is widened to RGBX on the way in, the
//! filter runs over four lanes per pixel (the fourth is ignored), and the result is
//! transposed back and narrowed to RGB. The sums, their order and the rounding are the
//! scalar path's, so the bytes are the same.
//!
//! **`ToTensor` into f32 `[C, H, W]` planes.** The interleaved samples are split into
//! planes in registers and `ToTensor`'s arithmetic (the operations its tables are built
//! with, so the same bits) is computed 8 samples at a time, in the fused vertical pass and
//! for a whole u8 image.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::convert::Affine;
use super::resize::{clip8, sum_rows};
use super::ImageRef;

/// Source columns `x0..x1` of rows `y0..y1` of an RGB image, transposed: `x1 - x0` rows
/// of `y1 - y0` RGBX pixels (the fourth byte zero) in `out`.
#[target_feature(enable = "avx2")]
pub(super) fn transpose_rgb_to_rgbx(
    src: ImageRef<'_>,
    (y0, y1): (usize, usize),
    (x0, x1): (usize, usize),
    out: &mut Vec<u8>,
) {
    let (w, h, n) = (src.w, y1 - y0, x1 - x0);
    assert!(src.c == 3 && y0 <= y1 && y1 <= src.h && x0 <= x1 && x1 <= w);
    assert!(src.data.len() >= src.h * w * 3);
    // Every byte is written below (whole blocks, then the edges).
    out.resize(n * h * 4, 0);
    let (sp, dp, len) = (src.data.as_ptr(), out.as_mut_ptr(), src.data.len());
    // One pixel, scalar.
    let one = |y: usize, x: usize| {
        let s = (y * w + x) * 3;
        let d = ((x - x0) * h + (y - y0)) * 4;
        // SAFETY: y < src.h and x < w: the pixel is inside `src.data`; x - x0 < n and
        // y - y0 < h: the 4 bytes at `d` are inside `out` (n * h * 4 bytes).
        unsafe {
            let p = [*sp.add(s), *sp.add(s + 1), *sp.add(s + 2), 0];
            std::ptr::copy_nonoverlapping(p.as_ptr(), dp.add(d), 4);
        }
    };
    let widen_perm = _mm256_setr_epi32(0, 1, 2, 3, 3, 4, 5, 6);
    let widen_shuf = _mm256_setr_epi8(
        0, 1, 2, -128, 3, 4, 5, -128, 6, 7, 8, -128, 9, 10, 11, -128, 0, 1, 2, -128, 3, 4, 5, -128,
        6, 7, 8, -128, 9, 10, 11, -128,
    );
    let (yb, xb) = (y0 + h / 8 * 8, x0 + n / 8 * 8);
    for y in (y0..yb).step_by(8) {
        for x in (x0..xb).step_by(8) {
            // Each row's 8 pixels are read as 32 bytes: the last 8 must be in the buffer.
            if ((y + 7) * w + x) * 3 + 32 > len {
                for yy in y..y + 8 {
                    for xx in x..x + 8 {
                        one(yy, xx);
                    }
                }
                continue;
            }
            let mut r = [_mm256_setzero_si256(); 8];
            for (i, r) in r.iter_mut().enumerate() {
                // SAFETY: the 32 bytes from pixel (y + i, x) are inside `src.data`
                // (checked above for the last of the 8 rows).
                let v =
                    unsafe { _mm256_loadu_si256(sp.add(((y + i) * w + x) * 3) as *const __m256i) };
                *r = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(v, widen_perm), widen_shuf);
            }
            let c = transpose8(r);
            for (j, c) in c.iter().enumerate() {
                // SAFETY: column x + j < x1 holds rows y..y + 8 < y1 at
                // ((x + j - x0) * h + y - y0) * 4, 32 bytes inside `out`.
                unsafe {
                    _mm256_storeu_si256(
                        dp.add(((x + j - x0) * h + (y - y0)) * 4) as *mut __m256i,
                        *c,
                    )
                };
            }
        }
        for yy in y..y + 8 {
            for xx in xb..x1 {
                one(yy, xx);
            }
        }
    }
    for yy in yb..y1 {
        for xx in x0..x1 {
            one(yy, xx);
        }
    }
}

/// The horizontal filter as a vertical one over the transposed RGBX tile `t` (one row
/// per source column, `t.w` pixels each; `bounds` and `k` index its rows), written as RGB
/// into `out`: `t.w` rows of `out_w` pixels. Output columns are computed 8 at a time and
/// transposed back in registers.
#[target_feature(enable = "avx2")]
pub(super) fn columns_rgbx_to_rgb(
    t: ImageRef<'_>,
    bounds: &[(usize, usize)],
    (k, ksize): (&[i32], usize),
    out_w: usize,
    out: &mut Vec<u8>,
) {
    let rows = t.w;
    let stride = rows * 4;
    assert!(t.c == 4 && bounds.len() == out_w && t.data.len() >= t.h * stride);
    // Every byte is written below.
    out.resize(rows * out_w * 3, 0);
    let mut acc = vec![0i32; stride];
    let mut cols = vec![0u8; 8 * stride];
    let filter = |xx: usize, acc: &mut [i32], col: &mut [u8]| {
        let (xmin, n) = bounds[xx];
        sum_rows(acc, t, xmin, &k[xx * ksize..xx * ksize + n]);
        for (o, &a) in col.iter_mut().zip(acc.iter()) {
            *o = clip8(a);
        }
    };
    let narrow_shuf = _mm256_setr_epi8(
        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -128, -128, -128, -128, 0, 1, 2, 4, 5, 6, 8, 9, 10,
        12, 13, 14, -128, -128, -128, -128,
    );
    let narrow_perm = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7);
    let dp = out.as_mut_ptr();
    let rb = rows / 8 * 8;
    let xb = out_w / 8 * 8;
    for g in (0..xb).step_by(8) {
        for j in 0..8 {
            filter(g + j, &mut acc, &mut cols[j * stride..(j + 1) * stride]);
        }
        let cp = cols.as_ptr();
        for r0 in (0..rb).step_by(8) {
            let mut v = [_mm256_setzero_si256(); 8];
            for (j, v) in v.iter_mut().enumerate() {
                // SAFETY: rows r0..r0 + 8 <= rows of column j: 32 bytes inside `cols`.
                *v = unsafe { _mm256_loadu_si256(cp.add(j * stride + r0 * 4) as *const __m256i) };
            }
            let px = transpose8(v);
            for (i, p) in px.iter().enumerate() {
                let p =
                    _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(*p, narrow_shuf), narrow_perm);
                // SAFETY: row r0 + i < rows, pixels g..g + 8 <= out_w: the 24 bytes at
                // ((r0 + i) * out_w + g) * 3 are inside `out` (rows * out_w * 3 bytes).
                unsafe {
                    let d = dp.add(((r0 + i) * out_w + g) * 3);
                    _mm_storeu_si128(d as *mut __m128i, _mm256_castsi256_si128(p));
                    _mm_storel_epi64(d.add(16) as *mut __m128i, _mm256_extracti128_si256::<1>(p));
                }
            }
        }
        for j in 0..8 {
            let col = &cols[j * stride..(j + 1) * stride];
            for r in rb..rows {
                let d = (r * out_w + g + j) * 3;
                out[d..d + 3].copy_from_slice(&col[r * 4..r * 4 + 3]);
            }
        }
    }
    for xx in xb..out_w {
        let col = &mut cols[..stride];
        filter(xx, &mut acc, col);
        for r in 0..rows {
            let d = (r * out_w + xx) * 3;
            out[d..d + 3].copy_from_slice(&col[r * 4..r * 4 + 3]);
        }
    }
}

/// The vertical pass of a fused resize + `ToTensor` for 3 channels, f32 `[C, H, W]`: as
/// `resize::vertical_lut_impl`, each sample is rounded to u8 as the u8 pass rounds it,
/// then computed by `affine` (the arithmetic its table was built with) rather than looked
/// up, 8 pixels at a time: the interleaved sums are split into planes in registers.
#[target_feature(enable = "avx2")]
pub(super) fn vertical_chw_f32(
    src: ImageRef<'_>,
    bounds: &[(usize, usize)],
    (k, ksize): (&[i32], usize),
    affine: &Affine,
    out: &mut [MaybeUninit<u8>],
) {
    let w = src.w;
    let stride = w * 3;
    let out_h = bounds.len();
    let plane = out_h * w;
    assert!(src.c == 3 && affine.mean.len() >= 3 && affine.std.len() >= 3);
    // Every byte of `out` is written below: each row of each plane, whole.
    assert_eq!(out.len(), 3 * plane * 4);
    let op = out.as_mut_ptr() as *mut f32;
    let mut acc = vec![0i32; stride];
    let (zero, max) = (_mm256_setzero_si256(), _mm256_set1_epi32(255));
    let planes = Planes::new(affine);
    let xb = w / 8 * 8;
    for (yy, &(ymin, n)) in bounds.iter().enumerate() {
        sum_rows(&mut acc, src, ymin, &k[yy * ksize..yy * ksize + n]);
        let ap = acc.as_ptr();
        for x in (0..xb).step_by(8) {
            let v: [__m256i; 3] = std::array::from_fn(|i| {
                // SAFETY: pixels x..x + 8 <= w: the 24 sums from x * 3 are inside `acc`.
                let a = unsafe { _mm256_loadu_si256(ap.add(x * 3 + i * 8) as *const __m256i) };
                // clip8: the arithmetic shift, clamped to 0..=255.
                _mm256_min_epi32(_mm256_max_epi32(_mm256_srai_epi32::<22>(a), zero), max)
            });
            // SAFETY: plane ch, row yy < out_h, pixels x..x + 8 <= w: inside `out` (3 *
            // plane f32s) for every ch.
            unsafe { planes.store(v, affine, op.add(yy * w + x), plane) };
        }
        for x in xb..w {
            for ch in 0..3 {
                let v = clip8(acc[x * 3 + ch]);
                // SAFETY: as above, for one pixel.
                unsafe {
                    op.add(ch * plane + yy * w + x)
                        .write_unaligned(affine.apply(ch, v))
                };
            }
        }
    }
}

/// `ToTensor` of a 3-channel u8 image into f32 `[C, H, W]` planes, written whole into
/// `out`: `convert::scatter_into` with `affine` computed 8 pixels at a time (the same bits as
/// its table).
#[target_feature(enable = "avx2")]
pub(super) fn scatter_chw_f32(px: &[u8], affine: &Affine, out: &mut [MaybeUninit<u8>]) {
    assert!(px.len().is_multiple_of(3) && affine.mean.len() >= 3 && affine.std.len() >= 3);
    let n = px.len() / 3;
    // Every byte of `out` is written below: 3 planes of n f32s.
    assert_eq!(out.len(), n * 3 * 4);
    let op = out.as_mut_ptr() as *mut f32;
    let planes = Planes::new(affine);
    let sp = px.as_ptr();
    let nb = n / 8 * 8;
    for i in (0..nb).step_by(8) {
        let v: [__m256i; 3] = std::array::from_fn(|j| {
            // SAFETY: pixels i..i + 8 <= n: the 24 bytes from i * 3 are inside `px`.
            _mm256_cvtepu8_epi32(unsafe {
                _mm_loadl_epi64(sp.add(i * 3 + j * 8) as *const __m128i)
            })
        });
        // SAFETY: samples i..i + 8 of each of the 3 planes of n are inside `out` (3 * n
        // f32s).
        unsafe { planes.store(v, affine, op.add(i), n) };
    }
    for i in nb..n {
        for ch in 0..3 {
            // SAFETY: as above, for one sample.
            unsafe {
                op.add(ch * n + i)
                    .write_unaligned(affine.apply(ch, px[i * 3 + ch]))
            };
        }
    }
}

/// Splits 8 interleaved RGB pixels (24 values in 0..=255, as i32) into planes and writes
/// each channel's 8 outputs of `affine`.
struct Planes {
    perm: [__m256i; 3],
    mean: [__m256; 3],
    std: [__m256; 3],
    d255: __m256,
}

impl Planes {
    #[target_feature(enable = "avx2")]
    fn new(affine: &Affine) -> Planes {
        Planes {
            perm: [
                _mm256_setr_epi32(0, 3, 6, 1, 4, 7, 2, 5),
                _mm256_setr_epi32(1, 4, 7, 2, 5, 0, 3, 6),
                _mm256_setr_epi32(2, 5, 0, 3, 6, 1, 4, 7),
            ],
            mean: std::array::from_fn(|ch| _mm256_set1_ps(affine.mean[ch])),
            std: std::array::from_fn(|ch| _mm256_set1_ps(affine.std[ch])),
            d255: _mm256_set1_ps(255.0),
        }
    }

    /// Writes channel `ch` of the 8 pixels in `v` at `dst + ch * plane`.
    ///
    /// # Safety
    /// The 8 f32s at `dst.add(ch * plane)` must be writable for each of the 3 channels.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn store(&self, v: [__m256i; 3], affine: &Affine, dst: *mut f32, plane: usize) {
        // Lanes of each channel: R at 0, 3, 6 of v[0], 1, 4, 7 of v[1], 2, 5 of v[2]; G
        // and B shifted by one and two; the permutes put the pixels in order.
        let split = [
            _mm256_blend_epi32::<0b0010_0100>(_mm256_blend_epi32::<0b1001_0010>(v[0], v[1]), v[2]),
            _mm256_blend_epi32::<0b0100_1001>(_mm256_blend_epi32::<0b0010_0100>(v[0], v[1]), v[2]),
            _mm256_blend_epi32::<0b1001_0010>(_mm256_blend_epi32::<0b0100_1001>(v[0], v[1]), v[2]),
        ];
        for (ch, s) in split.into_iter().enumerate() {
            let mut f = _mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(s, self.perm[ch]));
            if affine.scale {
                f = _mm256_div_ps(f, self.d255);
            }
            f = _mm256_div_ps(_mm256_sub_ps(f, self.mean[ch]), self.std[ch]);
            // SAFETY: the caller's contract.
            unsafe { _mm256_storeu_ps(dst.add(ch * plane), f) };
        }
    }
}

/// Transposes 8 x 8 32-bit lanes: lane `j` of input `i` becomes lane `i` of output `j`.
#[target_feature(enable = "avx2")]
#[inline]
fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(h: usize, w: usize) -> Vec<u8> {
        (0..h * w * 3).map(|i| (i * 7 + i / 5) as u8).collect()
    }

    #[test]
    fn the_transpose_widens_every_pixel() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        // Sizes with and without whole blocks, and a window that ends at the buffer's end
        // (the 32-byte reads must fall back there).
        for &(h, w, y0, y1, x0, x1) in &[
            (16, 16, 0, 16, 0, 16),
            (19, 21, 0, 19, 0, 21),
            (40, 37, 3, 40, 5, 37),
            (9, 9, 1, 9, 1, 9),
            (64, 33, 10, 50, 0, 31),
        ] {
            let data = img(h, w);
            let src = ImageRef {
                data: &data,
                h,
                w,
                c: 3,
            };
            let mut out = vec![0xAA; 3];
            // SAFETY: AVX2 is there (checked above).
            unsafe { transpose_rgb_to_rgbx(src, (y0, y1), (x0, x1), &mut out) };
            let rows = y1 - y0;
            assert_eq!(out.len(), (x1 - x0) * rows * 4);
            for x in x0..x1 {
                for y in y0..y1 {
                    let s = (y * w + x) * 3;
                    let d = ((x - x0) * rows + (y - y0)) * 4;
                    assert_eq!(
                        &out[d..d + 4],
                        &[data[s], data[s + 1], data[s + 2], 0],
                        "pixel ({y}, {x}) of {h}x{w}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_columns_pass_transposes_back() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        // One tap of weight 1 per output column, reading column `perm[xx]`: the output is
        // the transposed tile's columns, permuted, narrowed to RGB.
        for &(cols_in, rows, out_w) in &[(20, 16, 16), (13, 19, 11), (40, 9, 27)] {
            let t: Vec<u8> = (0..cols_in * rows * 4)
                .map(|i| (i * 13 + 1) as u8)
                .collect();
            let tref = ImageRef {
                data: &t,
                h: cols_in,
                w: rows,
                c: 4,
            };
            let perm: Vec<usize> = (0..out_w).map(|xx| (xx * 7 + 3) % cols_in).collect();
            let bounds: Vec<(usize, usize)> = perm.iter().map(|&p| (p, 1)).collect();
            let k = vec![1i32 << 22; out_w];
            let mut out = Vec::new();
            // SAFETY: AVX2 is there (checked above).
            unsafe { columns_rgbx_to_rgb(tref, &bounds, (&k, 1), out_w, &mut out) };
            for r in 0..rows {
                for (xx, &p) in perm.iter().enumerate() {
                    let s = (p * rows + r) * 4;
                    let d = (r * out_w + xx) * 3;
                    assert_eq!(&out[d..d + 3], &t[s..s + 3], "row {r} column {xx}");
                }
            }
        }
    }
}
