//! The resampler's unit tests (the module they test: `image::resize`).

use super::super::convert::{scatter, Affine};
use super::*;

#[test]
fn the_pass_order_is_pillow_s() {
    // From 20 wide, 24 high (the box is the image resized).
    let b = [0.0, 0.0, 20.0, 24.0];
    // Rows down by 5, columns up by 10: rows first.
    assert!(vertical_first(b, 30, 19));
    // Rows down by 14, columns down by 2: rows first; by 6 and 8: columns first.
    assert!(vertical_first(b, 18, 10));
    assert!(!vertical_first(b, 12, 18));
    // Exactly twice: columns first; rows not shrinking: columns first.
    assert!(!vertical_first(b, 16, 16));
    assert!(!vertical_first(b, 10, 30));
    // A crop box counts by its own size.
    assert!(vertical_first([5.0, 2.0, 15.0, 22.0], 10, 12));
}

/// The AVX2 kernels (the RGBX transposes of the horizontal pass, the computed
/// `[C, H, W]` f32 output) against the scalar passes, byte for byte: fractional
/// boxes, up- and downscales, flips (reversed weights), every filter, and widths that
/// are and are not multiples of 8.
#[test]
fn the_simd_passes_match_the_scalar_ones() {
    let mut seed = 7u64;
    let mut rnd = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize
    };
    let affine = Affine {
        scale: true,
        mean: vec![0.485, 0.456, 0.406],
        std: vec![0.229, 0.224, 0.225],
    };
    for case in 0..60 {
        let (h, w) = (9 + rnd() % 70, 9 + rnd() % 70);
        let data: Vec<u8> = (0..h * w * 3).map(|_| rnd() as u8).collect();
        let src = ImageRef {
            data: &data,
            h,
            w,
            c: 3,
        };
        let f = [
            Interpolation::Bilinear,
            Interpolation::Bicubic,
            Interpolation::Lanczos,
            Interpolation::Box,
        ][case % 4];
        let (out_w, out_h) = (1 + rnd() % 60, 1 + rnd() % 60);
        let x0 = (rnd() % (w / 3)) as f64 + 0.25;
        let x1 = w as f64 - (rnd() % (w / 3)) as f64 - 0.5;
        let mut wh = weights(w, x0, x1, out_w, f, true);
        if case % 3 == 0 {
            wh.reverse();
        }
        let y0 = rnd() % 4;
        let mut simd = Vec::new();
        horizontal(src, y0, h, &wh, out_w, &mut simd);
        let mut scalar = Vec::new();
        horizontal_impl(src, y0, h, &wh, out_w, &mut scalar);
        assert_eq!(
            simd, scalar,
            "horizontal, case {case}: {h}x{w} -> {out_w}, {f:?}"
        );

        let mut wv = weights(h, 0.5, h as f64 - 0.75, out_h, f, true);
        if case % 3 == 1 {
            wv.reverse();
        }
        let tables = f32_tables(&affine);
        let n = out_h * w * 3 * 4;
        let mut a = vec![MaybeUninit::new(0u8); n];
        let mut b = vec![MaybeUninit::new(0u8); n];
        vertical_lut_impl::<4>(src, &wv, &tables, Layout::Chw, &mut a);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is there (checked just above).
            unsafe { rgbx::vertical_chw_f32(src, &wv.bounds, (&wv.k, wv.ksize), &affine, &mut b) };
            // SAFETY: both buffers were initialised.
            let (a, b) = unsafe {
                (
                    std::slice::from_raw_parts(a.as_ptr() as *const u8, n),
                    std::slice::from_raw_parts(b.as_ptr() as *const u8, n),
                )
            };
            assert_eq!(a, b, "vertical, case {case}: {h}x{w} -> {out_h}, {f:?}");
            // The table conversion of a whole image (the rows-first path's).
            let unscaled = Affine {
                scale: case % 2 == 0,
                ..affine.clone()
            };
            let simd = super::super::convert::scatter_f32(
                &data,
                3,
                Layout::Chw,
                &f32_tables(&unscaled),
                &unscaled,
            );
            assert_eq!(
                simd,
                scatter(&data, 3, Layout::Chw, &f32_tables(&unscaled)),
                "scatter, case {case}: {h}x{w}"
            );
        }
    }
}

/// The f32 tables of `affine`, as `ToTensor` builds them.
fn f32_tables(affine: &Affine) -> Vec<[[u8; 4]; 256]> {
    (0..3)
        .map(|ch| std::array::from_fn(|v| affine.apply(ch, v as u8).to_le_bytes()))
        .collect()
}

fn img(h: usize, w: usize, c: usize, f: impl Fn(usize, usize, usize) -> u8) -> Vec<u8> {
    let mut v = Vec::new();
    for y in 0..h {
        for x in 0..w {
            for ch in 0..c {
                v.push(f(y, x, ch));
            }
        }
    }
    v
}

#[test]
fn constant_images_stay_constant() {
    for f in [
        Interpolation::Bilinear,
        Interpolation::Bicubic,
        Interpolation::Lanczos,
        Interpolation::Box,
        Interpolation::Nearest,
    ] {
        let d = img(13, 17, 3, |_, _, _| 77);
        let src = ImageRef {
            data: &d,
            h: 13,
            w: 17,
            c: 3,
        };
        for (ow, oh) in [(5, 4), (40, 31), (17, 13), (1, 1)] {
            let o = resample(src, [0.0, 0.0, 17.0, 13.0], ow, oh, f, true);
            assert_eq!(o.len(), ow * oh * 3);
            assert!(o.iter().all(|&v| v == 77), "{f:?} {ow}x{oh}");
        }
    }
}

#[test]
fn weights_sum_to_one_and_stay_in_bounds() {
    for (n, out) in [(100, 7), (7, 100), (224, 224), (3, 1)] {
        let w = weights(n, 0.0, n as f64, out, Interpolation::Bicubic, true);
        for (i, &(xmin, len)) in w.bounds.iter().enumerate() {
            assert!(xmin + len <= n);
            let s: i64 = w.k[i * w.ksize..i * w.ksize + len]
                .iter()
                .map(|&v| v as i64)
                .sum();
            assert!((s - (1 << PRECISION_BITS)).abs() <= len as i64, "{s}");
        }
    }
}

#[test]
fn halving_averages_pairs_with_box() {
    let d = img(2, 4, 1, |_, x, _| [0, 100, 50, 51][x]);
    let src = ImageRef {
        data: &d,
        h: 2,
        w: 4,
        c: 1,
    };
    let o = resample(src, [0.0, 0.0, 4.0, 2.0], 2, 2, Interpolation::Box, true);
    assert_eq!(o, vec![50, 51, 50, 51]);
}
