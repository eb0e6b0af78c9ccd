//! Audio operators in pipelines: spec names, the sample-rate field, equality with the
//! kernels, determinism of the random ones, and errors that name the operator and record.
//! The kernels' own parity with torchaudio is tested in stoker-ops.

use std::path::PathBuf;

use stoker_core::{DType, Sample, Tensor, Value};
use stoker_ops::audio::{
    AmplitudeToDb, DecodeAudio, MelSpectrogram, Resample, SType, Spectrogram, Stft, TimeStretch,
};
use stoker_pipeline::{AudioOp, Builtin, Item, Pipeline, PipelineSpec, Rate, RunOptions};

const FILES: [&str; 5] = [
    "mp3_mono_44k1.mp3",
    "flac16_stereo_44k1.flac",
    "pcm16_stereo_44k1.wav",
    "vorbis_stereo_44k1.ogg",
    "float32_mono_22k05.wav",
];

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../stoker-ops/tests/fixtures/audio/files")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `n` samples, the fixture clips in turn, in field `audio`.
fn clips(n: usize) -> Pipeline {
    Pipeline::from_samples(
        (0..n)
            .map(|i| {
                let mut s = Sample::new();
                s.insert("__key__", format!("clip{i}"));
                s.insert(
                    "audio",
                    Value::Bytes(fixture(FILES[i % FILES.len()]).into()),
                );
                s
            })
            .collect(),
    )
}

fn samples(p: &Pipeline) -> Vec<Sample> {
    p.run()
        .unwrap()
        .map(|i| match i.unwrap() {
            Item::Sample(s) => s,
            Item::Batch(_) => panic!("a batch"),
        })
        .collect()
}

fn tensor<'a>(s: &'a Sample, f: &str) -> &'a Tensor {
    match s.get(f) {
        Some(Value::Tensor(t)) => t,
        v => panic!("{f}: {v:?}"),
    }
}

fn spec(ops: &str) -> Pipeline {
    let spec: PipelineSpec =
        toml::from_str(&format!("source = \"unused\"\nformat = \"files\"\n{ops}")).unwrap();
    spec.apply_ops(clips(10)).unwrap()
}

const FRONT_END: &str = r#"
[[ops]]
op = "decode_audio"
field = "audio"
mono = true
[[ops]]
op = "resample"
field = "audio"
rate = 16000
[[ops]]
op = "mel_spectrogram"
field = "audio"
n_fft = 400
hop_length = 160
n_mels = 80
[[ops]]
op = "amplitude_to_db"
field = "audio"
top_db = 80
"#;

#[test]
fn a_speech_front_end_from_a_spec_equals_the_kernels() {
    let out = samples(&spec(FRONT_END));
    assert_eq!(out.len(), 10);
    let resample = Resample::new(16_000);
    let mel = MelSpectrogram::new(400, 80).hop_length(160);
    let db = AmplitudeToDb::new(SType::Power, Some(80.0));
    for (i, s) in out.iter().enumerate() {
        let audio = DecodeAudio::default()
            .mono(true)
            .allow_truncated(false)
            .max_bad_packets(0)
            .apply(&fixture(FILES[i % FILES.len()]))
            .unwrap();
        let want = db
            .apply(&mel.apply(&resample.apply(&audio).unwrap()).unwrap())
            .unwrap();
        let got = tensor(s, "audio");
        assert_eq!(got.dtype(), DType::F32);
        assert_eq!(got.shape()[..2], [1, 80]);
        assert_eq!(got, &want, "clip {i}");
        assert_eq!(s.get("audio_sample_rate"), Some(&Value::Int(16_000)));
    }
}

#[test]
fn decode_keeps_the_rate_and_spectral_ops_keep_the_shape_contracts() {
    let out = samples(&spec(
        r#"
[[ops]]
op = "decode_audio"
field = "audio"
[[ops]]
op = "rename"
from = "audio"
to = "wave"
[[ops]]
op = "rename"
from = "audio_sample_rate"
to = "wave_sample_rate"
[[ops]]
op = "spectrogram"
field = "wave"
n_fft = 256
hop_length = 64
power = 1.0
"#,
    ));
    for (i, s) in out.iter().enumerate() {
        let rate = match FILES[i % FILES.len()] {
            f if f.contains("22k05") => 22_050,
            _ => 44_100,
        };
        assert_eq!(
            s.get("wave_sample_rate"),
            Some(&Value::Int(rate)),
            "clip {i}"
        );
        let audio = DecodeAudio::default()
            .allow_truncated(false)
            .max_bad_packets(0)
            .apply(&fixture(FILES[i % FILES.len()]))
            .unwrap();
        let want = Spectrogram::new(256)
            .hop_length(64)
            .power(1.0)
            .apply(&audio.samples)
            .unwrap();
        assert_eq!(tensor(s, "wave"), &want);
        assert_eq!(tensor(s, "wave").shape()[1], 129);
    }
}

const AUGMENT: &str = r#"
[[ops]]
op = "decode_audio"
field = "audio"
mono = true
[[ops]]
op = "resample"
field = "audio"
rate = 16000
[[ops]]
op = "stft"
field = "audio"
n_fft = 400
hop_length = 200
[[ops]]
op = "time_stretch"
field = "audio"
rate = [0.8, 1.25]
hop_length = 200
[[ops]]
op = "complex_power"
field = "audio"
[[ops]]
op = "mel_scale"
field = "audio"
n_mels = 64
[[ops]]
op = "time_masking"
field = "audio"
mask_param = 30
[[ops]]
op = "frequency_masking"
field = "audio"
mask_param = 15
"#;

