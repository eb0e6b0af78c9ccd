//! Behaviour of the resampler, spectral kernels and augmentations beyond the parity cases:
//! shapes, edge cases, parameter errors, and the masks' draws.

use stoker_core::rng::Rng;
use stoker_core::{ErrorKind, Tensor};
use stoker_ops::audio::{
    complex_power, AmplitudeToDb, Audio, FrequencyMasking, MelSpectrogram, RandomTimeStretch,
    Resample, ResampleKernel, SType, Spectrogram, Stft, TimeMasking, TimeStretch,
};

fn tone(rate: u32, hz: f64, n: usize, channels: usize) -> Audio {
    let chans: Vec<Vec<f32>> = (0..channels)
        .map(|c| {
            (0..n)
                .map(|i| {
                    (0.5 * (2.0 * std::f64::consts::PI * hz * (c + 1) as f64 * i as f64
                        / rate as f64)
                        .sin()) as f32
                })
                .collect()
        })
        .collect();
    Audio::from_channels(&chans, rate).unwrap()
}

#[test]
fn resample_lengths_identity_and_errors() {
    let a = tone(44100, 440.0, 44_101, 2);
    let r = Resample::new(16000);
    let out = r.apply(&a).unwrap();
    // ceil(44101 * 160 / 441)
    assert_eq!(out.samples.shape(), &[2, 16001]);
    assert_eq!(out.sample_rate, 16000);
    // The cached kernel is reused and gives the same result.
    assert_eq!(r.apply(&a).unwrap(), out);
    assert_eq!(r.clone().apply(&a).unwrap(), out);
    // Same rate: unchanged.
    assert_eq!(Resample::new(44100).apply(&a).unwrap(), a);
    // Empty input.
    let empty = Audio::from_channels(&[vec![], vec![]], 44100).unwrap();
    assert_eq!(r.apply(&empty).unwrap().samples.shape(), &[2, 0]);
    // A 1 kHz tone keeps its amplitude through 44.1 -> 16 kHz (passband).
    let t = tone(44100, 1000.0, 44100, 1);
    let y = r.apply(&t).unwrap().samples.to_vec::<f32>().unwrap();
    let peak = y[2000..14000].iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!((peak - 0.5).abs() < 0.005, "{peak}");
    // A 10 kHz tone above the new Nyquist is filtered out.
    let t = tone(44100, 10_000.0, 44100, 1);
    let y = r.apply(&t).unwrap().samples.to_vec::<f32>().unwrap();
    let peak = y[2000..14000].iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(peak < 0.01, "{peak}");
    // Errors.
    for (o, n) in [(0, 16000), (16000, 0)] {
        let e = ResampleKernel::new(o, n, 6, 0.99).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.message.starts_with("resample: "), "{e}");
    }
    assert!(ResampleKernel::new(44100, 16000, 0, 0.99).is_err());
    assert!(ResampleKernel::new(44100, 16000, 6, 1.5).is_err());
    // Coprime large rates would need a huge filter: refused, not allocated.
    let e = ResampleKernel::new(1_000_003, 2_000_003, 6, 0.99).unwrap_err();
    assert!(e.message.contains("limit"), "{e}");
}

