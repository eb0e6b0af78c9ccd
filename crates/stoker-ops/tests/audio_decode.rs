//! Decoder behaviour: offsets and durations, downmix, empty/truncated/corrupt/absurd files,
//! and a mutation sweep that must never panic or hang.

use std::path::PathBuf;

use stoker_core::rng::Rng;
use stoker_core::ErrorKind;
use stoker_ops::audio::{audio_info, decode_audio, DecodeAudio};

fn file(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/audio/files")
        .join(name);
    std::fs::read(p).unwrap()
}

fn samples(name: &str, opts: &DecodeAudio) -> (Vec<f32>, Vec<usize>, u32) {
    let a = decode_audio(&file(name), opts).unwrap();
    (
        a.samples.to_vec::<f32>().unwrap(),
        a.samples.shape().to_vec(),
        a.sample_rate,
    )
}

/// Channel-major `[c, n]` -> frames `lo..hi` of every channel.
fn slice(data: &[f32], c: usize, n: usize, lo: usize, hi: usize) -> Vec<f32> {
    (0..c)
        .flat_map(|ch| data[ch * n + lo..ch * n + hi].to_vec())
        .collect()
}

#[test]
fn offset_and_duration_cut_the_same_frames_as_a_full_decode() {
    // Lossy streams seek a few frames early so that the decoder has its history: the
    // frames equal a continuous decode's.
    for name in [
        "pcm16_stereo_44k1.wav",
        "flac16_stereo_44k1.flac",
        "pcm24_stereo_48k.wav",
        "float64_stereo_16k.wav",
        "mp3_mono_44k1.mp3",
        "lame_stereo_22k05.mp3",
        "vorbis_stereo_44k1.ogg",
    ] {
        let (full, shape, rate) = samples(name, &DecodeAudio::default());
        let (c, n) = (shape[0], shape[1]);
        let off = 0.1;
        let dur = 0.07;
        let lo = (off * rate as f64).round() as usize;
        let hi = lo + (dur * rate as f64).round() as usize;
        let opts = DecodeAudio::default().offset_s(off).duration_s(Some(dur));
        let (part, pshape, _) = samples(name, &opts);
        assert_eq!(pshape, vec![c, hi - lo], "{name}");
        let want = slice(&full, c, n, lo, hi);
        assert_eq!(part, want, "{name}: offset decode");

        // Duration only: a prefix.
        let opts = DecodeAudio::default().duration_s(Some(dur));
        let (head, hshape, _) = samples(name, &opts);
        let m = (dur * rate as f64).round() as usize;
        assert_eq!(hshape, vec![c, m], "{name}");
        assert_eq!(head, slice(&full, c, n, 0, m), "{name}: prefix");

        // Offset past the end: no frames.
        let opts = DecodeAudio::default().offset_s(100.0);
        let (_, eshape, _) = samples(name, &opts);
        assert_eq!(eshape, vec![c, 0], "{name}: past the end");
    }
}

#[test]
fn mono_is_the_channel_mean() {
    let (full, shape, _) = samples("pcm16_3ch_16k.wav", &DecodeAudio::default());
    let (mono, mshape, _) = samples("pcm16_3ch_16k.wav", &DecodeAudio::default().mono(true));
    let n = shape[1];
    assert_eq!(mshape, vec![1, n]);
    for i in 0..n {
        let mean = (full[i] + full[n + i] + full[2 * n + i]) / 3.0;
        assert!((mono[i] - mean).abs() <= 1e-7, "frame {i}");
    }
}

#[test]
fn info_reads_the_header() {
    let i = audio_info(&file("flac24_stereo_48k.flac")).unwrap();
    assert_eq!(
        (i.sample_rate, i.channels, i.frames),
        (48000, Some(2), Some(12000))
    );
    assert_eq!(i.codec, "flac");
    let i = audio_info(&file("pcm_u8_mono_8k.wav")).unwrap();
    assert_eq!(
        (i.sample_rate, i.channels, i.frames),
        (8000, Some(1), Some(8000))
    );
}

#[test]
fn empty_stream_and_non_audio() {
    let a = decode_audio(&file("pcm16_empty.wav"), &DecodeAudio::default()).unwrap();
    assert_eq!(a.samples.shape(), &[2, 0]);
    assert_eq!(a.sample_rate, 16000);
    for bad in [
        &b""[..],
        b"RIFF",
        b"not audio at all, just text",
        &[0u8; 4096],
    ] {
        let e = decode_audio(bad, &DecodeAudio::default()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Operator, "{e}");
        assert!(e.message.starts_with("decode_audio: "), "{e}");
    }
}

