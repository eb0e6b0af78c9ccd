//! Decoding WAV, FLAC, MP3 and Ogg Vorbis with symphonia.
//!
//! Policies for bad files (each tested in `tests/audio_decode.rs`):
//!
//! - **Corrupt packets** (a frame whose CRC or bitstream is bad) are skipped, replaced by
//!   silence of the packet's duration so that later audio keeps its timing, and counted in
//!   [`DecodeReport::bad_packets`]; more than [`DecodeAudio::max_bad_packets`] of them is an
//!   error. This is what ffmpeg (torchaudio's backend) and libsndfile/mpg123 do: a player
//!   keeps going after a damaged frame.
//! - **Truncated files** (the data ends before the header says) decode to the frames that
//!   are there, like libsndfile; [`DecodeReport::truncated`] says so, and
//!   `allow_truncated(false)` makes it an error.
//! - **Empty streams** (a valid header and no frames) give `[C, 0]`; bytes that are no
//!   known format are an error.
//! - **Bombs**: the header's length (channels x frames) is checked against
//!   [`DecodeAudio::max_samples`] before any sample is decoded, and the running total is
//!   checked again while decoding (for formats without a length, or headers that lie).

use std::io::Cursor;

use stoker_core::Error;
use symphonia::core::audio::{AudioBufferRef, SampleBuffer};
use symphonia::core::codecs::{
    DecoderOptions, CODEC_TYPE_MP1, CODEC_TYPE_MP2, CODEC_TYPE_MP3, CODEC_TYPE_NULL,
    CODEC_TYPE_VORBIS,
};
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::{FormatOptions, FormatReader, SeekMode, SeekTo};
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions, ReadBytes};
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Instantiate;
use symphonia::core::units::{Time, TimeBase};

use super::headers::{check_container, check_metadata, check_riff};
use super::{f32_tensor, Audio};

/// Default [`DecodeAudio::max_samples`]: 2^27 samples (512 MiB of f32; 23 minutes of
/// 48 kHz stereo).
pub const DEFAULT_MAX_SAMPLES: u64 = 1 << 27;

/// Default [`DecodeAudio::max_bad_packets`].
pub const DEFAULT_MAX_BAD_PACKETS: u32 = 16;

/// Options of the audio decoder (operator `decode_audio`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DecodeAudio {
    /// Average the channels into one (`waveform.mean(0, keepdim=True)`).
    pub mono: bool,
    /// Start this many seconds into the stream (seeking where the format allows).
    pub offset_s: f64,
    /// Decode at most this many seconds (stops decoding there).
    pub duration_s: Option<f64>,
    /// Refuse streams with more samples (channels x frames) than this.
    pub max_samples: u64,
    /// Skip up to this many corrupt packets (as silence); one more is an error.
    pub max_bad_packets: u32,
    /// Accept a stream that ends before its header says (default true).
    pub allow_truncated: bool,
    /// A file extension (`"mp3"`, `"wav"`, ...) to help format detection; the content
    /// decides in the end.
    pub hint: Option<String>,
}

impl Default for DecodeAudio {
    fn default() -> DecodeAudio {
        DecodeAudio {
            mono: false,
            offset_s: 0.0,
            duration_s: None,
            max_samples: DEFAULT_MAX_SAMPLES,
            max_bad_packets: DEFAULT_MAX_BAD_PACKETS,
            allow_truncated: true,
            hint: None,
        }
    }
}

impl DecodeAudio {
    /// Downmix to one channel.
    pub fn mono(mut self, mono: bool) -> Self {
        self.mono = mono;
        self
    }
    /// Start `s` seconds in.
    pub fn offset_s(mut self, s: f64) -> Self {
        self.offset_s = s;
        self
    }
    /// Decode at most `s` seconds.
    pub fn duration_s(mut self, s: Option<f64>) -> Self {
        self.duration_s = s;
        self
    }
    /// The sample limit.
    pub fn max_samples(mut self, n: u64) -> Self {
        self.max_samples = n;
        self
    }
    /// The corrupt-packet allowance.
    pub fn max_bad_packets(mut self, n: u32) -> Self {
        self.max_bad_packets = n;
        self
    }
    /// Whether a truncated stream is accepted.
    pub fn allow_truncated(mut self, yes: bool) -> Self {
        self.allow_truncated = yes;
        self
    }
    /// A file-extension hint. Kept for specs that give one; the decoder finds the format
    /// by its markers (symphonia 0.5's probe does not read hints), so it changes nothing.
    pub fn hint(mut self, ext: Option<&str>) -> Self {
        self.hint = ext.map(str::to_owned);
        self
    }

