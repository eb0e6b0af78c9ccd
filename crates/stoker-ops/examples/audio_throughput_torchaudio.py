"""The peer of `audio_throughput.rs`: the same speech front end on the same MP3 clips with
soundfile (libsndfile + mpg123) for decoding and torchaudio for the DSP, on one thread.

    python crates/stoker-ops/examples/audio_throughput_torchaudio.py /work/data-audio

Decode (mono) -> Resample(44100, 16000) (kernel built once, as transforms.Resample does)
-> Spectrogram(400, hop 160, power=None) -> TimeStretch(rate in 0.9-1.1) -> |.|^2 ->
MelScale(80) -> AmplitudeToDB(top_db=80) -> FrequencyMasking(27) -> TimeMasking(100); also
MelSpectrogram directly (no stretch), and librosa's load(sr=16000) + melspectrogram for
reference.
"""

import glob
import os
import sys
import time

import numpy as np
import soundfile as sf
import torch
import torchaudio
import torchaudio.transforms as T

torch.set_num_threads(1)
d = sys.argv[1] if len(sys.argv) > 1 else "/work/data-audio"
files = sorted(glob.glob(os.path.join(d, "*.mp3")))
blobs = [open(f, "rb").read() for f in files]
n = len(blobs)
import io

resample = T.Resample(44100, 16000)
spec = T.Spectrogram(400, hop_length=160, power=None)
stretch = T.TimeStretch(hop_length=160, n_freq=201)
mel = T.MelScale(80, 16000, n_stft=201)
db = T.AmplitudeToDB("power", 80.0)
fmask = T.FrequencyMasking(27)
tmask = T.TimeMasking(100)
melspec = T.MelSpectrogram(16000, n_fft=400, hop_length=160, n_mels=80)
gen = np.random.default_rng(0)

with torch.inference_mode():
    t0 = time.perf_counter()
    decoded = []
    audio_s = 0.0
    for b in blobs:
        x, sr = sf.read(io.BytesIO(b), dtype="float32", always_2d=True)
        x = torch.from_numpy(x.mean(axis=1, keepdims=True).T.copy())
        audio_s += x.shape[1] / sr
        decoded.append(x)
    t_decode = time.perf_counter() - t0

    t0 = time.perf_counter()
    res = [resample(x) for x in decoded]
    t_resample = time.perf_counter() - t0

    t0 = time.perf_counter()
    for x in res:
        s = stretch(spec(x), float(gen.uniform(0.9, 1.1)))
        m = db(mel(s.abs().pow(2.0)))
        m = tmask(fmask(m))
    t_features = time.perf_counter() - t0

    t0 = time.perf_counter()
    for x in res:
        m = tmask(fmask(db(melspec(x))))
    t_plain = time.perf_counter() - t0

try:
    import librosa

    t0 = time.perf_counter()
    for f in files[:50]:
        y, _ = librosa.load(f, sr=16000, mono=True)
        m = librosa.power_to_db(librosa.feature.melspectrogram(y=y, sr=16000, n_fft=400, hop_length=160, n_mels=80, htk=True, norm=None))
    t_librosa = (time.perf_counter() - t0) * n / 50
except Exception as e:  # librosa is optional
    print("librosa skipped:", e)
    t_librosa = None

print(f"{n} clips, {audio_s:.0f} s of audio; one thread, torch {torch.__version__}, torchaudio {torchaudio.__version__}, libsndfile {sf.__libsndfile_version__}")


def row(name, t):
    print(f"{name:<44} {n / t:8.1f} clips/s {audio_s / t:8.0f}x real time ({t:.3f} s)")


row("decode MP3 (soundfile, mono)", t_decode)
row("resample 44.1 -> 16 kHz", t_resample)
row("stft + stretch + power + mel + dB + masks", t_features)
row("mel spectrogram + dB + masks (no stretch)", t_plain)
row("full chain (with stretch)", t_decode + t_resample + t_features)
row("full chain (no stretch)", t_decode + t_resample + t_plain)
if t_librosa:
    row("librosa load(sr=16k, soxr) + mel + dB", t_librosa)