#[test]
fn truncated_files_decode_what_is_there() {
    let full = file("pcm16_stereo_44k1.wav");
    let cut = &full[..full.len() / 2];
    let (a, report) = DecodeAudio::default().apply_with_report(cut).unwrap();
    let frames = a.samples.shape()[1];
    assert!(frames > 10_000 && frames < 22_050, "{frames}");
    assert!(report.truncated);
    // The frames that are there are right.
    let whole = decode_audio(&full, &DecodeAudio::default()).unwrap();
    let w = whole.samples.to_vec::<f32>().unwrap();
    let p = a.samples.to_vec::<f32>().unwrap();
    assert_eq!(&p[..frames], &w[..frames]);
    let e = DecodeAudio::default()
        .allow_truncated(false)
        .apply(cut)
        .unwrap_err();
    assert!(e.message.contains("truncated"), "{e}");

    for name in [
        "flac16_stereo_44k1.flac",
        "mp3_mono_44k1.mp3",
        "vorbis_stereo_44k1.ogg",
    ] {
        let full = file(name);
        let whole = decode_audio(&full, &DecodeAudio::default()).unwrap();
        let (a, _) = DecodeAudio::default()
            .apply_with_report(&full[..full.len() * 2 / 3])
            .unwrap();
        let (n, m) = (whole.samples.shape()[1], a.samples.shape()[1]);
        assert!(m > n / 3 && m < n, "{name}: {m} of {n} frames");
    }
}

#[test]
fn corrupt_flac_frames_are_skipped_as_silence_and_counted() {
    let mut bytes = file("flac16_stereo_44k1.flac");
    let whole = decode_audio(&bytes, &DecodeAudio::default()).unwrap();
    // Damage a run of bytes in the middle of the stream (inside some frame).
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0x5a;
    }
    let (a, report) = DecodeAudio::default().apply_with_report(&bytes).unwrap();
    assert!(report.bad_packets >= 1, "{report:?}");
    // Timing is kept: the same length as the intact file.
    assert_eq!(a.samples.shape(), whole.samples.shape());
    let e = DecodeAudio::default()
        .max_bad_packets(0)
        .apply(&bytes)
        .unwrap_err();
    assert!(e.message.contains("corrupt packets"), "{e}");
}

#[test]
fn sample_limit_refuses_bombs() {
    // A header that claims a 4 GiB data chunk.
    let mut bytes = file("pcm16_stereo_44k1.wav");
    bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let pos = bytes.windows(4).position(|w| w == b"data").unwrap();
    bytes[pos + 4..pos + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = decode_audio(&bytes, &DecodeAudio::default()).unwrap_err();
    assert!(e.message.contains("over the limit"), "{e}");
    // A duration limit makes the same header acceptable.
    let a = decode_audio(&bytes, &DecodeAudio::default().duration_s(Some(0.1))).unwrap();
    assert_eq!(a.samples.shape(), &[2, 4410]);
    // Formats without a length in the header are checked while decoding.
    let e = decode_audio(
        &file("lame_stereo_22k05.mp3"),
        &DecodeAudio::default().max_samples(10_000),
    )
    .unwrap_err();
    assert!(e.message.contains("limit"), "{e}");
}

#[test]
fn bad_parameters_are_invalid() {
    let bytes = file("pcm16_stereo_44k1.wav");
    for opts in [
        DecodeAudio::default().offset_s(-1.0),
        DecodeAudio::default().offset_s(f64::NAN),
        DecodeAudio::default().duration_s(Some(-0.5)),
    ] {
        let e = decode_audio(&bytes, &opts).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid, "{e}");
    }
}

