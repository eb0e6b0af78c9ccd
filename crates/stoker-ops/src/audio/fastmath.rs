//! `f32` trigonometry for the phase vocoder without libm calls: each function works in
//! `f64` with series far more accurate than `f32` needs (errors below 1e-11), so its result
//! is `f32`'s correctly rounded value but for the rare input within that error of a
//! rounding boundary, where it may be one unit in the last place from libm's (which is not
//! correctly rounded everywhere either). Inputs outside the fast paths (not finite, very
//! large, both zero) go to libm. Inlined and branch-light, they are several times faster
//! than the calls they replace (`atan2f`, `hypotf`, `sinf` + `cosf`, `roundevenf`).

use std::f64::consts::{FRAC_2_PI, FRAC_PI_2, FRAC_PI_4, PI};

/// `tan(pi / 8)`: above it, `atan(t) = pi / 4 + atan((t - 1) / (t + 1))`.
const TAN_PI_8: f64 = 0.414_213_562_373_095_03;

/// `atan(u)` for `|u| <= tan(pi / 8)`: the Taylor series `u - u^3/3 + u^5/5 - ...` to
/// `u^23` (the next term is below 1e-11 there), by Horner's rule in `u^2`.
#[inline(always)]
pub(crate) fn atan_small(u: f64) -> f64 {
    const A: [f64; 12] = {
        let mut a = [0.0; 12];
        let mut k = 0;
        while k < 12 {
            let c = 1.0 / (2 * k + 1) as f64;
            a[k] = if k % 2 == 0 { c } else { -c };
            k += 1;
        }
        a
    };
    let z = u * u;
    let mut p = A[11];
    for &c in A[..11].iter().rev() {
        p = c + z * p;
    }
    u * p
}

/// `y.atan2(x)` (see the module documentation).
#[inline(always)]
pub(crate) fn atan2(y: f32, x: f32) -> f32 {
    if !(x.is_finite() && y.is_finite()) || (x == 0.0 && y == 0.0) {
        return y.atan2(x);
    }
    let (ax, ay) = ((x as f64).abs(), (y as f64).abs());
    let swap = ay > ax;
    let t = if swap { ax / ay } else { ay / ax };
    let a = if t > TAN_PI_8 {
        FRAC_PI_4 + atan_small((t - 1.0) / (t + 1.0))
    } else {
        atan_small(t)
    };
    let a = if swap { FRAC_PI_2 - a } else { a };
    let a = if x.is_sign_negative() { PI - a } else { a };
    (a as f32).copysign(y)
}

/// `x.hypot(y)`: `f64` holds the sum of the squares exactly, so its square root rounded to
/// `f32` is the correctly rounded result (as glibc's `hypotf` computes it).
#[inline(always)]
pub(crate) fn hypot(x: f32, y: f32) -> f32 {
    let (x, y) = (x as f64, y as f64);
    (x * x + y * y).sqrt() as f32
}

/// Rounds to the nearest integer, ties to even, for `|v| < 2^51` (adding and removing
/// `1.5 * 2^52` leaves no fraction bits), else as `round_ties_even`.
#[inline(always)]
pub(crate) fn round_even_f64(v: f64) -> f64 {
    const M: f64 = 6_755_399_441_055_744.0;
    if v.abs() < (1u64 << 51) as f64 {
        (v + M) - M
    } else {
        v.round_ties_even()
    }
}

/// Rounds to the nearest integer, ties to even (as `f32::round_ties_even`).
#[inline(always)]
pub(crate) fn round_even_f32(v: f32) -> f32 {
    const M: f32 = 12_582_912.0; // 1.5 * 2^23
    if v.abs() < (1u32 << 22) as f32 {
        (v + M) - M
    } else {
        v.round_ties_even()
    }
}

/// `pi / 2` in two parts: the first has 33 significant bits, so `n * PIO2_HI` is exact for
/// `|n| < 2^20`.
const PIO2_HI: f64 = f64::from_bits(0x3FF9_21FB_5440_0000);
const PIO2_LO: f64 = f64::from_bits(0x3DD0_B461_1A62_6331);

/// `round_even_f64` for `|v| < 2^51`, without its branch.
#[inline(always)]
pub(crate) fn round_magic_f64(v: f64) -> f64 {
    const M: f64 = 6_755_399_441_055_744.0;
    (v + M) - M
}

