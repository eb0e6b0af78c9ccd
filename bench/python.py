#!/usr/bin/env python3
"""Python package benchmark: stoker's Python API against PyTorch's DataLoader + torchvision,
tf.data and Ray Data, on the same JPEG files in the same run, from local disk and from the
S3 test server with injected latency; plus the same pipeline with a Python function in the
middle.

One command (after `bash bench/setup.sh`, and the stoker package installed into the bench
venv: `.venv-bench/bin/pip install ./python`, a release build):

    python3 bench/python.py [--reps 3] [--sources local,s3] [--variants plain,pyfn]
                            [--only stoker,torch-2w,...] [--out bench/results/python.json]

Data: the 2,000 ImageNet-like JPEGs of bench/ops.py (10 class directories), read from the
page cache (local) or served by stoker-testserver with --latency-ms (default 10) before
each response (s3). The pipeline: decode, RandomResizedCrop(224), horizontal flip, float32
CHW normalized with ImageNet's mean/std, batches of 64 (bench/python_readers.py). Variant
`pyfn` adds a Python function between the transforms and the batching (a 32x32 cutout).

Contenders:
  stoker        stoker.from_url(...).map(native ops).batch(64), batches as torch tensors
                (threads = cores); pyfn: the function in stoker's worker processes
  stoker-np     plain only: the same with NumPy batches (torch is not imported: its import
                takes about 1 s of every torch contender's time to the first batch)
  stoker-thr    pyfn only: the function run by stoker's threads (workers="threads")
  torch-2w      torchvision in a DataLoader, 2 workers (local: ImageFolder; s3: the S3
                connector's S3MapDataset)
  torch-best    the same with the best worker count found here (3 local, 6 s3)
  tfdata        tf.data with AUTOTUNE (s3: boto3 inside tf.py_function)
  ray           Ray Data read_binary_files + map + iter_torch_batches

Reported per contender: images/s from process start, images/s after the first batch,
images/s of the loader alone (`loader/s`: timed from the moment the array framework, torch
or TensorFlow or NumPy, has been imported, since a training script imports it whatever
loads its data; the import itself took 1-2 s of every torch contender's time here), CPU
ms per image and peak RSS and PSS, all summed over the process tree (workers, Ray's
processes), the same memory above a process that only imports the framework (`+RSS`,
`+PSS`: what the loader adds to a training process), and the time to the first batch from
process start and from that import.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness as H  # noqa: E402  (the loop, child processes, test server: bench/harness.py)
import ops as opsbench  # noqa: E402  (the JPEGs, the pipeline's Rep and summary)

REPO = HERE.parent
READERS = HERE / "python_readers.py"
BUCKET = "imagefolder-2000"

CONTENDERS = ["stoker", "stoker-np", "stoker-thr", "torch-2w", "torch-best", "tfdata", "ray"]

log = opsbench.log


def argv_of(name: str, source: str, variant: str, where: list[str]) -> list[str] | None:
    pyfn = variant == "pyfn"
    if name == "stoker":
        return ["stoker", *where, *(["--pyfn", "processes"] if pyfn else [])]
    if name == "stoker-np":
        return ["stoker", *where, "--numpy"] if not pyfn else None
    if name == "stoker-thr":
        return ["stoker", *where, "--pyfn", "threads"] if pyfn else None
    extra = ["--pyfn"] if pyfn else []
    if name == "torch-2w":
        return ["torch", *where, "--workers", "2", *extra]
    if name == "torch-best":
        return ["torch", *where, "--workers", "3" if source == "local" else "6", *extra]
    if name in ("tfdata", "ray"):
        return [name, *where, *extra]
    raise ValueError(name)


def run_one(ctx: opsbench.Ctx, args: list[str]) -> opsbench.Rep:
    return opsbench.run_reader(ctx, READERS, args)


#: The array framework each contender's batches live in (imported by a training script
#: whatever loads its data); its bare import is measured as a memory baseline.
FRAMEWORK = {"stoker": "torch", "stoker-np": "numpy", "stoker-thr": "torch", "torch-2w": "torch",
             "torch-best": "torch", "tfdata": "tensorflow", "ray": "torch"}


def framework_baseline(ctx: opsbench.Ctx, python: Path, framework: str) -> dict:
    """Peak RSS and PSS of a process that only imports the framework (median of 3)."""
    code = f"import {framework}, time; time.sleep(0.5)"
    runs = [H.run_child([str(python), "-c", code], ctx.env, ctx.args.timeout, sample_memory=True) for _ in range(3)]
    return {"rss": H.median(r.peak_rss for r in runs), "pss": H.median(r.peak_pss for r in runs)}


def loader_figures(reps: list[opsbench.Rep]) -> dict:
    """The same run timed from the array framework's import on (torch, TensorFlow or NumPy,
    which a training script imports whatever loads its data): the loader's own cost."""
    if not reps:
        return {}
    med = H.median
    return {
        "import_s": med(r.import_s for r in reps),
        "loader_images_per_s": med(r.images / (r.seconds - r.import_s) for r in reps),
        "first_batch_after_import_s": (None if any(r.first_batch_s is None for r in reps)
                                       else med(r.first_batch_s - r.import_s for r in reps)),
    }


