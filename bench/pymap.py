#!/usr/bin/env python3
"""Per-sample cost of a Python function in a pipeline (`Pipeline.map(fn)`), a measurement,
not a test.

One command (with the package installed in .venv, see docs/python.md):

    .venv/bin/python bench/pymap.py [--samples 20000] [--threads 2] [--payload 0]

Pipelines over samples in memory (`stoker.from_samples`: no I/O, so what is left is the
engine and the Python stage), each sample an int, a short text and `--payload` bytes of
float32 tensor: the same pipeline without a Python stage, with a trivial function
(returns the sample it got) on the engine's threads (`workers="threads"`), and in worker
processes (`processes=1` and `--threads`). Prints samples/s and microseconds per sample of
each, and the overhead per sample over the pipeline without the function. Workers start
before timing (one warm-up run's first items), so the figures are the steady state.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import stoker


def identity(sample):
    return sample


def timed(p: stoker.Pipeline) -> float:
    run = p.run()
    next(run)  # listing, first workers: not timed
    start = time.perf_counter()
    n = sum(1 for _ in run)
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--payload", type=int, default=0, help="bytes of tensor per sample")
    args = ap.parse_args()

    tensor = np.zeros(args.payload // 4, dtype=np.float32)
    samples = [{"i": i, "txt": f"sample {i}", "x": tensor} for i in range(args.samples)]
    base = stoker.from_samples(samples).options(threads=args.threads)
    cases = {
        "no Python stage": base,
        "threads": base.map(identity, workers="threads"),
        "processes=1": base.map(identity, processes=1),
        f"processes={args.threads}": base.map(identity, processes=args.threads),
    }
    print(f"{args.samples} samples, {args.payload} bytes of tensor each, threads={args.threads}")
    baseline = None
    for name, p in cases.items():
        rate = timed(p)
        us = 1e6 / rate
        if baseline is None:
            baseline = us
            extra = ""
        else:
            extra = f"  (+{us - baseline:.1f} us/sample over no Python stage)"
        print(f"  {name:<18} {rate:>10,.0f} samples/s  {us:>8.1f} us/sample{extra}")


if __name__ == "__main__":
    main()