    /// Decodes `bytes`.
    pub fn apply(&self, bytes: &[u8]) -> Result<Audio, Error> {
        self.apply_with_report(bytes).map(|(a, _)| a)
    }

    /// Decodes `bytes` and says what was repaired on the way.
    pub fn apply_with_report(&self, bytes: &[u8]) -> Result<(Audio, DecodeReport), Error> {
        guarded(|| decode(bytes, self))
    }
}

/// What [`DecodeAudio::apply_with_report`] had to repair.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DecodeReport {
    /// Corrupt packets replaced by silence.
    pub bad_packets: u32,
    /// The stream ended before the length its header gives.
    pub truncated: bool,
}

/// What a header says about a stream ([`audio_info`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AudioInfo {
    /// Codec name (`"pcm_s16le"`, `"flac"`, `"mp3"`, `"vorbis"`, ...).
    pub codec: String,
    /// Frames per second.
    pub sample_rate: u32,
    /// Channels, when the header says.
    pub channels: Option<usize>,
    /// Frames, when the header says.
    pub frames: Option<u64>,
}

/// Decodes `bytes` with `opts` (see [`DecodeAudio`]).
pub fn decode_audio(bytes: &[u8], opts: &DecodeAudio) -> Result<Audio, Error> {
    opts.apply(bytes)
}

/// Reads the header of `bytes` without decoding any sample.
pub fn audio_info(bytes: &[u8]) -> Result<AudioInfo, Error> {
    guarded(|| info(bytes))
}

fn info(bytes: &[u8]) -> Result<AudioInfo, Error> {
    let (reader, track) = open(bytes)?;
    drop(reader);
    let p = &track.params;
    Ok(AudioInfo {
        codec: symphonia::default::get_codecs()
            .get_codec(p.codec)
            .map_or_else(|| "unknown".to_owned(), |d| d.short_name.to_owned()),
        sample_rate: track.sample_rate,
        channels: p.channels.map(|c| c.count()),
        frames: p.n_frames,
    })
}

pub(super) const OP: &str = "decode_audio";

/// Frames decoded before the requested offset when a lossy stream seeks (two 2048-sample
/// Vorbis blocks; more than three MP3 frames).
const PREROLL_FRAMES: u64 = 4096;

struct TrackInfo {
    id: u32,
    sample_rate: u32,
    params: symphonia::core::codecs::CodecParameters,
}

fn sym_err(e: SymError) -> Error {
    Error::operator(format!("{OP}: {e}"))
}

/// Runs `f`, turning a panic into an error: symphonia panics on some malformed streams
/// (a WAV header with a sample rate of 0 panicked in its `TimeBase::new`, found by
/// `fuzz/audio`); [`check_riff`] refuses the ones known, and this keeps any other from
/// taking down the worker. The fuzz target lets panics inside symphonia unwind to here.
fn guarded<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::operator(format!(
            "{OP}: malformed stream (the decoder failed: {})",
            stoker_core::panic_message(&*p)
        )))
    })
}

