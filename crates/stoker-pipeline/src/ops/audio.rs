//! The audio operators of [`Builtin`](super::Builtin): each turns its spec arguments into
//! a kernel of `stoker_ops::audio` and applies it to one field of a sample.
//!
//! A decoded clip is an `f32` `[channels, frames]` tensor in its field, with its rate (Hz)
//! as an integer in `<field>_sample_rate`: `resample` updates the rate, `mel_scale` and
//! `mel_spectrogram` read it. Spectral operators replace the field with their output and
//! keep the rate next to it.
//!
//! A kernel starts from its own defaults (torchaudio's: `Stft::default`,
//! `MelScale::default`, `DecodeAudio::default`, ...) and takes only the arguments the spec
//! gives, so a default is written once, in `stoker_ops`. The resampler's polyphase kernel
//! is built once per distinct operator and shared (`cached` in `ops.rs`).

use std::sync::{Arc, OnceLock};

use stoker_core::{Error, OpMeta, Sample, Tensor, Value};
use stoker_ops::audio::{
    complex_power, AmplitudeToDb, Audio, DecodeAudio, FrequencyMasking, MelNorm, MelScale,
    MelScaleKind, MelSpectrogram, RandomTimeStretch, Resample, SType, Spectrogram, Stft,
    TimeMasking, TimeStretch, DEFAULT_POWER,
};

use super::{cached, OpContext, Shared};

/// A time-stretch rate: fixed, or `[low, high]` drawn uniformly per sample.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum Rate {
    /// One rate for every sample.
    Fixed(f64),
    /// A rate drawn per sample.
    Range([f64; 2]),
}

impl Rate {
    /// Whether the rate is drawn per sample.
    pub fn is_random(&self) -> bool {
        matches!(self, Rate::Range(_))
    }
}

/// `time_masking`'s `p` when the spec gives none: the kernel's.
fn time_mask_p() -> f64 {
    TimeMasking::new(1).p
}

/// `frequency_masking`'s `p` when the spec gives none: the kernel's.
fn frequency_mask_p() -> f64 {
    FrequencyMasking::new(1).p
}