def table(rows: list[dict]) -> str:
    head = (f"{'source':6} {'variant':7} {'contender':11} {'images/s':>9} {'steady/s':>9} {'loader/s':>9} "
            f"{'CPU ms/img':>10} {'RSS MiB':>8} {'PSS MiB':>8} {'+RSS':>6} {'+PSS':>6} {'1st batch s':>11} "
            f"{'1st (loader)':>12}  stoker/peer (steady; loader)")
    lines = [head, "-" * len(head)]
    by = {(r["source"], r["variant"], r["contender"]): r for r in rows}
    for r in rows:
        tag = f"{r['source']:6} {r['variant']:7} {r['contender']:11}"
        if r.get("error"):
            lines.append(f"{tag} error: {r['error'][:90]}")
            continue
        s = by.get((r["source"], r["variant"], "stoker"))
        ratio = ""
        if s and not s.get("error") and not r["contender"].startswith("stoker"):
            ratio = H.ratio_text(s, r, ["images_per_s", "steady_images_per_s", "loader_images_per_s"])
        fb = "-" if r["first_batch_s"] is None else f"{r['first_batch_s']:.2f}"
        fl = "-" if r.get("first_batch_after_import_s") is None else f"{r['first_batch_after_import_s']:.2f}"
        lines.append(f"{tag} {r['images_per_s']:9.0f} {r['steady_images_per_s']:9.0f} "
                     f"{r['loader_images_per_s']:9.0f} "
                     f"{r['cpu_ms_per_image']:10.2f} {r['peak_rss_mib']:8.0f} {r['peak_pss_mib']:8.0f} "
                     f"{r.get('rss_above_framework_mib', float('nan')):6.0f} "
                     f"{r.get('pss_above_framework_mib', float('nan')):6.0f} "
                     f"{fb:>11} {fl:>12}  {ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_arg(p, "--reps", 3)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--sources", default="local,s3")
    p.add_argument("--variants", default="plain,pyfn")
    H.add_arg(p, "--only", ",".join(CONTENDERS))
    H.add_arg(p, "--latency-ms", 10)
    H.add_arg(p, "--python", REPO / ".venv-bench/bin/python")
    H.add_arg(p, "--server", REPO / "target/release/stoker-testserver")
    H.add_arg(p, "--timeout", 600)
    H.add_arg(p, "--out", REPO / "bench/results/python.json")
    a = p.parse_args(argv)
    sources = H.pick(a.sources, ["local", "s3"], p.error, what="source", default=(), keep_order=True)
    variants = H.pick(a.variants, ["plain", "pyfn"], p.error, what="variant", default=(), keep_order=True)
    names = H.pick(a.only, CONTENDERS, p.error, default=(), keep_order=True)
    for path, what in ((a.python, "the venv (bash bench/setup.sh)"),
                       (a.server, "the test server (cargo build --release -p stoker-testserver)")):
        if not path.exists():
            log(f"missing {path}: build/install {what}")
            return 2
    data = opsbench.prepare_data(a.images, a.python)
    work = Path("/tmp/stoker-bench-python")
    work.mkdir(exist_ok=True)
    env = H.client_env(work)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    ctx = opsbench.Ctx(a, data, Path("/nonexistent"), Path("/nonexistent"), a.python, work, env)
    server = None
    rows = []
    baselines = {}
    for fw in sorted({FRAMEWORK[n] for n in names if n in FRAMEWORK}):
        baselines[fw] = framework_baseline(ctx, a.python, fw)
        log(f"baseline: import {fw} alone peaks at RSS {baselines[fw]['rss'] / 2**20:.0f} MiB, "
            f"PSS {baselines[fw]['pss'] / 2**20:.0f} MiB")
    try:
        endpoint = ""
        if "s3" in sources:
            server = H.Server.start(a.server, data.parent, a.latency_ms, work / "server.log")
            endpoint = server.endpoint
            log(f"test server at {endpoint}, bucket {BUCKET} = {data}")
        for source in sources:
            where = (["--dir", str(data)] if source == "local"
                     else ["--s3", f"s3://{data.name}/", "--endpoint", endpoint])
            for variant in variants:
                todo = [(n, argv_of(n, source, variant, where)) for n in names]
                todo = [(n, args) for n, args in todo if args is not None]
                argv = dict(todo)
                # One untimed pass warms the page cache, the server and the imports.
                try:
                    run_one(ctx, todo[0][1])
                except H.ContenderError as e:
                    log(f"warm-up: {e}")

                def ok(rep: int, _g, n: str, r: opsbench.Rep) -> None:
                    log(f"{source} {variant} {n} rep {rep + 1}: {r.images / r.seconds:.0f} images/s, "
                        f"{1000 * r.cpu_s / r.images:.2f} ms CPU/image, "
                        f"PSS {r.peak_pss / 2**20:.0f} MiB")

                # Every contender once per rep, the order rotated each rep.
                trials = H.run_reps(a.reps, [(None, list(argv))], lambda _g, n, _rep: run_one(ctx, argv[n]),
                                    expect=lambda _g, _n, r: f"{r.images} images, expected {a.images}"
                                    if r.images != a.images else None,
                                    on_ok=ok, on_fail=lambda _rep, _g, n, err: log(f"{source} {variant} {n}: {err}"))
                for n, _ in todo:
                    reps = trials.reps[(None, n)]
                    row = opsbench.summarize(f"{source}/{variant}", n, reps, trials.errors.get((None, n)))
                    row.update(source=source, variant=variant, **loader_figures(reps))
                    base = baselines.get(FRAMEWORK.get(n, ""))
                    if base and not row.get("error"):
                        row.update(framework=FRAMEWORK[n],
                                   rss_above_framework_mib=row["peak_rss_mib"] - base["rss"] / 2**20,
                                   pss_above_framework_mib=row["peak_pss_mib"] - base["pss"] / 2**20)
                    rows.append(row)
    finally:
        H.kill_live_children()
        if server is not None:
            server.stop()
    print(table(rows))
    H.write_json(a.out, {
        "date": H.now_iso(utc=False),
        "commit": H.git_commit(),
        "machine": H.machine(),
        "args": H.args_dict(a),
        "rows": rows,
        "framework_baselines": baselines,
        "median": statistics.median.__name__,
    }, indent=1, newline=False)
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    H.run_main(main, log)