#[test]
fn mutated_and_truncated_files_never_panic() {
    let mut rng = Rng::from_words(&[5, 5]);
    for name in [
        "pcm16_stereo_44k1.wav",
        "pcm_u8_mono_8k.wav",
        "float32_mono_22k05.wav",
        "flac24_stereo_48k.flac",
        "mp3_mono_44k1.mp3",
        "lame_stereo_22k05.mp3",
        "vorbis_stereo_44k1.ogg",
    ] {
        let orig = file(name);
        let opts = DecodeAudio::default().max_samples(1 << 22);
        for i in 0..40 {
            let mut b = orig.clone();
            if i % 2 == 0 {
                // Damage a few bytes, often in the header.
                let k = 1 + rng.below(8) as usize;
                for _ in 0..k {
                    let limit = if rng.below(2) == 0 {
                        256.min(b.len())
                    } else {
                        b.len()
                    };
                    let at = rng.below(limit as u64) as usize;
                    b[at] = rng.below(256) as u8;
                }
            } else {
                b.truncate(rng.below(b.len() as u64) as usize);
            }
            // Ok or a clean error; both are fine, a panic is not.
            let _ = decode_audio(&b, &opts);
            let _ = decode_audio(&b, &opts.clone().offset_s(0.2).mono(true));
            let _ = audio_info(&b);
        }
    }
}

/// Found by `fuzz/audio` (a CI run on 4 December 2026): a WAV header whose sample rate is 0
/// made symphonia panic while opening it (`TimeBase` with a zero denominator). It is a clean
/// operator error naming the field, for the header and for the decode.
#[test]
fn a_wav_header_with_a_zero_sample_rate_is_an_error_not_a_panic() {
    let mut wav = b"RIFF\x24\xfa\0\0WAVEfmt \x10\0\0\0".to_vec();
    // PCM, 8 channels, 0 Hz, 0 bytes/s, block align 4, 32 bits.
    wav.extend_from_slice(&[1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 32, 0]);
    wav.extend_from_slice(b"data\0\xfa\0\0");
    wav.extend((0..512u32).map(|i| (i * 7) as u8));
    for opts in [
        DecodeAudio::default(),
        DecodeAudio::default().mono(true).offset_s(0.01),
    ] {
        let e = decode_audio(&wav, &opts).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Operator, "{e}");
        assert!(e.to_string().contains("sample rate of 0"), "{e}");
    }
    let e = audio_info(&wav).unwrap_err();
    assert!(e.to_string().contains("sample rate of 0"), "{e}");
    // And 0 channels.
    let at = wav.windows(4).position(|w| w == b"fmt ").unwrap() + 10;
    wav[at] = 0;
    wav[at + 4] = 0x44;
    let e = audio_info(&wav).unwrap_err();
    assert!(e.to_string().contains("0 channels"), "{e}");
}

/// The page checksum of an Ogg page (CRC-32, polynomial 0x04C11DB7, not reflected, over the
/// page with its checksum field zeroed), so that a corrupted page is still a valid page.
fn ogg_crc(page: &[u8]) -> u32 {
    let mut crc = 0u32;
    for (i, &b) in page.iter().enumerate() {
        let b = if (22..26).contains(&i) { 0 } else { b };
        crc ^= u32::from(b) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04c1_1db7
            } else {
                crc << 1
            };
        }
    }
    crc
}

fn refused(bytes: &[u8], needle: &str) {
    for r in [
        decode_audio(bytes, &DecodeAudio::default()).map(|_| ()),
        audio_info(bytes).map(|_| ()),
    ] {
        let e = r.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Operator, "{e}");
        assert!(e.to_string().contains(needle), "{e}");
    }
}