/// The audio operators a spec can name, with their arguments (one modality of
/// [`Builtin`](super::Builtin)).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum AudioOp {
    /// Decodes WAV, FLAC, MP3 or Ogg Vorbis bytes in `field` into an `f32` `[channels,
    /// frames]` tensor in `[-1, 1)`, and puts the rate (Hz) in `<field>_sample_rate`.
    DecodeAudio {
        /// The field (encoded audio bytes).
        field: String,
        /// Average the channels into one.
        #[serde(default)]
        mono: bool,
        /// Start this many seconds in.
        #[serde(default)]
        offset_s: Option<f64>,
        /// Decode at most this many seconds.
        #[serde(default)]
        duration_s: Option<f64>,
        /// Refuse streams with more samples (channels x frames) than this (default 2^27).
        #[serde(default)]
        max_samples: Option<u64>,
        /// Corrupt packets replaced by silence before the record is an error (default 0:
        /// any corrupt packet is an error). When above 0, the count of repaired packets is
        /// put in `<field>_bad_packets`.
        #[serde(default)]
        max_bad_packets: u32,
        /// Accept a stream that ends before its header says (default false: an error).
        #[serde(default)]
        allow_truncated: bool,
        /// A format hint (`mp3`, `wav`, `flac`, `ogg`); the content decides in the end.
        #[serde(default)]
        format: Option<String>,
    },
    /// Resamples the clip in `field` to `rate` Hz (torchaudio's windowed sinc).
    Resample {
        /// The field (a decoded clip).
        field: String,
        /// Target rate, Hz.
        rate: u32,
        /// Zero crossings of the sinc per side (default 6).
        #[serde(default)]
        lowpass_filter_width: Option<u32>,
        /// Cutoff as a fraction of the lower Nyquist rate (default 0.99).
        #[serde(default)]
        rolloff: Option<f64>,
    },
    /// `|STFT|^power` of the clip in `field`: `f32` `[C, n_fft/2 + 1, frames]`.
    Spectrogram {
        /// The field (a decoded clip).
        field: String,
        /// FFT size (default 400).
        #[serde(default)]
        n_fft: Option<usize>,
        /// Window length (default `n_fft`).
        #[serde(default)]
        win_length: Option<usize>,
        /// Hop (default `win_length / 2`).
        #[serde(default)]
        hop_length: Option<usize>,
        /// Reflect-pad by half a window at both ends (default true).
        #[serde(default)]
        center: Option<bool>,
        /// Exponent of the magnitude (default 2).
        #[serde(default)]
        power: Option<f32>,
    },
    /// The complex STFT of the clip in `field`: `f32` `[C, n_fft/2 + 1, frames, 2]`
    /// (real, imaginary), the input of `time_stretch`.
    Stft {
        /// The field (a decoded clip).
        field: String,
        /// FFT size (default 400).
        #[serde(default)]
        n_fft: Option<usize>,
        /// Window length (default `n_fft`).
        #[serde(default)]
        win_length: Option<usize>,
        /// Hop (default `win_length / 2`).
        #[serde(default)]
        hop_length: Option<usize>,
        /// Reflect-pad by half a window at both ends (default true).
        #[serde(default)]
        center: Option<bool>,
    },
    /// `|X|^power` of a complex STFT (`[.., 2]` last axis) in `field`.
    ComplexPower {
        /// The field (a complex STFT).
        field: String,
        /// Exponent (default 2).
        #[serde(default)]
        power: Option<f32>,
    },
    /// Mel spectrogram of the clip in `field`: `f32` `[C, n_mels, frames]`.
    MelSpectrogram {
        /// The field (a decoded clip).
        field: String,
        /// FFT size (default 400).
        #[serde(default)]
        n_fft: Option<usize>,
        /// Window length (default `n_fft`).
        #[serde(default)]
        win_length: Option<usize>,
        /// Hop (default `win_length / 2`).
        #[serde(default)]
        hop_length: Option<usize>,
        /// Exponent of the magnitude (default 2).
        #[serde(default)]
        power: Option<f32>,
        /// Mel bands (default 128).
        #[serde(default)]
        n_mels: Option<usize>,
        /// Lowest frequency (default 0).
        #[serde(default)]
        f_min: Option<f64>,
        /// Highest frequency (default half the sample rate).
        #[serde(default)]
        f_max: Option<f64>,
        /// `htk` (default) or `slaney`.
        #[serde(default)]
        mel_scale: Option<String>,
        /// `slaney` area normalisation (default none).
        #[serde(default)]
        norm: Option<String>,
    },
    /// Mel projection of the spectrogram in `field` (rate from `<field>_sample_rate`).
    MelScale {
        /// The field (a `[C, F, T]` spectrogram).
        field: String,
        /// Mel bands (default 128).
        #[serde(default)]
        n_mels: Option<usize>,
        /// Lowest frequency (default 0).
        #[serde(default)]
        f_min: Option<f64>,
        /// Highest frequency (default half the sample rate).
        #[serde(default)]
        f_max: Option<f64>,
        /// `htk` (default) or `slaney`.
        #[serde(default)]
        mel_scale: Option<String>,
        /// `slaney` area normalisation (default none).
        #[serde(default)]
        norm: Option<String>,
    },
    /// Decibels of the (power or magnitude) spectrogram in `field`.
    AmplitudeToDb {
        /// The field.
        field: String,
        /// `power` (default) or `magnitude`.
        #[serde(default)]
        stype: Option<String>,
        /// Floor at the maximum minus this many dB (default none).
        #[serde(default)]
        top_db: Option<f32>,
    },
    /// Phase-vocoder time stretch of the complex STFT in `field` by `rate`: one number, or
    /// `[low, high]` for a rate drawn uniformly per sample.
    TimeStretch {
        /// The field (a complex STFT from `stft`).
        field: String,
        /// The rate (> 1 speeds up), or a range.
        rate: Rate,
        /// The STFT's hop (default `n_fft / 2`, from the bins).
        #[serde(default)]
        hop_length: Option<usize>,
    },
    /// SpecAugment time mask on the spectrogram in `field`.
    TimeMasking {
        /// The field.
        field: String,
        /// Widths are drawn in `[0, mask_param)`.
        mask_param: usize,
        /// Largest fraction of the axis masked (default 1).
        #[serde(default = "time_mask_p")]
        p: f64,
        /// A separate mask per channel (default false).
        #[serde(default)]
        iid_channels: bool,
        /// Fill value (default 0).
        #[serde(default)]
        mask_value: f32,
    },
    /// SpecAugment frequency mask on the spectrogram in `field`.
    FrequencyMasking {
        /// The field.
        field: String,
        /// Widths are drawn in `[0, mask_param)`.
        mask_param: usize,
        /// Largest fraction of the axis masked (default 1).
        #[serde(default = "frequency_mask_p")]
        p: f64,
        /// A separate mask per channel (default false).
        #[serde(default)]
        iid_channels: bool,
        /// Fill value (default 0).
        #[serde(default)]
        mask_value: f32,
    },
}