fn open(bytes: &[u8]) -> Result<(Box<dyn FormatReader>, TrackInfo), Error> {
    if bytes.is_empty() {
        return Err(Error::operator(format!("{OP}: empty input")));
    }
    check_riff(bytes)?;
    let mut mss = MediaSourceStream::new(
        Box::new(Cursor::new(bytes.to_vec())),
        MediaSourceStreamOptions::default(),
    );
    let fmt_opts = FormatOptions {
        enable_gapless: true,
        ..FormatOptions::default()
    };
    let probe_err = |e| match e {
        SymError::Unsupported(_) => {
            Error::operator(format!("{OP}: not a WAV, FLAC, MP3 or Ogg Vorbis stream"))
        }
        SymError::IoError(_) => Error::operator(format!("{OP}: truncated header")),
        e => sym_err(e),
    };
    // What symphonia's `Probe::format` does (find a marker, read any metadata before the
    // container, make the container's reader), with the header checks of `headers.rs` run on
    // each structure at the offset where the probe found it.
    let probe = symphonia::default::get_probe();
    let reader = loop {
        match probe.next(&mut mss).map_err(probe_err)? {
            Instantiate::Format(make) => {
                check_container(bytes, mss.pos() as usize)?;
                break make(mss, &fmt_opts).map_err(probe_err)?;
            }
            Instantiate::Metadata(make) => {
                check_metadata(bytes, mss.pos() as usize)?;
                make(&MetadataOptions::default())
                    .read_all(&mut mss)
                    .map_err(probe_err)?;
            }
        }
    };
    let track = reader
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| Error::operator(format!("{OP}: no audio track")))?;
    let sample_rate = match track.codec_params.sample_rate {
        Some(r) if r > 0 => r,
        _ => {
            return Err(Error::operator(format!(
                "{OP}: no sample rate in the header"
            )))
        }
    };
    let info = TrackInfo {
        id: track.id,
        sample_rate,
        params: track.codec_params.clone(),
    };
    Ok((reader, info))
}

/// Converts a timestamp in `tb` units to frames at `rate`.
fn ts_to_frames(ts: u64, tb: Option<TimeBase>, rate: u32) -> u64 {
    match tb {
        Some(tb) if tb.denom != rate || tb.numer != 1 => {
            (ts as u128 * tb.numer as u128 * rate as u128 / tb.denom.max(1) as u128) as u64
        }
        _ => ts,
    }
}

