//! Audio containers and codecs through the audio decoder: WAV, FLAC, MP3, Ogg Vorbis
//! (symphonia), header only and decoded, with the sample limit lowered.
//! Regression: a WAV header with a sample rate of 0 (symphonia panicked; now refused by
//! name, `a_wav_header_with_a_zero_sample_rate_is_an_error_not_a_panic`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker_ops::audio::{audio_info, DecodeAudio};

fuzz_target!(|data: &[u8]| {
    // The decoder catches symphonia's panics and makes them errors (`guarded` in
    // stoker-ops' audio/decode.rs); a panic anywhere else still aborts.
    stoker_fuzz::abort_on_panics_except_in(&["/symphonia-"]);
    let Some((&opts, data)) = data.split_first() else {
        return;
    };
    let _ = audio_info(data);
    let hint = [None, Some("wav"), Some("flac"), Some("mp3"), Some("ogg")][(opts % 5) as usize];
    let d = DecodeAudio::default()
        .mono(opts & 8 != 0)
        .max_samples(1 << 20)
        .allow_truncated(opts & 16 == 0)
        .offset_s(if opts & 32 != 0 { 0.01 } else { 0.0 })
        .duration_s((opts & 64 != 0).then_some(0.05))
        .hint(hint);
    if let Ok((audio, _report)) = d.apply_with_report(data) {
        assert!(audio.channels() >= 1 || audio.frames() == 0);
    }
});
