//! The audio operators of [`Builtin`]: each turns its spec arguments into a kernel of
//! `stoker_ops::audio` and applies it to one field of a sample.
//!
//! A decoded clip is an `f32` `[channels, frames]` tensor in its field, with its rate (Hz)
//! as an integer in `<field>_sample_rate`: `resample` updates the rate, `mel_scale` and
//! `mel_spectrogram` read it. Spectral operators replace the field with their output and
//! keep the rate next to it.

use std::sync::{Arc, OnceLock};

use stoker_core::{Error, Sample, Tensor, Value};
use stoker_ops::audio::{
    complex_power, AmplitudeToDb, Audio, DecodeAudio, FrequencyMasking, MelNorm, MelScale,
    MelScaleKind, MelSpectrogram, RandomTimeStretch, Resample, SType, Spectrogram, Stft,
    TimeMasking, TimeStretch,
};

use crate::column_ops::{cached, Shared};
use crate::ops::{Builtin, OpContext};

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

/// Whether `b` is one of this module's operators.
pub(crate) fn is_audio_op(b: &Builtin) -> bool {
    matches!(
        b,
        Builtin::DecodeAudio { .. }
            | Builtin::Resample { .. }
            | Builtin::Spectrogram { .. }
            | Builtin::Stft { .. }
            | Builtin::ComplexPower { .. }
            | Builtin::MelSpectrogram { .. }
            | Builtin::MelScale { .. }
            | Builtin::AmplitudeToDb { .. }
            | Builtin::TimeStretch { .. }
            | Builtin::TimeMasking { .. }
            | Builtin::FrequencyMasking { .. }
    )
}

/// The field holding `field`'s sample rate.
pub(crate) fn rate_field(field: &str) -> String {
    format!("{field}_sample_rate")
}

fn positive(op: &str, what: &str, v: Option<usize>) -> Result<(), Error> {
    if v == Some(0) {
        return Err(Error::invalid(format!("{op}: {what} must be at least 1")));
    }
    Ok(())
}

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
    let mut s = Stft::new(n_fft.unwrap_or(400));
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
    Ok(s.center(center.unwrap_or(true)))
}

fn power(op: &str, p: Option<f32>) -> Result<f32, Error> {
    let p = p.unwrap_or(2.0);
    if !(p > 0.0 && p.is_finite()) {
        return Err(Error::invalid(format!(
            "{op}: power must be positive, not {p}"
        )));
    }
    Ok(p)
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
    let scale = match scale.unwrap_or("htk") {
        "htk" => MelScaleKind::Htk,
        "slaney" => MelScaleKind::Slaney,
        m => {
            return Err(Error::invalid(format!(
                "{op}: mel_scale {m:?} is not htk or slaney"
            )))
        }
    };
    let norm = match norm {
        None => MelNorm::None,
        Some("slaney") => MelNorm::Slaney,
        Some(n) => {
            return Err(Error::invalid(format!(
                "{op}: norm {n:?} is not slaney (or absent)"
            )))
        }
    };
    let f_min = f_min.unwrap_or(0.0);
    if f_min.is_nan() || f_min < 0.0 || f_max.is_some_and(|m| m.is_nan() || m <= f_min) {
        return Err(Error::invalid(format!(
            "{op}: needs 0 <= f_min < f_max, got {f_min} and {f_max:?}"
        )));
    }
    Ok(MelScale::new(n_mels.unwrap_or(128))
        .f_range(f_min, f_max)
        .norm(norm)
        .scale(scale))
}