impl AudioOp {
    /// The operators' names in a spec (their `op`), in the order of the variants.
    pub const NAMES: &'static [&'static str] = &[
        "decode_audio",
        "resample",
        "spectrogram",
        "stft",
        "complex_power",
        "mel_spectrogram",
        "mel_scale",
        "amplitude_to_db",
        "time_stretch",
        "time_masking",
        "frequency_masking",
    ];

    /// The operator's name in plans and errors.
    pub fn name(&self) -> String {
        match self {
            AudioOp::DecodeAudio { field, .. } => format!("decode_audio({field})"),
            AudioOp::Resample { field, .. } => format!("resample({field})"),
            AudioOp::Spectrogram { field, .. } => format!("spectrogram({field})"),
            AudioOp::Stft { field, .. } => format!("stft({field})"),
            AudioOp::ComplexPower { field, .. } => format!("complex_power({field})"),
            AudioOp::MelSpectrogram { field, .. } => format!("mel_spectrogram({field})"),
            AudioOp::MelScale { field, .. } => format!("mel_scale({field})"),
            AudioOp::AmplitudeToDb { field, .. } => format!("amplitude_to_db({field})"),
            AudioOp::TimeStretch { field, .. } => format!("time_stretch({field})"),
            AudioOp::TimeMasking { field, .. } => format!("time_masking({field})"),
            AudioOp::FrequencyMasking { field, .. } => format!("frequency_masking({field})"),
        }
    }

    /// The operator's declaration for the optimizer.
    pub(crate) fn meta(&self) -> OpMeta {
        let m = OpMeta::new(self.name());
        match self {
            AudioOp::TimeStretch { rate, .. } if rate.is_random() => {
                m.random().with_cost_ns(5_000_000.0)
            }
            AudioOp::TimeMasking { .. } | AudioOp::FrequencyMasking { .. } => {
                m.random().with_cost_ns(200_000.0)
            }
            _ => m.with_cost_ns(2_000_000.0),
        }
    }

    /// Checks the operator's arguments before running.
    pub fn validate(&self) -> Result<(), Error> {
        let b = self;
        match b {
            AudioOp::DecodeAudio { .. } => decoder(b).map(drop),
            AudioOp::Resample { .. } => resampler(b).map(drop),
            AudioOp::Spectrogram { .. } => spectrogram(b).map(drop),
            AudioOp::Stft {
                n_fft,
                win_length,
                hop_length,
                center,
                ..
            } => stft("stft", *n_fft, *win_length, *hop_length, *center).map(drop),
            AudioOp::ComplexPower { power: p, .. } => power("complex_power", *p).map(drop),
            AudioOp::MelSpectrogram { .. } => mel_spectrogram(b).map(drop),
            AudioOp::MelScale {
                n_mels,
                f_min,
                f_max,
                mel_scale,
                norm,
                ..
            } => mel(
                "mel_scale",
                *n_mels,
                *f_min,
                *f_max,
                mel_scale.as_deref(),
                norm.as_deref(),
            )
            .map(drop),
            AudioOp::AmplitudeToDb { .. } => to_db(b).map(drop),
            AudioOp::TimeStretch {
                rate, hop_length, ..
            } => {
                positive("time_stretch", "hop_length", *hop_length)?;
                check_rate(rate)
            }
            AudioOp::TimeMasking { p, .. } => mask_args("time_masking", *p),
            AudioOp::FrequencyMasking { p, .. } => mask_args("frequency_masking", *p),
        }
    }

    /// Applies the operator to one sample.
    pub(crate) fn apply(&self, mut s: Sample, ctx: &mut OpContext) -> Result<Sample, Error> {
        let b = self;
        let (field, out): (&str, Tensor) = match b {
            AudioOp::DecodeAudio {
                field,
                max_bad_packets,
                ..
            } => {
                let data = match s.require(field)? {
                    Value::Bytes(b) => b.clone(),
                    other => {
                        return Err(Error::operator(format!(
                            "decode_audio: field {field:?} is {}, not encoded audio bytes",
                            other.kind()
                        )))
                    }
                };
                let (audio, report) = decoder(b)?.apply_with_report(&data)?;
                s.insert(rate_field(field), audio.sample_rate as i64);
                if *max_bad_packets > 0 {
                    s.insert(format!("{field}_bad_packets"), report.bad_packets as i64);
                }
                (field, audio.samples)
            }
            AudioOp::Resample { field, .. } => {
                let audio = resampler(b)?.apply(&clip(&s, field, "resample")?)?;
                s.insert(rate_field(field), audio.sample_rate as i64);
                (field, audio.samples)
            }
            AudioOp::Spectrogram { field, .. } => {
                let t = tensor_field(&s, field, "spectrogram", "a decoded clip")?;
                (field, spectrogram(b)?.apply(t)?)
            }
            AudioOp::Stft {
                field,
                n_fft,
                win_length,
                hop_length,
                center,
            } => {
                let t = tensor_field(&s, field, "stft", "a decoded clip")?;
                let k = stft("stft", *n_fft, *win_length, *hop_length, *center)?;
                (field, k.apply(t)?)
            }
            AudioOp::ComplexPower { field, power: p } => {
                let t = tensor_field(&s, field, "complex_power", "a complex STFT")?;
                let p = power("complex_power", *p)?.unwrap_or(DEFAULT_POWER);
                (field, complex_power(t, p)?)
            }
            AudioOp::MelSpectrogram { field, .. } => {
                let audio = clip(&s, field, "mel_spectrogram")?;
                (field, mel_spectrogram(b)?.apply(&audio)?)
            }
            AudioOp::MelScale {
                field,
                n_mels,
                f_min,
                f_max,
                mel_scale,
                norm,
            } => {
                let rate = sample_rate(&s, field, "mel_scale")?;
                let t = tensor_field(&s, field, "mel_scale", "a spectrogram")?;
                let k = mel(
                    "mel_scale",
                    *n_mels,
                    *f_min,
                    *f_max,
                    mel_scale.as_deref(),
                    norm.as_deref(),
                )?;
                (field, k.apply(t, rate)?)
            }
            AudioOp::AmplitudeToDb { field, .. } => {
                let t = tensor_field(&s, field, "amplitude_to_db", "a spectrogram")?;
                (field, to_db(b)?.apply(t)?)
            }
            AudioOp::TimeStretch {
                field,
                rate,
                hop_length,
            } => {
                check_rate(rate)?;
                let t = tensor_field(&s, field, "time_stretch", "a complex STFT (stft first)")?;
                // The bins come from the STFT itself: [.., F, T, 2].
                let shape = t.shape();
                let n_freq = if shape.len() >= 3 {
                    shape[shape.len() - 3]
                } else {
                    0
                };
                let out = match *rate {
                    Rate::Fixed(r) => {
                        let mut k = TimeStretch::new(n_freq);
                        if let Some(h) = hop_length {
                            k = k.hop_length(*h);
                        }
                        k.apply(t, r)?
                    }
                    Rate::Range([lo, hi]) => {
                        let mut k = RandomTimeStretch::new(n_freq, (lo, hi));
                        if let Some(h) = hop_length {
                            k = k.hop_length(*h);
                        }
                        k.apply(t, ctx.rng())?
                    }
                };
                (field, out)
            }
            AudioOp::TimeMasking {
                field,
                mask_param,
                p,
                iid_channels,
                mask_value,
            } => {
                let t = tensor_field(&s, field, "time_masking", "a spectrogram")?;
                let k = TimeMasking::new(*mask_param)
                    .p(*p)
                    .iid_channels(*iid_channels)
                    .mask_value(*mask_value);
                (field, k.apply(t, ctx.rng())?)
            }
            AudioOp::FrequencyMasking {
                field,
                mask_param,
                p,
                iid_channels,
                mask_value,
            } => {
                let t = tensor_field(&s, field, "frequency_masking", "a spectrogram")?;
                let k = FrequencyMasking::new(*mask_param)
                    .p(*p)
                    .iid_channels(*iid_channels)
                    .mask_value(*mask_value);
                (field, k.apply(t, ctx.rng())?)
            }
        };
        s.insert(field, out);
        Ok(s)
    }
}

