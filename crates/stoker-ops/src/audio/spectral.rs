//! STFT, spectrograms, mel filterbanks and decibels, as torchaudio computes them.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};
use stoker_core::{DType, Error, Tensor};

use super::{f32_tensor, waveform, Audio};

thread_local! {
    /// One planner per thread: plans are cached by size, so planning the same `n_fft` again
    /// is a lookup.
    static PLANNER: RefCell<RealFftPlanner<f32>> = RefCell::new(RealFftPlanner::new());
}

/// torchaudio's default FFT size (`n_fft`) of its STFT, spectrogram and mel spectrogram
/// transforms: what [`Stft::default`], [`Spectrogram::default`] and
/// [`MelSpectrogram::default`] use.
pub const DEFAULT_N_FFT: usize = 400;

/// torchaudio's default exponent of a spectrogram's magnitude (2: power), also
/// [`complex_power`]'s usual one.
pub const DEFAULT_POWER: f32 = 2.0;

/// torchaudio's default number of mel bands ([`MelScale::default`]).
pub const DEFAULT_N_MELS: usize = 128;

fn plan(n_fft: usize) -> Arc<dyn RealToComplex<f32>> {
    PLANNER.with(|p| p.borrow_mut().plan_fft_forward(n_fft))
}

/// Short-time Fourier transform (operator `stft`), as `torch.stft(x, n_fft, hop_length,
/// win_length, window=torch.hann_window(win_length), center, pad_mode="reflect",
/// onesided=True, return_complex=True)`.
///
/// The Hann window is periodic (`0.5 - 0.5 cos(2 pi i / win_length)`) and, when shorter than
/// `n_fft`, zero-padded on both sides to `n_fft`. With `center` the signal is
/// reflect-padded by `n_fft / 2` on each side (it must then be longer than `n_fft / 2`
/// samples, as torch requires), so there are `1 + N / hop` frames.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Stft {
    /// FFT size; `n_fft / 2 + 1` frequency bins.
    pub n_fft: usize,
    /// Window length (default `n_fft`).
    pub win_length: Option<usize>,
    /// Hop between frames (default `win_length / 2`).
    pub hop_length: Option<usize>,
    /// Reflect-pad by `n_fft / 2` so that frame `t` is centred on sample `t * hop`.
    pub center: bool,
}

impl Default for Stft {
    /// torchaudio's defaults: [`DEFAULT_N_FFT`], the window as long as the FFT, a hop of
    /// half a window, centred.
    fn default() -> Stft {
        Stft::new(DEFAULT_N_FFT)
    }
}

impl Stft {
    /// An STFT of size `n_fft` with torchaudio's defaults.
    pub fn new(n_fft: usize) -> Stft {
        Stft {
            n_fft,
            win_length: None,
            hop_length: None,
            center: true,
        }
    }
    /// Sets the window length.
    pub fn win_length(mut self, w: usize) -> Self {
        self.win_length = Some(w);
        self
    }
    /// Sets the hop.
    pub fn hop_length(mut self, h: usize) -> Self {
        self.hop_length = Some(h);
        self
    }
    /// Sets centring.
    pub fn center(mut self, c: bool) -> Self {
        self.center = c;
        self
    }

    /// Number of frequency bins.
    pub fn bins(&self) -> usize {
        self.n_fft / 2 + 1
    }

    /// `(n_fft, win_length, hop_length)` checked.
    fn resolved(&self, op: &str) -> Result<(usize, usize, usize), Error> {
        let n_fft = self.n_fft;
        let win = self.win_length.unwrap_or(n_fft);
        let hop = self.hop_length.unwrap_or(win / 2);
        if n_fft == 0 || n_fft > 1 << 20 {
            return Err(Error::invalid(format!(
                "{op}: n_fft must be in 1..=2^20, got {n_fft}"
            )));
        }
        if win == 0 || win > n_fft {
            return Err(Error::invalid(format!(
                "{op}: win_length must be in 1..=n_fft ({n_fft}), got {win}"
            )));
        }
        if hop == 0 {
            return Err(Error::invalid(format!("{op}: hop_length must be positive")));
        }
        Ok((n_fft, win, hop))
    }

    /// Frames for `n` samples (`None` when `n` is too short).
    pub fn frames(&self, n: usize) -> Option<usize> {
        let (n_fft, _, hop) = self.resolved("stft").ok()?;
        let len = if self.center {
            if n <= n_fft / 2 {
                return None;
            }
            n + 2 * (n_fft / 2)
        } else {
            n
        };
        (len >= n_fft).then(|| 1 + (len - n_fft) / hop)
    }

