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

With ``--placement`` it measures instead a function that costs about ``--work-ms`` of work
per item (``sleep``: GIL-free, as NumPy on large arrays or I/O; ``spin``: a Python loop
holding the GIL) placed after a sequential stage: per sample after ``shuffle(64)``, and per
batch after ``batch(--batch)`` (``map_batches``), on the engine's threads and in
``--threads`` worker processes, ``--items`` items each (the median of ``--reps`` runs):

    .venv/bin/python bench/pymap.py --placement [--items 1000] [--work-ms 1] [--threads 4]

It prints items/s and the speedup over calling the function once per item in a row
(``1000 / work-ms`` items/s). A build whose engine cannot run a stage there prints the
error instead.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402  (median, the common flags: bench/harness.py)

# numpy and stoker (the package under test) are imported where used, so that --help runs
# in any Python.


def identity(sample):
    return sample


def sleep_ms(item, ms):
    """GIL-free work: the thread sleeps (as NumPy on large arrays or I/O lets others run)."""
    time.sleep(ms / 1000)
    return item


def spin_ms(item, ms):
    """GIL-holding work: a Python loop for ``ms``."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass
    return item


def placement(args: argparse.Namespace) -> None:
    import numpy as np

    import stoker

    n, b, ms, t = args.items, args.batch, args.work_ms, args.threads
    samples = [{"i": i, "x": np.zeros(16, dtype=np.float32)} for i in range(n * b)]
    base = stoker.from_samples(samples).options(threads=t)
    after = {
        "after shuffle(64), per sample": lambda fn, **kw: base.take(n).shuffle(64).map(fn, **kw),
        f"after batch({b}), per batch": lambda fn, **kw: base.batch(b).map(fn, **kw),
    }
    modes = {"threads": {"workers": "threads"}, f"processes={t}": {"processes": t}}
    serial = 1000 / ms
    print(f"{n} items, {ms} ms of work each, threads={t}; one call at a time: {serial:,.0f} items/s")
    for where, make in after.items():
        for kind, work in (("sleep (GIL-free)", sleep_ms), ("spin (holds the GIL)", spin_ms)):
            for mode, kw in modes.items():
                fn = functools.partial(work, ms=ms)
                try:
                    rates = [timed(make(fn, **kw)) for _ in range(args.reps)]
                except Exception as e:  # noqa: BLE001 - an engine that cannot: say why
                    print(f"  {where:<30} {kind:<21} {mode:<12} error: {str(e).splitlines()[0][:90]}")
                    continue
                rate = H.median(rates)
                print(
                    f"  {where:<30} {kind:<21} {mode:<12} {rate:>8,.0f} items/s  "
                    f"x{rate / serial:.2f}  (runs: {', '.join(f'{r:,.0f}' for r in rates)})"
                )


def timed(p) -> float:  # p: a stoker.Pipeline
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
    ap.add_argument("--placement", action="store_true", help="a costly function after shuffle and batch")
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--work-ms", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=16)
    H.add_arg(ap, "--reps", 3, help="--placement: runs of each case (the median is printed)")
    args = ap.parse_args()
    if args.placement:
        placement(args)
        return

    import numpy as np

    import stoker

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
    H.run_main(main)