/// The field holding `field`'s sample rate.
fn rate_field(field: &str) -> String {
    format!("{field}_sample_rate")
}

fn positive(op: &str, what: &str, v: Option<usize>) -> Result<(), Error> {
    if v == Some(0) {
        return Err(Error::invalid(format!("{op}: {what} must be at least 1")));
    }
    Ok(())
}

/// The STFT of `op`: the kernel's defaults (torchaudio's), with what the spec gives.
fn stft(
    op: &str,
    n_fft: Option<usize>,
    win: Option<usize>,
    hop: Option<usize>,
    center: Option<bool>,
) -> Result<Stft, Error> {
    positive(op, "n_fft", n_fft)?;
    positive(op, "win_length", win)?;
    positive(op, "hop_length", hop)?;
    let mut s = n_fft.map_or_else(Stft::default, Stft::new);
    if let Some(w) = win {
        if w > s.n_fft {
            return Err(Error::invalid(format!(
                "{op}: win_length {w} is larger than n_fft {}",
                s.n_fft
            )));
        }
        s = s.win_length(w);
    }
    if let Some(h) = hop {
        s = s.hop_length(h);
    }
    if let Some(c) = center {
        s = s.center(c);
    }
    Ok(s)
}

/// The spec's exponent of a magnitude, checked (`None`: the kernel's default).
fn power(op: &str, p: Option<f32>) -> Result<Option<f32>, Error> {
    match p {
        Some(p) if !(p > 0.0 && p.is_finite()) => Err(Error::invalid(format!(
            "{op}: power must be positive, not {p}"
        ))),
        p => Ok(p),
    }
}