    /// Runs the transform over `c` channels of `n` samples and hands every frame's
    /// one-sided spectrum to `sink(channel, frame, spectrum)`. Returns the frame count.
    pub(crate) fn run(
        &self,
        op: &str,
        data: &[f32],
        c: usize,
        n: usize,
        mut sink: impl FnMut(usize, usize, &[Complex<f32>]),
    ) -> Result<usize, Error> {
        let (n_fft, win, hop) = self.resolved(op)?;
        let frames = self.frames(n).ok_or_else(|| {
            Error::operator(format!(
                "{op}: {n} samples are too short for n_fft {n_fft}{}",
                if self.center {
                    " (reflect padding needs more than n_fft / 2)"
                } else {
                    ""
                }
            ))
        })?;
        // The periodic Hann window, zero-padded to n_fft.
        let left = (n_fft - win) / 2;
        let mut window = vec![0.0f32; n_fft];
        for i in 0..win {
            let x = 2.0 * std::f64::consts::PI * i as f64 / win as f64;
            window[left + i] = (0.5 - 0.5 * x.cos()) as f32;
        }
        let fft = plan(n_fft);
        let mut input = fft.make_input_vec();
        let mut spectrum = fft.make_output_vec();
        let mut scratch = fft.make_scratch_vec();
        let pad = if self.center { n_fft / 2 } else { 0 };
        let mut padded = Vec::with_capacity(n + 2 * pad);
        for ch in 0..c {
            let x = &data[ch * n..(ch + 1) * n];
            padded.clear();
            // Reflect: x[pad], ..., x[1], x[0], x[1], ..., x[n-2], x[n-1], x[n-2], ...
            padded.extend((1..=pad).rev().map(|i| x[i]));
            padded.extend_from_slice(x);
            padded.extend((1..=pad).map(|i| x[n - 1 - i]));
            for t in 0..frames {
                let frame = &padded[t * hop..t * hop + n_fft];
                for ((d, s), w) in input.iter_mut().zip(frame).zip(&window) {
                    *d = s * w;
                }
                fft.process_with_scratch(&mut input, &mut spectrum, &mut scratch)
                    .map_err(|e| Error::operator(format!("{op}: FFT failed: {e}")))?;
                sink(ch, t, &spectrum);
            }
        }
        Ok(frames)
    }

    /// The complex STFT of an `f32` `[C, N]` waveform: `[C, n_fft / 2 + 1, T, 2]` (real,
    /// imaginary).
    pub fn apply(&self, samples: &Tensor) -> Result<Tensor, Error> {
        let (data, c, n) = waveform(samples, "stft")?;
        let f = self.bins();
        let t_n = self.frames(n).unwrap_or(0);
        let mut out = vec![0.0f32; c * f * t_n * 2];
        let frames = self.run("stft", &data, c, n, |ch, t, spec| {
            for (k, z) in spec.iter().enumerate() {
                let i = ((ch * f + k) * t_n + t) * 2;
                out[i] = z.re;
                out[i + 1] = z.im;
            }
        })?;
        f32_tensor(vec![c, f, frames, 2], &out)
    }
}

/// A power spectrogram (operator `spectrogram`): `|STFT|^power`, as
/// `torchaudio.transforms.Spectrogram(n_fft, win_length, hop_length, power=power)`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Spectrogram {
    /// The transform.
    pub stft: Stft,
    /// Exponent of the magnitude: 1 (magnitude), 2 (power, the default) or any positive
    /// number.
    pub power: f32,
}

impl Default for Spectrogram {
    /// torchaudio's defaults: a power spectrogram of size [`DEFAULT_N_FFT`].
    fn default() -> Spectrogram {
        Spectrogram::new(DEFAULT_N_FFT)
    }
}

impl Spectrogram {
    /// A power spectrogram of size `n_fft` with torchaudio's defaults.
    pub fn new(n_fft: usize) -> Spectrogram {
        Spectrogram {
            stft: Stft::new(n_fft),
            power: DEFAULT_POWER,
        }
    }
    /// Sets the window length.
    pub fn win_length(mut self, w: usize) -> Self {
        self.stft.win_length = Some(w);
        self
    }
    /// Sets the hop.
    pub fn hop_length(mut self, h: usize) -> Self {
        self.stft.hop_length = Some(h);
        self
    }
    /// Sets centring.
    pub fn center(mut self, c: bool) -> Self {
        self.stft.center = c;
        self
    }
    /// Sets the exponent.
    pub fn power(mut self, p: f32) -> Self {
        self.power = p;
        self
    }

