#!/usr/bin/env python3
"""The data and the contenders of bench/cedar.py (cedar's pipelines), one per subcommand,
run in the venv of bench/setup.sh. Each contender prints one JSON line:

    {"samples": N, "batches": K, "seconds": S, "first_batch_s": F, "first_batch_samples": B,
     "import_s": I, "epoch_s": [...], "batch_sizes": {...}, ...}

`seconds`, `first_batch_s` and `import_s` count from the start of the reader (imports
included); `import_s` is when the array framework (torch, TensorFlow) had been imported.
Every batch is checked as it arrives (its shape and dtype; a contender whose batches are
wrong exits with an error, never a figure), and the counts are checked again by the driver.

  gen  --what text|audio|images --n N --root DIR   the data (seeded; see gen_*)
  run  --pipeline cv|nlp|asr|imagenet --system stoker|torch|tfdata|ray [options]

Pipelines (cedar's, bench/cedar.py's docstring has the details):
  cv        SimCLRv2 augmentation: decode JPEG, RandomResizedCrop 224, horizontal flip,
            ColorJitter(0.8, 0.8, 0.8, 0.2) with p 0.8, RandomGrayscale 0.2, GaussianBlur
            kernel 11 (sigma 0.1-2), to float32 CHW normalized (ImageNet), shuffle, batch 32
  nlp       GPT-2-style byte-level BPE (a tokenizer trained here on text PyPI packages ship),
            truncated to 254 tokens + BOS + EOS (= 256, padded), a lookup in a frozen
            50,257 x 764 float32 table (a Python function), shuffle, batch 32
  asr       decode MP3, resample to 8 kHz, STFT (400), time stretch 0.8 (phase vocoder),
            power, time mask (80), frequency mask (80), mel (256), shuffle, batch 16 (padded)
  imagenet  decode, RandomResizedCrop 224, flip, float32 CHW normalized, shuffle, batch 64
            (the training pipeline of the 3-epoch comparison)
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

BATCH = {"cv": 32, "nlp": 32, "asr": 16, "imagenet": 64}
SHUFFLE = 1024  # the shuffle buffer of every pipeline, written after the maps
SIZE = 224  # RandomResizedCrop
JITTER = (0.8, 0.8, 0.8, 0.2)  # SimCLR's colour distortion at strength 1
JITTER_P = 0.8
GRAY_P = 0.2
BLUR_KERNEL = 11
BLUR_SIGMA = (0.1, 2.0)

# NLP
VOCAB = 50257
EMBED_DIM = 764
MAX_TOKENS = 256  # 254 text tokens + BOS + EOS (cedar: Truncate(254), AddToken x2)
EOT = "<|endoftext|>"

# ASR
RATE = 8000
N_FFT = 400
HOP = N_FFT // 2  # torchaudio's default hop (win_length // 2)
STRETCH = 0.8
TIME_MASK = 80
FREQ_MASK = 80
N_MELS = 256
CLIP_RATE = 48000  # the clips' rate (as Common Voice's MP3s)

#: Optimizer passes (crates/stoker-pipeline/src/optimize.rs PASSES) that cedar's ablation
#: turns on one by one; a build's other passes are on only in the last step (the default).
PASSES = ("shuffle", "cache", "fusion")
ALL_ON = ("*",)
#: cedar's ablation steps: (threads, autotune, passes on); threads None = the default.
ABLATION = {
    "off": (1, False, ()),
    "par": (None, True, ()),
    "reorder": (None, True, ("shuffle",)),
    "cache": (None, True, ("shuffle", "cache")),
    "all": (None, True, ALL_ON),
    "nocache": (None, True, ("*", "-cache")),  # the default less the cache pass
}


# =============================================================================== data


def gen_images(a: argparse.Namespace) -> None:
    """A hard-linked ImageFolder tree of the first N JPEGs of bench/ops.py's set (--src, a
    flat directory), class i % 10 as ops.py assigns them."""
    src = a.src
    names = sorted(n for n in os.listdir(src) if n.endswith(".jpg"))[: a.n]
    if len(names) < a.n:
        raise SystemExit(f"{src} has {len(names)} JPEGs, fewer than {a.n}")
    out = a.out
    for i, name in enumerate(names):
        d = os.path.join(out, f"class{i % 10:02d}")
        os.makedirs(d, exist_ok=True)
        target = os.path.join(d, name)
        if not os.path.exists(target):
            os.link(os.path.join(src, name), target)
    H.emit({"images": len(names), "dir": out})


def _site_texts() -> tuple[list[tuple[str, str]], str]:
    """Every UTF-8 .py/.rst/.txt/.md and licence file of 2-48 KB in this venv's
    site-packages, duplicates (same bytes) removed, ordered by a hash of their path (so a
    prefix of the list spreads over the packages); and where they come from."""
    import hashlib
    import sysconfig
    from pathlib import Path

    site = Path(sysconfig.get_paths()["purelib"])
    seen: set[bytes] = set()
    docs = []
    for root, dirs, names in os.walk(site):
        dirs.sort()
        for n in sorted(names):
            p = Path(root) / n
            if not (p.suffix in (".py", ".rst", ".txt", ".md") or n.upper().startswith(("LICENSE", "COPYING"))):
                continue
            try:
                size = p.stat().st_size
            except OSError:
                continue
            if not 2048 <= size <= 48 * 1024:
                continue
            b = p.read_bytes()
            h = hashlib.sha1(b).digest()
            if h in seen:
                continue
            seen.add(h)
            try:
                text = b.decode("utf-8")
            except UnicodeDecodeError:
                continue
            rel = str(p.relative_to(site))
            docs.append((hashlib.sha1(rel.encode()).hexdigest(), text, rel))
    docs.sort()
    return [(rel, text) for _h, text, rel in docs], str(site)


def gen_text(a: argparse.Namespace) -> None:
    """Under --root: tokenizer.json (byte-level BPE, vocab 50,257 where the text allows,
    trained with `tokenizers` on the first --train-mb MB of site-packages text), table.npy
    (the frozen 50,257 x 764 float32 embedding table, standard normal, seed 0), and
    docs-N/part-XX.jsonl: the first N documents (not in the training text's order
    necessarily: the same hash order), {"text": ...} per line, 8 files."""
    import hashlib

    import numpy as np

    root = a.root
    os.makedirs(root, exist_ok=True)
    docs, site = _site_texts()
    tok_path = os.path.join(root, "tokenizer.json")
    if not os.path.exists(tok_path):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        budget, texts = a.train_mb * 1e6, []
        for _rel, text in docs:
            if budget <= 0:
                break
            texts.append(text)
            budget -= len(text)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=[EOT],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(texts, trainer)
        H.write_atomic(tok_path, tok.save)
        manifest = {"site_packages": site, "candidates": len(docs), "train_docs": len(texts),
                    "train_chars": sum(map(len, texts)), "vocab": tok.get_vocab_size()}
        with open(os.path.join(root, "tokenizer-manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
    table_path = os.path.join(root, "table.npy")
    if not os.path.exists(table_path):
        table = np.random.default_rng(0).standard_normal((VOCAB, EMBED_DIM), dtype=np.float32)
        H.write_atomic(table_path, lambda tmp: np.save(open(tmp, "wb"), table))
    if len(docs) < a.n:
        raise SystemExit(f"only {len(docs)} documents of 2-48 KB in {site}, fewer than {a.n}")
    out = os.path.join(root, f"docs-{a.n}")
    ok = out + ".ok"  # next to the directory: only the documents are in it
    if not os.path.exists(ok):
        os.makedirs(out, exist_ok=True)
        chosen = docs[: a.n]
        digest = hashlib.sha256()
        for f in range(8):
            with open(os.path.join(out, f"part-{f:02d}.jsonl"), "w", encoding="utf-8") as w:
                for rel, text in chosen[f::8]:
                    w.write(json.dumps({"text": text}) + "\n")
                    digest.update(text.encode())
        info = {"docs": len(chosen), "chars": sum(len(t) for _r, t in chosen),
                "sha256": digest.hexdigest(), "first": [r for r, _t in chosen[:5]]}
        with open(ok, "w") as f:
            json.dump(info, f)
    with open(ok) as f:
        H.emit({"dir": out, **json.load(f)})


def _clip(i: int):
    """Clip i: 2-6 s at 48 kHz of a speech-like signal (a voiced tone with a gliding,
    vibrating pitch and three formants, a syllable envelope, noise bursts), seeded by i."""
    import numpy as np

    rng = np.random.default_rng(1000 + i)
    sr = CLIP_RATE
    n = int(sr * rng.uniform(2.0, 6.0))
    t = np.arange(n) / sr
    f0 = rng.uniform(90, 240) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(0.2, 0.6) * t)) \
        * (1 + 0.03 * np.sin(2 * np.pi * rng.uniform(4, 7) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    formants = rng.uniform([300, 900, 2200], [900, 2000, 3200])
    x = np.zeros(n)
    for h in range(1, 30):
        fh = h * f0
        amp = sum(np.exp(-((fh - fc) / 180.0) ** 2) for fc in formants) + 0.01
        x += np.where(fh < sr / 2, amp, 0.0) / np.sqrt(h) * np.sin(h * phase)
    x *= np.clip(np.sin(2 * np.pi * rng.uniform(2.5, 5) * t + rng.uniform(0, 6)), 0, None) ** 0.6
    x += 0.04 * rng.standard_normal(n) * (np.sin(2 * np.pi * rng.uniform(0.8, 1.6) * t) > 0.6)
    return (0.8 * x / np.abs(x).max()).astype("float32")


def gen_audio(a: argparse.Namespace) -> None:
    """--n MP3 clips (mono, 48 kHz, written by soundfile's libsndfile + LAME) under
    --root/clips-N, clip i the same whatever N."""
    import soundfile as sf

    out = os.path.join(a.root, f"clips-{a.n}")
    ok = out + ".ok"  # next to the directory: only the clips are in it
    if not os.path.exists(ok):
        os.makedirs(out, exist_ok=True)
        seconds = 0.0
        for i in range(a.n):
            x = _clip(i)
            seconds += len(x) / CLIP_RATE
            path = os.path.join(out, f"clip_{i:04d}.mp3")
            H.write_atomic(path, lambda tmp: sf.write(tmp, x, CLIP_RATE, format="MP3", subtype="MPEG_LAYER_III"))
        with open(ok, "w") as f:
            json.dump({"clips": a.n, "seconds": seconds}, f)
    with open(ok) as f:
        H.emit({"dir": out, **json.load(f)})


# =============================================================================== checks


def tree_cpu() -> float:
    """CPU seconds of this process and every live descendant, each with what it reaped
    (utime + stime + cutime + cstime): Ray's processes and a forkserver's workers, which
    this process never waits for, are counted too (wait4 in the driver misses them)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in H.proc_tree(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])
    return total / tick


