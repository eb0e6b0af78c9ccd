#!/usr/bin/env python3
"""Writes an ImageNet-like JPEG data set for `image_throughput`: N files of about 440x430
pixels (sizes vary around that), quality 90, ~110 KB each, with natural-ish content
(smooth gradients, shapes, textured noise) so that file sizes and decode costs are
realistic.

    python crates/stoker-ops/examples/make_jpegs.py /work/data-jpeg [N=2000]
"""

import os
import sys

import numpy as np
from PIL import Image, ImageDraw, ImageFilter


def picture(rng, w, h):
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    chans = []
    for _ in range(3):
        fx, fy = rng.uniform(0.5, 4.0, 2)
        ph = rng.uniform(0, 6.3, 2)
        chans.append(128 + 70 * np.sin(x / w * fx * 6.3 + ph[0]) * np.cos(y / h * fy * 6.3 + ph[1]))
    img = Image.fromarray(np.clip(np.stack(chans, -1), 0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    for _ in range(rng.integers(8, 20)):
        x0, y0 = rng.uniform(-0.1, 1.0) * w, rng.uniform(-0.1, 1.0) * h
        x1, y1 = x0 + rng.uniform(0.05, 0.5) * w, y0 + rng.uniform(0.05, 0.5) * h
        col = tuple(int(v) for v in rng.integers(0, 256, 3))
        if rng.uniform() < 0.5:
            d.ellipse([x0, y0, x1, y1], fill=col)
        else:
            d.rectangle([x0, y0, x1, y1], fill=col)
    img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 1.5)))
    # Texture: noise at two scales, like foliage or fabric.
    fine = rng.normal(0, 23, (h, w, 3))
    coarse = np.asarray(
        Image.fromarray(rng.normal(128, 40, (h // 4 + 1, w // 4 + 1)).clip(0, 255).astype(np.uint8))
        .resize((w, h), Image.Resampling.BICUBIC)
    ).astype(np.float32)[..., None] - 128
    arr = np.asarray(img).astype(np.float32) + fine + 0.5 * coarse
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/work/data-jpeg"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(2024)
    total = 0
    for i in range(n):
        w = int(rng.integers(400, 481))
        h = int(rng.integers(390, 471))
        path = os.path.join(out, f"img_{i:05d}.jpg")
        picture(rng, w, h).save(path, format="JPEG", quality=90)
        total += os.path.getsize(path)
    print(f"{n} files, mean {total / n / 1024:.1f} KiB, in {out}")


if __name__ == "__main__":
    main()