#[test]
fn random_audio_ops_depend_on_the_seed_not_the_threads() {
    let run = |seed: u64, threads: usize| {
        samples(
            &spec(AUGMENT)
                .seed(seed)
                .options(RunOptions::default().with_threads(threads)),
        )
        .iter()
        .map(|s| tensor(s, "audio").clone())
        .collect::<Vec<_>>()
    };
    let a = run(1, 1);
    assert_eq!(a, run(1, 3));
    assert_ne!(a, run(2, 1));
    // Stretching changes the number of frames; masks write zeros.
    let plain = Stft::new(400).hop_length(200);
    let mut lengths_changed = 0;
    for (i, t) in a.iter().enumerate() {
        assert_eq!(t.shape()[..2], [1, 64]);
        let audio = Resample::new(16_000)
            .apply(
                &DecodeAudio::default()
                    .mono(true)
                    .apply(&fixture(FILES[i % FILES.len()]))
                    .unwrap(),
            )
            .unwrap();
        let frames = plain.apply(&audio.samples).unwrap().shape()[2];
        if t.shape()[2] != frames {
            lengths_changed += 1;
        }
        let v: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(v.iter().all(|x| x.is_finite() && *x >= 0.0));
    }
    assert!(lengths_changed >= 8, "{lengths_changed} of 10 stretched");
}

#[test]
fn a_fixed_time_stretch_equals_the_kernel() {
    let p = clips(3)
        .map(Builtin::Audio(AudioOp::DecodeAudio {
            field: "audio".into(),
            mono: false,
            offset_s: None,
            duration_s: Some(0.5),
            max_samples: None,
            max_bad_packets: 0,
            allow_truncated: false,
            format: None,
        }))
        .map(Builtin::Audio(AudioOp::Stft {
            field: "audio".into(),
            n_fft: Some(512),
            win_length: None,
            hop_length: Some(128),
            center: None,
        }))
        .map(Builtin::Audio(AudioOp::TimeStretch {
            field: "audio".into(),
            rate: Rate::Fixed(1.3),
            hop_length: Some(128),
        }));
    for (i, s) in samples(&p).iter().enumerate() {
        let audio = DecodeAudio::default()
            .duration_s(Some(0.5))
            .apply(&fixture(FILES[i]))
            .unwrap();
        let stft = Stft::new(512)
            .hop_length(128)
            .apply(&audio.samples)
            .unwrap();
        let want = TimeStretch::new(257)
            .hop_length(128)
            .apply(&stft, 1.3)
            .unwrap();
        assert_eq!(tensor(s, "audio"), &want);
    }
}

#[test]
fn bad_audio_names_the_operator_and_the_record() {
    let mut s = Sample::new();
    s.insert("__key__", "noise");
    s.insert("audio", Value::Bytes(vec![7u8; 4000].into()));
    let p = Pipeline::from_samples(vec![s]).map(Builtin::Audio(AudioOp::DecodeAudio {
        field: "audio".into(),
        mono: false,
        offset_s: None,
        duration_s: None,
        max_samples: None,
        max_bad_packets: 0,
        allow_truncated: false,
        format: None,
    }));
    let msg = p.run().unwrap().next().unwrap().unwrap_err().to_string();
    assert!(msg.contains("decode_audio"), "{msg}");
    assert!(
        msg.contains("record 0") || msg.contains("memory:0"),
        "{msg}"
    );
    // A truncated clip is an error by default in pipelines...
    let mut flac = fixture("flac16_stereo_44k1.flac");
    flac.truncate(flac.len() * 2 / 3);
    let one = |allow: bool| {
        let mut s = Sample::new();
        s.insert("audio", Value::Bytes(flac.clone().into()));
        Pipeline::from_samples(vec![s]).map(Builtin::Audio(AudioOp::DecodeAudio {
            field: "audio".into(),
            mono: false,
            offset_s: None,
            duration_s: None,
            max_samples: None,
            max_bad_packets: 0,
            allow_truncated: allow,
            format: None,
        }))
    };
    let msg = one(false)
        .run()
        .unwrap()
        .next()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("decode_audio"), "{msg}");
    // ...and kept when allowed.
    assert!(one(true).run().unwrap().next().unwrap().is_ok());
    // A spectral operator without the rate field says where the rate comes from.
    let mut s = Sample::new();
    s.insert(
        "audio",
        Tensor::from_slice(vec![1, 1000], &[0.0f32; 1000]).unwrap(),
    );
    let p = Pipeline::from_samples(vec![s]).map(Builtin::Audio(AudioOp::Resample {
        field: "audio".into(),
        rate: 8000,
        lowpass_filter_width: None,
        rolloff: None,
    }));
    let msg = p.run().unwrap().next().unwrap().unwrap_err().to_string();
    assert!(msg.contains("audio_sample_rate"), "{msg}");
    // Arguments are checked before running.
    let bad: Result<PipelineSpec, _> = toml::from_str(
        "source = \"x\"\nformat = \"files\"\n[[ops]]\nop = \"time_stretch\"\nfield = \"a\"\nrate = [1.2, 0.9]\n",
    );
    let msg = bad.unwrap().apply_ops(clips(1)).unwrap_err().to_string();
    assert!(msg.contains("time_stretch"), "{msg}");
}
