#!/usr/bin/env python3
"""Operators benchmark: image pipelines in Stoker against torchvision in PyTorch's
DataLoader and against tf.data, on the same JPEG files in the same run; plus the limit,
libjpeg-turbo's own decode rate (through PIL) on all cores.

One command (after `bash bench/setup.sh`, which installs torch, torchvision, Pillow and
tensorflow-cpu into .venv-bench):

    python3 bench/ops.py [--reps 3] [--images 2000] [--only stoker,torch-2w,...]
                         [--pipelines imagenet,simclr] [--out bench/results/ops.json]

Data: N ImageNet-like JPEGs (about 440x430 px, 110 KB, quality 90, written by Pillow with
crates/stoker-ops/examples/make_jpegs.py), in 10 class directories (ImageFolder layout),
under /tmp/stoker-bench-data/ops, read from local disk (the page cache holds them: every
contender reads the same warm files; this benchmark is about the CPU work).

Pipelines:
  speech    (200 MP3 clips of 5-10 s, 44.1 kHz mono, 96 kbit/s, written by
            crates/stoker-ops/examples/audio_make_clips.py) decode to mono, resample to
            16 kHz, STFT(400, hop 160), TimeStretch(rate 0.9-1.1), power, MelScale(80),
            AmplitudeToDB(top 80), FrequencyMasking(27), TimeMasking(100); batches of 16
            as lists (the clips differ in length); peers: soundfile + torchaudio in a
            DataLoader
  imagenet  decode, RandomResizedCrop(224) (scale 0.08-1, ratio 3/4-4/3), horizontal flip
            p=0.5, to float32 CHW, normalize with ImageNet's mean/std; batches of 64
  text      GPT-2 BPE tokenization (the tokenizer.json fixture of stoker-ops) of 20,000
            English-like paragraphs of 40-160 words in 8 JSONL files (seeded; 15% of the
            words are made of random syllables, so BPE merges run, not only its cache): truncate to
            1024 ids, end-of-text id appended, batches of 64 padded to the longest (ids and
            mask padded with 0); peers: Hugging Face tokenizers' encode_batch_fast (rayon
            on every core) in batches of 64 (hf-64) and 1024 (hf-1024), to NumPy arrays
  simclr    the same plus ColorJitter(0.4, 0.4, 0.4, 0.1) with p=0.8, grayscale p=0.2,
            GaussianBlur(23, sigma 0.1-2)

Contenders:
  stoker     `stoker run` of the pipeline's spec (format imagefolder, threads = cores)
  torch-2w   torchvision.datasets.ImageFolder + transforms in a DataLoader, 2 workers
  torch-3w   the same with 3 workers (the best setting found on 2 cores)
  tfdata     tf.data (imagenet only): decode_and_crop_jpeg at a sampled box, resize,
             flip, normalize, AUTOTUNE
  hf-64, hf-1024  (text only) Hugging Face tokenizers, see the text pipeline
  limit-full the limit: PIL decode of every file to RGB, one process per core
  limit-half the same at half size, by libjpeg-turbo's DCT-domain scaling (PIL's draft)
  limit-crop only a RandomResizedCrop box of each file, by libjpeg-turbo's region decode
             (tf.io.decode_and_crop_jpeg), one process per core, timed after imports

Each rep runs every contender once (order rotated by one each rep); the table shows
medians of images/s, CPU seconds per image (all processes), peak RSS and PSS summed over
the process tree (sampled every 50 ms), and time to the first batch. `images/s` counts
the whole run from process start (imports, listing, worker start-up included); `steady/s`
counts from the first batch on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402  (the loop, child processes, tables: bench/harness.py)

BENCH_DIR = H.BENCH_DIR
REPO = H.REPO
READERS = BENCH_DIR / "ops_readers.py"
MAKE_JPEGS = REPO / "crates/stoker-ops/examples/make_jpegs.py"
MAKE_CLIPS = REPO / "crates/stoker-ops/examples/audio_make_clips.py"
CLIPS = 200
CLASSES = 10
TEXTS = 20000
TEXT_FILES = 8
TOKENIZER = REPO / "crates/stoker-ops/tests/fixtures/text/gpt2-tokenizer.json"

log = H.logger("ops")


# ---------------------------------------------------------------- data


def prepare_data(n: int, python: Path) -> Path:
    base = Path("/tmp/stoker-bench-data/ops")
    flat = base / f"flat-{n}"
    tree = base / f"imagefolder-{n}"
    if not (base / f"imagefolder-{n}.ok").exists():
        log(f"generating {n} JPEGs into {flat}")
        subprocess.run([str(python), str(MAKE_JPEGS), str(flat), str(n)], check=True)
        names = sorted(p.name for p in flat.iterdir() if p.suffix == ".jpg")
        for i, name in enumerate(names):
            d = tree / f"class{i % CLASSES:02d}"
            d.mkdir(parents=True, exist_ok=True)
            target = d / name
            if not target.exists():
                os.link(flat / name, target)
        (base / f"imagefolder-{n}.ok").write_text("ok\n")
    return tree


def prepare_audio(python: Path) -> Path:
    d = Path("/tmp/stoker-bench-data/ops/speech-200")
    if not (d.parent / "speech-200.ok").exists():
        log(f"writing {CLIPS} MP3 clips into {d}")
        subprocess.run([str(python), str(MAKE_CLIPS), str(d)], check=True)
        (d.parent / "speech-200.ok").write_text("ok\n")
    return d


WORDS = """the of and to in a is that for it as was with be by on not he i this are or his
from at which but have an they you were her she there been one all we their has would when
if so no will more can out up about into them some could time these two may then do first
any my now such like our over man me even most made after also did many before must
through back years where much your way well down should because each just those people
state how too little good world very still own see men work long get here between both
life being under never day same another know while last might us great old year off come
since against go came right used take three states himself few house use during without
again place around however home small found thought went say part once general high upon
school every government system data model training learning network image images layer
loss batch gradient memory storage object bucket server read write cache pipeline tensor
accuracy validation epoch token tokens sequence language speech audio sample samples""".split()


SYLLABLES = "ka lo mi ne ra tu vel sor phi gra str ing tion ment ous qua zel bri dro fen".split()


def _paragraph(rng) -> str:
    words = []
    for i in range(rng.randint(40, 160)):
        r = rng.random()
        if r < 0.15:  # rare words, names and typos: the BPE merges, not just its cache
            w = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
        elif r < 0.19:
            w = str(rng.randint(0, 99999))
        elif r < 0.22:
            w = rng.choice(WORDS).capitalize()
        else:
            w = rng.choice(WORDS)
        words.append(w)
        if rng.random() < 0.08:
            words[-1] += rng.choice([",", ".", ";", ":", "!", "?"])
    return " ".join(words) + "."


def prepare_text() -> Path:
    """TEXTS English-like paragraphs of 40-160 words (seeded), in TEXT_FILES JSONL files."""
    import random

    d = Path(f"/tmp/stoker-bench-data/ops/text-{TEXTS}-v2")
    ok = d.parent / f"text-{TEXTS}-v2.ok"
    if not ok.exists():
        log(f"writing {TEXTS} paragraphs into {d}")
        d.mkdir(parents=True, exist_ok=True)
        rng = random.Random(1)
        per = TEXTS // TEXT_FILES
        for f in range(TEXT_FILES):
            with open(d / f"part-{f:02d}.jsonl", "w", encoding="utf-8") as out:
                for _ in range(per):
                    out.write(json.dumps({"text": _paragraph(rng)}) + "\n")
        ok.write_text("ok\n")
    return d


# ---------------------------------------------------------------- contenders


@dataclass
class Ctx:
    args: argparse.Namespace
    data: Path
    audio: Path
    stoker: Path
    python: Path
    work: Path
    env: dict = field(default_factory=dict)
    text: Path = Path("/nonexistent")


@dataclass
class Rep:
    seconds: float
    images: int
    cpu_s: float
    peak_rss: int
    peak_pss: int
    first_batch_s: float | None
    first_batch_images: int = 0
    import_s: float = 0.0  # of `seconds`, importing the array framework (bench/python.py)

    def steady_rate(self) -> float:
        """Images/s after the first batch (start-up, imports and worker spawning excluded)."""
        if self.first_batch_s is None or self.seconds <= self.first_batch_s:
            return self.images / self.seconds
        return (self.images - self.first_batch_images) / (self.seconds - self.first_batch_s)


SIMCLR_OPS = """
[[ops]]
op = "color_jitter"
field = "jpg"
brightness = 0.4
contrast = 0.4
saturation = 0.4
hue = 0.1
p = 0.8
[[ops]]
op = "random_grayscale"
field = "jpg"
p = 0.2
[[ops]]
op = "gaussian_blur"
field = "jpg"
kernel_size = 23
sigma = [0.1, 2.0]
"""


SPEECH_SPEC = """
source = "file://{audio}/"
format = "files"
seed = 1

