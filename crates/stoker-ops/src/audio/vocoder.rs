//! The phase vocoder's inner loops ([`TimeStretch`]), written twice with the same
//! arithmetic: [`rows_scalar`], one bin at a time with branches (the reference, and the
//! path for inputs the fast one does not take), and [`rows`], split into passes the
//! compiler vectorises (angle and magnitude of every input frame; each output frame's
//! phase step and magnitude; the phase accumulation, the one sequential pass; sine and
//! cosine of every output phase), compiled for AVX2 too and picked at run time. The
//! branches become selects: every lane computes both sides and keeps the one the scalar
//! code would take, so the two give the same bits (tested). Inputs the scalar helpers send
//! to libm (a non-finite or all-zero bin, a phase of a million radians or more) are
//! redone by them after the vector pass.
//!
//! [`TimeStretch`]: super::TimeStretch

use std::f64::consts::{FRAC_2_PI, FRAC_PI_2, FRAC_PI_4, PI};

use super::fastmath;

/// `2 pi` in `f32`, as the scalar code and torchaudio use it.
const TWO_PI: f32 = (2.0 * PI) as f32;

/// What a stretch of `[.., F, T, 2]` rows to `t_out` frames needs besides the data.
pub(crate) struct Plan {
    /// Input frames a row.
    pub t: usize,
    /// Output frames a row.
    pub t_out: usize,
    /// Bin `k`'s expected phase advance a hop (rows cycle through the bins).
    pub advance: Vec<f32>,
    /// Output frame `i`'s input frame and fraction.
    pub steps: Vec<(usize, f32)>,
    /// The largest advance, `pi * hop`.
    end: f32,
}

impl Plan {
    /// The plan for `f` bins, `t` frames in, `t_out` out, at `rate` with the STFT's `hop`.
    pub fn new(f: usize, t: usize, t_out: usize, rate: f64, hop: f64) -> Plan {
        // torch.linspace(0, pi * hop, n_freq) as torch computes it in f32 (from both ends
        // towards the middle): its rounding accumulates over the frames, so it matters.
        let end = (PI * hop) as f32;
        let step = end / (f - 1) as f32;
        let advance = (0..f)
            .map(|k| {
                if k < f / 2 {
                    step * k as f32
                } else {
                    end - step * (f - 1 - k) as f32
                }
            })
            .collect();
        // torch.arange(0, t, rate) in f32: its indices and fractional parts.
        let steps = (0..t_out)
            .map(|i| {
                let s = (i as f64 * rate) as f32;
                (s as usize, s % 1.0)
            })
            .collect();
        Plan {
            t,
            t_out,
            advance,
            steps,
            end,
        }
    }
}

/// Stretches the rows of `data` into `out` by `plan`: the vectorised kernel, which rounds a
/// bin's phase step with the `f32` magic constant (exact below 2^22 turns), unless the hop
/// is that large.
pub(crate) fn stretch(data: &[f32], out: &mut [f32], plan: &Plan) {
    if (plan.end as f64) < (1u64 << 20) as f64 {
        rows(data, out, plan);
    } else {
        rows_scalar(data, out, plan);
    }
}

/// The scalar kernel: for each `[T, 2]` row of `data` (a bin of a channel), its `[t_out,
/// 2]` row of `out`.
pub(crate) fn rows_scalar(data: &[f32], out: &mut [f32], plan: &Plan) {
    let (t, t_out, advance, steps) = (plan.t, plan.t_out, &plan.advance, &plan.steps);
    let f = advance.len();
    let rows = if t == 0 { 0 } else { data.len() / (t * 2) };
    // Angle and magnitude of every input frame of a bin, computed once (each is used by
    // up to two output frames), with the two zero frames torchaudio pads at the end.
    let mut angle = vec![0.0f32; t + 2];
    let mut norm = vec![0.0f32; t + 2];
    for r in 0..rows {
        let adv = advance[r % f];
        let src = &data[r * t * 2..(r + 1) * t * 2];
        for (j, z) in src.chunks_exact(2).enumerate() {
            angle[j] = fastmath::atan2(z[1], z[0]);
            norm[j] = fastmath::hypot(z[0], z[1]);
        }
        // Accumulated in f64 like torch's CPU cumsum, stored as f32.
        let mut acc = angle[0] as f64;
        let dst = &mut out[r * t_out * 2..(r + 1) * t_out * 2];
        for (o, &(j, alpha)) in dst.chunks_exact_mut(2).zip(steps.iter()) {
            let mag = alpha * norm[j + 1] + (1.0 - alpha) * norm[j];
            let (sin, cos) = fastmath::sin_cos(acc as f32);
            o[0] = mag * cos;
            o[1] = mag * sin;
            // The increment that leads to the next output frame.
            let mut d = angle[j + 1] - angle[j] - adv;
            d -= TWO_PI * fastmath::round_even_f32(d / TWO_PI);
            acc += (d + adv) as f64;
        }
    }
}

