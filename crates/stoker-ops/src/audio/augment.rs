//! Spectrogram augmentation: phase-vocoder time stretch, time and frequency masking
//! (SpecAugment), with torchaudio's semantics and our generator.

use stoker_core::rng::Rng;
use stoker_core::{DType, Error, Tensor};

use super::{f32_tensor, vocoder};

/// Refuse outputs with more elements than this.
const MAX_ELEMENTS: u64 = 1 << 28;

/// Phase-vocoder time stretch of a complex STFT (operator `time_stretch`), as
/// `torchaudio.transforms.TimeStretch(hop_length, n_freq)(x, rate)` /
/// `torchaudio.functional.phase_vocoder`.
///
/// Input and output are `f32` `[.., F, T, 2]` (real, imaginary last, as [`Stft`] gives;
/// `F` must equal `n_freq`). Output frame `i` sits at input time `s = i * rate`:
/// magnitude interpolated linearly between frames `floor(s)` and `floor(s) + 1` (zeros past
/// the end), phase accumulated from the first frame's phase plus each step's phase
/// difference, unwrapped around the expected advance `pi * hop * k / (F - 1)` of bin `k`.
/// `ceil(T / rate)` frames come out; `rate > 1` speeds up (fewer frames).
///
/// [`Stft`]: super::Stft
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TimeStretch {
    /// Frequency bins (`n_fft / 2 + 1`; torchaudio: 201).
    pub n_freq: usize,
    /// The STFT's hop (default `n_fft / 2 = n_freq - 1`).
    pub hop_length: Option<usize>,
}

impl TimeStretch {
    /// A stretch for STFTs with `n_freq` bins and the default hop.
    pub fn new(n_freq: usize) -> TimeStretch {
        TimeStretch {
            n_freq,
            hop_length: None,
        }
    }
    /// Sets the STFT's hop.
    pub fn hop_length(mut self, h: usize) -> Self {
        self.hop_length = Some(h);
        self
    }

    /// Stretches `spec` by `rate`.
    pub fn apply(&self, spec: &Tensor, rate: f64) -> Result<Tensor, Error> {
        const OP: &str = "time_stretch";
        if !(rate > 0.0 && rate.is_finite()) {
            return Err(Error::invalid(format!(
                "{OP}: rate must be positive, got {rate}"
            )));
        }
        let shape = spec.shape();
        if shape.len() < 3 || shape[shape.len() - 1] != 2 || spec.dtype() != DType::F32 {
            return Err(Error::operator(format!(
                "{OP}: expects a complex f32 [.., F, T, 2] STFT, got {} {:?}",
                spec.dtype(),
                shape
            )));
        }
        let f = shape[shape.len() - 3];
        let t = shape[shape.len() - 2];
        if f != self.n_freq || f < 2 {
            return Err(Error::operator(format!(
                "{OP}: the STFT has {f} bins, the operator was set up for {}",
                self.n_freq
            )));
        }
        let batch: usize = shape[..shape.len() - 3].iter().product();
        let data = spec.to_vec::<f32>().unwrap_or_default();
        if rate == 1.0 {
            return Ok(spec.clone());
        }
        let t_out = if t == 0 {
            0
        } else {
            (t as f64 / rate).ceil() as u64
        };
        if t_out.saturating_mul((batch * f * 2) as u64) > MAX_ELEMENTS {
            return Err(Error::operator(format!(
                "{OP}: rate {rate} would make {t_out} frames from {t}, over the size limit"
            )));
        }
        let t_out = t_out as usize;
        let hop = self.hop_length.unwrap_or(self.n_freq - 1) as f64;
        let plan = vocoder::Plan::new(f, t, t_out, rate, hop);
        let mut out = vec![0.0f32; batch * f * t_out * 2];
        vocoder::stretch(&data, &mut out, &plan);
        let mut out_shape = shape.to_vec();
        let n = out_shape.len();
        out_shape[n - 2] = t_out;
        f32_tensor(out_shape, &out)
    }
}

/// Time stretch by a rate drawn uniformly from `rate` (operator `random_time_stretch`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RandomTimeStretch {
    /// The stretch.
    pub stretch: TimeStretch,
    /// `(low, high)`: the rate is `low + (high - low) * u`, `u` uniform in `[0, 1)`.
    pub rate: (f64, f64),
}

impl RandomTimeStretch {
    /// A stretch for `n_freq`-bin STFTs by a rate in `rate`.
    pub fn new(n_freq: usize, rate: (f64, f64)) -> RandomTimeStretch {
        RandomTimeStretch {
            stretch: TimeStretch::new(n_freq),
            rate,
        }
    }

    /// Sets the STFT's hop.
    pub fn hop_length(mut self, h: usize) -> Self {
        self.stretch.hop_length = Some(h);
        self
    }

    /// Draws the rate (one draw from `rng`).
    pub fn draw(&self, rng: &mut Rng) -> Result<f64, Error> {
        let (lo, hi) = self.rate;
        if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
            return Err(Error::invalid(format!(
                "random_time_stretch: rate range {:?} must satisfy 0 < low <= high",
                self.rate
            )));
        }
        Ok(lo + (hi - lo) * rng.unit())
    }

    /// Stretches `spec` by a drawn rate.
    pub fn apply(&self, spec: &Tensor, rng: &mut Rng) -> Result<Tensor, Error> {
        let rate = self.draw(rng)?;
        self.stretch.apply(spec, rate)
    }
}

