//! Audio kernels: decode, resample, spectrograms, mel filterbanks, decibels, time stretch,
//! time and frequency masking.
//!
//! A clip is an [`Audio`]: an `f32` [`Tensor`] of shape `[channels, frames]` (planar,
//! channel-major) plus its sample rate. Integer PCM decodes to `[-1, 1)` (`x / 2^(bits-1)`,
//! unsigned 8-bit recentred first), float files come out as stored. A pipeline keeps the
//! tensor in the sample's field and the rate next to it as an `Int` in
//! `<field>_sample_rate`, so that a later resample or mel operator knows the rate of every
//! clip without decoding again.
//!
//! Spectral kernels take the `[C, N]` tensor and produce `[C, F, T]` (`F` frequency bins or
//! mel bands, `T` frames); the complex STFT is `[C, F, T, 2]` (real, imaginary last, as
//! `torch.view_as_real`). Masking works on any `[.., F, T]` tensor.
//!
//! Every kernel is a parameter struct with an `apply` method; random kernels also take the
//! pipeline's per-sample [`Rng`](stoker_core::rng::Rng). Bad data is an
//! [`Error::operator`](stoker_core::Error::operator) and bad parameters an
//! [`Error::invalid`](stoker_core::Error::invalid), both starting with the operator's name.
//! No kernel panics on bad input or spawns threads: the pipeline parallelises across
//! samples.
//!
//! # Parity with torchaudio
//!
//! The DSP follows `torchaudio.functional` step by step so that models trained on
//! torchaudio features see the same numbers: [`Resample`] builds torchaudio's polyphase
//! windowed-sinc kernel (same taps, same output length) and only skips the taps that are
//! exactly zero; [`Spectrogram`] is `torch.stft` with a periodic Hann window, centre
//! reflect padding and `|X|^power`; [`melscale_fbanks`] is torchaudio's triangular
//! filterbank (HTK or Slaney scale, optional Slaney area normalisation, which also matches
//! librosa's `filters.mel`); [`AmplitudeToDb`] is `amplitude_to_DB` including its
//! whole-clip `top_db` floor; [`TimeStretch`] is `phase_vocoder`; the masks draw the
//! width and start as `mask_along_axis` does, from our generator. Decoding uses
//! symphonia (pure Rust); `docs/ops.md` lists the measured differences against
//! libsndfile-decoded references and torchaudio outputs
//! (`tests/fixtures/audio/make_fixtures.py`).

use stoker_core::{DType, Error, Tensor};

mod augment;
mod decode;
mod fastmath;
mod headers;
mod resample;
mod spectral;
mod vocoder;

pub use augment::{FrequencyMasking, RandomTimeStretch, TimeMasking, TimeStretch};
pub use decode::{
    audio_info, decode_audio, AudioInfo, DecodeAudio, DecodeReport, DEFAULT_MAX_BAD_PACKETS,
    DEFAULT_MAX_SAMPLES,
};
pub use resample::{Resample, ResampleKernel};
pub use spectral::{
    complex_power, melscale_fbanks, AmplitudeToDb, MelNorm, MelScale, MelScaleKind, MelSpectrogram,
    SType, Spectrogram, Stft, DEFAULT_N_FFT, DEFAULT_N_MELS, DEFAULT_POWER,
};

/// A decoded clip: `samples` is `f32` `[channels, frames]`, `sample_rate` in Hz.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    /// `f32` samples, shape `[channels, frames]`.
    pub samples: Tensor,
    /// Frames per second.
    pub sample_rate: u32,
}

impl Audio {
    /// A clip from an `f32` `[C, N]` tensor (a 1-d tensor is taken as one channel).
    pub fn new(samples: Tensor, sample_rate: u32) -> Result<Audio, Error> {
        if sample_rate == 0 {
            return Err(Error::invalid("audio: sample rate must be positive"));
        }
        let samples = match (samples.dtype(), samples.shape()) {
            (DType::F32, [_, _]) => samples,
            (DType::F32, [n]) => {
                let n = *n;
                Tensor::new(DType::F32, vec![1, n], samples.data().clone())?
            }
            (d, s) => {
                return Err(Error::operator(format!(
                    "audio: expects an f32 [channels, frames] tensor, got {d} {s:?}"
                )))
            }
        };
        Ok(Audio {
            samples,
            sample_rate,
        })
    }

    /// A clip from planar channel buffers of equal length.
    pub fn from_channels(channels: &[Vec<f32>], sample_rate: u32) -> Result<Audio, Error> {
        let n = channels.first().map_or(0, Vec::len);
        if channels.iter().any(|c| c.len() != n) {
            return Err(Error::invalid("audio: channels have different lengths"));
        }
        let mut flat = Vec::with_capacity(n * channels.len());
        for c in channels {
            flat.extend_from_slice(c);
        }
        Audio::new(f32_tensor(vec![channels.len(), n], &flat)?, sample_rate)
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        self.samples.shape().first().copied().unwrap_or(0)
    }

    /// Number of frames (samples per channel).
    pub fn frames(&self) -> usize {
        self.samples.shape().get(1).copied().unwrap_or(0)
    }

    /// Length in seconds.
    pub fn duration_s(&self) -> f64 {
        self.frames() as f64 / self.sample_rate as f64
    }
}

/// An `f32` tensor of `shape` holding `values`.
pub(crate) fn f32_tensor(shape: Vec<usize>, values: &[f32]) -> Result<Tensor, Error> {
    Tensor::from_slice(shape, values)
}

/// The samples of an `f32` `[C, N]` (or `[N]`) tensor as `(data, C, N)`, or says why `op`
/// cannot take it.
pub(crate) fn waveform(t: &Tensor, op: &str) -> Result<(Vec<f32>, usize, usize), Error> {
    let (c, n) = match *t.shape() {
        [c, n] => (c, n),
        [n] => (1, n),
        _ => {
            return Err(Error::operator(format!(
                "{op}: expects a [channels, frames] waveform, got shape {:?}",
                t.shape()
            )))
        }
    };
    let data = t.to_vec::<f32>().ok_or_else(|| {
        Error::operator(format!(
            "{op}: expects an f32 waveform, got a {} tensor",
            t.dtype()
        ))
    })?;
    Ok((data, c, n))
}