#[test]
fn spectrogram_shapes_and_short_inputs() {
    let a = tone(16000, 440.0, 16000, 2);
    let s = Spectrogram::new(400)
        .hop_length(160)
        .apply(&a.samples)
        .unwrap();
    assert_eq!(s.shape(), &[2, 201, 101]);
    let c = Stft::new(400).hop_length(160).apply(&a.samples).unwrap();
    assert_eq!(c.shape(), &[2, 201, 101, 2]);
    // Power 2 is the squared magnitude of the complex STFT.
    assert_eq!(complex_power(&c, 2.0).unwrap(), s);
    let (sv, cv) = (s.to_vec::<f32>().unwrap(), c.to_vec::<f32>().unwrap());
    for i in (0..sv.len()).step_by(97) {
        let p = cv[2 * i] * cv[2 * i] + cv[2 * i + 1] * cv[2 * i + 1];
        assert!((sv[i] - p).abs() <= 1e-5 * p.max(1.0));
    }
    // The peak bin of a 500 Hz tone at n_fft 400 / 16 kHz is bin 12.5 -> 12 or 13.
    let m = Spectrogram::new(400)
        .apply(&tone(16000, 500.0, 8000, 1).samples)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let t = 20;
    let frames = 8000 / 200 + 1;
    let best = (0..201)
        .max_by(|&a, &b| m[a * frames + t].total_cmp(&m[b * frames + t]))
        .unwrap();
    assert!(best == 12 || best == 13, "{best}");
    // Reflect padding needs more than n_fft / 2 samples.
    let short = tone(16000, 440.0, 200, 1);
    let e = Spectrogram::new(400).apply(&short.samples).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Operator);
    assert!(e.message.starts_with("spectrogram: "), "{e}");
    assert!(Spectrogram::new(400)
        .apply(&tone(16000, 440.0, 201, 1).samples)
        .is_ok());
    // Parameter errors.
    for s in [
        Spectrogram::new(0),
        Spectrogram::new(400).win_length(500),
        Spectrogram::new(400).hop_length(0),
        Spectrogram::new(400).power(0.0),
    ] {
        assert_eq!(s.apply(&a.samples).unwrap_err().kind, ErrorKind::Invalid);
    }
    // Wrong dtype / shape.
    let t = Tensor::from_slice(vec![2, 2, 2], &[0.0f32; 8]).unwrap();
    assert_eq!(
        Spectrogram::new(4).apply(&t).unwrap_err().kind,
        ErrorKind::Operator
    );
}

#[test]
fn mel_and_db() {
    let a = tone(16000, 440.0, 16000, 1);
    let mel = MelSpectrogram::new(400, 80)
        .hop_length(160)
        .apply(&a)
        .unwrap();
    assert_eq!(mel.shape(), &[1, 80, 101]);
    let db = AmplitudeToDb::new(SType::Power, Some(80.0))
        .apply(&mel)
        .unwrap();
    let v = db.to_vec::<f32>().unwrap();
    let max = v.iter().copied().fold(f32::MIN, f32::max);
    let min = v.iter().copied().fold(f32::MAX, f32::min);
    assert!(max - min <= 80.0 + 1e-3, "{max} {min}");
    // Silence: amin floor, -100 dB.
    let z = Tensor::from_slice(vec![1, 2, 2], &[0.0f32; 4]).unwrap();
    let d = AmplitudeToDb::default()
        .apply(&z)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(d.iter().all(|&x| (x + 100.0).abs() < 1e-4), "{d:?}");
    let e = AmplitudeToDb::new(SType::Power, Some(-1.0))
        .apply(&z)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
}

#[test]
fn time_stretch_lengths_and_identity() {
    let a = tone(16000, 440.0, 16000, 2);
    let spec = Stft::new(400).hop_length(160).apply(&a.samples).unwrap();
    let ts = TimeStretch::new(201).hop_length(160);
    assert_eq!(ts.apply(&spec, 1.0).unwrap(), spec);
    for (rate, frames) in [(0.8, 127), (1.25, 81), (2.0, 51)] {
        let out = ts.apply(&spec, rate).unwrap();
        assert_eq!(out.shape(), &[2, 201, frames, 2], "rate {rate}");
    }
    // The first frame keeps the input's first frame (phase and magnitude).
    let out = ts.apply(&spec, 1.5).unwrap().to_vec::<f32>().unwrap();
    let inp = spec.to_vec::<f32>().unwrap();
    let (t_in, t_out) = (101, 68);
    for k in [5usize, 50, 150] {
        let i = k * t_in * 2;
        let o = k * t_out * 2;
        assert!((out[o] - inp[i]).abs() < 1e-4 && (out[o + 1] - inp[i + 1]).abs() < 1e-4);
    }
    assert_eq!(ts.apply(&spec, 0.0).unwrap_err().kind, ErrorKind::Invalid);
    assert_eq!(
        TimeStretch::new(129).apply(&spec, 1.1).unwrap_err().kind,
        ErrorKind::Operator
    );
    // Random rates: in range, and a function of the generator only.
    let rts = RandomTimeStretch::new(201, (0.9, 1.1));
    let mut seen = Vec::new();
    for s in 0..50 {
        let r1 = rts.draw(&mut Rng::from_words(&[s])).unwrap();
        let r2 = rts.draw(&mut Rng::from_words(&[s])).unwrap();
        assert_eq!(r1, r2);
        assert!((0.9..1.1).contains(&r1));
        seen.push(r1);
    }
    assert!(seen.iter().any(|&r| r < 0.95) && seen.iter().any(|&r| r > 1.05));
    assert!(RandomTimeStretch::new(201, (1.2, 1.1))
        .draw(&mut Rng::from_words(&[0]))
        .is_err());
}

