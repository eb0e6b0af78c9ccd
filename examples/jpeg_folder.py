"""A small generated ImageFolder of JPEGs for the examples: ``root/<class>/<n>.jpg``.

Class ``k`` of ``classes`` (at most 6) is a noisy image tinted with the ``k``-th colour of a
small palette, with stripes, so a small CNN learns it in a few steps. Deterministic for a
seed.
"""

from __future__ import annotations

import io
import pathlib

import numpy as np
from PIL import Image


PALETTE = [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (0, 1, 1), (1, 0, 1)]


def make_imagefolder(
    root: str | pathlib.Path, classes: int = 4, per_class: int = 48, size: int = 48, seed: int = 0
) -> pathlib.Path:
    if not 1 <= classes <= len(PALETTE):
        raise ValueError(f"classes must be 1 to {len(PALETTE)}")
    root = pathlib.Path(root)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    for k in range(classes):
        d = root / f"class{k:02d}"
        d.mkdir(parents=True, exist_ok=True)
        stripes = np.sin((xx if k % 2 == 0 else yy) * 0.8) * 30
        for n in range(per_class):
            img = rng.normal(90, 30, size=(size, size, 3))
            img += np.multiply.outer(90 + stripes, np.array(PALETTE[k], dtype=float))
            buf = io.BytesIO()
            Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
            (d / f"{n:04d}.jpg").write_bytes(buf.getvalue())
    return root
