#!/usr/bin/env python3
"""The Python peers of bench/ops.py, one per subcommand, each printing one JSON line:
{"images": N, "seconds": S, "first_batch_s": F}. Run in the venv of bench/setup.sh.

  torch   --dir D --workers N --batch B --pipeline imagenet|simclr|speech
          torchvision.datasets.ImageFolder + the pipeline's transforms in a DataLoader;
          speech: soundfile decode + torchaudio transforms in a DataLoader
  tfdata  --dir D --batch B --pipeline imagenet
          tf.data: list files, read, decode_and_crop_jpeg at a box drawn by
          sample_distorted_bounding_box (scale 0.08-1, ratio 3/4-4/3: tf's own fused
          crop-decode), resize 224, flip, normalize, AUTOTUNE everywhere, batch
  tokenize --dir D --tokenizer F --batch B
          Hugging Face tokenizers: the JSONL files' "text" fields, encode_batch (rayon on
          every core) with truncation to 1024, the end-of-text id appended, padding to the
          longest in the batch (with 0); ids and masks to NumPy int arrays
  decode  --dir D --procs N [--half]
          the limit: PIL (libjpeg-turbo) decode of every file to RGB in N processes;
          with --half, at half size by libjpeg-turbo's DCT-domain scaling (PIL's draft);
          with --crop, only a RandomResizedCrop box of each file (torchvision's sampling:
          scale 0.08-1, ratio 3/4-4/3), by tf.io.decode_and_crop_jpeg (libjpeg-turbo's
          region decode), timed after each process has imported TensorFlow
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import harness as H  # bench/harness.py (bench/ is on sys.path: this file is run as a script)

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def emit(images: int, t0: float, first: float | None, first_n: int = 0, t_fw: float | None = None) -> None:
    """One JSON line. `t_fw`: when the array framework (torch, TensorFlow, NumPy) had been
    imported, which every training script does whatever its loader: `import_s` is the time
    from `t0` to it, so a reader can also time the loader alone."""
    H.emit({
        "images": images,
        "seconds": time.perf_counter() - t0,
        "first_batch_s": None if first is None else first - t0,
        "first_batch_images": first_n,
        "import_s": 0.0 if t_fw is None else t_fw - t0,
    })


def files(d: str) -> list[str]:
    out = []
    for root, _dirs, names in os.walk(d):
        out += [os.path.join(root, n) for n in names if n.lower().endswith((".jpg", ".jpeg"))]
    return sorted(out)


class SpeechClips:
    """MP3 clips through soundfile and torchaudio: the speech pipeline of bench/ops.py."""

    def __init__(self, d: str) -> None:
        self.paths = sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".mp3"))
        self.t = None

    def _transforms(self):
        import torchaudio.transforms as T

        return {
            "resample": T.Resample(44100, 16000),
            "spec": T.Spectrogram(400, hop_length=160, power=None),
            "stretch": T.TimeStretch(hop_length=160, n_freq=201),
            "mel": T.MelScale(80, 16000, n_stft=201),
            "db": T.AmplitudeToDB("power", 80.0),
            "fmask": T.FrequencyMasking(27),
            "tmask": T.TimeMasking(100),
        }

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import random

        import soundfile as sf
        import torch

        if self.t is None:  # built once per worker (the resample kernel is costly)
            self.t = self._transforms()
        t = self.t
        x, sr = sf.read(self.paths[i], dtype="float32", always_2d=True)
        w = torch.from_numpy(x.T.mean(0, keepdims=True))
        if sr != 44100:
            raise ValueError(f"{self.paths[i]}: {sr} Hz")
        w = t["resample"](w)
        s = t["stretch"](t["spec"](w), random.uniform(0.9, 1.1))
        m = t["db"](t["mel"](s.abs().pow(2)))
        return t["tmask"](t["fmask"](m))


def cmd_speech(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    dl = torch.utils.data.DataLoader(
        SpeechClips(a.dir), batch_size=16, shuffle=True, num_workers=a.workers,
        collate_fn=list, prefetch_factor=2 if a.workers else None,
    )
    n, first, first_n = 0, None, 0
    for b in dl:
        if first is None:
            first, first_n = time.perf_counter(), len(b)
        n += len(b)
    emit(n, t0, first, first_n)


def cmd_torch(a: argparse.Namespace) -> None:
    if a.pipeline == "speech":
        return cmd_speech(a)
    t0 = time.perf_counter()
    import torch
    from torchvision import datasets, transforms as T

    torch.set_num_threads(1)
    if a.pipeline == "imagenet":
        tf = T.Compose([
            T.RandomResizedCrop(224),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
        ])
    else:  # simclr
        tf = T.Compose([
            T.RandomResizedCrop(224),
            T.RandomHorizontalFlip(),
            T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
            T.RandomGrayscale(p=0.2),
            T.GaussianBlur(23, sigma=(0.1, 2.0)),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
        ])
    ds = datasets.ImageFolder(a.dir, transform=tf)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
        persistent_workers=False, prefetch_factor=2 if a.workers else None,
    )
    n, first, first_n = 0, None, 0
    for x, _y in dl:
        if first is None:
            first, first_n = time.perf_counter(), x.shape[0]
        n += x.shape[0]
    emit(n, t0, first, first_n)


def tf_random_crop_decode(tf, data):
    """RandomResizedCrop's box (scale 0.08-1, ratio 3/4-4/3) drawn by
    sample_distorted_bounding_box, decoded by decode_and_crop_jpeg (tf's own fused
    crop-decode): the crop as uint8 HWC, not yet resized. Shared with bench/cedar_readers.py."""
    shape = tf.image.extract_jpeg_shape(data)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, tf.zeros([0, 0, 4], tf.float32), area_range=(0.08, 1.0),
        aspect_ratio_range=(3 / 4, 4 / 3), max_attempts=10, use_image_if_no_bounding_boxes=True)
    y, x, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(size)
    return tf.io.decode_and_crop_jpeg(data, tf.stack([y, x, h, w]), channels=3)


def tf_imagenet(data, mean, std):
    """The ImageNet transform in TensorFlow on one JPEG's bytes: the fused random crop-decode
    (tf_random_crop_decode), resize to 224, flip, normalize, CHW. Shared with
    bench/python_readers.py."""
    import tensorflow as tf

    img = tf_random_crop_decode(tf, data)
    img = tf.image.resize(img, [224, 224], method="bilinear", antialias=True)
    img = tf.image.random_flip_left_right(img)
    img = (img - mean) / std
    return tf.transpose(img, [2, 0, 1])


def cmd_tfdata(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    paths = files(a.dir)
    mean = tf.constant(MEAN) * 255.0
    std = tf.constant(STD) * 255.0
    ds = (tf.data.Dataset.from_tensor_slices(paths)
          .shuffle(len(paths))
          .map(lambda path: tf_imagenet(tf.io.read_file(path), mean, std), num_parallel_calls=tf.data.AUTOTUNE)
          .batch(a.batch)
          .prefetch(tf.data.AUTOTUNE))
    n, first, first_n = 0, None, 0
    for x in ds:
        if first is None:
            first, first_n = time.perf_counter(), int(x.shape[0])
        n += int(x.shape[0])
    emit(n, t0, first, first_n)


def _decode_part(args: tuple[list[str], int]) -> int:
    from PIL import Image

    paths, half = args
    for p in paths:
        with Image.open(p) as im:
            if half:
                im.draft("RGB", (im.width // 2, im.height // 2))
            im.convert("RGB").load()
    return len(paths)


_tf = None


def _crop_init(barrier) -> None:
    global _tf
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.io.decode_jpeg(tf.io.encode_jpeg(tf.zeros([8, 8, 3], tf.uint8)))  # the ops loaded
    _tf = tf
    barrier.wait()  # no worker takes a task before every worker is ready


def _ready(_: int) -> bool:
    return _tf is not None


def rrc_box(rng, w: int, h: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3): y, x, h, w."""
    import math

    area = w * h
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw = int(round(math.sqrt(target * ratio)))
        ch = int(round(math.sqrt(target / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    side = min(w, h)
    return (h - side) // 2, (w - side) // 2, side, side


def _crop_part(paths: list[str]) -> int:
    import random

    from PIL import Image

    rng = random.Random(len(paths))
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        with Image.open(p) as im:  # the header only
            w, h = im.size
        y, x, ch, cw = rrc_box(rng, w, h)
        _tf.io.decode_and_crop_jpeg(data, [y, x, ch, cw], channels=3).numpy()
    return len(paths)


def text_files(d: str) -> list[str]:
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".jsonl"))


def cmd_tokenize(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    import numpy as np
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    eos = 50256
    tok = Tokenizer.from_file(a.tokenizer)
    tok.post_processor = TemplateProcessing(single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", eos)])
    tok.enable_truncation(1024)
    tok.enable_padding(pad_id=0, pad_token="!")  # ids and mask padded with 0, as stoker's spec
    n, first, first_n = 0, None, 0

    def flush(texts: list[str]) -> None:
        nonlocal n, first, first_n
        enc = tok.encode_batch_fast(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        assert ids.shape == mask.shape
        if first is None:
            first, first_n = time.perf_counter(), len(texts)
        n += len(texts)

    texts: list[str] = []
    for path in text_files(a.dir):
        with open(path, encoding="utf-8") as f:
            for line in f:
                texts.append(json.loads(line)["text"])
                if len(texts) == a.batch:
                    flush(texts)
                    texts = []
    if texts:
        flush(texts)
    emit(n, t0, first, first_n)


def cmd_decode(a: argparse.Namespace) -> None:
    import multiprocessing as mp

    paths = files(a.dir)
    if a.crop:
        ctx = mp.get_context("spawn")
        with ctx.Pool(a.procs, initializer=_crop_init, initargs=(ctx.Barrier(a.procs),)) as pool:
            assert all(pool.map(_ready, range(a.procs), chunksize=1))
            t0 = time.perf_counter()
            n = sum(pool.map(_crop_part, [paths[i::a.procs] for i in range(a.procs)], chunksize=1))
        emit(n, t0, None)
        return
    t0 = time.perf_counter()
    parts = [(paths[i::a.procs], a.half) for i in range(a.procs)]
    with mp.get_context("fork").Pool(a.procs) as pool:
        n = sum(pool.map(_decode_part, parts))
    emit(n, t0, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--dir", required=True)
    t.add_argument("--workers", type=int, default=2)
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--pipeline", choices=["imagenet", "simclr", "speech"], default="imagenet")
    f = sub.add_parser("tfdata")
    f.add_argument("--dir", required=True)
    f.add_argument("--batch", type=int, default=64)
    f.add_argument("--pipeline", choices=["imagenet"], default="imagenet")
    k = sub.add_parser("tokenize")
    k.add_argument("--dir", required=True)
    k.add_argument("--tokenizer", required=True)
    k.add_argument("--batch", type=int, default=64)
    d = sub.add_parser("decode")
    d.add_argument("--dir", required=True)
    d.add_argument("--procs", type=int, default=2)
    d.add_argument("--half", action="store_true")
    d.add_argument("--crop", action="store_true")
    a = p.parse_args()
    {"torch": cmd_torch, "tfdata": cmd_tfdata, "decode": cmd_decode, "tokenize": cmd_tokenize}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
