#!/usr/bin/env python3
"""The peers of `image_throughput`, in one process on one thread over the same files
(read into memory first), printing wall-clock and thread-CPU rates: PIL's decode (`Image.open` + `convert("RGB")`) and a torchvision
ImageNet train transform (RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor +
Normalize) on PIL images, as in torchvision's reference recipe.

    python crates/stoker-ops/examples/image_throughput_pil.py /work/data-jpeg [--limit N]
"""

import io
import os
import sys
import time

import torch
from PIL import Image
from torchvision import transforms as T


def main():
    args = sys.argv[1:]
    limit = None
    if "--limit" in args:
        i = args.index("--limit")
        limit = int(args[i + 1])
        del args[i : i + 2]
    d = args[0] if args else "/work/data-jpeg"
    names = sorted(n for n in os.listdir(d) if n.endswith((".jpg", ".jpeg")))[:limit]
    files = [open(os.path.join(d, n), "rb").read() for n in names]
    torch.set_num_threads(1)
    print(f"{len(files)} JPEGs in {d}; one process, one thread")

    def run(name, f):
        for b in files[:20]:
            f(b)
        t, c = time.perf_counter(), time.thread_time()
        for b in files:
            f(b)
        s, c = time.perf_counter() - t, time.thread_time() - c
        n = len(files)
        print(f"{name:38} {n / s:7.1f} images/s wall, {n / c:7.1f} images/s CPU "
              f"({c * 1e3 / n:.3f} ms CPU/image)")

    run("PIL decode", lambda b: Image.open(io.BytesIO(b)).convert("RGB"))
    tf = T.Compose([
        T.RandomResizedCrop(224),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    run("PIL decode + torchvision RRC/flip/norm", lambda b: tf(Image.open(io.BytesIO(b)).convert("RGB")))


if __name__ == "__main__":
    main()