class Counter:
    """Counts what a contender yields, checks each batch's shape, and times the run."""

    def __init__(self, pipeline: str, t0: float, n_per_epoch: int, epochs: int) -> None:
        self.pipeline = pipeline
        self.t0 = t0
        self.n = n_per_epoch
        self.epochs = epochs
        self.samples = 0
        self.batches = 0
        self.first = None
        self.first_n = 0
        self.sizes: dict[int, int] = {}
        self.epoch_ends: list[float] = []
        self.frames: list[int] = []  # asr: the padded time axis of each batch
        self.t_fw = t0
        self.loops = 0

    def framework(self) -> None:
        self.t_fw = time.perf_counter()

    def check(self, shape, dtype: str) -> int:
        """Checks one batch: (B, ...) with the pipeline's sample shape; returns B."""
        shape = tuple(int(d) for d in shape)
        b = shape[0]
        want = {"cv": (3, SIZE, SIZE), "imagenet": (3, SIZE, SIZE), "nlp": (MAX_TOKENS, EMBED_DIM)}.get(self.pipeline)
        ok = "float32" in dtype
        if self.pipeline == "asr":
            ok = ok and len(shape) == 4 and shape[1:3] == (1, N_MELS) and shape[3] > 0
            if ok:
                self.frames.append(shape[3])
        else:
            ok = ok and shape[1:] == want
        if not ok or not 1 <= b <= BATCH[self.pipeline]:
            raise SystemExit(f"{self.pipeline}: batch {self.batches} has shape {shape} {dtype}, expected "
                             f"(<= {BATCH[self.pipeline]}, {want or ('1', N_MELS, 'T')}) float32")
        return b

    def add(self, shape, dtype) -> None:
        b = self.check(shape, dtype)
        now = time.perf_counter()
        if self.first is None:
            self.first, self.first_n = now, b
        self.samples += b
        self.batches += 1
        self.sizes[b] = self.sizes.get(b, 0) + 1
        # A single run over several epochs: an epoch ends where its samples are all out.
        while len(self.epoch_ends) < self.epochs and self.samples >= self.n * (len(self.epoch_ends) + 1):
            self.epoch_ends.append(now)

    def end_epoch(self) -> None:
        """An epoch that is its own loop (DataLoader, stoker.torch) has ended: checks its
        count; its end is now (add() noted its last batch)."""
        self.loops += 1
        if self.samples != self.n * self.loops:
            raise SystemExit(f"{self.pipeline}: epoch {self.loops} ended after {self.samples} samples in all, "
                             f"expected {self.n * self.loops}")
        self.epoch_ends[self.loops - 1] = time.perf_counter()

    def report(self, **extra) -> None:
        end = time.perf_counter()
        # Every epoch's batches: all full but the last of each epoch (at most one partial
        # batch an epoch; a single run may also carry one across an epoch boundary).
        full = BATCH[self.pipeline]
        partial = sum(c for b, c in self.sizes.items() if b != full)
        if partial > self.epochs:
            raise SystemExit(f"{self.pipeline}: {partial} partial batches over {self.epochs} epoch(s): {self.sizes}")
        starts = [self.t0] + self.epoch_ends[:-1]
        epoch_s = [e - s for s, e in zip(starts, self.epoch_ends)]
        out = {
            "samples": self.samples,
            "batches": self.batches,
            "seconds": end - self.t0,
            "first_batch_s": None if self.first is None else self.first - self.t0,
            "first_batch_samples": self.first_n,
            "import_s": self.t_fw - self.t0,
            "epoch_s": epoch_s,
            "batch_sizes": {str(k): v for k, v in sorted(self.sizes.items())},
            "tree_cpu_s": tree_cpu(),
        }
        if self.frames:
            out["frames_min_max"] = [min(self.frames), max(self.frames)]
        out.update(extra)
        H.emit(out)