/// Found by fuzz/audio: symphonia allocates a comment's (or picture's, or ID3v2.3 frame's)
/// length before reading it, so a corrupt 32-bit length asked for 2.3 GB from an 800-byte
/// file. Each such length is checked against what holds it first, in every container that
/// has one, and the file is refused naming the structure and the byte.
#[test]
fn a_length_past_the_end_of_its_block_is_refused_before_anything_is_allocated() {
    // FLAC: the comment block of a file flac wrote (block at byte 42: vendor string, no
    // comments), given one comment whose length says 2.3 GB.
    let flac = file("flac16_stereo_44k1.flac");
    assert_eq!(
        flac[42] & 0x7f,
        4,
        "the fixture's second block is its comments"
    );
    let len = u32::from_be_bytes([0, flac[43], flac[44], flac[45]]) as usize;
    let mut block = flac[46..46 + len - 4].to_vec();
    block.extend_from_slice(&1u32.to_le_bytes());
    let first = 46 + block.len();
    block.extend_from_slice(&0x8800_0000u32.to_le_bytes());
    block.extend_from_slice(b"TITLE=x");
    let mut bad = flac[..42].to_vec();
    bad.push(flac[42]);
    bad.extend_from_slice(&(block.len() as u32).to_be_bytes()[1..]);
    bad.extend_from_slice(&block);
    bad.extend_from_slice(&flac[46 + len..]);
    refused(
        &bad,
        &format!(
            "FLAC comment block at byte 42 gives a length of 2281701376 bytes at byte {first}"
        ),
    );
    // With an honest length, the same comment decodes.
    let mut honest = bad.clone();
    honest[first..first + 4].copy_from_slice(&7u32.to_le_bytes());
    decode_audio(&honest, &DecodeAudio::default()).unwrap();

    // FLAC: a picture block (inserted after STREAMINFO) whose data length is 4 GB.
    let mut pic = Vec::new();
    pic.extend_from_slice(&3u32.to_be_bytes());
    pic.extend_from_slice(&10u32.to_be_bytes());
    pic.extend_from_slice(b"image/jpeg");
    pic.extend_from_slice(&0u32.to_be_bytes());
    pic.extend_from_slice(&[0; 16]);
    pic.extend_from_slice(&u32::MAX.to_be_bytes());
    pic.extend_from_slice(&[0xff, 0xd8, 0xff]);
    let mut bad = flac[..42].to_vec();
    bad.push(6);
    bad.extend_from_slice(&(pic.len() as u32).to_be_bytes()[1..]);
    bad.extend_from_slice(&pic);
    bad.extend_from_slice(&flac[42..]);
    refused(
        &bad,
        "FLAC picture block at byte 42 gives a length of 4294967295",
    );

    // Ogg Vorbis: the comment packet starts the second page; its first comment's length.
    let ogg = file("vorbis_stereo_44k1.ogg");
    let page = ogg.windows(4).skip(4).position(|w| w == b"OggS").unwrap() + 4;
    let data = page + 27 + ogg[page + 26] as usize;
    assert_eq!(&ogg[data..data + 7], b"\x03vorbis");
    let vendor = u32::from_le_bytes(ogg[data + 7..data + 11].try_into().unwrap()) as usize;
    let first = data + 7 + 4 + vendor + 4;
    let page_len = ogg[page + 27..data]
        .iter()
        .map(|&l| l as usize)
        .sum::<usize>()
        + data
        - page;
    let mut bad = ogg.clone();
    bad[first..first + 4].copy_from_slice(&0x7000_0000u32.to_le_bytes());
    let crc = ogg_crc(&bad[page..page + page_len]);
    bad[page + 22..page + 26].copy_from_slice(&crc.to_le_bytes());
    refused(
        &bad,
        &format!("Ogg Vorbis comment packet (from byte {data}) gives a length of 1879048192"),
    );

    // ID3v2.3 in front of an MP3: a title frame whose size says 4 GB. The same tag with an
    // honest size decodes to the same audio as the bare file.
    let mp3 = file("lame_stereo_22k05.mp3");
    let tag = |size: u32| {
        let mut t = b"ID3\x03\0\0".to_vec();
        let body = 10 + 6 + 8;
        t.extend_from_slice(&[0, 0, 0, body]);
        t.extend_from_slice(b"TIT2");
        t.extend_from_slice(&size.to_be_bytes());
        t.extend_from_slice(&[0, 0, 0]);
        t.extend_from_slice(b"title");
        t.extend_from_slice(&[0; 8]);
        t.extend_from_slice(&mp3);
        t
    };
    refused(
        &tag(0xffff_fff0),
        "ID3v2.3 frame TIT2 (tag at byte 0) gives a length of 4294967280 bytes at byte 14",
    );
    let plain = decode_audio(&mp3, &DecodeAudio::default()).unwrap();
    let tagged = decode_audio(&tag(6), &DecodeAudio::default()).unwrap();
    assert_eq!(
        plain.samples.to_vec::<f32>().unwrap(),
        tagged.samples.to_vec::<f32>().unwrap()
    );

    // The files as written still decode: the checks refuse only lengths past their end.
    for name in [
        "flac16_stereo_44k1.flac",
        "flac24_stereo_48k.flac",
        "vorbis_stereo_44k1.ogg",
        "mp3_mono_44k1.mp3",
    ] {
        decode_audio(&file(name), &DecodeAudio::default()).unwrap();
    }
}