[[ops]]
op = "decode_audio"
field = "mp3"
mono = true
[[ops]]
op = "resample"
field = "mp3"
rate = 16000
[[ops]]
op = "stft"
field = "mp3"
n_fft = 400
hop_length = 160
[[ops]]
op = "time_stretch"
field = "mp3"
rate = [0.9, 1.1]
hop_length = 160
[[ops]]
op = "complex_power"
field = "mp3"
[[ops]]
op = "mel_scale"
field = "mp3"
n_mels = 80
[[ops]]
op = "amplitude_to_db"
field = "mp3"
top_db = 80
[[ops]]
op = "frequency_masking"
field = "mp3"
mask_param = 27
[[ops]]
op = "time_masking"
field = "mp3"
mask_param = 100
[[ops]]
op = "batch"
size = 16
collate = "list"

[options]
threads = {threads}
"""


TEXT_SPEC = """
source = "file://{text}/"
format = "jsonl"
seed = 1

[[ops]]
op = "tokenize"
field = "text"
tokenizer = "{tokenizer}"
max_length = 1024
eos_id = 50256
[[ops]]
op = "batch"
size = 64
collate = "pad"
pad_value = 0

[options]
threads = {threads}
"""


def stoker_spec(ctx: Ctx, pipeline: str) -> Path:
    if pipeline == "text":
        p = ctx.work / "ops-text.toml"
        p.write_text(TEXT_SPEC.format(text=ctx.text, tokenizer=TOKENIZER, threads=os.cpu_count()))
        return p
    if pipeline == "speech":
        p = ctx.work / "ops-speech.toml"
        p.write_text(SPEECH_SPEC.format(audio=ctx.audio, threads=os.cpu_count()))
        return p
    extra = SIMCLR_OPS if pipeline == "simclr" else ""
    spec = f"""