# =============================================================================== Python functions


_TABLE = None


def table():
    """The frozen embedding table, loaded once per process (worker processes too) from
    $CEDAR_TABLE."""
    global _TABLE
    if _TABLE is None:
        import numpy as np

        _TABLE = np.load(os.environ["CEDAR_TABLE"])
    return _TABLE


def embed_sample(sample: dict) -> dict:
    """The NLP pipeline's lookup on one sample (cedar: nn.Embedding(50257, 764), frozen):
    (256,) ids -> (256, 764) float32."""
    ids = sample["input_ids"]
    return {"input_ids": ids, "attention_mask": sample["attention_mask"], "emb": table()[ids]}


def embed_batch(batch: dict) -> dict:
    """The same lookup on a batch: (B, 256) ids -> (B, 256, 764)."""
    ids = batch["input_ids"]
    return {"input_ids": ids, "attention_mask": batch["attention_mask"], "emb": table()[ids]}


_RAY: dict = {}


def ray_embed(row: dict) -> dict:
    """Ray Data's NLP map on one row: the tokenizer (truncated to 254), BOS/EOS, padding to
    256, the lookup; the tokenizer and table loaded once per worker process."""
    import numpy as np

    if not _RAY:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(os.environ["CEDAR_TOKENIZER"])
        tok.enable_truncation(MAX_TOKENS - 2)
        _RAY.update(tok=tok, eot=_eot_id(os.environ["CEDAR_TOKENIZER"]))
    ids = [_RAY["eot"], *_RAY["tok"].encode(row["text"]).ids, _RAY["eot"]]
    ids = np.array(ids + [0] * (MAX_TOKENS - len(ids)), dtype=np.int64)
    return {"input_ids": ids, "emb": table()[ids]}