    fn check(&self, op: &str) -> Result<(), Error> {
        if !(self.power > 0.0 && self.power.is_finite()) {
            return Err(Error::invalid(format!(
                "{op}: power must be positive, got {}",
                self.power
            )));
        }
        Ok(())
    }

    /// `[C, F, T]` from an `f32` `[C, N]` waveform, `F = n_fft / 2 + 1`.
    pub fn apply(&self, samples: &Tensor) -> Result<Tensor, Error> {
        let (out, c, f, t) = self.compute("spectrogram", samples)?;
        f32_tensor(vec![c, f, t], &out)
    }

    /// `(values [C, F, T], C, F, T)`.
    pub(crate) fn compute(
        &self,
        op: &str,
        samples: &Tensor,
    ) -> Result<(Vec<f32>, usize, usize, usize), Error> {
        self.check(op)?;
        let (data, c, n) = waveform(samples, op)?;
        let f = self.stft.bins();
        let t_n = self.stft.frames(n).unwrap_or(0);
        let mut out = vec![0.0f32; c * f * t_n];
        let power = self.power;
        let frames = self.stft.run(op, &data, c, n, |ch, t, spec| {
            let row = ch * f * t_n + t;
            if power == 2.0 {
                for (k, z) in spec.iter().enumerate() {
                    out[row + k * t_n] = z.re * z.re + z.im * z.im;
                }
            } else if power == 1.0 {
                for (k, z) in spec.iter().enumerate() {
                    out[row + k * t_n] = z.re.hypot(z.im);
                }
            } else {
                for (k, z) in spec.iter().enumerate() {
                    out[row + k * t_n] = z.re.hypot(z.im).powf(power);
                }
            }
        })?;
        Ok((out, c, f, frames))
    }
}

/// `|z|^power` of a complex `[.., F, T, 2]` tensor (as [`Stft`] or [`TimeStretch`] give):
/// `[.., F, T]`, as torchaudio's `spec.abs().pow(power)` (power 2 sums the squares).
///
/// [`TimeStretch`]: super::TimeStretch
pub fn complex_power(spec: &Tensor, power: f32) -> Result<Tensor, Error> {
    const OP: &str = "complex_power";
    if !(power > 0.0 && power.is_finite()) {
        return Err(Error::invalid(format!(
            "{OP}: power must be positive, got {power}"
        )));
    }
    let shape = spec.shape();
    if shape.last() != Some(&2) || spec.dtype() != DType::F32 {
        return Err(Error::operator(format!(
            "{OP}: expects a complex f32 [.., 2] tensor, got {} {:?}",
            spec.dtype(),
            shape
        )));
    }
    let v = spec.to_vec::<f32>().unwrap_or_default();
    let out: Vec<f32> = v
        .chunks_exact(2)
        .map(|z| {
            if power == 2.0 {
                z[0] * z[0] + z[1] * z[1]
            } else if power == 1.0 {
                z[0].hypot(z[1])
            } else {
                z[0].hypot(z[1]).powf(power)
            }
        })
        .collect();
    f32_tensor(shape[..shape.len() - 1].to_vec(), &out)
}

/// The mel scale's formula.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MelScaleKind {
    /// `2595 log10(1 + f / 700)` (torchaudio's default).
    #[default]
    Htk,
    /// Slaney's Auditory Toolbox: linear below 1 kHz, logarithmic above (librosa's default).
    Slaney,
}

/// Normalisation of the mel filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MelNorm {
    /// Triangles of height 1 (torchaudio's default).
    #[default]
    None,
    /// Divide each triangle by half its width in Hz (constant area; librosa's default).
    Slaney,
}

fn hz_to_mel(f: f64, kind: MelScaleKind) -> f64 {
    match kind {
        MelScaleKind::Htk => 2595.0 * (1.0 + f / 700.0).log10(),
        MelScaleKind::Slaney => {
            let f_sp = 200.0 / 3.0;
            if f >= 1000.0 {
                1000.0 / f_sp + (f / 1000.0).ln() / (6.4f64.ln() / 27.0)
            } else {
                f / f_sp
            }
        }
    }
}