source = "file://{ctx.data}/"
format = "imagefolder"
seed = 1

[[ops]]
op = "decode_image"
field = "jpg"
[[ops]]
op = "random_resized_crop"
field = "jpg"
size = [224, 224]
[[ops]]
op = "random_flip"
field = "jpg"
{extra}
[[ops]]
op = "image_to_tensor"
field = "jpg"
normalize = "imagenet"
[[ops]]
op = "batch"
size = 64

[options]
threads = {os.cpu_count()}
"""
    p = ctx.work / f"ops-{pipeline}.toml"
    p.write_text(spec)
    return p


def c_stoker(ctx: Ctx, pipeline: str) -> Rep:
    r = H.run_child([str(ctx.stoker), "run", str(stoker_spec(ctx, pipeline)), "--json"], ctx.env,
                    ctx.args.timeout, sample_memory=True)
    H.check(r, "stoker run")
    res = H.last_json(r.stdout)
    return Rep(float(res["seconds"]), int(res["samples"]), r.cpu_s, r.peak_rss, r.peak_pss,
               res.get("first_item_s"), 16 if pipeline == "speech" else 64)


def run_reader(ctx: Ctx, readers: Path, args: list[str]) -> Rep:
    """One peer: `ctx.python readers ARGS...` (ops_readers.py, python_readers.py), its JSON line
    and the process tree's CPU and memory."""
    r = H.run_child([str(ctx.python), str(readers), *args], ctx.env, ctx.args.timeout, sample_memory=True)
    H.check(r, args[0])
    res = H.last_json(r.stdout)
    return Rep(float(res["seconds"]), int(res["images"]), r.cpu_s, r.peak_rss, r.peak_pss,
               res.get("first_batch_s"), int(res.get("first_batch_images") or 0), float(res.get("import_s") or 0.0))