/// The vectorised kernel, same arguments and results as [`rows_scalar`], for plans whose
/// every `|advance[k] / 2 pi|` is below `2^20` (the phase step's rounding; [`stretch`]).
pub(crate) fn rows(data: &[f32], out: &mut [f32], plan: &Plan) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { rows_avx2(data, out, plan) };
    }
    rows_lanes(data, out, plan)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn rows_avx2(data: &[f32], out: &mut [f32], plan: &Plan) {
    rows_lanes(data, out, plan)
}

#[inline(always)]
fn rows_lanes(data: &[f32], out: &mut [f32], plan: &Plan) {
    let (t, t_out, advance, steps) = (plan.t, plan.t_out, &plan.advance, &plan.steps);
    let f = advance.len();
    let rows = if t == 0 { 0 } else { data.len() / (t * 2) };
    let (mut re, mut im) = (vec![0.0f32; t], vec![0.0f32; t]);
    let mut angle = vec![0.0f32; t + 2];
    let mut norm = vec![0.0f32; t + 2];
    let lo: Vec<usize> = steps.iter().map(|s| s.0).collect();
    let alpha: Vec<f32> = steps.iter().map(|s| s.1).collect();
    let mut inc = vec![0.0f32; t_out];
    let mut mag = vec![0.0f32; t_out];
    let mut phase = vec![0.0f32; t_out];
    for r in 0..rows {
        let adv = advance[r % f];
        let src = &data[r * t * 2..(r + 1) * t * 2];
        for ((z, a), b) in src.chunks_exact(2).zip(&mut re).zip(&mut im) {
            *a = z[0];
            *b = z[1];
        }
        let mut odd = 0u32;
        for (((&x, &y), a), n) in re.iter().zip(&im).zip(&mut angle).zip(&mut norm) {
            odd |= (!(x.is_finite() && y.is_finite()) || (x == 0.0 && y == 0.0)) as u32;
            *a = atan2(y, x);
            *n = fastmath::hypot(x, y);
        }
        if odd != 0 {
            // Silence (all-zero frames) is common: only those elements are redone.
            for ((&x, &y), a) in re.iter().zip(&im).zip(&mut angle) {
                if !(x.is_finite() && y.is_finite()) || (x == 0.0 && y == 0.0) {
                    *a = fastmath::atan2(y, x);
                }
            }
        }
        // Each output frame's magnitude and the phase step that leads to the next one.
        for ((&j, &al), (d_out, m)) in lo.iter().zip(&alpha).zip(inc.iter_mut().zip(&mut mag)) {
            let (a0, a1) = (angle[j], angle[j + 1]);
            *m = al * norm[j + 1] + (1.0 - al) * norm[j];
            let mut d = a1 - a0 - adv;
            d -= TWO_PI * round_magic(d / TWO_PI);
            *d_out = d + adv;
        }
        // Accumulated in f64 like torch's CPU cumsum, stored as f32: sequential.
        let mut acc = angle[0] as f64;
        for (p, &d) in phase.iter_mut().zip(&inc) {
            *p = acc as f32;
            acc += d as f64;
        }
        let dst = &mut out[r * t_out * 2..(r + 1) * t_out * 2];
        let mut far = 0u32;
        for ((o, &p), &m) in dst.chunks_exact_mut(2).zip(&phase).zip(&mag) {
            far |= !near(p) as u32;
            let (sin, cos) = sin_cos(p);
            o[0] = m * cos;
            o[1] = m * sin;
        }
        if far != 0 {
            for ((o, &p), &m) in dst.chunks_exact_mut(2).zip(&phase).zip(&mag) {
                if !near(p) {
                    let (sin, cos) = fastmath::sin_cos(p);
                    o[0] = m * cos;
                    o[1] = m * sin;
                }
            }
        }
    }
}

/// A phase the vector `sin_cos` takes (`|p| < 1e6`; not NaN).
#[inline(always)]
fn near(p: f32) -> bool {
    p.abs() < 1.0e6
}

