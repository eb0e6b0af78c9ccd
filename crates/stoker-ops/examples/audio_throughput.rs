//! Single-thread throughput of the speech front end on a directory of MP3 clips:
//! decode (mono) -> resample to 16 kHz -> STFT (n_fft 400, hop 160) -> random time stretch
//! (0.9-1.1) -> power -> 80 mel bands -> dB (top_db 80) -> frequency mask (27) -> time
//! mask (100). Also times the stages alone, and the chain without the stretch
//! (`MelSpectrogram` directly).
//!
//! ```sh
//! python crates/stoker-ops/examples/audio_make_clips.py /work/data-audio
//! cargo run --release -p stoker-ops --example audio_throughput -- /work/data-audio
//! python crates/stoker-ops/examples/audio_throughput_torchaudio.py /work/data-audio
//! ```
#![allow(clippy::print_stdout)]

use std::time::Instant;

use stoker_core::rng::Rng;
use stoker_ops::audio::{
    complex_power, AmplitudeToDb, DecodeAudio, FrequencyMasking, MelScale, MelSpectrogram,
    RandomTimeStretch, Resample, SType, Stft, TimeMasking,
};

fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/work/data-audio".into());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("read dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "mp3"))
        .collect();
    files.sort();
    let clips: Vec<Vec<u8>> = files.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let n = clips.len();
    let decode = DecodeAudio::default().mono(true);
    let resample = Resample::new(16000);
    let stft = Stft::new(400).hop_length(160);
    let stretch = RandomTimeStretch::new(201, (0.9, 1.1)).hop_length(160);
    let mel = MelScale::new(80);
    let db = AmplitudeToDb::new(SType::Power, Some(80.0));
    let fmask = FrequencyMasking::new(27);
    let tmask = TimeMasking::new(100);
    let melspec = MelSpectrogram::new(400, 80).hop_length(160);

    // Warm-up (kernel cache, FFT plans).
    let a = decode.apply(&clips[0]).unwrap();
    let _ = resample.apply(&a).unwrap();

    let mut audio_s = 0.0;
    let t0 = Instant::now();
    let decoded: Vec<_> = clips
        .iter()
        .map(|b| {
            let a = decode.apply(b).unwrap();
            audio_s += a.duration_s();
            a
        })
        .collect();
    let t_decode = t0.elapsed().as_secs_f64();

    let t0 = Instant::now();
    let resampled: Vec<_> = decoded.iter().map(|a| resample.apply(a).unwrap()).collect();
    let t_resample = t0.elapsed().as_secs_f64();

    let t0 = Instant::now();
    let mut frames = 0usize;
    for (i, a) in resampled.iter().enumerate() {
        let mut rng = Rng::from_words(&[0, i as u64]);
        let spec = stft.apply(&a.samples).unwrap();
        let spec = stretch.apply(&spec, &mut rng).unwrap();
        let power = complex_power(&spec, 2.0).unwrap();
        let m = mel.apply(&power, a.sample_rate).unwrap();
        let m = db.apply(&m).unwrap();
        let m = fmask.apply(&m, &mut rng).unwrap();
        let m = tmask.apply(&m, &mut rng).unwrap();
        frames += m.shape()[2];
    }
    let t_features = t0.elapsed().as_secs_f64();

    let t0 = Instant::now();
    for (i, a) in resampled.iter().enumerate() {
        let mut rng = Rng::from_words(&[1, i as u64]);
        let m = melspec.apply(a).unwrap();
        let m = db.apply(&m).unwrap();
        let m = fmask.apply(&m, &mut rng).unwrap();
        let _ = tmask.apply(&m, &mut rng).unwrap();
    }
    let t_plain = t0.elapsed().as_secs_f64();

    let total = t_decode + t_resample + t_features;
    println!("{n} clips, {audio_s:.0} s of audio, {frames} feature frames; one thread, stoker-ops");
    let row = |name: &str, t: f64| {
        println!(
            "{name:<44} {:8.1} clips/s {:8.0}x real time ({:.3} s)",
            n as f64 / t,
            audio_s / t,
            t
        )
    };
    row("decode MP3 (mono)", t_decode);
    row("resample 44.1 -> 16 kHz", t_resample);
    row("stft + stretch + power + mel + dB + masks", t_features);
    row("mel spectrogram + dB + masks (no stretch)", t_plain);
    row("full chain (with stretch)", total);
    row("full chain (no stretch)", t_decode + t_resample + t_plain);
}
