//! Parity of the audio kernels with libsndfile (decoding), torchaudio and librosa (DSP), on
//! the fixtures that `tests/fixtures/audio/make_fixtures.py` writes. Each case prints its
//! measured max / mean absolute difference; the bounds are the ones `docs/ops.md` states.

use std::path::PathBuf;

use serde_json::Value as Json;
use stoker_core::Tensor;
use stoker_ops::audio::{
    melscale_fbanks, AmplitudeToDb, Audio, DecodeAudio, MelNorm, MelScaleKind, MelSpectrogram,
    Resample, SType, Spectrogram, Stft, TimeStretch,
};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/audio")
}

fn manifest() -> Json {
    let text = std::fs::read_to_string(dir().join("manifest.json")).expect("manifest");
    serde_json::from_str(&text).expect("manifest json")
}

fn read_ref(name: &str) -> Vec<f32> {
    let name = if name.ends_with(".f32") {
        name.to_owned()
    } else {
        format!("{name}.f32")
    };
    let bytes = std::fs::read(dir().join("ref").join(name)).expect("ref file");
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn shape(v: &Json) -> Vec<usize> {
    v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

fn case<'a>(m: &'a Json, section: &str, key: &str, name: &str) -> &'a Json {
    m[section]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c[key] == name)
        .unwrap_or_else(|| panic!("no {section} case {name}"))
}

/// The decoded reference of `name` as a clip.
fn input(m: &Json, name: &str) -> Audio {
    let c = case(m, "decode", "ref", &format!("{name}.f32"));
    let sh = shape(c);
    let t = Tensor::from_slice(sh, &read_ref(name)).unwrap();
    Audio::new(t, c["sample_rate"].as_u64().unwrap() as u32).unwrap()
}

/// Checks `ours` against `theirs` and returns (max, mean) absolute difference.
fn compare(label: &str, ours: &[f32], theirs: &[f32], max_tol: f32, mean_tol: f32) -> (f32, f32) {
    assert_eq!(ours.len(), theirs.len(), "{label}: lengths differ");
    let mut max = 0.0f32;
    let mut sum = 0.0f64;
    for (a, b) in ours.iter().zip(theirs) {
        assert!(a.is_finite(), "{label}: non-finite output");
        let d = (a - b).abs();
        max = max.max(d);
        sum += d as f64;
    }
    let mean = (sum / ours.len().max(1) as f64) as f32;
    eprintln!(
        "{label}: max {max:.3e} mean {mean:.3e} ({} values)",
        ours.len()
    );
    assert!(
        max <= max_tol && mean <= mean_tol,
        "{label}: max {max:e} / mean {mean:e} over {max_tol:e} / {mean_tol:e}"
    );
    (max, mean)
}