# =============================================================================== stoker


def stoker_pipeline(a: argparse.Namespace, stoker):
    """The pipeline as a Stoker user writes it: the maps, then shuffle(1024), then batch."""
    p = a.pipeline
    if p in ("cv", "imagenet"):
        q = (stoker.from_url(a.data, format="imagefolder")
             .map("decode_image", field="jpg")
             .map("random_resized_crop", field="jpg", size=[SIZE, SIZE])
             .map("random_flip", field="jpg"))
        if p == "cv":
            b, c, s, h = JITTER
            q = (q.map("color_jitter", field="jpg", brightness=b, contrast=c, saturation=s, hue=h, p=JITTER_P)
                 .map("random_grayscale", field="jpg", p=GRAY_P)
                 .map("gaussian_blur", field="jpg", kernel_size=BLUR_KERNEL, sigma=list(BLUR_SIGMA)))
        q = q.map("image_to_tensor", field="jpg", normalize="imagenet").shuffle(SHUFFLE).batch(BATCH[p])
    elif p == "nlp":
        import cedar_readers as R  # by module name: worker processes import the function

        eot = _eot_id(a.tokenizer)
        q = (stoker.from_url(a.data, format="jsonl", glob="*.jsonl")
             .map("tokenize", field="text", tokenizer=a.tokenizer, max_length=MAX_TOKENS, pad_to=MAX_TOKENS,
                  bos_id=eot, eos_id=eot))
        if a.lookup == "sample":
            q = q.map(R.embed_sample, **workers(a)).shuffle(SHUFFLE).batch(BATCH[p])
        elif a.lookup == "batch":
            q = q.map("select", fields=["input_ids", "attention_mask"]).shuffle(SHUFFLE).batch(BATCH[p])
            q = q.map(R.embed_batch, **workers(a))
        elif a.lookup == "native":
            # Stoker's native embedding operator (commit 096296a): rows of the .npy table
            # by id, memory-mapped; the driver runs this only when the build has it.
            q = (q.map("embedding", field="input_ids", table=os.environ["CEDAR_TABLE"], to="emb")
                 .map("select", fields=["input_ids", "attention_mask", "emb"])
                 .shuffle(SHUFFLE).batch(BATCH[p]))
        else:
            raise SystemExit(f"unknown lookup {a.lookup}")
    elif p == "asr":
        f = "mp3"
        q = (stoker.from_url(a.data, format="files", glob="*.mp3")
             # max_bad_packets=1: Stoker refuses 9 of the 300 clips (libsndfile's MP3s) for a
             # "gap" of 5-39 frames before the last packet, which mpg123 decodes without
             # one (the samples are the same; Stoker adds that many zeros at the end).
             .map("decode_audio", field=f, mono=True, max_bad_packets=1)
             .map("resample", field=f, rate=RATE)
             .map("stft", field=f, n_fft=N_FFT)
             .map("time_stretch", field=f, rate=STRETCH, hop_length=HOP)
             .map("complex_power", field=f)
             .map("time_masking", field=f, mask_param=TIME_MASK)
             .map("frequency_masking", field=f, mask_param=FREQ_MASK)
             .map("mel_scale", field=f, n_mels=N_MELS)
             .shuffle(SHUFFLE)
             .batch(BATCH[p], collate="pad"))
    else:
        raise SystemExit(f"unknown pipeline {p}")
    threads, autotune, on = ABLATION[a.ablation]
    known = known_passes(stoker)
    if "*" in on:
        disabled = [d for d in known if "-" + d in on]
    else:
        disabled = [d for d in known if d not in on]
    opts = {"autotune": autotune, "disable": disabled}
    if threads is not None:
        opts["threads"] = threads
    return q.seed(1).options(**opts)