fn mel_to_hz(m: f64, kind: MelScaleKind) -> f64 {
    match kind {
        MelScaleKind::Htk => 700.0 * (10f64.powf(m / 2595.0) - 1.0),
        MelScaleKind::Slaney => {
            let f_sp = 200.0 / 3.0;
            let min_log_mel = 1000.0 / f_sp;
            if m >= min_log_mel {
                1000.0 * ((6.4f64.ln() / 27.0) * (m - min_log_mel)).exp()
            } else {
                f_sp * m
            }
        }
    }
}

/// torchaudio's `melscale_fbanks(n_freqs, f_min, f_max, n_mels, sample_rate, norm,
/// mel_scale)`: the `[n_freqs, n_mels]` matrix (row-major) that maps a spectrogram's bins
/// to mel bands. The bins are `linspace(0, sample_rate // 2, n_freqs)` (torchaudio's
/// integer half rate); the `n_mels + 2` band edges are equally spaced in mels between
/// `f_min` and `f_max`.
pub fn melscale_fbanks(
    n_freqs: usize,
    f_min: f64,
    f_max: f64,
    n_mels: usize,
    sample_rate: u32,
    norm: MelNorm,
    kind: MelScaleKind,
) -> Result<Vec<f32>, Error> {
    if n_freqs < 2 || n_mels == 0 || n_mels > 1 << 14 {
        return Err(Error::invalid(format!(
            "mel_scale: need n_freqs >= 2 and 1 <= n_mels <= 16384, got {n_freqs} and {n_mels}"
        )));
    }
    if !(f_min >= 0.0 && f_min < f_max && f_max.is_finite()) {
        return Err(Error::invalid(format!(
            "mel_scale: need 0 <= f_min < f_max, got {f_min} and {f_max}"
        )));
    }
    let nyq = (sample_rate / 2) as f64;
    let all: Vec<f64> = (0..n_freqs)
        .map(|i| nyq * i as f64 / (n_freqs - 1) as f64)
        .collect();
    let (m_min, m_max) = (hz_to_mel(f_min, kind), hz_to_mel(f_max, kind));
    let pts: Vec<f64> = (0..n_mels + 2)
        .map(|i| {
            mel_to_hz(
                m_min + (m_max - m_min) * i as f64 / (n_mels + 1) as f64,
                kind,
            )
        })
        .collect();
    let mut fb = vec![0.0f32; n_freqs * n_mels];
    for (i, &f) in all.iter().enumerate() {
        for m in 0..n_mels {
            let down = (f - pts[m]) / (pts[m + 1] - pts[m]);
            let up = (pts[m + 2] - f) / (pts[m + 2] - pts[m + 1]);
            let mut v = down.min(up).max(0.0);
            if norm == MelNorm::Slaney {
                v *= 2.0 / (pts[m + 2] - pts[m]);
            }
            fb[i * n_mels + m] = v as f32;
        }
    }
    Ok(fb)
}

/// A mel filter bank as each band's non-zero `(bin, weight)` pairs.
type Bands = Vec<Vec<(usize, f32)>>;

/// Filter banks kept for the process (a pipeline uses one or two settings).
const MAX_CACHED_BANDS: usize = 16;

/// Mel projection of a spectrogram (operator `mel_scale`), as
/// `torchaudio.transforms.MelScale`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MelScale {
    /// Number of mel bands (torchaudio: 128).
    pub n_mels: usize,
    /// Lowest frequency, Hz.
    pub f_min: f64,
    /// Highest frequency, Hz (default `sample_rate // 2`).
    pub f_max: Option<f64>,
    /// Filter normalisation.
    pub norm: MelNorm,
    /// Scale formula.
    pub scale: MelScaleKind,
}

impl Default for MelScale {
    fn default() -> MelScale {
        MelScale {
            n_mels: DEFAULT_N_MELS,
            f_min: 0.0,
            f_max: None,
            norm: MelNorm::None,
            scale: MelScaleKind::Htk,
        }
    }
}

impl MelScale {
    /// `n_mels` bands, HTK scale, no normalisation, 0 Hz to Nyquist.
    pub fn new(n_mels: usize) -> MelScale {
        MelScale {
            n_mels,
            ..MelScale::default()
        }
    }
    /// Sets the frequency range.
    pub fn f_range(mut self, f_min: f64, f_max: Option<f64>) -> Self {
        self.f_min = f_min;
        self.f_max = f_max;
        self
    }
    /// Sets the normalisation.
    pub fn norm(mut self, norm: MelNorm) -> Self {
        self.norm = norm;
        self
    }
    /// Sets the scale.
    pub fn scale(mut self, scale: MelScaleKind) -> Self {
        self.scale = scale;
        self
    }

