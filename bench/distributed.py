"""Stoker on Ray (`Pipeline.distribute`), against local Stoker and Ray Data, on this
machine's cores. Each contender is a Python process of its own; medians over `--reps`
interleaved repetitions.

    python3 bench/distributed.py                     # 2,000 JPEGs, 2 epochs, 5 reps
    python3 bench/distributed.py --images 500 --reps 1 --only local,ray

Groups and contenders (the ImageNet-style pipeline: decode, RandomResizedCrop 224, flip,
normalise, batches of 64, over `stoker demo`'s JPEGs as a local ImageFolder):

- `overhead`: `local` (the pipeline in the process, `threads` = the cores), `ray` (the same
  pipeline through `distribute(W)` on a local Ray of the same cores, one engine thread per
  worker actor), `raydata` (`ray.data.read_images` + `map_batches` with torchvision's
  transforms + `iter_torch_batches`, the same cores). Images/s over the epochs, counted from
  the iterator's creation (Ray's start is reported apart, as `startup_s`: a cluster is
  normally up already), time to the first batch, peak RSS and PSS of the whole process tree
  (Ray's GCS, raylet and workers included).
  `tfservice`: the same pipeline in tf.data (decode_jpeg, sample_distorted_bounding_box +
  resize, flip, normalise, batch 64) run by tf.data service, a dispatcher and `--workers`
  worker servers in the child process, `distributed_epoch`.
- `offload`: a trainer pinned to core 0, doing `--step-ms` of CPU work per batch (a
  simulated training step); its input either `local` (the pipeline in the trainer, on core
  0 too) or `ray` (one worker actor on core 1). Steps per second, both ways.

Each child prints one JSON line; the parent checks the image count. Results go to
bench/results/distributed.json; the table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# The children run with `python -P` (the script's folder not on sys.path: bench/profile.py
# would shadow the standard library's `profile`, which torch imports), so only the parent
# imports the harness.
if __name__ == "__main__" and "--child" not in sys.argv:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness as H  # noqa: E402

    log = H.logger("distributed")

SPEC = """source = "{root}"
format = "imagefolder"
seed = 42
epochs = {epochs}
shuffle_shards = true

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
[[ops]]
op = "image_to_tensor"
field = "jpg"
normalize = "imagenet"
[[ops]]
op = "batch"
size = 64

