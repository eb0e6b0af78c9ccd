"""Writes the speech-pipeline benchmark set: 200 MP3 clips of 5-10 s, 44.1 kHz mono,
96 kbit/s (LAME through `lameenc`), speech-like content (voiced tone with vibrato and
formants, syllable envelope, noise bursts).

    python crates/stoker-ops/examples/audio_make_clips.py /work/data-audio
"""

import os
import sys

import lameenc
import numpy as np

out = sys.argv[1] if len(sys.argv) > 1 else "/work/data-audio"
os.makedirs(out, exist_ok=True)
sr = 44100
rng = np.random.default_rng(7)
for i in range(200):
    seconds = rng.uniform(5.0, 10.0)
    n = int(sr * seconds)
    t = np.arange(n) / sr
    f0 = rng.uniform(90, 220) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(2, 5) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    x = np.zeros(n)
    formants = rng.uniform([400, 1200, 2300], [800, 1800, 3000])
    for h in range(1, 50):
        fh = h * f0
        amp = sum(np.exp(-((fh - fc) / 150.0) ** 2) for fc in formants) + 0.02
        x += np.where(fh < sr / 2, amp, 0) / h**0.5 * np.sin(h * phase)
    x *= np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t), 0, None) ** 0.5
    x += 0.05 * rng.standard_normal(n) * (np.sin(2 * np.pi * 1.3 * t) > 0.7)
    x = x / np.abs(x).max() * 0.8
    enc = lameenc.Encoder()
    enc.set_bit_rate(96)
    enc.set_in_sample_rate(sr)
    enc.set_channels(1)
    enc.set_quality(2)
    data = enc.encode((x * 32767).astype("<i2").tobytes()) + enc.flush()
    with open(os.path.join(out, f"clip_{i:03d}.mp3"), "wb") as f:
        f.write(data)
print(f"wrote 200 clips to {out}")