/// The power spectrogram of `op`: the kernel's defaults, with what the spec gives.
fn power_spectrogram(
    op: &str,
    p: Option<f32>,
    n_fft: Option<usize>,
    win: Option<usize>,
    hop: Option<usize>,
    center: Option<bool>,
) -> Result<Spectrogram, Error> {
    let p = power(op, p)?;
    let mut s = Spectrogram::default();
    if let Some(p) = p {
        s = s.power(p);
    }
    s.stft = stft(op, n_fft, win, hop, center)?;
    Ok(s)
}

fn mel(
    op: &str,
    n_mels: Option<usize>,
    f_min: Option<f64>,
    f_max: Option<f64>,
    scale: Option<&str>,
    norm: Option<&str>,
) -> Result<MelScale, Error> {
    positive(op, "n_mels", n_mels)?;
    let mut m = n_mels.map_or_else(MelScale::default, MelScale::new);
    if let Some(s) = scale {
        m = m.scale(match s {
            "htk" => MelScaleKind::Htk,
            "slaney" => MelScaleKind::Slaney,
            s => {
                return Err(Error::invalid(format!(
                    "{op}: mel_scale {s:?} is not htk or slaney"
                )))
            }
        });
    }
    if let Some(n) = norm {
        m = m.norm(match n {
            "slaney" => MelNorm::Slaney,
            n => {
                return Err(Error::invalid(format!(
                    "{op}: norm {n:?} is not slaney (or absent)"
                )))
            }
        });
    }
    let (f_min, f_max) = (f_min.unwrap_or(m.f_min), f_max.or(m.f_max));
    if f_min.is_nan() || f_min < 0.0 || f_max.is_some_and(|m| m.is_nan() || m <= f_min) {
        return Err(Error::invalid(format!(
            "{op}: needs 0 <= f_min < f_max, got {f_min} and {f_max:?}"
        )));
    }
    Ok(m.f_range(f_min, f_max))
}

