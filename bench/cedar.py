#!/usr/bin/env python3
"""cedar's pipelines (issue 26): Stoker, with its optimizations turned on one by one, against
PyTorch's DataLoader (its best worker count), tf.data (AUTOTUNE) where it can express the
pipeline, and Ray Data, on the same data in the same run; and an ImageNet-style training
loop over 3 epochs against the DataLoader.

One command (after `bash bench/setup.sh`, or a venv .venv-bench with a release wheel of
stoker, torch, torchvision, torchaudio, tokenizers, soundfile, tensorflow-cpu and ray[data]):

    python3 bench/cedar.py [--reps 3] [--pipelines cv,nlp,asr,imagenet] [--only ...]
                           [--out bench/results/cedar.json]
    python3 bench/cedar.py --quick          # a few hundred samples, 1 rep: a check, not figures

Data (generated once, seeded, under /tmp/stoker-bench-data/cedar; nothing is downloaded):
  cv, imagenet  the ImageNet-like JPEGs of bench/ops.py (about 440x430 px, 110 KB), the first
                --cv-images (320) / --imagenet-images (1,200) of them as an ImageFolder tree
  nlp           --nlp-docs (640) documents of 2-48 KB: the .py/.rst/.txt/.md and licence
                files that the venv's PyPI packages ship (duplicates removed, in an order
                hashed from their paths), 8 JSONL files; a byte-level BPE tokenizer
                (`tokenizers`, vocab 50,257) trained on the first 37 MB of the same files;
                a 50,257 x 764 float32 table (standard normal, seed 0)
  asr           --asr-clips (200) speech-like clips of 2-6 s (a voiced tone with gliding
                pitch and formants, syllables, noise bursts), mono 48 kHz MP3 written by
                soundfile (libsndfile 1.2 + LAME)

Pipelines (bench/cedar_readers.py has them in each system; the maps are written first,
then `shuffle(1024)`, then the batch, as a user writes a training pipeline):
  cv        SimCLRv2: decode, RandomResizedCrop 224, flip, ColorJitter(0.8, 0.8, 0.8, 0.2)
            p 0.8, RandomGrayscale 0.2, GaussianBlur 11 (sigma 0.1-2), normalize; batch 32
  nlp       GPT-2-style BPE, truncated to 254 + BOS + EOS (256, padded), a Python function
            looking the ids up in the frozen table (256 x 764 float32 a sample); batch 32
  asr       decode MP3, resample 8 kHz, STFT 400, time stretch 0.8, power, time mask 80,
            frequency mask 80, mel 256; batch 16 padded
  imagenet  decode, RandomResizedCrop 224, flip, normalize; batch 64; 3 epochs

cv, nlp and asr run --epochs (2) epochs each, so that caching has something to do.

Contenders (one child process each, the order rotated every rep):
  stoker-off      one thread, no autotuner, every optimizer pass off (the plan as written)
  stoker+par      + parallelism: all cores, autotuned
  stoker+reorder  + the shuffle pass (the buffer becomes a permutation of the objects, or moves)
  stoker+cache    + the cache pass (samples kept after the deterministic head for later epochs)
  stoker          + fusion: everything on (the default; the Python function placed by
                  measurement, workers="auto")
  stoker-proc     (nlp) the default but the function in worker processes (Stoker's default
                  for a Python function; the ablation rows run it on threads)
  stoker-batch    (nlp) the lookup after `batch` (one call a batch), threads
  stoker-native   (nlp) the lookup by Stoker's native `embedding` operator (run when the
                  installed build has it)
  stoker-torch    (imagenet) stoker.torch.DataLoader, a run per epoch, as a training loop
  stoker-run      (imagenet) one run of `.epochs(3)`
  stoker-nocache  (imagenet) the same with the cache pass off (the fused decode + crop kernel
                  every epoch): what the cache costs epoch 1 and gains later
  torch-Nw        PyTorch's DataLoader (torchvision / HF tokenizers + F.embedding / soundfile +
                  torchaudio), shuffle=True, N persistent workers, for each N in
                  --torch-workers (1,2,4): each runs in the reps like the others, and the
                  ratios are to the fastest of them in that pipeline ("the DataLoader's
                  best"). A short probe before the reps picked the best too often wrongly
                  on this shared machine; 0 workers (all in the main process) was the
                  slowest in every pipeline in a first run, 2.5-27x below the best, so it is
                  not run by default (--torch-workers 0,1,2,4 adds it).
  tfdata          tf.data, AUTOTUNE (cv: native ops; nlp: the tokenizer in tf.py_function,
                  tf.gather; asr: not expressible in TF's own ops, not run)
  ray             Ray Data: read, map (the same Python as the DataLoader's), iter_torch_batches

Reported, medians over the reps: samples/s over the whole run from process start (imports,
start-up, every epoch), samples/s after the first batch, CPU ms per sample (the process tree:
workers, Ray's processes), peak RSS and PSS summed over the process tree (sampled every 50
ms), time to the first batch, the ratio of samples/s to the best DataLoader row's (steady in
brackets);
for imagenet each epoch's images/s and the ratio over epochs 2-3. samples/s is the figure to
compare: steady/s flatters a run that fills a shuffle buffer before its first batch (the
buffer is then handed out at once) and a DataLoader whose workers prefetched. Every contender checks every
batch's shape as it arrives and the driver checks the sample count; a wrong one is FAILED.
Stoker's rows keep the run's plan (`explain()`) and each operator's measured ms per sample
(`stats()["operators"]`) in the JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402  (the loop, child processes, tables: bench/harness.py)

HERE = H.BENCH_DIR
REPO = H.REPO
READERS = HERE / "cedar_readers.py"
ROOT = Path("/tmp/stoker-bench-data/cedar")

log = H.logger("cedar")

ABLATION = [("stoker-off", "off"), ("stoker+par", "par"), ("stoker+reorder", "reorder"),
            ("stoker+cache", "cache"), ("stoker", "all")]
STOKER_ROWS = dict(ABLATION)
CONTENDERS = {
    "cv": [n for n, _ in ABLATION] + ["torch", "tfdata", "ray"],
    "nlp": [n for n, _ in ABLATION] + ["stoker-proc", "stoker-batch", "torch", "tfdata", "ray"],
    "asr": [n for n, _ in ABLATION] + ["torch", "ray"],
    "imagenet": ["stoker-torch", "stoker-run", "stoker-nocache", "torch"],
}
#: Contenders run only when the installed stoker has what they need ({name: operator}).
NEEDS_OP = {"stoker-native": "embedding"}
OPT_IN = {"nlp": ["stoker-native"]}  # run when the build has the operator, or --only names them
TORCH = [f"torch-{w}w" for w in range(9)]  # "torch" in CONTENDERS: one per --torch-workers
ALL = sorted(({c for cs in CONTENDERS.values() for c in cs} - {"torch"}) | {c for cs in OPT_IN.values() for c in cs}
             | set(TORCH))
PIPELINES = ["cv", "nlp", "asr", "imagenet"]
PACKAGES = ("stoker", "torch", "torchvision", "torchaudio", "tokenizers", "numpy", "pillow", "soundfile",
            "tensorflow-cpu", "ray", "pyarrow")


# ---------------------------------------------------------------- data


def gen(python: Path, env: dict, *args: str) -> dict:
    r = H.run_child([str(python), str(READERS), "gen", *args], env, 1800)
    if r.returncode != 0:
        raise H.HarnessError(f"generating data ({' '.join(args)}) failed: {H.tail(r.stderr)}")
    return H.last_json(r.stdout)


def prepare(a: argparse.Namespace, pipelines: list[str], env: dict) -> dict:
    """{pipeline: {"dir", "n", ...}} for the pipelines asked for (generated when missing)."""
    data: dict[str, dict] = {}
    if {"cv", "imagenet"} & set(pipelines):
        import ops as opsbench  # the JPEGs of bench/ops.py (generated there when missing)

        flat = opsbench.prepare_data(2000, a.python).parent / "flat-2000"
        for p, n in (("cv", a.cv_images), ("imagenet", a.imagenet_images)):
            if p in pipelines:
                out = ROOT / f"images-{n}"
                info = gen(a.python, env, "--what", "images", "--n", str(n), "--src", str(flat), "--out", str(out))
                data[p] = {"dir": str(out), "n": n, "info": info}
    if "nlp" in pipelines:
        log(f"text: {a.nlp_docs} documents, tokenizer, embedding table (once: about 30 s)")
        info = gen(a.python, env, "--what", "text", "--n", str(a.nlp_docs), "--root", str(ROOT / "text"))
        manifest = ROOT / "text" / "tokenizer-manifest.json"
        data["nlp"] = {"dir": info["dir"], "n": a.nlp_docs, "info": info,
                       "tokenizer": str(ROOT / "text" / "tokenizer.json"), "table": str(ROOT / "text" / "table.npy"),
                       "tokenizer_manifest": manifest.read_text() if manifest.exists() else None}
    if "asr" in pipelines:
        log(f"audio: {a.asr_clips} MP3 clips (once: about {a.asr_clips // 4} s)")
        info = gen(a.python, env, "--what", "audio", "--n", str(a.asr_clips), "--root", str(ROOT / "audio"))
        data["asr"] = {"dir": info["dir"], "n": a.asr_clips, "info": info}
    return data


# ---------------------------------------------------------------- contenders


def reader_args(pipeline: str, name: str, d: dict, a: argparse.Namespace) -> list[str]:
    epochs = a.imagenet_epochs if pipeline == "imagenet" else a.epochs
    common = ["run", "--pipeline", pipeline, "--data", d["dir"], "--n", str(d["n"]), "--epochs", str(epochs)]
    if pipeline == "nlp":
        common += ["--tokenizer", d["tokenizer"], "--table", d["table"]]
    if name in STOKER_ROWS:
        # The default row places the Python function as Stoker does by default (measured);
        # the ablation steps before it keep it on threads.
        pyfn = ["--pyfn", "auto"] if name == "stoker" else []
        return [*common, "--system", "stoker", "--ablation", STOKER_ROWS[name], *pyfn]
    if name in TORCH:
        return [*common, "--system", "torch", "--workers", name[len("torch-"):-1]]
    extra = {
        "stoker-proc": ["--system", "stoker", "--pyfn", "processes"],
        "stoker-batch": ["--system", "stoker", "--lookup", "batch"],
        "stoker-native": ["--system", "stoker", "--lookup", "native"],
        "stoker-torch": ["--system", "stoker", "--per-epoch"],
        "stoker-run": ["--system", "stoker"],
        "stoker-nocache": ["--system", "stoker", "--ablation", "nocache"],
        "tfdata": ["--system", "tfdata"],
        "ray": ["--system", "ray"],
    }[name]
    return [*common, *extra]


class Rep:
    """One run of one contender: what the reader printed and what the harness measured."""

    def __init__(self, res: dict, child: H.ChildResult) -> None:
        self.res = res
        self.samples = int(res["samples"])
        self.seconds = float(res["seconds"])
        self.first_batch_s = res.get("first_batch_s")
        self.first_n = int(res.get("first_batch_samples") or 0)
        self.import_s = float(res.get("import_s") or 0.0)
        self.epoch_s = list(res.get("epoch_s") or [])
        # The process tree's CPU: wait4's (everything reaped down the tree) or what the
        # reader summed over its live tree at its end (Ray's processes, a forkserver's
        # workers, which the reader's process never reaps), whichever saw more.
        self.cpu_s = max(child.cpu_s, float(res.get("tree_cpu_s") or 0.0))
        self.wall_s = child.wall_s
        self.peak_rss = child.peak_rss
        self.peak_pss = child.peak_pss

    def rate(self) -> float:
        return self.samples / self.seconds

    def steady(self) -> float:
        if self.first_batch_s is None or self.seconds <= self.first_batch_s:
            return self.rate()
        return (self.samples - self.first_n) / (self.seconds - self.first_batch_s)

    def brief(self) -> dict:
        r = dict(self.res)
        r.pop("explain", None)
        r.update(cpu_s=self.cpu_s, wall_s=self.wall_s, peak_rss=self.peak_rss, peak_pss=self.peak_pss)
        return r


def run_reader(a: argparse.Namespace, env: dict, args: list[str]) -> Rep:
    child = H.run_child([str(a.python), str(READERS), *args], env, a.timeout, sample_memory=True)
    H.check(child, f"{args[2]} {' '.join(args[args.index('--system'):])}")
    return Rep(H.last_json(child.stdout), child)


# ---------------------------------------------------------------- summaries


def summarize(pipeline: str, name: str, reps: list[Rep], error: str | None, epochs: int, n: int) -> dict:
    row: dict = {"pipeline": pipeline, "contender": name, "error": error, "reps": [r.brief() for r in reps]}
    if not reps:
        return row
    med = H.median
    row.update(
        samples=reps[0].samples,
        epochs=epochs,
        samples_per_s=med(r.rate() for r in reps),
        steady_per_s=med(r.steady() for r in reps),
        loader_per_s=med(r.samples / (r.seconds - r.import_s) for r in reps),
        cpu_ms_per_sample=med(1000 * r.cpu_s / r.samples for r in reps),
        peak_rss_mib=med(r.peak_rss for r in reps) / 2**20,
        peak_pss_mib=med(r.peak_pss for r in reps) / 2**20,
        first_batch_s=(med(r.first_batch_s for r in reps)
                       if all(r.first_batch_s is not None for r in reps) else None),
    )
    if all(len(r.epoch_s) == epochs for r in reps):
        row["epoch_per_s"] = [med(n / r.epoch_s[e] for r in reps) for e in range(epochs)]
        if epochs >= 3:
            row["later_epochs_per_s"] = med(n * (epochs - 1) / sum(r.epoch_s[1:]) for r in reps)
    mid = H.median_item(reps, key=lambda r: r.rate())
    for key in ("explain", "stats", "passes_known", "run_options", "workers", "frames_min_max"):
        if key in mid.res:
            row[key] = mid.res[key]
    return row


def add_ratios(rows: list[dict]) -> None:
    """Each row's samples/s (and after the first batch, and over epochs 2+) over the
    fastest DataLoader row's of its pipeline (marked `dataloader_best`)."""
    refs: dict[str, dict] = {}
    for r in rows:
        if r["contender"] in TORCH and not r.get("error") and "samples_per_s" in r:
            if r["pipeline"] not in refs or r["samples_per_s"] > refs[r["pipeline"]]["samples_per_s"]:
                refs[r["pipeline"]] = r
    for r in refs.values():
        r["dataloader_best"] = True
    for r in rows:
        ref = refs.get(r["pipeline"])
        if ref is None or "samples_per_s" not in r:
            continue
        r["vs_torch"] = r["samples_per_s"] / ref["samples_per_s"]
        r["vs_torch_steady"] = r["steady_per_s"] / ref["steady_per_s"]
        if "later_epochs_per_s" in r and "later_epochs_per_s" in ref:
            r["vs_torch_later"] = r["later_epochs_per_s"] / ref["later_epochs_per_s"]
        if "epoch_per_s" in r and "epoch_per_s" in ref:
            r["vs_torch_epochs"] = [x / y for x, y in zip(r["epoch_per_s"], ref["epoch_per_s"])]


