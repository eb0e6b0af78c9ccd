#!/usr/bin/env python3
"""Rank split benchmark: what one data-parallel rank reads and how long its epoch takes, with
the interleaved split (every rank reads every shard, keeps 1/world) against the contiguous
split (each rank reads its span of the epoch's records), on the same tar shards from the same
S3 test server with injected latency.

One command:

    python3 bench/ranks.py [--world 4] [--shards 32] [--samples 200] [--sample-kb 100]
                           [--latency-ms 10] [--reps 3] [--out bench/results/ranks.json]

The shards are written once with Python's `tarfile` (WebDataset layout: `KEY.jpg` of random
bytes + `KEY.cls`), cached under /tmp/stoker-bench-data/ranks. The contiguous split reads a
shard index that `stoker index` writes (timed too: a one-time cost per dataset). Each rank
of `--world` runs on its own, one after the other (one machine cannot be several nodes;
what a rank reads and how long it takes is what a node sees), `--reps` times, both splits
interleaved. Every run must yield floor(total / world) samples. Standard library only.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402  (the loop, test server, logging: bench/harness.py)

REPO = H.REPO
log = H.logger("ranks-bench")
BUCKET = "ranks"


def make_data(root: Path, shards: int, samples: int, kb: int) -> int:
    d = root / BUCKET / "train"
    marker = root / f".done-{shards}-{samples}-{kb}"
    if marker.exists():
        return shards * samples
    d.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    for s in range(shards):
        path = d / f"shard-{s:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(samples):
                key = f"s{s:04d}-{i:05d}"
                for ext, data in (("jpg", rng.randbytes(kb * 1000)), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    marker.write_text("ok")
    return shards * samples


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    t = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    dt = time.monotonic() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return dt, p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--samples", type=int, default=200, help="samples per shard")
    ap.add_argument("--sample-kb", type=int, default=100)
    H.add_arg(ap, "--latency-ms", 10)
    H.add_arg(ap, "--reps", 3)
    H.add_arg(ap, "--no-build")
    H.add_arg(ap, "--out", REPO / "bench" / "results" / "ranks.json")
    a = ap.parse_args()

    if not a.no_build:
        H.cargo_build(log)
    stoker = REPO / "target" / "release" / "stoker"
    root = Path("/tmp/stoker-bench-data/ranks")
    total = make_data(root, a.shards, a.samples, a.sample_kb)
    work = Path(tempfile.mkdtemp(prefix="stoker-ranks-"))
    server = H.Server.start(REPO / "target" / "release" / "stoker-testserver", root, a.latency_ms, work / "server.log",
                            ["--fast-etags"])
    env = dict(H.client_env(work), AWS_ENDPOINT_URL=server.endpoint)
    try:
        index = work / "index.json"
        t_index, _ = run([str(stoker), "index", f"s3://{BUCKET}/train/", "--format", "tar", "--output", str(index)], env)
        subprocess.run(["cp", str(index), str(root / BUCKET / "index.json")], check=True)
        per_rank = total // a.world

        def epoch(_g, split: str, rep: int) -> list[dict]:
            """Every rank of one split, one after the other."""
            runs = []
            for rank in range(a.world):
                extra = f'shard_index = "s3://{BUCKET}/index.json"\n' if split == "contiguous" else ""
                spec = work / f"{split}-{rank}.toml"
                spec.write_text(
                    f'source = "s3://{BUCKET}/train/"\nformat = "tar"\nshuffle_shards = true\ninterleave = 4\n'
                    f'seed = {rep}\n[rank]\nrank = {rank}\nworld = {a.world}\nsplit = "{split}"\n{extra}'
                )
                _, p = run([str(stoker), "run", str(spec), "--json"], env)
                r = json.loads(p.stdout)
                if r["samples"] != per_rank:
                    raise SystemExit(f"{split} rank {rank}: {r['samples']} samples, want {per_rank}")
                runs.append({"rep": rep, "rank": rank, "seconds": r["seconds"], "bytes_read": r["bytes_read"]})
            return runs

        # Both splits in each rep, which goes first alternating; any failure ends the run.
        splits = ["interleaved", "contiguous"]
        trials = H.run_reps(a.reps, [(None, splits)], epoch,
                            on_fail=lambda _rep, _g, split, err: sys.exit(f"{split}: {err}"))
        results = {split: [x for runs in trials.reps[(None, split)] for x in runs] for split in splits}
        dataset_bytes = sum(f.stat().st_size for f in (root / BUCKET / "train").iterdir())
        print(f"rank split: {a.shards} tar shards x {a.samples} samples of {a.sample_kb} KB "
              f"({dataset_bytes / 2**20:.0f} MiB), world {a.world}, {a.latency_ms:g} ms latency, "
              f"median over {a.reps} reps x {a.world} ranks; stoker index took {t_index:.2f} s")
        print(f"{'split':<12} {'rank epoch s':>12} {'MiB read/rank':>14} {'x dataset':>10}")
        summary = {}
        for split, rows in results.items():
            s = H.median(r["seconds"] for r in rows)
            b = H.median(r["bytes_read"] for r in rows)
            summary[split] = {"seconds": s, "bytes_read": b}
            print(f"{split:<12} {s:>12.2f} {b / 2**20:>14.0f} {b / dataset_bytes:>10.2f}")
        ratio = summary["interleaved"]["seconds"] / summary["contiguous"]["seconds"]
        print(f"contiguous: {ratio:.2f}x faster per rank, "
              f"{summary['interleaved']['bytes_read'] / summary['contiguous']['bytes_read']:.2f}x fewer bytes")
        H.write_json(a.out, {"args": H.args_dict(a), "index_s": t_index, "dataset_bytes": dataset_bytes,
                             "runs": results, "summary": summary}, indent=1, newline=False)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    H.run_main(main, log)