def _py(ctx: Ctx, args: list[str]) -> Rep:
    return run_reader(ctx, READERS, args)


def _dir(ctx: Ctx, pipeline: str) -> Path:
    return ctx.audio if pipeline == "speech" else ctx.data


CONTENDERS = {
    "stoker": lambda ctx, p: c_stoker(ctx, p),
    "torch-2w": lambda ctx, p: _py(ctx, ["torch", "--dir", str(_dir(ctx, p)), "--workers", "2", "--pipeline", p]),
    "torch-3w": lambda ctx, p: _py(ctx, ["torch", "--dir", str(_dir(ctx, p)), "--workers", "3", "--pipeline", p]),
    "tfdata": lambda ctx, p: _py(ctx, ["tfdata", "--dir", str(ctx.data), "--pipeline", p]),
    "hf-64": lambda ctx, p: _py(ctx, ["tokenize", "--dir", str(ctx.text), "--tokenizer", str(TOKENIZER),
                                      "--batch", "64"]),
    "hf-1024": lambda ctx, p: _py(ctx, ["tokenize", "--dir", str(ctx.text), "--tokenizer", str(TOKENIZER),
                                        "--batch", "1024"]),
    "limit-full": lambda ctx, p: _py(ctx, ["decode", "--dir", str(ctx.data), "--procs", str(os.cpu_count())]),
    "limit-half": lambda ctx, p: _py(ctx, ["decode", "--dir", str(ctx.data), "--procs", str(os.cpu_count()),
                                           "--half"]),
    "limit-crop": lambda ctx, p: _py(ctx, ["decode", "--dir", str(ctx.data), "--procs", str(os.cpu_count()),
                                           "--crop"]),
}
ONLY_IMAGENET = {"tfdata", "limit-full", "limit-half", "limit-crop"}
ONLY_TEXT = {"hf-64", "hf-1024"}
PIPELINES = ["imagenet", "simclr", "speech", "text"]


def contenders_of(pipeline: str, names: list[str]) -> list[str]:
    if pipeline == "text":
        return [n for n in names if n == "stoker" or n in ONLY_TEXT]
    return [n for n in names if n not in ONLY_TEXT and (pipeline == "imagenet" or n not in ONLY_IMAGENET)]


def summarize(pipeline: str, name: str, reps: list[Rep], error: str | None) -> dict:
    row = {"pipeline": pipeline, "contender": name, "error": error, "reps": [r.__dict__ for r in reps]}
    if reps:
        med = H.median
        row.update(
            images=reps[0].images,
            seconds=med(r.seconds for r in reps),
            images_per_s=med(r.images / r.seconds for r in reps),
            steady_images_per_s=med(r.steady_rate() for r in reps),
            cpu_ms_per_image=med(1000 * r.cpu_s / r.images for r in reps),
            peak_rss_mib=med(r.peak_rss for r in reps) / 2**20,
            peak_pss_mib=med(r.peak_pss for r in reps) / 2**20,
            first_batch_s=med(r.first_batch_s for r in reps) if all(r.first_batch_s is not None for r in reps) else None,
        )
    return row


