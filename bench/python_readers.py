#!/usr/bin/env python3
"""The contenders of bench/python.py, one per subcommand, each printing one JSON line:
{"images": N, "seconds": S, "first_batch_s": F, "first_batch_images": B}. Run in the venv
of bench/setup.sh (plus the stoker package for `stoker`).

Every contender runs the ImageNet-style pipeline (decode, RandomResizedCrop 224, horizontal
flip, float32 CHW normalized with ImageNet's mean/std, batches of 64) over an ImageFolder
tree, from local disk (--dir) or from the S3 test server (--s3 s3://bucket/prefix/ with
--endpoint). With --pyfn, a Python function (`cutout`: a random 32x32 square of the image
set to 0) runs on every sample between the transforms and the batching.

  stoker  --threads N [--pyfn threads|processes] [--numpy]
                                                   stoker's Python package (torch tensors;
                                                   --numpy: NumPy arrays, no torch import)
  torch   --workers N                              torchvision in PyTorch's DataLoader;
                                                   S3: the S3 connector's S3MapDataset
  tfdata                                           tf.data, AUTOTUNE; S3: boto3 in
                                                   tf.py_function (TF has no S3 reader)
  ray                                              Ray Data: read_binary_files, map,
                                                   iter_torch_batches
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import harness as H  # bench/harness.py (bench/ is on sys.path: this file is run as a script)
from harness import ACCESS_KEY, REGION, SECRET_KEY
from ops_readers import MEAN, STD, emit, tf_imagenet  # noqa: F401  (same directory)
from ops_readers import files as local_files  # noqa: F401

BATCH = 64


def cutout(x):
    """The Python function in the middle: zeroes a random 32x32 square of a CHW array or
    tensor (in place; callers pass their own copy)."""
    h, w = x.shape[-2], x.shape[-1]
    y0 = random.randrange(0, h - 32)
    x0 = random.randrange(0, w - 32)
    x[..., y0:y0 + 32, x0:x0 + 32] = 0
    return x


def stoker_cutout(sample: dict) -> dict:
    """`cutout` on a stoker sample (its arrays are read-only views of Stoker's buffers)."""
    sample["jpg"] = cutout(sample["jpg"].copy())
    return sample


def split_s3(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix


def boto3_client(endpoint: str, pool: int = 32):
    return H.boto3_client(endpoint, pool)


def s3_keys(endpoint: str, url: str) -> list[str]:
    bucket, prefix = split_s3(url)
    s3 = boto3_client(endpoint)
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", []) if o["Key"].lower().endswith((".jpg", ".jpeg"))]
    return sorted(keys)


def label_of(path: str) -> str:
    return path.rsplit("/", 2)[-2]


def class_index(name: str) -> int:
    """The data's class directories are class00..class09: their number is ImageFolder's
    index (sorted names)."""
    return int("".join(c for c in name if c.isdigit()) or 0)


# ------------------------------------------------------------------------------- stoker


def cmd_stoker(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    if a.numpy:
        import numpy  # noqa: F401  (the framework: NumPy)
    else:
        import torch  # noqa: F401  (the framework)
    t_fw = time.perf_counter()
    import stoker

    if a.numpy:
        def to_torch(b):  # NumPy batches as they come (no torch import)
            return b
    else:
        from stoker.torch import to_torch

    if a.s3:
        p = stoker.from_url(a.s3, format="imagefolder", endpoint=a.endpoint, access_key=ACCESS_KEY,
                            secret_key=SECRET_KEY, region=REGION, allow_http=True)
    else:
        p = stoker.from_url(a.dir, format="imagefolder")
    p = (p.shuffle_shards()
         .map("decode_image", field="jpg")
         .map("random_resized_crop", field="jpg", size=[224, 224])
         .map("random_flip", field="jpg")
         .map("image_to_tensor", field="jpg", normalize="imagenet"))
    if a.pyfn:
        p = p.map(stoker_cutout, workers=a.pyfn)
    p = p.batch(BATCH).seed(1).options(threads=a.threads)
    n, first, first_n = 0, None, 0
    for b in p:
        x = to_torch(b)["jpg"]
        if first is None:
            first, first_n = time.perf_counter(), x.shape[0]
        n += x.shape[0]
    emit(n, t0, first, first_n, t_fw)


# ------------------------------------------------------------------------------- torch


def torch_transform(pyfn: bool):
    from torchvision import transforms as T

    steps = [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    if pyfn:
        steps.append(T.Lambda(cutout))
    return T.Compose(steps)


class S3Images:
    """The S3 connector's map dataset, decoded by PIL and transformed by torchvision."""

    def __init__(self, endpoint: str, url: str, pyfn: bool) -> None:
        from s3torchconnector import S3MapDataset, S3ClientConfig  # noqa: F401

        self.ds = S3MapDataset.from_prefix(url, region=REGION, endpoint=endpoint)
        self.tf = torch_transform(pyfn)
        self.classes: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        from PIL import Image

        obj = self.ds[i]
        with Image.open(obj) as im:
            x = self.tf(im.convert("RGB"))
        return x, class_index(label_of(obj.key))


def cmd_torch(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    import torch
    t_fw = time.perf_counter()
    from torchvision import datasets

    torch.set_num_threads(1)
    if a.s3:
        os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        ds = S3Images(a.endpoint, a.s3, a.pyfn is not None)
    else:
        ds = datasets.ImageFolder(a.dir, transform=torch_transform(a.pyfn is not None))
    dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=a.workers,
                                     prefetch_factor=2 if a.workers else None)
    n, first, first_n = 0, None, 0
    for x, _y in dl:
        if first is None:
            first, first_n = time.perf_counter(), x.shape[0]
        n += x.shape[0]
    emit(n, t0, first, first_n, t_fw)


# ------------------------------------------------------------------------------- tf.data


def cmd_tfdata(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    t_fw = time.perf_counter()

    mean = tf.constant(MEAN) * 255.0
    std = tf.constant(STD) * 255.0
    if a.s3:
        bucket, _ = split_s3(a.s3)
        keys = s3_keys(a.endpoint, a.s3)
        s3 = boto3_client(a.endpoint)

        def fetch(key):
            return s3.get_object(Bucket=bucket, Key=key.numpy().decode())["Body"].read()

        def read(key):
            return tf.py_function(fetch, [key], tf.string)

        names = keys
    else:
        names = local_files(a.dir)
        read = tf.io.read_file

    def load(name):
        img = tf_imagenet(read(name), mean, std)
        if a.pyfn:
            img = tf.py_function(lambda t: cutout(np.array(t)), [img], tf.float32)
            img.set_shape([3, 224, 224])
        return img

    ds = (tf.data.Dataset.from_tensor_slices(names)
          .shuffle(len(names))
          .map(load, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(BATCH)
          .prefetch(tf.data.AUTOTUNE))
    n, first, first_n = 0, None, 0
    for x in ds:
        if first is None:
            first, first_n = time.perf_counter(), int(x.shape[0])
        n += int(x.shape[0])
    emit(n, t0, first, first_n, t_fw)


# ------------------------------------------------------------------------------- Ray Data


def cmd_ray(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import io

    import numpy as np
    import torch  # noqa: F401  (the framework iter_torch_batches hands batches to)
    t_fw = time.perf_counter()
    import ray
    from PIL import Image

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    tf = torch_transform(False)
    if a.s3:
        from pyarrow import fs

        host = a.endpoint.split("://", 1)[1]
        filesystem = fs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION,
                                     endpoint_override=host, scheme="http")
        bucket, prefix = split_s3(a.s3)
        ds = ray.data.read_binary_files(f"{bucket}/{prefix}", filesystem=filesystem, include_paths=True)
    else:
        ds = ray.data.read_binary_files(a.dir, include_paths=True)

    def transform(row: dict) -> dict:
        with Image.open(io.BytesIO(row["bytes"])) as im:
            x = tf(im.convert("RGB")).numpy()
        if a.pyfn:
            x = cutout(x)
        return {"jpg": x, "cls": class_index(label_of(row["path"]))}

    ds = ds.random_shuffle().map(transform)
    n, first, first_n = 0, None, 0
    for b in ds.iter_torch_batches(batch_size=BATCH):
        k = int(b["jpg"].shape[0])
        if first is None:
            first, first_n = time.perf_counter(), k
        n += k
    emit(n, t0, first, first_n, t_fw)
    ray.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    subs = {name: sub.add_parser(name) for name in ("stoker", "torch", "tfdata", "ray")}
    for s in subs.values():
        where = s.add_mutually_exclusive_group(required=True)
        where.add_argument("--dir")
        where.add_argument("--s3")
        s.add_argument("--endpoint")
    subs["stoker"].add_argument("--threads", type=int, default=os.cpu_count())
    subs["stoker"].add_argument("--pyfn", choices=["threads", "processes"])
    subs["stoker"].add_argument("--numpy", action="store_true", help="NumPy batches, torch not imported")
    subs["torch"].add_argument("--workers", type=int, default=2)
    for name in ("torch", "tfdata", "ray"):
        subs[name].add_argument("--pyfn", action="store_const", const="python")
    a = p.parse_args()
    {"stoker": cmd_stoker, "torch": cmd_torch, "tfdata": cmd_tfdata, "ray": cmd_ray}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