    /// The filter matrix for `n_freqs` bins at `sample_rate`: `[n_freqs, n_mels]`.
    pub fn fbanks(&self, n_freqs: usize, sample_rate: u32) -> Result<Vec<f32>, Error> {
        let f_max = self.f_max.unwrap_or((sample_rate / 2) as f64);
        melscale_fbanks(
            n_freqs,
            self.f_min,
            f_max,
            self.n_mels,
            sample_rate,
            self.norm,
            self.scale,
        )
    }

    /// Each band's non-zero filter weights, `(bin, weight)` in bin order (each triangle
    /// covers a run of bins; the zeros elsewhere add nothing). Built once per setting and
    /// shape for the whole process: the filters cost far more to compute than to apply.
    fn bands(&self, n_freqs: usize, sample_rate: u32) -> Result<Arc<Bands>, Error> {
        type Key = (usize, u64, Option<u64>, usize, u32, MelNorm, MelScaleKind);
        static CACHE: Mutex<Vec<(Key, Arc<Bands>)>> = Mutex::new(Vec::new());
        let key = (
            n_freqs,
            self.f_min.to_bits(),
            self.f_max.map(f64::to_bits),
            self.n_mels,
            sample_rate,
            self.norm,
            self.scale,
        );
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, b)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(b.clone());
        }
        let fb = self.fbanks(n_freqs, sample_rate)?;
        let m_n = self.n_mels;
        let bands: Bands = (0..m_n)
            .map(|m| {
                (0..n_freqs)
                    .map(|k| (k, fb[k * m_n + m]))
                    .filter(|&(_, w)| w != 0.0)
                    .collect()
            })
            .collect();
        let bands = Arc::new(bands);
        if cache.len() >= MAX_CACHED_BANDS {
            cache.remove(0);
        }
        cache.push((key, bands.clone()));
        Ok(bands)
    }

    /// `[C, n_mels, T]` from an `f32` `[C, F, T]` (or `[F, T]`) spectrogram of audio at
    /// `sample_rate`.
    pub fn apply(&self, spec: &Tensor, sample_rate: u32) -> Result<Tensor, Error> {
        let (c, f, t) = match *spec.shape() {
            [c, f, t] => (c, f, t),
            [f, t] => (1, f, t),
            _ => {
                return Err(Error::operator(format!(
                    "mel_scale: expects a [C, F, T] spectrogram, got shape {:?}",
                    spec.shape()
                )))
            }
        };
        let data = spec.to_vec::<f32>().ok_or_else(|| {
            Error::operator(format!(
                "mel_scale: expects an f32 spectrogram, got {}",
                spec.dtype()
            ))
        })?;
        let out = self.project(&data, c, f, t, sample_rate)?;
        f32_tensor(vec![c, self.n_mels, t], &out)
    }

    /// `data` `[c, f, t]` to `[c, n_mels, t]`.
    fn project(
        &self,
        data: &[f32],
        c: usize,
        f: usize,
        t: usize,
        sample_rate: u32,
    ) -> Result<Vec<f32>, Error> {
        let bands = self.bands(f, sample_rate)?;
        let m_n = self.n_mels;
        let mut out = vec![0.0f32; c * m_n * t];
        for (m, bins) in bands.iter().enumerate() {
            for ch in 0..c {
                let dst = &mut out[(ch * m_n + m) * t..(ch * m_n + m + 1) * t];
                for &(k, w) in bins {
                    let src = &data[(ch * f + k) * t..(ch * f + k + 1) * t];
                    for (d, s) in dst.iter_mut().zip(src) {
                        *d += w * s;
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Mel spectrogram of a clip (operator `mel_spectrogram`), as
/// `torchaudio.transforms.MelSpectrogram(sample_rate, n_fft, win_length, hop_length, f_min,
/// f_max, n_mels=n_mels, power=power, norm=norm, mel_scale=scale)`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MelSpectrogram {
    /// The spectrogram (torchaudio: n_fft 400, power 2).
    pub spectrogram: Spectrogram,
    /// The mel projection.
    pub mel: MelScale,
}

impl Default for MelSpectrogram {
    /// torchaudio's defaults: [`DEFAULT_N_MELS`] bands over a power spectrogram of size
    /// [`DEFAULT_N_FFT`].
    fn default() -> MelSpectrogram {
        MelSpectrogram::new(DEFAULT_N_FFT, DEFAULT_N_MELS)
    }
}

impl MelSpectrogram {
    /// `n_mels` bands over a power spectrogram of size `n_fft`, torchaudio's defaults
    /// otherwise (`hop = n_fft / 2`, HTK, no normalisation).
    pub fn new(n_fft: usize, n_mels: usize) -> MelSpectrogram {
        MelSpectrogram {
            spectrogram: Spectrogram::new(n_fft),
            mel: MelScale::new(n_mels),
        }
    }
    /// Sets the hop.
    pub fn hop_length(mut self, h: usize) -> Self {
        self.spectrogram.stft.hop_length = Some(h);
        self
    }
    /// Sets the window length.
    pub fn win_length(mut self, w: usize) -> Self {
        self.spectrogram.stft.win_length = Some(w);
        self
    }

    /// `[C, n_mels, T]` from a clip.
    pub fn apply(&self, audio: &Audio) -> Result<Tensor, Error> {
        let (spec, c, f, t) = self
            .spectrogram
            .compute("mel_spectrogram", &audio.samples)?;
        let out = self.mel.project(&spec, c, f, t, audio.sample_rate)?;
        f32_tensor(vec![c, self.mel.n_mels, t], &out)
    }
}

/// What an [`AmplitudeToDb`] input holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SType {
    /// Squared magnitudes: `10 log10`.
    #[default]
    Power,
    /// Magnitudes: `20 log10`.
    Magnitude,
}

/// Decibels (operator `amplitude_to_db`), as `torchaudio.transforms.AmplitudeToDB(stype,
/// top_db)`: `m * log10(max(x, amin)) - m * log10(max(amin, ref))`, then, with `top_db`,
/// a floor at `max - top_db` where the maximum is over each item's last three axes (the
/// whole `[C, F, T]` clip, all channels together, as torchaudio does).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AmplitudeToDb {
    /// Power or magnitude input.
    pub stype: SType,
    /// Dynamic range kept below the maximum (torchaudio: none; librosa: 80).
    pub top_db: Option<f32>,
    /// Smallest value before the logarithm (1e-10).
    pub amin: f32,
    /// Reference value that becomes 0 dB (1).
    pub ref_value: f32,
}

impl Default for AmplitudeToDb {
    fn default() -> AmplitudeToDb {
        AmplitudeToDb {
            stype: SType::Power,
            top_db: None,
            amin: 1e-10,
            ref_value: 1.0,
        }
    }
}

impl AmplitudeToDb {
    /// Power to dB with an optional `top_db`.
    pub fn new(stype: SType, top_db: Option<f32>) -> AmplitudeToDb {
        AmplitudeToDb {
            stype,
            top_db,
            ..AmplitudeToDb::default()
        }
    }

    /// Converts an `f32` tensor of any shape.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor, Error> {
        const OP: &str = "amplitude_to_db";
        if self.amin.is_nan()
            || self.amin <= 0.0
            || self.ref_value.is_nan()
            || self.ref_value <= 0.0
        {
            return Err(Error::invalid(format!(
                "{OP}: amin and ref_value must be positive"
            )));
        }
        if let Some(t) = self.top_db {
            if t.is_nan() || t < 0.0 {
                return Err(Error::invalid(format!(
                    "{OP}: top_db must be >= 0, got {t}"
                )));
            }
        }
        if x.dtype() != DType::F32 {
            return Err(Error::operator(format!(
                "{OP}: expects an f32 tensor, got {}",
                x.dtype()
            )));
        }
        let mut v = x.to_vec::<f32>().unwrap_or_default();
        let mult = match self.stype {
            SType::Power => 10.0f32,
            SType::Magnitude => 20.0,
        };
        let offset = mult * self.amin.max(self.ref_value).log10();
        for e in v.iter_mut() {
            *e = mult * e.max(self.amin).log10() - offset;
        }
        if let Some(top) = self.top_db {
            let shape = x.shape();
            let group: usize = shape.iter().rev().take(3).product();
            if group > 0 {
                for chunk in v.chunks_mut(group) {
                    let max = chunk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let floor = max - top;
                    for e in chunk.iter_mut() {
                        *e = e.max(floor);
                    }
                }
            }
        }
        Tensor::new(
            DType::F32,
            x.shape().to_vec(),
            f32_tensor(vec![v.len()], &v)?.data().clone(),
        )
    }
}
