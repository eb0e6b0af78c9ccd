#!/usr/bin/env python3
"""Several epochs from S3, one run per epoch, as a PyTorch training loop iterates its
loader: does the second epoch read what the first one fetched?

The ImageNet-style pipeline of bench/python.py (decode, RandomResizedCrop 224, flip, float32
CHW normalized, batches of 64) over the same 2,000 JPEGs, served by stoker-testserver with
--latency-ms (default 10) before every response, for --epochs epochs (default 3):

  stoker        stoker.torch.DataLoader(stoker.torch.Dataset(p)), num_workers=0 (each
                epoch a run through the process's shared store: the default)
  stoker-own    the same with p.options(share_store=False): each epoch a store of its own
  torch         PyTorch's DataLoader over the S3 connector's S3MapDataset, PIL and
                torchvision, --workers (default 4), persistent_workers=True

Each contender runs in its own process (measured with bench/harness.py's process-tree
sampler: peak RSS and PSS over all processes) and prints every epoch's seconds. Reported:
medians over --reps of each epoch's images/s, and peak memory.

    .venv-bench/bin/python bench/epochs.py --reps 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import harness as H  # noqa: E402  (the loop, child processes, test server: bench/harness.py)

CONTENDERS = ("stoker", "stoker-own", "torch")


# ------------------------------------------------------------------------------- readers


def read_stoker(a: argparse.Namespace) -> list[float]:
    import torch  # noqa: F401  (the framework)

    import stoker
    import stoker.torch as st

    p = (stoker.from_url(a.s3, format="imagefolder", endpoint=a.endpoint, access_key=H.ACCESS_KEY,
                         secret_key=H.SECRET_KEY, region=H.REGION, allow_http=True)
         .shuffle_shards()
         .map("decode_image", field="jpg")
         .map("random_resized_crop", field="jpg", size=[224, 224])
         .map("random_flip", field="jpg")
         .map("image_to_tensor", field="jpg", normalize="imagenet")
         .batch(64).seed(1).options(threads=a.threads))
    if a.own:
        p = p.options(share_store=False)
    loader = st.DataLoader(st.Dataset(p))
    times, images = [], 0
    for _ in range(a.epochs):
        t = time.perf_counter()
        for b in loader:
            images += b["jpg"].shape[0]
        times.append(time.perf_counter() - t)
    H.emit({"epoch_s": times, "images": images})
    return times


def read_torch(a: argparse.Namespace) -> list[float]:
    import os

    import torch
    from python_readers import S3Images

    torch.set_num_threads(1)
    os.environ.update(AWS_ACCESS_KEY_ID=H.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=H.SECRET_KEY)
    ds = S3Images(a.endpoint, a.s3, False)
    dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=a.workers,
                                     persistent_workers=True, prefetch_factor=2)
    times, images = [], 0
    for _ in range(a.epochs):
        t = time.perf_counter()
        for x, _y in dl:
            images += x.shape[0]
        times.append(time.perf_counter() - t)
    H.emit({"epoch_s": times, "images": images})
    return times


# ------------------------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--read", choices=CONTENDERS, help=argparse.SUPPRESS)
    p.add_argument("--s3", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--own", action="store_true", help=argparse.SUPPRESS)
    H.add_arg(p, "--reps", 3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=4)
    H.add_arg(p, "--only", ",".join(CONTENDERS))
    H.add_arg(p, "--latency-ms", 10)
    H.add_arg(p, "--python", REPO / ".venv-bench/bin/python")
    H.add_arg(p, "--server", REPO / "target/release/stoker-testserver")
    H.add_arg(p, "--timeout", 900)
    H.add_arg(p, "--out", REPO / "bench/results/epochs.json")
    a = p.parse_args(argv)
    if a.read == "torch":
        read_torch(a)
        return 0
    if a.read:
        read_stoker(a)
        return 0

    import ops as opsbench

    names = H.pick(a.only, CONTENDERS, p.error, default=(), keep_order=True)
    data = opsbench.prepare_data(a.images, a.python)
    work = Path("/tmp/stoker-bench-epochs")
    work.mkdir(exist_ok=True)
    env = H.client_env(work)
    server = H.Server.start(a.server, data.parent, a.latency_ms, work / "server.log")
    try:
        common = ["--s3", f"s3://{data.name}/", "--endpoint", server.endpoint,
                  "--epochs", str(a.epochs), "--threads", str(a.threads), "--workers", str(a.workers)]

        def run(_g, n: str, _rep: int) -> dict:
            args = ["--read", "torch" if n == "torch" else "stoker", *common]
            if n == "stoker-own":
                args.append("--own")
            r = H.run_child([str(a.python), str(Path(__file__).resolve()), *args], env, a.timeout, sample_memory=True)
            if r.returncode != 0:
                raise H.ContenderError(f"exited {r.returncode}: {H.tail(r.stderr)}")
            res = H.last_json(r.stdout)
            res.update(peak_rss=r.peak_rss, peak_pss=r.peak_pss, cpu_s=r.cpu_s)
            return res

        def ok(rep: int, _g, n: str, res: dict) -> None:
            rates = ", ".join(f"{a.images / s:.0f}" for s in res["epoch_s"])
            print(f"rep {rep + 1} {n}: images/s by epoch {rates}; peak RSS "
                  f"{res['peak_rss'] / 2**20:.0f} MiB, PSS {res['peak_pss'] / 2**20:.0f} MiB", file=sys.stderr)

        # The contenders in turn, the order rotated each rep; a failed rep is reported and
        # the contender still runs in the next.
        trials = H.run_reps(a.reps, [(None, names)], run,
                            expect=lambda _g, _n, res: f"{res['images']} images, expected {a.images * a.epochs}"
                            if res["images"] != a.images * a.epochs else None,
                            on_ok=ok, on_fail=lambda _rep, _g, n, err: print(f"{n}: {err}", file=sys.stderr),
                            skip_failed=False)
        results = {n: trials.reps[(None, n)] for n in names}
    finally:
        H.kill_live_children()
        server.stop()
    rows = []
    for n, reps in results.items():
        if not reps:
            continue
        by_epoch = [H.median(a.images / r["epoch_s"][e] for r in reps) for e in range(a.epochs)]
        rows.append({"contender": n, "reps": len(reps), "images_per_s_by_epoch": by_epoch,
                     "peak_rss_mib": H.median(r["peak_rss"] for r in reps) / 2**20,
                     "peak_pss_mib": H.median(r["peak_pss"] for r in reps) / 2**20,
                     "cpu_ms_per_image": H.median(r["cpu_s"] for r in reps) * 1000
                     / (a.images * a.epochs)})
    print(f"{'contender':<12} {'images/s by epoch (medians)':<36} {'peak RSS':>9} {'PSS':>7} {'CPU ms/img':>10}")
    for row in rows:
        rates = " ".join(f"{x:7.0f}" for x in row["images_per_s_by_epoch"])
        print(f"{row['contender']:<12} {rates:<36} {row['peak_rss_mib']:7.0f}Mi "
              f"{row['peak_pss_mib']:5.0f}Mi {row['cpu_ms_per_image']:10.2f}")
    H.write_json(a.out, {"args": H.args_dict(a), "rows": rows}, indent=1, newline=False)
    return 0


if __name__ == "__main__":
    H.run_main(main)