def table(rows: list[dict]) -> str:
    head = (f"{'pipeline':9} {'contender':11} {'images/s':>9} {'steady/s':>9} {'CPU ms/img':>10} {'RSS MiB':>8} "
            f"{'PSS MiB':>8} {'1st batch s':>11}  stoker/peer (steady)")
    lines = [head, "-" * len(head)]
    by = {(r["pipeline"], r["contender"]): r for r in rows}
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['pipeline']:9} {r['contender']:11} error: {r['error'][:90]}")
            continue
        s = by.get((r["pipeline"], "stoker"))
        ratio = ""
        if s and not s.get("error") and r["contender"] != "stoker":
            ratio = H.ratio_text(s, r, ["images_per_s", "steady_images_per_s"])
        fb = "-" if r["first_batch_s"] is None else f"{r['first_batch_s']:.2f}"
        lines.append(f"{r['pipeline']:9} {r['contender']:11} {r['images_per_s']:9.0f} "
                     f"{r['steady_images_per_s']:9.0f} {r['cpu_ms_per_image']:10.2f} "
                     f"{r['peak_rss_mib']:8.0f} {r['peak_pss_mib']:8.0f} {fb:>11}  {ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_arg(p, "--reps", 3)
    p.add_argument("--images", type=int, default=2000)
    H.add_arg(p, "--only", ",".join(CONTENDERS))
    p.add_argument("--pipelines", default="imagenet,simclr")
    H.add_arg(p, "--stoker", REPO / "target/release/stoker")
    H.add_arg(p, "--python", REPO / ".venv-bench/bin/python")
    H.add_arg(p, "--timeout", 600)
    H.add_arg(p, "--out", REPO / "bench/results/ops.json")
    a = p.parse_args(argv)
    names = H.pick(a.only, CONTENDERS, p.error, default=(), keep_order=True)
    pipelines = H.pick(a.pipelines, PIPELINES, p.error, what="pipeline", default=(), keep_order=True)
    for path, what in ((a.stoker, "stoker (cargo build --release -p stoker)"), (a.python, "the venv (bash bench/setup.sh)")):
        if not path.exists():
            log(f"missing {path}: build/install {what}")
            return 2
    data = prepare_data(a.images, a.python)
    audio = prepare_audio(a.python) if "speech" in pipelines else Path("/nonexistent")
    work = Path("/tmp/stoker-bench-ops")
    work.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    text = prepare_text() if "text" in pipelines else Path("/nonexistent")
    ctx = Ctx(a, data, audio, a.stoker, a.python, work, env, text)
    rows = []
    try:
        for pipeline in pipelines:
            expected = {"speech": CLIPS, "text": TEXTS}.get(pipeline, a.images)
            todo = contenders_of(pipeline, names)
            # One untimed pass warms the page cache and the Python imports.
            for n in todo[:1]:
                try:
                    CONTENDERS[n](ctx, pipeline)
                except H.ContenderError:
                    pass

            def ok(rep: int, pipeline: str, n: str, r: Rep) -> None:
                log(f"{pipeline} {n} rep {rep + 1}: {r.images / r.seconds:.0f} images/s, "
                    f"{1000 * r.cpu_s / r.images:.2f} ms CPU/image")

            # Every contender once per rep, the order rotated each rep.
            trials = H.run_reps(a.reps, [(pipeline, todo)], lambda pl, n, _rep: CONTENDERS[n](ctx, pl),
                                expect=lambda _pl, _n, r: f"{r.images} items, expected {expected}"
                                if r.images != expected else None,
                                on_ok=ok, on_fail=lambda _rep, pl, n, err: log(f"{pl} {n}: {err}"))
            rows += [summarize(pipeline, n, trials.reps[(pipeline, n)], trials.errors.get((pipeline, n)))
                     for n in todo]
    finally:
        H.kill_live_children()
    print(table(rows))
    H.write_json(a.out, {
        "date": H.now_iso(utc=False),
        "commit": H.git_commit(),
        "machine": H.machine(),
        "args": H.args_dict(a),
        "rows": rows,
    }, indent=1, newline=False)
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    H.run_main(main, log)