/// Relative version: differences divided by the reference's largest magnitude.
fn compare_rel(label: &str, ours: &[f32], theirs: &[f32], max_tol: f32, mean_tol: f32) {
    let scale = theirs.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    let a: Vec<f32> = ours.iter().map(|v| v / scale).collect();
    let b: Vec<f32> = theirs.iter().map(|v| v / scale).collect();
    compare(
        &format!("{label} (relative to max {scale:.3e})"),
        &a,
        &b,
        max_tol,
        mean_tol,
    );
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn decode_matches_libsndfile() {
    let m = manifest();
    for c in m["decode"].as_array().unwrap() {
        let file = c["file"].as_str().unwrap();
        let bytes = std::fs::read(dir().join("files").join(file)).unwrap();
        let audio = DecodeAudio::default().apply(&bytes).unwrap();
        let want = shape(c);
        assert_eq!(
            audio.sample_rate as u64,
            c["sample_rate"].as_u64().unwrap(),
            "{file}"
        );
        let reference = read_ref(c["ref"].as_str().unwrap());
        // Lossless files must decode exactly; lossy ones within the decoders' rounding.
        let (max_tol, mean_tol) = if file.ends_with(".ogg") {
            (1e-6, 1e-7)
        } else if file.ends_with(".mp3") {
            (2e-6, 2e-7)
        } else {
            (0.0, 0.0)
        };
        assert_eq!(audio.samples.shape(), &want[..], "{file}: shape");
        compare(file, &values(&audio.samples), &reference, max_tol, mean_tol);
    }
    for pair in m["same_samples"].as_array().unwrap() {
        let file = pair[0].as_str().unwrap();
        let bytes = std::fs::read(dir().join("files").join(file)).unwrap();
        let audio = DecodeAudio::default().apply(&bytes).unwrap();
        compare(
            file,
            &values(&audio.samples),
            &read_ref(pair[1].as_str().unwrap()),
            0.0,
            0.0,
        );
    }
}

#[test]
fn resample_matches_torchaudio() {
    let m = manifest();
    for c in m["dsp"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["op"] == "resample")
    {
        let p = &c["params"];
        let clip = input(&m, c["input"].as_str().unwrap());
        assert_eq!(clip.sample_rate as u64, p["orig"].as_u64().unwrap());
        let r = Resample::new(p["new"].as_u64().unwrap() as u32)
            .lowpass_filter_width(p["lowpass_filter_width"].as_u64().unwrap() as u32)
            .rolloff(p["rolloff"].as_f64().unwrap());
        let out = r.apply(&clip).unwrap();
        assert_eq!(out.samples.shape(), &shape(c)[..], "{}", c["name"]);
        compare(
            c["name"].as_str().unwrap(),
            &values(&out.samples),
            &read_ref(c["ref"].as_str().unwrap()),
            5e-7,
            5e-8,
        );
    }
}

#[test]
fn stft_and_spectrogram_match_torch() {
    let m = manifest();
    let c = case(&m, "dsp", "name", "stft_400_160");
    let clip = input(&m, "pcm32_mono_16k");
    let out = Stft::new(400).hop_length(160).apply(&clip.samples).unwrap();
    assert_eq!(out.shape(), &shape(c)[..]);
    compare_rel(
        "stft_400_160",
        &values(&out),
        &read_ref("dsp_stft_400_160"),
        1e-6,
        1e-7,
    );

    for c in m["dsp"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["op"] == "spectrogram")
    {
        let p = &c["params"];
        let clip = input(&m, c["input"].as_str().unwrap());
        let s = Spectrogram::new(p["n_fft"].as_u64().unwrap() as usize)
            .hop_length(p["hop"].as_u64().unwrap() as usize)
            .win_length(p["win"].as_u64().unwrap() as usize)
            .power(p["power"].as_f64().unwrap() as f32)
            .center(p["center"].as_bool().unwrap());
        let out = s.apply(&clip.samples).unwrap();
        assert_eq!(out.shape(), &shape(c)[..], "{}", c["name"]);
        compare_rel(
            c["name"].as_str().unwrap(),
            &values(&out),
            &read_ref(c["ref"].as_str().unwrap()),
            1e-6,
            1e-7,
        );
    }
}

fn norm_of(v: &Json) -> MelNorm {
    if v.as_str() == Some("slaney") {
        MelNorm::Slaney
    } else {
        MelNorm::None
    }
}

fn scale_of(v: &Json) -> MelScaleKind {
    if v.as_str() == Some("slaney") {
        MelScaleKind::Slaney
    } else {
        MelScaleKind::Htk
    }
}

#[test]
fn mel_filterbanks_match_torchaudio_and_librosa() {
    let m = manifest();
    for c in m["dsp"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["op"] == "melscale_fbanks")
    {
        let p = &c["params"];
        let (n_freqs, n_mels) = (
            p["n_freqs"].as_u64().unwrap() as usize,
            p["n_mels"].as_u64().unwrap() as usize,
        );
        let mut fb = melscale_fbanks(
            n_freqs,
            p["f_min"].as_f64().unwrap(),
            p["f_max"].as_f64().unwrap(),
            n_mels,
            p["sample_rate"].as_u64().unwrap() as u32,
            norm_of(&p["norm"]),
            scale_of(&p["scale"]),
        )
        .unwrap();
        if p["layout"].is_string() {
            // librosa stores [n_mels, n_freqs].
            let mut t = vec![0.0; fb.len()];
            for f in 0..n_freqs {
                for k in 0..n_mels {
                    t[k * n_freqs + f] = fb[f * n_mels + k];
                }
            }
            fb = t;
        }
        compare_rel(
            c["name"].as_str().unwrap(),
            &fb,
            &read_ref(c["ref"].as_str().unwrap()),
            1e-5,
            1e-6,
        );
    }
}

#[test]
fn mel_spectrogram_and_db_match_torchaudio_and_librosa() {
    let m = manifest();
    for c in m["dsp"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["op"] == "mel_spectrogram")
    {
        let p = &c["params"];
        let clip = input(&m, c["input"].as_str().unwrap());
        let mut ms = MelSpectrogram::new(
            p["n_fft"].as_u64().unwrap() as usize,
            p["n_mels"].as_u64().unwrap() as usize,
        )
        .hop_length(p["hop"].as_u64().unwrap() as usize);
        if let Some(w) = p["win"].as_u64() {
            ms = ms.win_length(w as usize);
        }
        ms.mel = ms
            .mel
            .clone()
            .f_range(p["f_min"].as_f64().unwrap(), p["f_max"].as_f64())
            .norm(norm_of(&p["norm"]))
            .scale(scale_of(&p["scale"]));
        let out = ms.apply(&clip).unwrap();
        assert_eq!(out.shape(), &shape(c)[..], "{}", c["name"]);
        compare_rel(
            c["name"].as_str().unwrap(),
            &values(&out),
            &read_ref(c["ref"].as_str().unwrap()),
            1e-5,
            1e-7,
        );
    }
    for c in m["dsp"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["op"] == "amplitude_to_db")
    {
        let p = &c["params"];
        let src_name = c["input"].as_str().unwrap();
        let src = case(&m, "dsp", "name", src_name.trim_start_matches("dsp_"));
        let x = Tensor::from_slice(shape(src), &read_ref(src_name)).unwrap();
        let stype = if p["stype"] == "power" {
            SType::Power
        } else {
            SType::Magnitude
        };
        let out = AmplitudeToDb::new(stype, p["top_db"].as_f64().map(|v| v as f32))
            .apply(&x)
            .unwrap();
        compare(
            c["name"].as_str().unwrap(),
            &values(&out),
            &read_ref(c["ref"].as_str().unwrap()),
            1e-3,
            1e-5,
        );
    }
}

#[test]
fn time_stretch_matches_torchaudio_phase_vocoder() {
    let m = manifest();
    let stft_case = case(&m, "dsp", "name", "stft_400_160");
    let stft = Tensor::from_slice(shape(stft_case), &read_ref("dsp_stft_400_160")).unwrap();
    for c in m["dsp"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["op"] == "time_stretch")
    {
        let p = &c["params"];
        let out = TimeStretch::new(201)
            .hop_length(160)
            .apply(&stft, p["rate"].as_f64().unwrap())
            .unwrap();
        assert_eq!(out.shape(), &shape(c)[..], "{}", c["name"]);
        compare_rel(
            c["name"].as_str().unwrap(),
            &values(&out),
            &read_ref(c["ref"].as_str().unwrap()),
            2e-3,
            1e-6,
        );
    }
}