/// [`fastmath::round_even_f32`] for `|v| < 2^22`, without its branch.
#[inline(always)]
fn round_magic(v: f32) -> f32 {
    const M: f32 = 12_582_912.0; // 1.5 * 2^23
    (v + M) - M
}

/// `tan(pi / 8)`, as in [`fastmath`].
const TAN_PI_8: f64 = 0.414_213_562_373_095_03;

/// [`fastmath::atan2`] for finite inputs not both zero, with selects for its branches.
#[inline(always)]
fn atan2(y: f32, x: f32) -> f32 {
    let (ax, ay) = ((x as f64).abs(), (y as f64).abs());
    let swap = ay > ax;
    let num = if swap { ax } else { ay };
    let den = if swap { ay } else { ax };
    let t = num / den;
    let big = t > TAN_PI_8;
    let u = if big { (t - 1.0) / (t + 1.0) } else { t };
    let p = fastmath::atan_small(u);
    let a = if big { FRAC_PI_4 + p } else { p };
    let a = if swap { FRAC_PI_2 - a } else { a };
    let a = if x.is_sign_negative() { PI - a } else { a };
    (a as f32).copysign(y)
}

/// [`fastmath::sin_cos`] for `|x| < 1e6`, with selects for its quadrant (other inputs give
/// some value the caller replaces).
#[inline(always)]
fn sin_cos(x: f32) -> (f32, f32) {
    let x = if x.abs() < 1.0e6 { x as f64 } else { 0.0 };
    let n = fastmath::round_magic_f64(x * FRAC_2_PI);
    let (s, c) = fastmath::sin_cos_reduced(x, n);
    let q = n as i32;
    let (a, b) = if q & 1 != 0 { (c, s) } else { (s, c) };
    let s = if q & 2 != 0 { -a } else { a };
    let c = if (q + 1) & 2 != 0 { -b } else { b };
    (s as f32, c as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spectrogram-like row set: smooth magnitudes, random phases, the odd zero and, when
    /// `special`, the values the vector pass hands back to libm.
    fn spec(rows: usize, t: usize, seed: u64, special: bool) -> Vec<f32> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut v = Vec::with_capacity(rows * t * 2);
        for _ in 0..rows * t {
            let m = (next() * 8.0 - 4.0).exp() as f32;
            let a = (next() * 2.0 - 1.0) * PI;
            let (re, im) = ((m as f64 * a.cos()) as f32, (m as f64 * a.sin()) as f32);
            let pick = next();
            v.extend_from_slice(&match pick {
                p if p < 0.02 => [0.0, 0.0],
                p if p < 0.03 => [-0.0, 0.0],
                p if p < 0.04 => [re, 0.0],
                p if p < 0.05 => [0.0, -im],
                p if special && p < 0.055 => [f32::INFINITY, im],
                p if special && p < 0.06 => [re, f32::NAN],
                _ => [re, im],
            });
        }
        v
    }

    fn same_bits(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{what}: element {i}: {x} vs {y}"
            );
        }
    }

    #[test]
    fn the_vector_kernel_gives_the_scalar_kernels_bits() {
        // Shapes of real use (201 bins, hops 100-200, rates both ways), a long clip whose
        // phases pass a million radians, and rows with infinities and NaNs.
        for (case, &(f, t, rate, hop, special)) in [
            (201, 160, 0.8, 200.0, false),
            (201, 97, 1.3, 160.0, true),
            (65, 3000, 0.9, 200.0, false),
            (5, 1, 0.5, 2.0, true),
            (129, 40, 1.0 / 3.0, 128.0, true),
        ]
        .iter()
        .enumerate()
        {
            let n_rows = 2 * f;
            let data = spec(n_rows, t, 7 + case as u64, special);
            let t_out = (t as f64 / rate).ceil() as usize;
            let plan = Plan::new(f, t, t_out, rate, hop);
            let (mut a, mut b) = (vec![0.0; n_rows * t_out * 2], vec![1.0; n_rows * t_out * 2]);
            rows_scalar(&data, &mut a, &plan);
            rows(&data, &mut b, &plan);
            same_bits(&a, &b, &format!("case {case}"));
            let mut c = vec![2.0; n_rows * t_out * 2];
            rows_lanes(&data, &mut c, &plan);
            same_bits(&a, &c, &format!("case {case}, baseline lanes"));
        }
    }
}
