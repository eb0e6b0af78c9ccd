//! Band-limited resampling: torchaudio's polyphase windowed-sinc filter.
//!
//! With `g = gcd(orig, new)`, `o = orig / g` input samples map onto `n = new / g` output
//! samples, so the filter has `n` phases that repeat every `o` input samples. Phase `j`'s
//! tap `k` (`k` in `-w..w + o`, `w = ceil(lowpass_filter_width * o / base)`,
//! `base = min(o, n) * rolloff`) is `sinc(pi t) * cos(pi t / (2 * lpw))^2 * base / o` with
//! `t = (k / o - j / n) * base` clamped to `+-lpw`, exactly as
//! `torchaudio.functional._get_sinc_resample_kernel` builds it (Hann window). Output
//! `b * n + j` is the dot product of phase `j` with the input zero-padded by `w` on the left,
//! starting at `b * o`; the output has `ceil(len * n / o)` samples.
//!
//! torchaudio runs every phase over all `2w + o` taps. Where `|t| >= lpw` the window is
//! zero (torchaudio's float evaluation leaves under 1e-20), so we keep only each phase's
//! non-zero run, about `2 * lpw * o / base` taps: for 44.1 kHz to 16 kHz, 34 of 475.

use std::sync::{Arc, Mutex};

use stoker_core::Error;

use super::{f32_tensor, waveform, Audio};

const OP: &str = "resample";

/// Refuse filters larger than this many taps in all (64 MiB).
const MAX_TAPS: u64 = 1 << 24;