def workers(a: argparse.Namespace) -> dict:
    """The Python function's placement: `--pyfn auto` is Stoker's default (`workers="auto"`:
    threads or processes, chosen by measuring whether the function holds the GIL)."""
    return {} if a.pyfn == "auto" else {"workers": a.pyfn}


def known_passes(stoker) -> list[str]:
    """The optimizer passes this build of Stoker can turn off: `stoker.OPTIMIZER_PASSES`
    where the package has it, else the list its refusal of an unknown name gives, else each
    of PASSES tried. The results file records them (an older build without a pass runs
    the ablation step without it)."""
    names = getattr(stoker, "OPTIMIZER_PASSES", None)
    if names is not None:
        return list(names)
    try:
        stoker.from_samples([{"x": 0}]).options(disable=["no-such-pass"])
    except ValueError as e:
        text = str(e)
        if "turned off:" in text:
            return [n.strip().strip(")") for n in text.split("turned off:", 1)[1].split(",") if n.strip()]
    known = []
    for name in PASSES:
        try:
            stoker.from_samples([{"x": 0}]).options(disable=[name])
            known.append(name)
        except ValueError:
            pass
    return known


def has_op(stoker, name: str) -> bool:
    """Whether this build of Stoker knows the operator `name` (an unknown one is refused
    when the pipeline is built, before any run)."""
    try:
        stoker.from_samples([{"x": 0}]).map(name, field="x")
    except Exception as e:  # noqa: BLE001
        return "unknown" not in str(e).lower()
    return True


def _eot_id(tokenizer: str) -> int:
    with open(tokenizer) as f:
        vocab = json.load(f)["model"]["vocab"]
    return int(vocab[EOT])


FIELD = {"cv": "jpg", "imagenet": "jpg", "nlp": "emb", "asr": "mp3"}


def run_stoker(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    c = Counter(a.pipeline, t0, a.n, a.epochs)
    import torch  # noqa: F401  (the framework the batches go to)

    c.framework()
    import stoker
    from stoker.torch import to_torch

    if a.pipeline == "nlp":
        import cedar_readers as R  # the module the pipeline's functions come from

        os.environ["CEDAR_TABLE"] = a.table
        if a.pyfn != "processes":
            R.table()  # loaded before the run, as a module-level table would be
    p = stoker_pipeline(a, stoker)
    field = FIELD[a.pipeline]
    if a.per_epoch:  # a training loop over stoker.torch: one run per epoch
        import stoker.torch as st

        loader = st.DataLoader(st.Dataset(p))
        for _ in range(a.epochs):
            for b in loader:
                x = b[field]
                c.add(x.shape, str(x.dtype))
            c.end_epoch()
        c.report(explain=p.explain(), passes_known=known_passes(stoker), run_options=p.run_options)
        return
    p = p.epochs(a.epochs)
    run = p.run()
    for b in run:
        x = to_torch(b)[field]
        c.add(x.shape, str(x.dtype))
    stats = run.stats()
    keep = {k: stats.get(k) for k in ("operators", "sample_cache", "batch_slots", "autotune", "threads", "memory")
            if k in stats}
    # The run's own explain(): the plan it ran (the cache is decided by the run) and each
    # operator's measurements against its declaration.
    c.report(explain=run.explain(), stats=keep, passes_known=known_passes(stoker), run_options=p.run_options)


# =============================================================================== torch


def torch_simclr():
    from torchvision import transforms as T

    return T.Compose([
        T.RandomResizedCrop(SIZE),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(*JITTER)], p=JITTER_P),
        T.RandomGrayscale(p=GRAY_P),
        T.GaussianBlur(BLUR_KERNEL, sigma=BLUR_SIGMA),
        T.ToTensor(),
        T.Normalize(MEAN, STD),
    ])