fn decode(bytes: &[u8], o: &DecodeAudio) -> Result<(Audio, DecodeReport), Error> {
    if !(o.offset_s.is_finite() && o.offset_s >= 0.0) {
        return Err(Error::invalid(format!(
            "{OP}: offset {} s must be finite and >= 0",
            o.offset_s
        )));
    }
    if let Some(d) = o.duration_s {
        if d.is_nan() || d < 0.0 {
            return Err(Error::invalid(format!("{OP}: duration {d} s must be >= 0")));
        }
    }
    let (mut reader, track) = open(bytes)?;
    let rate = track.sample_rate;
    let start = (o.offset_s * rate as f64).round() as u64;
    let want: Option<u64> = o
        .duration_s
        .map(|d| (d * rate as f64).round().min(u64::MAX as f64) as u64);

    // The header's length, checked before decoding anything.
    let header_frames = track.params.n_frames;
    let header_channels = track.params.channels.map(|c| c.count() as u64);
    if let (Some(n), Some(c)) = (header_frames, header_channels) {
        let mut frames = n.saturating_sub(start);
        if let Some(w) = want {
            frames = frames.min(w);
        }
        if frames.saturating_mul(c) > o.max_samples {
            return Err(Error::operator(format!(
                "{OP}: the header says {c} channels x {n} frames, over the limit of {} samples",
                o.max_samples
            )));
        }
    }
    if header_channels == Some(0) {
        return Err(Error::operator(format!("{OP}: the header says 0 channels")));
    }

    let mut decoder = symphonia::default::get_codecs()
        .make(&track.params, &DecoderOptions { verify: false })
        .map_err(|e| match e {
            SymError::Unsupported(_) => Error::operator(format!(
                "{OP}: unsupported codec (WAV PCM, FLAC, MP3 and Vorbis are built in)"
            )),
            e => sym_err(e),
        })?;

    // Timeline position (in frames) where the next decoded frame belongs; packets carry
    // their own timestamps, which place the first one and reveal frames the container
    // reader dropped (a FLAC frame that failed its CRC is skipped by resynchronising).
    let mut pos: Option<u64> = None;
    // Lossy decoders need a few frames of history after a seek (MP3's bit reservoir and
    // overlap-add, Vorbis' previous block) before their output equals a continuous
    // decode's, so seek that much earlier; the frames before `start` are dropped anyway.
    let lossy = [
        CODEC_TYPE_MP1,
        CODEC_TYPE_MP2,
        CODEC_TYPE_MP3,
        CODEC_TYPE_VORBIS,
    ]
    .contains(&track.params.codec);
    let preroll = if lossy { PREROLL_FRAMES } else { 0 };
    if start > 0 {
        let seek_frames = start.saturating_sub(preroll);
        let seek = reader.seek(
            SeekMode::Accurate,
            SeekTo::Time {
                time: Time::from(seek_frames as f64 / rate as f64),
                track_id: Some(track.id),
            },
        );
        match seek {
            Ok(_) => decoder.reset(),
            Err(SymError::SeekError(_)) | Err(SymError::IoError(_)) => {
                // Past the end (an empty result), or a stream that cannot seek: decode from
                // the start and drop the frames before `start`.
                match header_frames {
                    Some(n) if start >= n => {
                        let c = header_channels.unwrap_or(1) as usize;
                        let c = if o.mono { 1 } else { c };
                        let audio = Audio::new(f32_tensor(vec![c, 0], &[])?, rate)?;
                        return Ok((audio, DecodeReport::default()));
                    }
                    _ => reader = open(bytes)?.0,
                }
            }
            Err(e) => return Err(sym_err(e)),
        }
    }

    let mut report = DecodeReport::default();
    let mut channels: Vec<Vec<f32>> = Vec::new();
    let mut n_ch: Option<usize> = header_channels.map(|c| c as usize);
    let mut kept: u64 = 0;
    let mut sample_buf: Option<SampleBuffer<f32>> = None;
    let done = |kept: u64| want.is_some_and(|w| kept >= w);

    // Appends `frames` frames of planar `data` (or silence when `data` is None) that start
    // at timeline position `pos`, keeping only [start, start + want).
    let push = |channels: &mut Vec<Vec<f32>>,
                data: Option<&[f32]>,
                frames: usize,
                c: usize,
                pos: u64,
                kept: &mut u64|
     -> Result<(), Error> {
        if channels.is_empty() {
            channels.resize_with(c, Vec::new);
        }
        let skip = start.saturating_sub(pos).min(frames as u64) as usize;
        let mut take = frames - skip;
        if let Some(w) = want {
            take = take.min(w.saturating_sub(*kept) as usize);
        }
        if take == 0 {
            return Ok(());
        }
        if (*kept + take as u64).saturating_mul(c as u64) > o.max_samples {
            return Err(Error::operator(format!(
                "{OP}: the stream holds more than {} samples (the limit)",
                o.max_samples
            )));
        }
        for (ch, out) in channels.iter_mut().enumerate() {
            match data {
                Some(d) => out.extend_from_slice(&d[ch * frames + skip..ch * frames + skip + take]),
                None => out.resize(out.len() + take, 0.0),
            }
        }
        *kept += take as u64;
        Ok(())
    };

    while !done(kept) {
        let packet = match reader.next_packet() {
            Ok(p) => p,
            Err(SymError::IoError(_)) | Err(SymError::ResetRequired) => break,
            Err(SymError::DecodeError(msg)) => {
                // A damaged container page/frame header: count it, resynchronise.
                report.bad_packets += 1;
                if report.bad_packets > o.max_bad_packets {
                    return Err(Error::operator(format!(
                        "{OP}: more than {} corrupt packets (last: {msg})",
                        o.max_bad_packets
                    )));
                }
                continue;
            }
            Err(e) => return Err(sym_err(e)),
        };
        if packet.track_id() != track.id {
            continue;
        }
        let pts = ts_to_frames(packet.ts(), track.params.time_base, rate);
        let at = match pos {
            None => pts,
            Some(p) if pts > p => {
                // A gap: frames the reader could not deliver. Silence keeps the timing.
                let gap = (pts - p).min(o.max_samples.saturating_add(1)) as usize;
                report.bad_packets += 1;
                if report.bad_packets > o.max_bad_packets {
                    return Err(Error::operator(format!(
                        "{OP}: more than {} corrupt packets (last: {gap} frames missing)",
                        o.max_bad_packets
                    )));
                }
                if let Some(c) = n_ch {
                    push(&mut channels, None, gap, c, p, &mut kept)?;
                }
                pts
            }
            Some(p) => p,
        };
        pos = Some(at);
        match decoder.decode(&packet) {
            Ok(buf) => {
                let spec = *buf.spec();
                let frames = buf.frames();
                let c = spec.channels.count();
                if c == 0 {
                    return Err(Error::operator(format!("{OP}: a packet with 0 channels")));
                }
                if spec.rate != rate {
                    return Err(Error::operator(format!(
                        "{OP}: the sample rate changes from {rate} to {} mid-stream",
                        spec.rate
                    )));
                }
                match n_ch {
                    Some(n) if n != c => {
                        return Err(Error::operator(format!(
                            "{OP}: the channel count changes from {n} to {c} mid-stream"
                        )))
                    }
                    _ => n_ch = Some(c),
                }
                if frames == 0 {
                    continue;
                }
                if channels.is_empty() {
                    // The header's length, so that the channels do not grow by doubling
                    // (copies, fresh pages); bounded by the input's size (32 frames a
                    // byte is past what any codec here makes), so that a header that lies
                    // reserves nothing out of proportion; a longer stream grows as before.
                    let want_frames = header_frames
                        .map(|n| n.saturating_sub(start))
                        .map(|n| want.map_or(n, |w| n.min(w)))
                        .unwrap_or(0)
                        .min(o.max_samples / c as u64)
                        .min(bytes.len() as u64 * 32);
                    channels = (0..c)
                        .map(|_| Vec::with_capacity(want_frames as usize))
                        .collect();
                }
                if let AudioBufferRef::F32(planar) = &buf {
                    // The decoder's own planes (MP3, Vorbis, ...): no copy in between.
                    let planes = planar.planes();
                    let planes = planes.planes();
                    let skip = start.saturating_sub(at).min(frames as u64) as usize;
                    let mut take = frames - skip;
                    if let Some(w) = want {
                        take = take.min(w.saturating_sub(kept) as usize);
                    }
                    if (kept + take as u64).saturating_mul(c as u64) > o.max_samples {
                        return Err(Error::operator(format!(
                            "{OP}: the stream holds more than {} samples (the limit)",
                            o.max_samples
                        )));
                    }
                    for (out, plane) in channels.iter_mut().zip(planes) {
                        out.extend_from_slice(&plane[skip..skip + take]);
                    }
                    kept += take as u64;
                    pos = Some(at + frames as u64);
                    continue;
                }
                let sb = match &mut sample_buf {
                    Some(sb) if sb.capacity() >= frames * c => sb,
                    slot => slot.insert(SampleBuffer::<f32>::new(frames as u64, spec)),
                };
                sb.copy_planar_ref(buf);
                push(
                    &mut channels,
                    Some(&sb.samples()[..frames * c]),
                    frames,
                    c,
                    at,
                    &mut kept,
                )?;
                pos = Some(at + frames as u64);
            }
            Err(SymError::DecodeError(msg)) => {
                report.bad_packets += 1;
                if report.bad_packets > o.max_bad_packets {
                    return Err(Error::operator(format!(
                        "{OP}: more than {} corrupt packets (last: {msg})",
                        o.max_bad_packets
                    )));
                }
                // Silence for the packet's duration keeps the rest of the clip in time.
                let frames = ts_to_frames(packet.dur(), track.params.time_base, rate);
                let frames = frames.min(o.max_samples.saturating_add(1)) as usize;
                if let Some(c) = n_ch {
                    push(&mut channels, None, frames, c, at, &mut kept)?;
                }
                pos = Some(at + frames as u64);
            }
            Err(SymError::IoError(_)) => {
                // A packet cut short by the end of the data.
                break;
            }
            Err(e) => return Err(sym_err(e)),
        }
    }

    let c = n_ch.unwrap_or(1);
    if channels.is_empty() {
        channels.resize_with(c, Vec::new);
    }
    if let Some(n) = header_frames {
        let expect = n.saturating_sub(start);
        let expect = want.map_or(expect, |w| expect.min(w));
        if kept < expect {
            report.truncated = true;
            if !o.allow_truncated {
                return Err(Error::operator(format!(
                    "{OP}: truncated stream: {kept} of {expect} frames"
                )));
            }
        }
    }
    if o.mono && channels.len() > 1 {
        let n = channels[0].len();
        let count = channels.len() as f32;
        let mut m = vec![0.0f32; n];
        for ch in &channels {
            for (a, b) in m.iter_mut().zip(ch) {
                *a += b;
            }
        }
        m.iter_mut().for_each(|v| *v /= count);
        channels = vec![m];
    }
    Ok((Audio::from_channels(&channels, rate)?, report))
}