/// Sine and cosine of `x - n pi / 2` (`n` the nearest integer to `x 2 / pi`, `|x| < 1e6`):
/// the reduction, then the Taylor series of both on `[-pi/4, pi/4]`.
#[inline(always)]
pub(crate) fn sin_cos_reduced(x: f64, n: f64) -> (f64, f64) {
    let r = (x - n * PIO2_HI) - n * PIO2_LO;
    let z = r * r;
    let s = r + r
        * z
        * (-1.0 / 6.0
            + z * (1.0 / 120.0
                + z * (-1.0 / 5040.0
                    + z * (1.0 / 362_880.0
                        + z * (-1.0 / 39_916_800.0 + z * (1.0 / 6_227_020_800.0))))));
    let c = 1.0
        + z * (-0.5
            + z * (1.0 / 24.0
                + z * (-1.0 / 720.0
                    + z * (1.0 / 40_320.0
                        + z * (-1.0 / 3_628_800.0
                            + z * (1.0 / 479_001_600.0 + z * (-1.0 / 87_178_291_200.0)))))));
    (s, c)
}

/// `x.sin_cos()` (see the module documentation): reduced by multiples of `pi / 2` (exact
/// for `|x| < 1e6`), then the Taylor series of both on `[-pi/4, pi/4]`.
#[inline(always)]
pub(crate) fn sin_cos(x: f32) -> (f32, f32) {
    if x.is_nan() || x.abs() >= 1.0e6 {
        return x.sin_cos();
    }
    let x = x as f64;
    let n = round_even_f64(x * FRAC_2_PI);
    let (s, c) = sin_cos_reduced(x, n);
    let (s, c) = match (n as i64) & 3 {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    };
    (s as f32, c as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place between two f32s of one sign (0 when equal).
    fn ulps(a: f32, b: f32) -> u32 {
        if a == b {
            return 0;
        }
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    fn values() -> impl Iterator<Item = f32> {
        // A fixed spread of magnitudes and signs, and the special values.
        let mut v = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::MIN_POSITIVE,
            1e-40,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        let mut s = 0x1234_5678_u32;
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let e = (s % 40) as i32 - 20;
            let m = (s >> 8) as f32 / (1u32 << 24) as f32;
            let x = m * 2f32.powi(e);
            v.push(if s & 1 == 0 { x } else { -x });
        }
        v.into_iter()
    }

    #[test]
    fn atan2_is_correctly_rounded_and_within_one_ulp_of_libm() {
        let vals: Vec<f32> = values().collect();
        let (mut n, mut off) = (0, 0);
        for (i, &y) in vals.iter().enumerate() {
            for &x in vals.iter().skip(i % 97).step_by(97) {
                let (a, b) = (atan2(y, x), y.atan2(x));
                if a.is_nan() || b.is_nan() {
                    assert!(a.is_nan() && b.is_nan(), "atan2({y}, {x}): {a} vs {b}");
                    continue;
                }
                assert_eq!(
                    a.is_sign_negative(),
                    b.is_sign_negative(),
                    "atan2({y}, {x})"
                );
                // glibc's atan2f is often one ulp off; f64's atan2 rounded is (nearly
                // always) the correctly rounded result.
                assert!(ulps(a, b) <= 1, "atan2({y}, {x}) = {a}, libm {b}");
                let exact = (y as f64).atan2(x as f64) as f32;
                n += 1;
                off += (ulps(a, exact) > 0) as usize;
            }
        }
        assert!(off * 100_000 < n, "{off} of {n} not correctly rounded");
    }

    #[test]
    fn hypot_and_rounding_are_exact() {
        let vals: Vec<f32> = values().filter(|v| v.is_finite()).collect();
        for w in vals.windows(2) {
            let (x, y) = (w[0], w[1]);
            assert_eq!(
                hypot(x, y).to_bits(),
                x.hypot(y).to_bits(),
                "hypot({x}, {y})"
            );
            let v = x * 1e3;
            assert_eq!(round_even_f32(v), v.round_ties_even(), "{v}");
            assert_eq!(
                round_even_f64(v as f64),
                (v as f64).round_ties_even(),
                "{v}"
            );
        }
        for v in [0.5f32, 1.5, 2.5, -0.5, -2.5, 4194303.5, 8388609.0, 1e30] {
            assert_eq!(round_even_f32(v), v.round_ties_even(), "{v}");
            assert_eq!(round_even_f64(v as f64), (v as f64).round_ties_even());
        }
    }

    #[test]
    fn sin_cos_is_correctly_rounded_and_within_one_ulp_of_libm() {
        let (mut n, mut off) = (0, 0);
        for x in values().chain((0..200_000).map(|i| i as f32 * 4.999)) {
            let ((s, c), (s0, c0)) = (sin_cos(x), x.sin_cos());
            if s0.is_nan() {
                assert!(s.is_nan() && c.is_nan(), "{x}");
                continue;
            }
            let (s1, c1) = (x as f64).sin_cos();
            for (a, b, exact) in [(s, s0, s1 as f32), (c, c0, c1 as f32)] {
                n += 1;
                assert!(ulps(a, b) <= 1, "sin_cos({x}): {a}, libm {b}");
                off += (ulps(a, exact) > 0) as usize;
            }
        }
        assert!(off * 100_000 < n, "{off} of {n} not correctly rounded");
    }
}