def fmt(x, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def main_table(rows: list[dict], md: bool) -> str:
    head = ["pipeline", "contender", "samples/s", "steady/s", "CPU ms/sample", "RSS MiB", "PSS MiB",
            "1st batch s", "vs DataLoader best (steady)"]
    cells = []
    for r in rows:
        if r["pipeline"] == "imagenet":
            continue
        tag = [r["pipeline"], r["contender"]]
        if r.get("error") or "samples_per_s" not in r:
            cells.append(H.Span(tag, "FAILED: " + H.first_line(r.get("error"), 110)))
            continue
        ratio = "-" if "vs_torch" not in r else f"{r['vs_torch']:.2f}x ({r['vs_torch_steady']:.2f}x)"
        if r.get("dataloader_best"):
            ratio = "the DataLoader's best"
        cells.append(tag + [fmt(r["samples_per_s"]), fmt(r["steady_per_s"]), fmt(r["cpu_ms_per_sample"], ".2f"),
                            fmt(r["peak_rss_mib"]), fmt(r["peak_pss_mib"]), fmt(r["first_batch_s"], ".2f"), ratio])
    return markdown(head, cells) if md else H.text_table(head, cells, right={2, 3, 4, 5, 6, 7})


def epochs_table(rows: list[dict], epochs: int, md: bool) -> str:
    head = ["contender", *[f"epoch {e + 1} images/s" for e in range(epochs)], "epochs 2+ images/s",
            "CPU ms/image", "RSS MiB", "PSS MiB", "1st batch s", "vs DataLoader best (epochs 2+; per epoch)"]
    cells = []
    for r in rows:
        if r["pipeline"] != "imagenet":
            continue
        if r.get("error") or "epoch_per_s" not in r:
            cells.append(H.Span([r["contender"]], "FAILED: " + H.first_line(r.get("error"), 110)))
            continue
        ratio = "-"
        if "vs_torch_later" in r:
            ratio = f"{r['vs_torch_later']:.2f}x ({'; '.join(f'{x:.2f}x' for x in r['vs_torch_epochs'])})"
        if r.get("dataloader_best"):
            ratio = "the DataLoader's best"
        cells.append([r["contender"], *[fmt(x) for x in r["epoch_per_s"]], fmt(r.get("later_epochs_per_s")),
                      fmt(r["cpu_ms_per_sample"], ".2f"), fmt(r["peak_rss_mib"]), fmt(r["peak_pss_mib"]),
                      fmt(r["first_batch_s"], ".2f"), ratio])
    return markdown(head, cells) if md else H.text_table(head, cells, right=set(range(1, epochs + 6)))


def operators_table(rows: list[dict], md: bool) -> str:
    """Where the time of Stoker's default rows goes: each operator's measured ms a sample."""
    head = ["pipeline", "contender", "operator", "ms/sample", "KB in", "KB out"]
    cells = []
    for r in rows:
        if r["contender"] not in ("stoker", "stoker-run", "stoker-nocache", "stoker-batch", "stoker-proc") \
                or not r.get("stats"):
            continue
        for o in r["stats"].get("operators") or []:
            cells.append([r["pipeline"], r["contender"], o["name"], fmt(o["ns_per_sample"] / 1e6, ".2f"),
                          fmt(o.get("bytes_in_per_sample", 0) / 1024), fmt(o.get("bytes_out_per_sample", 0) / 1024)])
    return markdown(head, cells) if md else H.text_table(head, cells, right={3, 4, 5})


def markdown(head: list[str], cells: list) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        if isinstance(c, H.Span):
            c = c.cells + [c.text] + [""] * (len(head) - len(c.cells) - 1)
        lines.append("| " + " | ".join(c) + " |")
    return "\n".join(lines)


def targets(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        if r["contender"] not in ("stoker", "stoker-run", "stoker-torch", "stoker-nocache") or "vs_torch" not in r:
            continue
        if r["pipeline"] == "imagenet":
            x = r.get("vs_torch_later")
            if x is None:
                continue
            what = f"imagenet {r['contender']}: epochs 2-3 >= 3x the DataLoader"
        else:
            x = r["vs_torch"]
            what = f"{r['pipeline']}: stoker >= 3x the DataLoader"
        out.append(f"  {what:<55} {'met' if x >= 3 else 'NOT met':<8} {x:.2f}x")
    return out


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_arg(p, "--reps", None)
    p.add_argument("--quick", action="store_true", help="a few hundred samples, 1 rep, the DataLoader with 2 workers")
    p.add_argument("--pipelines", default=",".join(PIPELINES))
    H.add_arg(p, "--only", "")
    p.add_argument("--epochs", type=int, default=2, help="epochs of cv, nlp and asr")
    p.add_argument("--imagenet-epochs", type=int, default=3)
    p.add_argument("--cv-images", type=int)
    p.add_argument("--imagenet-images", type=int)
    p.add_argument("--nlp-docs", type=int)
    p.add_argument("--asr-clips", type=int)
    p.add_argument("--torch-workers", default=None, help="DataLoader worker counts, each a contender (default 1,2,4)")
    H.add_arg(p, "--python", REPO / ".venv-bench/bin/python")
    H.add_arg(p, "--timeout", 600)
    H.add_arg(p, "--out", REPO / "bench/results/cedar.json")
    a = p.parse_args(argv)
    quick = {"reps": 1, "cv_images": 96, "imagenet_images": 192, "nlp_docs": 192, "asr_clips": 48,
             "torch_workers": "2"}
    full = {"reps": 3, "cv_images": 320, "imagenet_images": 1200, "nlp_docs": 640, "asr_clips": 200,
            "torch_workers": "1,2,4"}
    for k, v in (quick if a.quick else full).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.torch_workers = [int(x) for x in str(a.torch_workers).split(",") if x.strip()]
    pipelines = H.pick(a.pipelines, PIPELINES, p.error, what="pipeline", keep_order=True)
    only = H.pick(a.only, ALL, p.error, default=(), keep_order=True) if a.only else []
    if not a.python.exists():
        log(f"missing {a.python}: bash bench/setup.sh (or make the venv, see the docstring)")
        return 2
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("RAY_DEDUP_LOGS", "0")
    data = prepare(a, pipelines, env)
    has = {}
    for name, op in NEEDS_OP.items():
        r = H.run_child([str(a.python), str(READERS), "has-op", op], env, 120)
        has[name] = r.returncode == 0 and bool(H.last_json(r.stdout).get("known"))
        log(f"{name}: the installed stoker {'has' if has[name] else 'has no'} {op} operator")
    groups = []
    torch_names = [f"torch-{w}w" for w in a.torch_workers]
    for pl in pipelines:
        names = [x for n in CONTENDERS[pl] for x in (torch_names if n == "torch" else [n])]
        names += [n for n in OPT_IN.get(pl, []) if n in only or has.get(n)]
        if only:
            names = [n for n in names if n in only]
        if names:
            groups.append((pl, names))
    log(f"pipelines {[g for g, _ in groups]}, {a.reps} rep(s), {sum(len(n) for _, n in groups)} contenders")
    rows: list[dict] = []
    try:
        args_of = {(pl, n): reader_args(pl, n, data[pl], a) for pl, names in groups for n in names}

        def ok(rep: int, pl: str, n: str, r: Rep) -> None:
            log(f"rep {rep + 1} {pl} {n}: {r.rate():.0f} samples/s ({r.steady():.0f} after the first batch), "
                f"{1000 * r.cpu_s / r.samples:.2f} ms CPU/sample, PSS {r.peak_pss / 2**20:.0f} MiB")

        def expect(pl: str, n: str, r: Rep) -> str | None:
            epochs = a.imagenet_epochs if pl == "imagenet" else a.epochs
            want = data[pl]["n"] * epochs
            return None if r.samples == want else f"{r.samples} samples, expected {want}"

        trials = H.run_reps(a.reps, groups, lambda pl, n, _rep: run_reader(a, env, args_of[(pl, n)]),
                            expect=expect, on_ok=ok,
                            on_fail=lambda _rep, pl, n, err: log(f"{pl} {n}: FAILED: {H.first_line(err, 300)}"))
        for pl, names in groups:
            epochs = a.imagenet_epochs if pl == "imagenet" else a.epochs
            for n in names:
                row = summarize(pl, n, trials.reps[(pl, n)], trials.errors.get((pl, n)), epochs, data[pl]["n"])
                row["argv"] = args_of[(pl, n)]
                rows.append(row)
    finally:
        H.kill_live_children()
    add_ratios(rows)
    sections = []
    if any(r["pipeline"] != "imagenet" for r in rows):
        sections.append(("cedar's pipelines", main_table, rows))
    if any(r["pipeline"] == "imagenet" for r in rows):
        sections.append((f"ImageNet-style training, {a.imagenet_epochs} epochs",
                         lambda rs, md: epochs_table(rs, a.imagenet_epochs, md), rows))
    sections.append(("Stoker's operators (measured ms a sample, median rep)", operators_table, rows))
    for title, fn, rs in sections:
        print(f"\n{title}\n{fn(rs, False)}")
    goals = targets(rows)
    if goals:
        print("\ntargets (issue 26):\n" + "\n".join(goals))
    md = "\n\n".join(f"{title}\n\n{fn(rs, True)}" for title, fn, rs in sections)
    md_path = a.out.with_suffix(".md")
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(md + "\n")
    H.write_json(a.out, {
        "date": H.now_iso(utc=False),
        "environment": H.environment(python=a.python, packages=PACKAGES),
        "args": H.args_dict(a),
        "data": data,
        "dataloader_best": {r["pipeline"]: r["contender"] for r in rows if r.get("dataloader_best")},
        "rows": rows,
        "targets": goals,
    }, indent=1, newline=False)
    log(f"wrote {a.out} and {md_path}")
    return 0


if __name__ == "__main__":
    H.run_main(main, log)