/// Masked (index) set along the last two axes of a `[c, f, t]` tensor that was all ones.
fn masked(v: &[f32], c: usize, f: usize, t: usize) -> Vec<Vec<(usize, usize)>> {
    (0..c)
        .map(|ch| {
            let mut m = Vec::new();
            for i in 0..f {
                for j in 0..t {
                    if v[(ch * f + i) * t + j] != 1.0 {
                        m.push((i, j));
                    }
                }
            }
            m
        })
        .collect()
}

#[test]
fn masks_follow_torchaudio_semantics() {
    let (c, f, t) = (2, 40, 100);
    let ones = Tensor::from_slice(vec![c, f, t], &vec![1.0f32; c * f * t]).unwrap();
    let mut widths = Vec::new();
    for s in 0..400u64 {
        let mut rng = Rng::from_words(&[s]);
        let out = TimeMasking::new(30)
            .mask_value(-5.0)
            .apply(&ones, &mut rng)
            .unwrap();
        let v = out.to_vec::<f32>().unwrap();
        assert!(v.iter().all(|&x| x == 1.0 || x == -5.0));
        let m = masked(&v, c, f, t);
        // One mask for both channels, whole columns, contiguous.
        assert_eq!(m[0], m[1]);
        let cols: std::collections::BTreeSet<usize> = m[0].iter().map(|p| p.1).collect();
        assert_eq!(m[0].len(), cols.len() * f);
        if let (Some(&lo), Some(&hi)) = (cols.first(), cols.last()) {
            assert_eq!(hi - lo + 1, cols.len());
        }
        assert!(cols.len() < 30);
        widths.push(cols.len());
        // Same generator, same mask.
        let again = TimeMasking::new(30)
            .mask_value(-5.0)
            .apply(&ones, &mut Rng::from_words(&[s]))
            .unwrap();
        assert_eq!(again, out);
    }
    // Width = floor(U * 30): uniform over 0..=29, mean 14.5.
    let mean = widths.iter().sum::<usize>() as f64 / widths.len() as f64;
    assert!((12.5..16.5).contains(&mean), "{mean}");
    assert!(widths.contains(&0) && widths.iter().any(|&w| w >= 27));

    // Frequency masks cover whole rows; iid draws differ between channels.
    let mut differ = false;
    for s in 0..50u64 {
        let out = FrequencyMasking::new(20)
            .iid_channels(true)
            .apply(&ones, &mut Rng::from_words(&[s]))
            .unwrap();
        let m = masked(&out.to_vec::<f32>().unwrap(), c, f, t);
        for ch in &m {
            let rows: std::collections::BTreeSet<usize> = ch.iter().map(|p| p.0).collect();
            assert_eq!(ch.len(), rows.len() * t);
            assert!(rows.len() < 20);
        }
        differ |= m[0] != m[1];
    }
    assert!(differ);
    // p caps the width at p * length; p = 0 leaves the input alone.
    for s in 0..100u64 {
        let out = TimeMasking::new(100)
            .p(0.05)
            .apply(&ones, &mut Rng::from_words(&[s]))
            .unwrap();
        let m = masked(&out.to_vec::<f32>().unwrap(), c, f, t);
        assert!(m[0].len() / f < 5);
    }
    let out = TimeMasking::new(100)
        .p(0.0)
        .apply(&ones, &mut Rng::from_words(&[1]))
        .unwrap();
    assert_eq!(out, ones);
    // A mask wider than the axis stays inside it.
    let out = TimeMasking::new(1000)
        .apply(&ones, &mut Rng::from_words(&[3]))
        .unwrap();
    assert_eq!(out.shape(), ones.shape());
    assert_eq!(
        TimeMasking::new(3)
            .p(1.5)
            .apply(&ones, &mut Rng::from_words(&[0]))
            .unwrap_err()
            .kind,
        ErrorKind::Invalid
    );
    let flat = Tensor::from_slice(vec![4], &[1.0f32; 4]).unwrap();
    assert_eq!(
        FrequencyMasking::new(3)
            .apply(&flat, &mut Rng::from_words(&[0]))
            .unwrap_err()
            .kind,
        ErrorKind::Operator
    );
}