#[derive(Clone, Copy)]
enum Axis {
    Freq,
    Time,
}

/// One masked interval along an axis of length `len`, drawn as torchaudio's
/// `mask_along_axis`: width `w = u1 * param`, start `floor(u2 * (len - w))`, the mask covers
/// `start .. start + floor(w)`.
fn draw_mask(rng: &mut Rng, param: usize, len: usize) -> (usize, usize) {
    let value = rng.unit() * param as f64;
    let min_value = rng.unit() * (len as f64 - value);
    // `.long()` truncates towards zero.
    let start = min_value.trunc() as i64;
    let end = start + value.trunc() as i64;
    let clamp = |v: i64| v.clamp(0, len as i64) as usize;
    (clamp(start), clamp(end))
}

#[allow(clippy::too_many_arguments)]
fn mask(
    op: &str,
    spec: &Tensor,
    axis: Axis,
    mask_param: usize,
    p: f64,
    value: f32,
    iid: bool,
    rng: &mut Rng,
) -> Result<Tensor, Error> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid(format!(
            "{op}: p must be in [0, 1], got {p}"
        )));
    }
    let shape = spec.shape();
    if shape.len() < 2 || spec.dtype() != DType::F32 {
        return Err(Error::operator(format!(
            "{op}: expects an f32 [.., F, T] spectrogram, got {} {:?}",
            spec.dtype(),
            shape
        )));
    }
    let (f, t) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let len = match axis {
        Axis::Freq => f,
        Axis::Time => t,
    };
    // torchaudio's _get_mask_param.
    let param = if p == 1.0 {
        mask_param
    } else {
        mask_param.min((len as f64 * p) as usize)
    };
    if param < 1 {
        return Ok(spec.clone());
    }
    let items: usize = shape[..shape.len() - 2].iter().product();
    let mut data = spec.to_vec::<f32>().unwrap_or_default();
    let shared = (!iid).then(|| draw_mask(rng, param, len));
    for item in 0..items {
        let (start, end) = match shared {
            Some(m) => m,
            None => draw_mask(rng, param, len),
        };
        let plane = &mut data[item * f * t..(item + 1) * f * t];
        match axis {
            Axis::Freq => plane[start * t..end * t].fill(value),
            Axis::Time => {
                for row in plane.chunks_mut(t.max(1)) {
                    row[start..end].fill(value);
                }
            }
        }
    }
    f32_tensor(shape.to_vec(), &data)
}

macro_rules! masking {
    ($name:ident, $op:literal, $axis:expr, $doc:literal) => {
        #[doc = $doc]
        ///
        /// The width is uniform in `[0, mask_param)` (continuous, then truncated, as
        /// torchaudio draws it), the start uniform over the positions where the mask fits.
        /// With `p < 1` the width is also capped at `p` times the axis length. By default
        /// one mask covers every channel (torchaudio on a `[C, F, T]` tensor);
        /// `iid_channels` draws one per `[F, T]` plane (torchaudio's `iid_masks=True`).
        #[derive(Debug, Clone, PartialEq)]
        #[non_exhaustive]
        pub struct $name {
            /// Upper bound (exclusive) of the mask width.
            pub mask_param: usize,
            /// Draw a separate mask for every `[F, T]` plane.
            pub iid_channels: bool,
            /// Largest fraction of the axis a mask may cover (1 = no cap).
            pub p: f64,
            /// Fill value (torchaudio: 0).
            pub mask_value: f32,
        }

        impl $name {
            /// Masks up to `mask_param` (exclusive) rows, filled with 0.
            pub fn new(mask_param: usize) -> $name {
                $name {
                    mask_param,
                    iid_channels: false,
                    p: 1.0,
                    mask_value: 0.0,
                }
            }
            /// Sets per-plane masks.
            pub fn iid_channels(mut self, yes: bool) -> Self {
                self.iid_channels = yes;
                self
            }
            /// Sets the cap fraction.
            pub fn p(mut self, p: f64) -> Self {
                self.p = p;
                self
            }
            /// Sets the fill value.
            pub fn mask_value(mut self, v: f32) -> Self {
                self.mask_value = v;
                self
            }

            /// Masks `spec` (`f32` `[.., F, T]`).
            pub fn apply(&self, spec: &Tensor, rng: &mut Rng) -> Result<Tensor, Error> {
                mask(
                    $op,
                    spec,
                    $axis,
                    self.mask_param,
                    self.p,
                    self.mask_value,
                    self.iid_channels,
                    rng,
                )
            }
        }
    };
}

masking!(
    TimeMasking,
    "time_masking",
    Axis::Time,
    "SpecAugment time masking (operator `time_masking`), as `torchaudio.transforms.TimeMasking`."
);
masking!(
    FrequencyMasking,
    "frequency_masking",
    Axis::Freq,
    "SpecAugment frequency masking (operator `frequency_masking`), as \
     `torchaudio.transforms.FrequencyMasking`."
);