fn decoder(b: &AudioOp) -> Result<DecodeAudio, Error> {
    let AudioOp::DecodeAudio {
        mono,
        offset_s,
        duration_s,
        max_samples,
        max_bad_packets,
        allow_truncated,
        format,
        ..
    } = b
    else {
        unreachable!("decoder() of a decode_audio")
    };
    if let Some(offset) = *offset_s {
        if !(offset >= 0.0 && offset.is_finite()) {
            return Err(Error::invalid(format!(
                "decode_audio: offset_s must be >= 0, not {offset}"
            )));
        }
    }
    if duration_s.is_some_and(|d| d.is_nan() || d <= 0.0) {
        return Err(Error::invalid(format!(
            "decode_audio: duration_s must be positive, not {duration_s:?}"
        )));
    }
    let mut d = DecodeAudio::default()
        .mono(*mono)
        .duration_s(*duration_s)
        .max_bad_packets(*max_bad_packets)
        .allow_truncated(*allow_truncated)
        .hint(format.as_deref());
    if let Some(o) = offset_s {
        d = d.offset_s(*o);
    }
    if let Some(m) = max_samples {
        d = d.max_samples(*m);
    }
    Ok(d)
}

fn resampler(b: &AudioOp) -> Result<Arc<Resample>, Error> {
    static CACHE: Shared<Resample> = OnceLock::new();
    let AudioOp::Resample {
        rate,
        lowpass_filter_width,
        rolloff,
        ..
    } = b
    else {
        unreachable!("resampler() of a resample")
    };
    cached(&CACHE, b, || {
        if *rate == 0 {
            return Err(Error::invalid("resample: rate must be positive"));
        }
        let mut r = Resample::new(*rate);
        if let Some(w) = lowpass_filter_width {
            if *w == 0 {
                return Err(Error::invalid(
                    "resample: lowpass_filter_width must be at least 1",
                ));
            }
            r = r.lowpass_filter_width(*w);
        }
        if let Some(f) = rolloff {
            if !(*f > 0.0 && *f <= 1.0) {
                return Err(Error::invalid(format!(
                    "resample: rolloff must be in (0, 1], not {f}"
                )));
            }
            r = r.rolloff(*f);
        }
        Ok(r)
    })
}