def torch_imagenet():
    from torchvision import transforms as T

    return T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


class TextDocs:
    """cedar's NLP pipeline as a map-style dataset: the documents (read from the JSONL
    files when the dataset is made), GPT-2-style BPE (Hugging Face tokenizers, truncated to
    254), BOS/EOS, padded to 256, then F.embedding in the frozen table."""

    def __init__(self, data: str, tokenizer: str, table_path: str) -> None:
        import numpy as np
        import torch

        self.docs = []
        for name in sorted(os.listdir(data)):
            if name.endswith(".jsonl"):
                with open(os.path.join(data, name), encoding="utf-8") as f:
                    self.docs += [json.loads(line)["text"] for line in f if line.strip()]
        self.tokenizer = tokenizer
        self.eot = _eot_id(tokenizer)
        self.table = torch.from_numpy(np.load(table_path))  # shared with forked workers
        self.tok = None

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int):
        import torch
        import torch.nn.functional as F

        if self.tok is None:  # per process
            from tokenizers import Tokenizer

            self.tok = Tokenizer.from_file(self.tokenizer)
            self.tok.enable_truncation(MAX_TOKENS - 2)
        ids = [self.eot, *self.tok.encode(self.docs[i]).ids, self.eot]
        n = len(ids)
        ids = torch.tensor(ids + [0] * (MAX_TOKENS - n), dtype=torch.int64)
        mask = torch.zeros(MAX_TOKENS, dtype=torch.int64)
        mask[:n] = 1
        return {"input_ids": ids, "attention_mask": mask, "emb": F.embedding(ids, self.table)}