[options]
threads = {threads}
disable = ["cache"]
"""


def busy(ms: float) -> None:
    """`ms` milliseconds of this thread's CPU time (a training step's stand-in): a fixed
    amount of work, which takes longer when the core is shared."""
    end = time.thread_time() + ms / 1000
    x = 1.0
    while time.thread_time() < end:
        for _ in range(1000):
            x = x * 1.0000001 + 1e-9


def child(a: argparse.Namespace) -> None:
    out: dict = {}
    if a.group == "offload":
        if a.contender == "local":
            os.sched_setaffinity(0, {0})
        else:
            # Ray's processes (and the worker it starts) inherit core 1; then the trainer
            # moves to core 0.
            os.sched_setaffinity(0, {1})
    t0 = time.perf_counter()
    ray = None
    if a.contender in ("ray", "raydata"):
        import ray

        cpus = 1 if a.group == "offload" else a.cores
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    out["startup_s"] = time.perf_counter() - t0
    if a.contender == "raydata":
        it = raydata_batches(a)
    elif a.contender == "tfservice":
        it = tfservice_batches(a)
    else:
        import stoker

        threads = 1 if a.group == "offload" else a.cores
        p = stoker.from_spec(SPEC.format(root=a.root, epochs=a.epochs, threads=threads))
        if a.contender == "ray":
            workers = 1 if a.group == "offload" else a.workers
            p = p.distribute(workers, cpus_per_worker=1)
        it = iter(p)
    if a.group == "offload" and a.contender == "ray":
        # The worker is started (it is made with the run): the trainer goes to core 0.
        os.sched_setaffinity(0, {0})
    t1 = time.perf_counter()
    n = steps = 0
    first = None
    n_first = 0
    for b in it:
        k = len(b["jpg"]) if "jpg" in b else len(b["image"])
        if first is None:
            first = time.perf_counter() - t1
            n_first = k
        n += k
        if a.group == "offload":
            busy(a.step_ms)
            steps += 1
    wall = time.perf_counter() - t1
    # Steady: after the first batch (a cluster's workers are normally started already).
    steady = (n - n_first) / max(wall - (first or 0.0), 1e-9)
    out.update(images=n, steps=steps, wall_s=wall, first_batch_s=first, steady_images_per_s=steady)
    if ray is not None:
        ray.shutdown()
    print(json.dumps(out))


def raydata_batches(a: argparse.Namespace):
    import numpy as np
    import ray.data
    import torch
    import torchvision.transforms.v2 as T

    tf = T.Compose(
        [
            T.RandomResizedCrop(224, antialias=True),
            T.RandomHorizontalFlip(),
            T.ToDtype(torch.float32, scale=True),
            T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )

    def augment(batch: dict) -> dict:
        imgs = [tf(torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1)).numpy() for x in batch["image"]]
        return {"image": np.stack(imgs)}

    ds = ray.data.read_images(a.root, mode="RGB").map_batches(augment, batch_size=64)
    for _ in range(a.epochs):
        yield from ds.iter_torch_batches(batch_size=64)


def tfservice_batches(a: argparse.Namespace):
    """The same pipeline in tf.data, run by tf.data service: a dispatcher and `--workers`
    worker servers in this process (tensorflow-cpu ships them), the files split among the
    workers (`distributed_epoch`), every map AUTOTUNEd."""
    import tensorflow as tf

    svc = tf.data.experimental.service
    dispatcher = svc.DispatchServer(svc.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    workers = [svc.WorkerServer(svc.WorkerConfig(dispatcher_address=address, port=0)) for _ in range(a.workers)]
    mean = tf.constant([0.485, 0.456, 0.406])
    std = tf.constant([0.229, 0.224, 0.225])

    def load(path):
        img = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.shape(img), tf.zeros([1, 0, 4]), area_range=(0.08, 1.0),
            aspect_ratio_range=(3 / 4, 4 / 3), use_image_if_no_bounding_boxes=True,
        )
        img = tf.image.resize(tf.slice(img, begin, size), [224, 224])
        img = tf.image.random_flip_left_right(img)
        return (img / 255.0 - mean) / std

    files = tf.data.Dataset.list_files(f"{a.root}/*/*.jpg", shuffle=True, seed=42)
    ds = files.repeat(a.epochs).map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(64)
    ds = ds.prefetch(tf.data.AUTOTUNE).apply(
        svc.distribute(processing_mode="distributed_epoch", service=dispatcher.target)
    )
    for b in ds:
        yield {"image": b}
    del workers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--workers", type=int, default=2, help="worker actors in the overhead group")
    ap.add_argument("--step-ms", type=float, default=60.0, help="the offload group's training step")
    ap.add_argument("--offload-images", type=int, default=2000)
    ap.add_argument("--only", default="", help="contenders to run (local,ray,raydata,tfservice)")
    ap.add_argument("--groups", default="overhead,offload")
    ap.add_argument("--python", type=Path, default=Path(sys.executable))
    ap.add_argument("--data-dir", type=Path, default=Path("/tmp/stoker-bench-data/profile"))
    ap.add_argument("--stoker", type=Path, default=None, help="default: target/release/stoker")
    ap.add_argument("--out", type=Path, default=None, help="default: bench/results/distributed.json")
    ap.add_argument("--child", nargs=2, metavar=("GROUP", "CONTENDER"), help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        a.group, a.contender = a.child
        child(a)
        return 0
    a.stoker = a.stoker or H.REPO / "target/release/stoker"
    a.out = a.out or H.RESULTS / "distributed.json"

    root = a.data_dir / "demo" / "images"
    if not root.is_dir() or sum(1 for _ in root.rglob("*.jpg")) < a.images:
        if not a.stoker.exists():
            subprocess.run(["cargo", "build", "--release", "-p", "stoker"], cwd=H.REPO, check=True)
        log(f"generating {a.images} JPEGs in {a.data_dir} (stoker demo --dir)")
        subprocess.run(
            [str(a.stoker), "demo", "--images", str(a.images), "--epochs", "1", "--dir", str(a.data_dir), "--json"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    # The offload group reads a subset (its steps are slow): a folder of hard links.
    sub = a.data_dir / f"offload-{a.offload_images}"
    if not sub.is_dir():
        files = sorted(root.rglob("*.jpg"))[: a.offload_images]
        for f in files:
            d = sub / f.parent.name
            d.mkdir(parents=True, exist_ok=True)
            os.link(f, d / f.name)
    total = sum(1 for _ in root.rglob("*.jpg"))
    only = set(filter(None, a.only.split(",")))
    groups = []
    for g in a.groups.split(","):
        cs = ["local", "ray", "raydata", "tfservice"] if g == "overhead" else ["local", "ray"]
        cs = [c for c in cs if not only or c in only]
        if cs:
            groups.append((g, cs))
    expected = {"overhead": total * a.epochs, "offload": a.offload_images}

    def run(group: str, contender: str, rep: int) -> dict:
        data = root if group == "overhead" else sub
        epochs = a.epochs if group == "overhead" else 1
        cmd = [
            str(a.python), "-P", __file__, "--child", group, contender, "--root", str(data),
            "--epochs", str(epochs), "--cores", str(a.cores), "--workers", str(a.workers),
            "--step-ms", str(a.step_ms),
        ]
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        r = H.run_child(cmd, env, timeout=900, sample_memory=True)
        if r.returncode != 0:
            raise H.ContenderError(H.tail(r.stderr, 400))
        doc = json.loads(r.stdout.strip().splitlines()[-1])
        doc.update(
            images_per_s=doc["images"] / doc["wall_s"],
            steps_per_s=doc["steps"] / doc["wall_s"],
            peak_rss_mib=r.peak_rss / 2**20,
            peak_pss_mib=r.peak_pss / 2**20,
            cpu_s=r.cpu_s,
        )
        return doc

    def on_ok(rep: int, g: str, c: str, r: dict) -> None:
        log(
            f"rep {rep} {g} {c}: {r['images_per_s']:.0f} images/s ({r['steady_images_per_s']:.0f} after the first "
            f"batch), {r['steps_per_s']:.2f} steps/s, "
            f"first batch {r['first_batch_s']:.2f} s, startup {r['startup_s']:.1f} s, "
            f"PSS {r['peak_pss_mib']:.0f} MiB"
        )

    trials = H.run_reps(
        a.reps,
        groups,
        run,
        expect=lambda g, _c, r: None if r["images"] == expected[g] else f"{r['images']} images, not {expected[g]}",
        on_ok=on_ok,
        on_fail=lambda rep, g, c, e: log(f"rep {rep} {g} {c} FAILED: {e}"),
    )
    rows = []
    summary: dict = {}
    for g, cs in groups:
        rate = "images_per_s" if g == "overhead" else "steps_per_s"
        base = [r[rate] for r in trials.reps[(g, "local")]] if (g, "local") in trials.reps else []
        for c in cs:
            rs = trials.reps[(g, c)]
            if not rs:
                rows.append([g, c, "FAILED", trials.errors.get((g, c), "")[-60:], "", "", "", "", "", "", ""])
                continue
            med = H.median(r[rate] for r in rs)
            paired = H.median(r[rate] / b for r, b in zip(rs, base)) if base else float("nan")
            m = {f: H.median(r[f] for r in rs) for f in ("first_batch_s", "startup_s", "peak_rss_mib", "peak_pss_mib", "cpu_s", "steady_images_per_s")}
            base_steady = [r["steady_images_per_s"] for r in trials.reps.get((g, "local"), [])]
            m["steady_paired_ratio_to_local"] = (
                H.median(r["steady_images_per_s"] / b for r, b in zip(rs, base_steady)) if base_steady else float("nan")
            )
            summary[f"{g}/{c}"] = {"median": med, "paired_ratio_to_local": paired, **m}
            rows.append(
                [
                    g, c, f"{med:.2f}" if g == "offload" else f"{med:.0f}",
                    f"{min(r[rate] for r in rs):.2f}-{max(r[rate] for r in rs):.2f}" if g == "offload"
                    else f"{min(r[rate] for r in rs):.0f}-{max(r[rate] for r in rs):.0f}",
                    f"{paired:.2f}", f"{m['steady_images_per_s']:.0f}", f"{m['steady_paired_ratio_to_local']:.2f}",
                    f"{m['first_batch_s']:.2f}", f"{m['startup_s']:.1f}",
                    f"{m['peak_rss_mib']:.0f}", f"{m['peak_pss_mib']:.0f}",
                ]
            )
    head = ["group", "contender", "median rate", "range", "/ local (paired)", "steady images/s", "/ local (paired)", "first batch s",
            "startup s", "peak RSS MiB", "peak PSS MiB"]
    print("rate: images/s (overhead), training steps/s (offload)")
    print(H.text_table(head, rows, right=[2, 3, 4, 5, 6, 7, 8, 9, 10]))
    H.write_json(
        a.out,
        {
            "when": H.now_iso(),
            "args": H.args_dict(a),
            "environment": H.environment(),
            "summary": summary,
            "errors": {f"{g}/{c}": e for (g, c), e in trials.errors.items()},
            "reps": {f"{g}/{c}": trials.reps[(g, c)] for g, cs in groups for c in cs},
        },
    )
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