fn decoder(b: &Builtin) -> Result<DecodeAudio, Error> {
    let Builtin::DecodeAudio {
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
    let offset = offset_s.unwrap_or(0.0);
    if !(offset >= 0.0 && offset.is_finite()) {
        return Err(Error::invalid(format!(
            "decode_audio: offset_s must be >= 0, not {offset}"
        )));
    }
    if duration_s.is_some_and(|d| d.is_nan() || d <= 0.0) {
        return Err(Error::invalid(format!(
            "decode_audio: duration_s must be positive, not {duration_s:?}"
        )));
    }
    let mut d = DecodeAudio::default()
        .mono(*mono)
        .offset_s(offset)
        .duration_s(*duration_s)
        .max_bad_packets(*max_bad_packets)
        .allow_truncated(*allow_truncated)
        .hint(format.as_deref());
    if let Some(m) = max_samples {
        d = d.max_samples(*m);
    }
    Ok(d)
}

fn resampler(b: &Builtin) -> Result<Arc<Resample>, Error> {
    static CACHE: Shared<Resample> = OnceLock::new();
    let Builtin::Resample {
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

fn spectrogram(b: &Builtin) -> Result<Spectrogram, Error> {
    let Builtin::Spectrogram {
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
    let mut s = Spectrogram::new(400).power(power("spectrogram", *p)?);
    s.stft = stft("spectrogram", *n_fft, *win_length, *hop_length, *center)?;
    Ok(s)
}

fn mel_spectrogram(b: &Builtin) -> Result<MelSpectrogram, Error> {
    const OP: &str = "mel_spectrogram";
    let Builtin::MelSpectrogram {
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
    let mut m = MelSpectrogram::new(400, 128);
    m.spectrogram = Spectrogram::new(400).power(power(OP, *p)?);
    m.spectrogram.stft = stft(OP, *n_fft, *win_length, *hop_length, None)?;
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

fn to_db(b: &Builtin) -> Result<AmplitudeToDb, Error> {
    let Builtin::AmplitudeToDb { stype, top_db, .. } = b else {
        unreachable!("to_db() of an amplitude_to_db")
    };
    let stype = match stype.as_deref().unwrap_or("power") {
        "power" => SType::Power,
        "magnitude" => SType::Magnitude,
        s => {
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

/// Checks an audio operator's arguments before running.
pub(crate) fn validate(b: &Builtin) -> Result<(), Error> {
    match b {
        Builtin::DecodeAudio { .. } => decoder(b).map(drop),
        Builtin::Resample { .. } => resampler(b).map(drop),
        Builtin::Spectrogram { .. } => spectrogram(b).map(drop),
        Builtin::Stft {
            n_fft,
            win_length,
            hop_length,
            center,
            ..
        } => stft("stft", *n_fft, *win_length, *hop_length, *center).map(drop),
        Builtin::ComplexPower { power: p, .. } => power("complex_power", *p).map(drop),
        Builtin::MelSpectrogram { .. } => mel_spectrogram(b).map(drop),
        Builtin::MelScale {
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
        Builtin::AmplitudeToDb { .. } => to_db(b).map(drop),
        Builtin::TimeStretch {
            rate, hop_length, ..
        } => {
            positive("time_stretch", "hop_length", *hop_length)?;
            check_rate(rate)
        }
        Builtin::TimeMasking { p, .. } => mask_args("time_masking", *p),
        Builtin::FrequencyMasking { p, .. } => mask_args("frequency_masking", *p),
        _ => unreachable!("validate() of an audio operator"),
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

/// Applies an audio operator.
pub(crate) fn apply(b: &Builtin, mut s: Sample, ctx: &mut OpContext) -> Result<Sample, Error> {
    let (field, out): (&str, Tensor) = match b {
        Builtin::DecodeAudio {
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
        Builtin::Resample { field, .. } => {
            let audio = resampler(b)?.apply(&clip(&s, field, "resample")?)?;
            s.insert(rate_field(field), audio.sample_rate as i64);
            (field, audio.samples)
        }
        Builtin::Spectrogram { field, .. } => {
            let t = tensor_field(&s, field, "spectrogram", "a decoded clip")?;
            (field, spectrogram(b)?.apply(t)?)
        }
        Builtin::Stft {
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
        Builtin::ComplexPower { field, power: p } => {
            let t = tensor_field(&s, field, "complex_power", "a complex STFT")?;
            (field, complex_power(t, power("complex_power", *p)?)?)
        }
        Builtin::MelSpectrogram { field, .. } => {
            let audio = clip(&s, field, "mel_spectrogram")?;
            (field, mel_spectrogram(b)?.apply(&audio)?)
        }
        Builtin::MelScale {
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
        Builtin::AmplitudeToDb { field, .. } => {
            let t = tensor_field(&s, field, "amplitude_to_db", "a spectrogram")?;
            (field, to_db(b)?.apply(t)?)
        }
        Builtin::TimeStretch {
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
        Builtin::TimeMasking {
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
        Builtin::FrequencyMasking {
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
        _ => unreachable!("apply() of an audio operator"),
    };
    s.insert(field, out);
    Ok(s)
}
