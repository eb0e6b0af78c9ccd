"""Smoke test of the wheel in a fresh virtual environment (no Rust toolchain needed there):
the package imports from the installed wheel, not the source tree, and runs a pipeline of
every kind of stage over local files it writes."""

import os
import sys
import tempfile

import numpy as np

import stoker

here = os.path.dirname(os.path.abspath(__file__))
source = os.path.join(os.path.dirname(here), "python", "")
assert not stoker.__file__.startswith(source) and "site-packages" in stoker.__file__, stoker.__file__

with tempfile.TemporaryDirectory() as d:
    lines = "".join(f'{{"x": {i}, "y": "r{i}"}}\n' for i in range(100))
    with open(os.path.join(d, "part-0.jsonl"), "w") as f:
        f.write(lines)
    p = stoker.from_url(f"file://{d}/", format="jsonl").map(lambda s: {**s, "x2": s["x"] * 2}, workers="threads").batch(32)
    got = [b["x2"] for b in p]
    xs = np.concatenate([np.asarray(g) for g in got])
    assert sorted(xs.tolist()) == [2 * i for i in range(100)], xs
print(f"wheel smoke test: stoker {getattr(stoker, '__version__', '?')} from {os.path.dirname(stoker.__file__)} on Python {sys.version.split()[0]}: ok")