/// A precomputed resampling filter from one rate to another.
#[derive(Debug, Clone)]
pub struct ResampleKernel {
    orig: usize,
    new: usize,
    width: usize,
    /// Per phase: first tap index (into the `2w + o` taps) and number of taps.
    spans: Vec<(usize, usize)>,
    /// The taps of all phases, back to back.
    taps: Vec<f32>,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl ResampleKernel {
    /// torchaudio's filter from `orig_rate` to `new_rate` (Hz) with
    /// `lowpass_filter_width` zero crossings each side and cutoff `rolloff` x Nyquist of the
    /// lower rate (torchaudio's defaults: 6 and 0.99).
    pub fn new(
        orig_rate: u32,
        new_rate: u32,
        lowpass_filter_width: u32,
        rolloff: f64,
    ) -> Result<ResampleKernel, Error> {
        if orig_rate == 0 || new_rate == 0 {
            return Err(Error::invalid(format!(
                "{OP}: rates must be positive, got {orig_rate} -> {new_rate}"
            )));
        }
        if lowpass_filter_width == 0 {
            return Err(Error::invalid(format!(
                "{OP}: lowpass_filter_width must be positive"
            )));
        }
        if !(rolloff > 0.0 && rolloff <= 1.0) {
            return Err(Error::invalid(format!(
                "{OP}: rolloff must be in (0, 1], got {rolloff}"
            )));
        }
        let g = gcd(orig_rate as u64, new_rate as u64);
        let o = orig_rate as u64 / g;
        let n = new_rate as u64 / g;
        let lpw = lowpass_filter_width as f64;
        let base = o.min(n) as f64 * rolloff;
        let width = (lpw * o as f64 / base).ceil() as u64;
        let span_max = 2 * width + o;
        // Each phase keeps at most ~2 * lpw * o / base + 2 taps.
        let per_phase = ((2.0 * lpw * o as f64 / base).ceil() as u64 + 2).min(span_max);
        if n.saturating_mul(per_phase) > MAX_TAPS {
            return Err(Error::invalid(format!(
                "{OP}: {orig_rate} -> {new_rate} Hz needs a filter of {n} phases x \
                 {per_phase} taps (rates with a small common divisor); over the limit"
            )));
        }
        let (o, n, width) = (o as usize, n as usize, width as usize);
        // The taps are computed in f32 with torchaudio's operations in torchaudio's order
        // (it builds the kernel in the waveform's dtype), so they match its kernel to an ulp.
        let pi = std::f32::consts::PI;
        let lpw32 = lpw as f32;
        let base32 = base as f32;
        let scale32 = (base / o as f64) as f32;
        let mut spans = Vec::with_capacity(n);
        let mut taps = Vec::with_capacity(n * per_phase as usize);
        for j in 0..n {
            let shift = -(j as f32) / n as f32;
            let t_of = |k: usize| ((k as f32 - width as f32) / o as f32 + shift) * base32;
            // The non-zero run is the interval where |t| < lpw; t grows with k. Start a
            // couple of taps before where it begins in exact arithmetic, then step.
            let guess = width as f64 + o as f64 * (j as f64 / n as f64 - lpw / base) - 2.0;
            let mut first = guess.max(0.0) as usize;
            while first < 2 * width + o && t_of(first) <= -lpw32 {
                first += 1;
            }
            if first == 2 * width + o {
                spans.push((0, 0));
                continue;
            }
            let start = taps.len();
            let mut k = first;
            while k < 2 * width + o {
                let t = t_of(k);
                if t >= lpw32 {
                    break;
                }
                let w = (t * pi / lpw32 / 2.0).cos();
                let x = t * pi;
                let s = if x == 0.0 { 1.0 } else { x.sin() / x };
                taps.push(s * (w * w * scale32));
                k += 1;
            }
            spans.push((first, taps.len() - start));
        }
        Ok(ResampleKernel {
            orig: o,
            new: n,
            width,
            spans,
            taps,
        })
    }

    /// Output length for `len` input samples: `ceil(len * new / orig)` (reduced rates).
    pub fn output_len(&self, len: usize) -> usize {
        ((len as u128 * self.new as u128).div_ceil(self.orig as u128)) as usize
    }

    /// Resamples one channel, appending to `out`.
    pub fn apply_channel(&self, x: &[f32], out: &mut Vec<f32>) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { self.channel_avx2(x, out) };
        }
        self.channel(x, out, dot)
    }

    /// [`Self::channel`] with the eight partial sums of [`dot`] in one AVX register: the
    /// same arithmetic in the same order, so the same results.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn channel_avx2(&self, x: &[f32], out: &mut Vec<f32>) {
        self.channel(x, out, |a, b| {
            // SAFETY: this function runs only where AVX2 is (checked by its caller).
            unsafe { dot_avx(a, b) }
        })
    }

    #[inline(always)]
    fn channel(&self, x: &[f32], out: &mut Vec<f32>, dot: impl Fn(&[f32], &[f32]) -> f32) {
        let target = self.output_len(x.len());
        let (o, w) = (self.orig, self.width);
        let mut padded = vec![0.0f32; w + x.len() + w + o];
        padded[w..w + x.len()].copy_from_slice(x);
        out.reserve(target);
        let mut produced = 0;
        let mut b = 0;
        'blocks: loop {
            let base = b * o;
            let mut off = 0;
            for &(first, len) in &self.spans {
                if produced == target {
                    break 'blocks;
                }
                let taps = &self.taps[off..off + len];
                off += len;
                out.push(dot(taps, &padded[base + first..base + first + len]));
                produced += 1;
            }
            b += 1;
            if base + o + 2 * w + o > padded.len() && produced < target {
                // Cannot happen: the padding covers `len / o + 1` blocks, which is at least
                // `target / n` rounded up. Kept as a guard against an endless loop.
                out.resize(out.len() + (target - produced), 0.0);
                break;
            }
        }
    }
}

/// A dot product with eight partial sums (vectorises; torchaudio's conv1d sums in another
/// order, a difference of a few ulps).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// [`dot`] with its eight partial sums in one AVX register (no fused multiply-add: the
/// same roundings, so the same result).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot_avx(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let chunks = n / 8;
    let mut acc = _mm256_setzero_ps();
    for c in 0..chunks {
        // SAFETY: `c * 8 + 8 <= n`, within both slices.
        let (x, y) = unsafe {
            (
                _mm256_loadu_ps(a.as_ptr().add(c * 8)),
                _mm256_loadu_ps(b.as_ptr().add(c * 8)),
            )
        };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, y));
    }
    // (acc[0] + acc[4]), ..., (acc[3] + acc[7]); then (0 + 1) + (2 + 3) as [`dot`] adds.
    let q = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let mut l = [0.0f32; 4];
    // SAFETY: `l` holds four floats.
    unsafe { _mm_storeu_ps(l.as_mut_ptr(), q) };
    let mut s = (l[0] + l[1]) + (l[2] + l[3]);
    for i in chunks * 8..n {
        s += a[i] * b[i];
    }
    s
}