fn spectrogram(b: &AudioOp) -> Result<Spectrogram, Error> {
    let AudioOp::Spectrogram {
        n_fft,
        win_length,
        hop_length,
        center,
        power: p,
        ..
    } = b
    else {
        unreachable!("spectrogram() of a spectrogram")
    };
    power_spectrogram("spectrogram", *p, *n_fft, *win_length, *hop_length, *center)
}

fn mel_spectrogram(b: &AudioOp) -> Result<MelSpectrogram, Error> {
    const OP: &str = "mel_spectrogram";
    let AudioOp::MelSpectrogram {
        n_fft,
        win_length,
        hop_length,
        power: p,
        n_mels,
        f_min,
        f_max,
        mel_scale,
        norm,
        ..
    } = b
    else {
        unreachable!("mel_spectrogram() of a mel_spectrogram")
    };
    let mut m = MelSpectrogram::default();
    m.spectrogram = power_spectrogram(OP, *p, *n_fft, *win_length, *hop_length, None)?;
    m.mel = mel(
        OP,
        *n_mels,
        *f_min,
        *f_max,
        mel_scale.as_deref(),
        norm.as_deref(),
    )?;
    Ok(m)
}

fn to_db(b: &AudioOp) -> Result<AmplitudeToDb, Error> {
    let AudioOp::AmplitudeToDb { stype, top_db, .. } = b else {
        unreachable!("to_db() of an amplitude_to_db")
    };
    let stype = match stype.as_deref() {
        None => SType::default(),
        Some("power") => SType::Power,
        Some("magnitude") => SType::Magnitude,
        Some(s) => {
            return Err(Error::invalid(format!(
                "amplitude_to_db: stype {s:?} is not power or magnitude"
            )))
        }
    };
    if top_db.is_some_and(|t| t.is_nan() || t < 0.0) {
        return Err(Error::invalid(format!(
            "amplitude_to_db: top_db must be >= 0, not {top_db:?}"
        )));
    }
    Ok(AmplitudeToDb::new(stype, *top_db))
}
fn check_rate(r: &Rate) -> Result<(), Error> {
    let ok = match *r {
        Rate::Fixed(x) => x > 0.0 && x.is_finite(),
        Rate::Range([lo, hi]) => lo > 0.0 && lo <= hi && hi.is_finite(),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "time_stretch: rate must be positive (a range as 0 < low <= high), not {r:?}"
        )))
    }
}

fn mask_args(op: &str, p: f64) -> Result<(), Error> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{op}: p must be in [0, 1], not {p}"
        )))
    }
}

fn tensor_field<'a>(s: &'a Sample, field: &str, op: &str, what: &str) -> Result<&'a Tensor, Error> {
    match s.require(field)? {
        Value::Tensor(t) => Ok(t),
        other => Err(Error::operator(format!(
            "{op}: field {field:?} is {}, not {what}",
            other.kind()
        ))),
    }
}

fn sample_rate(s: &Sample, field: &str, op: &str) -> Result<u32, Error> {
    let rf = rate_field(field);
    match s.get(&rf) {
        Some(Value::Int(r)) if *r > 0 && *r <= u32::MAX as i64 => Ok(*r as u32),
        Some(other) => Err(Error::operator(format!(
            "{op}: field {rf:?} is {}, not a positive sample rate",
            other.kind()
        ))),
        None => Err(Error::operator(format!(
            "{op}: no field {rf:?} with the sample rate of {field:?} (decode_audio puts it there)"
        ))),
    }
}

/// The clip in `field` with its rate.
fn clip(s: &Sample, field: &str, op: &str) -> Result<Audio, Error> {
    let t = tensor_field(s, field, op, "a decoded clip (decode_audio first)")?;
    Audio::new(t.clone(), sample_rate(s, field, op)?)
        .map_err(|e| Error::operator(format!("{op}: field {field:?}: {}", e.message)))
}