class SpeechClips:
    """cedar's ASR pipeline as a map-style dataset: soundfile (libsndfile + mpg123) decode,
    torchaudio's Resample, Spectrogram (complex), TimeStretch (fixed rate), power,
    TimeMasking, FrequencyMasking, MelScale."""

    def __init__(self, data: str) -> None:
        self.paths = sorted(os.path.join(data, n) for n in os.listdir(data) if n.endswith(".mp3"))
        self.t = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import soundfile as sf
        import torch
        import torchaudio.transforms as T

        if self.t is None:  # once per process (the resampling kernel is built here)
            self.t = {
                "resample": T.Resample(CLIP_RATE, RATE),
                "spec": T.Spectrogram(N_FFT, hop_length=HOP, power=None),
                "stretch": T.TimeStretch(hop_length=HOP, n_freq=N_FFT // 2 + 1, fixed_rate=STRETCH),
                "tmask": T.TimeMasking(TIME_MASK),
                "fmask": T.FrequencyMasking(FREQ_MASK),
                "mel": T.MelScale(N_MELS, RATE, n_stft=N_FFT // 2 + 1),
            }
        t = self.t
        x, sr = sf.read(self.paths[i], dtype="float32", always_2d=True)
        if sr != CLIP_RATE:
            raise ValueError(f"{self.paths[i]}: {sr} Hz")
        w = torch.from_numpy(x.T.mean(0, keepdims=True))
        s = t["stretch"](t["spec"](t["resample"](w)))
        s = s.abs().pow(2)
        return t["mel"](t["fmask"](t["tmask"](s)))


def pad_collate(items):
    """Pads [1, n_mels, T] tensors along T with 0 and stacks them."""
    import torch

    width = max(x.shape[-1] for x in items)
    out = torch.zeros((len(items), *items[0].shape[:-1], width), dtype=items[0].dtype)
    for k, x in enumerate(items):
        out[k, ..., : x.shape[-1]] = x
    return out


def run_torch(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    c = Counter(a.pipeline, t0, a.n, a.epochs)
    import torch

    c.framework()
    import warnings

    warnings.filterwarnings("ignore", message=".*filterbank.*")  # 256 mels over 201 bins, as cedar
    collate = None
    if a.pipeline in ("cv", "imagenet"):
        from torchvision import datasets

        ds = datasets.ImageFolder(a.data, transform=torch_simclr() if a.pipeline == "cv" else torch_imagenet())
    elif a.pipeline == "nlp":
        ds = TextDocs(a.data, a.tokenizer, a.table)
    elif a.pipeline == "asr":
        ds = SpeechClips(a.data)
        collate = pad_collate
    else:
        raise SystemExit(a.pipeline)
    if a.limit:
        ds = torch.utils.data.Subset(ds, range(a.limit))
    if len(ds) != a.n:
        raise SystemExit(f"the dataset has {len(ds)} samples, expected {a.n}")
    w = a.workers
    dl = torch.utils.data.DataLoader(ds, batch_size=BATCH[a.pipeline], shuffle=True, num_workers=w,
                                     collate_fn=collate, persistent_workers=w > 0,
                                     prefetch_factor=2 if w else None)
    field = FIELD[a.pipeline]
    for _ in range(a.epochs):
        for b in dl:
            x = b[field] if isinstance(b, dict) else (b[0] if isinstance(b, (list, tuple)) else b)
            c.add(x.shape, str(x.dtype))
        c.end_epoch()
    c.report(workers=w)


# =============================================================================== tf.data


def tf_simclr(tf, data, mean, std):
    """SimCLRv2's augmentation in TensorFlow ops on one JPEG's bytes: tf's fused crop-decode
    at a RandomResizedCrop box, resize 224, flip, colour jitter (brightness, contrast,
    saturation, hue; p 0.8), grayscale (p 0.2), Gaussian blur (11 taps, sigma 0.1-2, as a
    separable depthwise convolution, reflect padding), normalize, CHW."""
    from ops_readers import tf_random_crop_decode  # the same crop-decode as bench/ops.py's

    img = tf_random_crop_decode(tf, data)
    img = tf.image.resize(img, [SIZE, SIZE], method="bilinear", antialias=True) / 255.0
    img = tf.image.random_flip_left_right(img)
    b, c, s, hue = JITTER

    def jitter(im):
        im = im * tf.random.uniform([], 1 - b, 1 + b)
        im = tf.image.adjust_contrast(im, tf.random.uniform([], 1 - c, 1 + c))
        im = tf.image.adjust_saturation(im, tf.random.uniform([], 1 - s, 1 + s))
        im = tf.image.adjust_hue(im, tf.random.uniform([], -hue, hue))
        return tf.clip_by_value(im, 0.0, 1.0)

    img = tf.cond(tf.random.uniform([]) < JITTER_P, lambda: jitter(img), lambda: img)
    img = tf.cond(tf.random.uniform([]) < GRAY_P, lambda: tf.tile(tf.image.rgb_to_grayscale(img), [1, 1, 3]),
                  lambda: img)
    sigma = tf.random.uniform([], *BLUR_SIGMA)
    r = BLUR_KERNEL // 2
    k = tf.exp(-tf.square(tf.range(-r, r + 1, dtype=tf.float32)) / (2 * sigma * sigma))
    k = k / tf.reduce_sum(k)
    kx = tf.tile(tf.reshape(k, [1, BLUR_KERNEL, 1, 1]), [1, 1, 3, 1])
    ky = tf.tile(tf.reshape(k, [BLUR_KERNEL, 1, 1, 1]), [1, 1, 3, 1])
    im = tf.pad(img[None], [[0, 0], [r, r], [r, r], [0, 0]], mode="REFLECT")
    im = tf.nn.depthwise_conv2d(im, kx, [1, 1, 1, 1], "VALID")
    im = tf.nn.depthwise_conv2d(im, ky, [1, 1, 1, 1], "VALID")[0]
    im = (im - mean) / std
    return tf.transpose(im, [2, 0, 1])


def run_tfdata(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    c = Counter(a.pipeline, t0, a.n, a.epochs)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    c.framework()
    batch = BATCH[a.pipeline]
    if a.pipeline == "cv":
        paths = []
        for root, _dirs, names in os.walk(a.data):
            paths += [os.path.join(root, n) for n in names if n.endswith(".jpg")]
        paths.sort()
        mean, std = tf.constant(MEAN), tf.constant(STD)
        ds = (tf.data.Dataset.from_tensor_slices(paths)
              .shuffle(len(paths))
              .map(lambda path: tf_simclr(tf, tf.io.read_file(path), mean, std), num_parallel_calls=tf.data.AUTOTUNE)
              .batch(batch)
              .prefetch(tf.data.AUTOTUNE))
    elif a.pipeline == "nlp":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(a.tokenizer)
        tok.enable_truncation(MAX_TOKENS - 2)
        eot = _eot_id(a.tokenizer)
        emb = tf.constant(np.load(a.table))

        def encode(line):
            ids = [eot, *tok.encode(json.loads(line.numpy())["text"]).ids, eot]
            return np.array(ids + [0] * (MAX_TOKENS - len(ids)), dtype=np.int64)

        def load(line):
            ids = tf.py_function(encode, [line], tf.int64)
            ids.set_shape([MAX_TOKENS])
            return {"input_ids": ids, "emb": tf.gather(emb, ids)}

        files = sorted(os.path.join(a.data, n) for n in os.listdir(a.data) if n.endswith(".jsonl"))
        ds = (tf.data.TextLineDataset(files)
              .map(load, num_parallel_calls=tf.data.AUTOTUNE)
              .shuffle(SHUFFLE)
              .batch(batch)
              .prefetch(tf.data.AUTOTUNE))
    else:
        raise SystemExit(f"tf.data cannot express the {a.pipeline} pipeline here")
    for _ in range(a.epochs):
        for b in ds:
            x = b["emb"] if isinstance(b, dict) else b
            c.add(x.shape, x.dtype.name)
        c.end_epoch()
    c.report()


# =============================================================================== Ray Data


def run_ray(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    c = Counter(a.pipeline, t0, a.n, a.epochs)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import io

    import numpy as np
    import torch  # noqa: F401  (iter_torch_batches hands batches to torch)

    c.framework()
    import ray

    env = {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__)), "CEDAR_TABLE": a.table or "",
           "CEDAR_TOKENIZER": a.tokenizer or ""}
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": env})
    ray.data.DataContext.get_current().enable_progress_bars = False
    batch = BATCH[a.pipeline]
    collate = None
    if a.pipeline == "cv":
        tf = torch_simclr()

        def transform(row: dict) -> dict:
            from PIL import Image

            with Image.open(io.BytesIO(row["bytes"])) as im:
                return {"jpg": tf(im.convert("RGB")).numpy()}

        ds = ray.data.read_binary_files(a.data, shuffle="files", file_extensions=["jpg"]).map(transform)
    elif a.pipeline == "nlp":
        # A function (Ray tasks), not a callable class: an actor pool of 2 takes both CPUs
        # and the read + shuffle tasks before it never run (it hung here). The tokenizer and
        # the table are loaded once per Ray worker process (ray_embed's module cache).
        def embed(row: dict) -> dict:
            import cedar_readers as R

            return R.ray_embed(row)

        ds = ray.data.read_json(a.data, file_extensions=["jsonl"]).random_shuffle().map(embed)
    elif a.pipeline == "asr":
        clips = SpeechClips(a.data)

        def transform(row: dict) -> dict:
            import soundfile as sf
            import torch as th

            if clips.t is None:
                clips[0]  # builds the transforms in this worker
            t = clips.t
            x, _sr = sf.read(io.BytesIO(row["bytes"]), dtype="float32", always_2d=True)
            w = th.from_numpy(x.T.mean(0, keepdims=True))
            s = t["stretch"](t["spec"](t["resample"](w))).abs().pow(2)
            return {"mp3": t["mel"](t["fmask"](t["tmask"](s))).numpy()}

        def collate(b: dict):
            return {"mp3": pad_collate([torch.from_numpy(x) for x in b["mp3"]])}

        ds = ray.data.read_binary_files(a.data, shuffle="files", file_extensions=["mp3"]).map(transform)
    else:
        raise SystemExit(a.pipeline)
    field = FIELD[a.pipeline]
    for _ in range(a.epochs):
        for b in ds.iter_torch_batches(batch_size=batch, collate_fn=collate):
            x = b[field]
            c.add(x.shape, str(x.dtype))
        c.end_epoch()
    c.report()
    ray.shutdown()


# =============================================================================== main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--what", choices=["text", "audio", "images"], required=True)
    g.add_argument("--n", type=int, required=True)
    g.add_argument("--root")
    g.add_argument("--src", help="images: the flat directory of JPEGs")
    g.add_argument("--out", help="images: the ImageFolder tree to make")
    g.add_argument("--train-mb", type=float, default=37.0, help="text: MB of text the tokenizer is trained on")
    k = sub.add_parser("has-op", help="prints {\"op\": NAME, \"known\": true|false} for this venv's stoker")
    k.add_argument("name")
    r = sub.add_parser("run")
    r.add_argument("--pipeline", choices=list(BATCH), required=True)
    r.add_argument("--system", choices=["stoker", "torch", "tfdata", "ray"], required=True)
    r.add_argument("--data", required=True)
    r.add_argument("--n", type=int, required=True, help="samples per epoch (checked)")
    r.add_argument("--epochs", type=int, default=1)
    r.add_argument("--limit", type=int, default=0, help="torch: the first N samples only (the probe)")
    r.add_argument("--workers", type=int, default=2, help="torch: DataLoader workers")
    r.add_argument("--ablation", choices=list(ABLATION), default="all", help="stoker: the ablation step")
    r.add_argument("--per-epoch", action="store_true", help="stoker: stoker.torch, a run per epoch")
    r.add_argument("--lookup", choices=["sample", "batch", "native"], default="sample", help="stoker nlp")
    r.add_argument("--pyfn", choices=["threads", "processes", "auto"], default="threads", help="stoker nlp")
    r.add_argument("--tokenizer")
    r.add_argument("--table")
    a = p.parse_args()
    if a.cmd == "has-op":
        import stoker

        H.emit({"op": a.name, "known": has_op(stoker, a.name), "passes": known_passes(stoker)})
        return
    if a.cmd == "gen":
        {"text": gen_text, "audio": gen_audio, "images": gen_images}[a.what](a)
        return
    {"stoker": run_stoker, "torch": run_torch, "tfdata": run_tfdata, "ray": run_ray}[a.system](a)


if __name__ == "__main__":
    sys.exit(main())