/// Resampling to a target rate (operator `resample`), as
/// `torchaudio.functional.resample(x, orig, target)` with the Hann-windowed sinc.
///
/// Filters are built on first use per source rate and kept (a handful of rates at most).
pub struct Resample {
    /// Output rate in Hz.
    pub target_rate: u32,
    /// Zero crossings of the sinc on each side (torchaudio: 6).
    pub lowpass_filter_width: u32,
    /// Cutoff as a fraction of the lower Nyquist frequency (torchaudio: 0.99).
    pub rolloff: f64,
    cache: Mutex<Vec<(KernelKey, Arc<ResampleKernel>)>>,
}

impl std::fmt::Debug for Resample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resample")
            .field("target_rate", &self.target_rate)
            .field("lowpass_filter_width", &self.lowpass_filter_width)
            .field("rolloff", &self.rolloff)
            .finish()
    }
}

impl Clone for Resample {
    fn clone(&self) -> Resample {
        Resample {
            target_rate: self.target_rate,
            lowpass_filter_width: self.lowpass_filter_width,
            rolloff: self.rolloff,
            cache: Mutex::new(Vec::new()),
        }
    }
}

const CACHE_ENTRIES: usize = 8;

/// (source rate, lowpass width, rolloff bits, target rate).
type KernelKey = (u32, u32, u64, u32);

impl Resample {
    /// Resampling to `target_rate` with torchaudio's defaults.
    pub fn new(target_rate: u32) -> Resample {
        Resample {
            target_rate,
            lowpass_filter_width: 6,
            rolloff: 0.99,
            cache: Mutex::new(Vec::new()),
        }
    }

    /// Sets the sinc's zero crossings per side.
    pub fn lowpass_filter_width(mut self, w: u32) -> Self {
        self.lowpass_filter_width = w;
        self
    }

    /// Sets the cutoff.
    pub fn rolloff(mut self, r: f64) -> Self {
        self.rolloff = r;
        self
    }

    /// The filter from `orig_rate` to the target rate (cached).
    pub fn kernel(&self, orig_rate: u32) -> Result<Arc<ResampleKernel>, Error> {
        let key: KernelKey = (
            orig_rate,
            self.lowpass_filter_width,
            self.rolloff.to_bits(),
            self.target_rate,
        );
        {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = cache.iter().find(|e| e.0 == key) {
                return Ok(e.1.clone());
            }
        }
        let k = Arc::new(ResampleKernel::new(
            orig_rate,
            self.target_rate,
            self.lowpass_filter_width,
            self.rolloff,
        )?);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.remove(0);
        }
        cache.push((key, k.clone()));
        Ok(k)
    }

    /// Resamples `audio` to the target rate (a copy when the rates are equal).
    pub fn apply(&self, audio: &Audio) -> Result<Audio, Error> {
        if audio.sample_rate == self.target_rate {
            return Ok(audio.clone());
        }
        let kernel = self.kernel(audio.sample_rate)?;
        let (data, c, n) = waveform(&audio.samples, OP)?;
        let m = kernel.output_len(n);
        let mut out = Vec::with_capacity(c * m);
        for ch in 0..c {
            kernel.apply_channel(&data[ch * n..(ch + 1) * n], &mut out);
        }
        Audio::new(f32_tensor(vec![c, m], &out)?, self.target_rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_avx_dot_gives_the_portable_bits() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let x: Vec<f32> = (0..20_011)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
            })
            .collect();
        for (from, to) in [
            (48_000, 8_000),
            (44_100, 16_000),
            (8_000, 22_050),
            (16_000, 16_001),
        ] {
            let k = ResampleKernel::new(from, to, 6, 0.99).unwrap();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            k.channel(&x, &mut a, dot);
            k.apply_channel(&x, &mut b);
            assert_eq!(a.len(), k.output_len(x.len()));
            let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same && a.len() == b.len(), "{from} -> {to}");
        }
    }
}
