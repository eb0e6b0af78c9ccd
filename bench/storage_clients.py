"""Client programs that bench/storage.py runs, one per child process.

Each program reads one workload and prints one JSON line on stdout:

    {"objects": N, "bytes": B, "seconds": S, "startup_cpu_s": C, ...}

`seconds` is measured inside the program from the first request (listing
included) to the last byte, so interpreter start-up and imports are not
counted; `startup_cpu_s` is the CPU the process had used when the timed part
began, so the harness can subtract it from the process's total CPU.

Usage (run with the venv's python for boto3/s3torch, any python3 for fs-*):

    python storage_clients.py boto3-small   --endpoint URL --bucket B --prefix P [--threads 32]
    python storage_clients.py boto3-large   --endpoint URL --bucket B --key K [--threads 16] [--part-size BYTES]
    python storage_clients.py s3torch-small --endpoint URL --bucket B --prefix P [--threads 32] [--api dataset|client]
    python storage_clients.py s3torch-large --endpoint URL --bucket B --key K [--api dataset|client]
    python storage_clients.py fs-small      --dir DIR [--threads 16]
    python storage_clients.py fs-large      --file FILE [--buffer BYTES]

Credentials and region come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
AWS_REGION in the environment.
"""

from __future__ import annotations

import argparse
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import harness as H  # bench/harness.py (bench/ is on sys.path: this file is run as a script)
from harness import MIB


def _region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def _ranges(size: int, part: int) -> list[tuple[int, int]]:
    """Inclusive byte ranges covering [0, size) in `part`-sized pieces."""
    return [(s, min(s + part, size) - 1) for s in range(0, size, part)]


# ---------------------------------------------------------------- boto3


def _boto3_client(endpoint: str, pool: int):
    # Credentials from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
    return H.boto3_client(endpoint, pool, keys=False, region=_region(), s3={"addressing_style": "path"},
                          retries={"max_attempts": 3, "mode": "standard"}, signature_version="s3v4")


def boto3_small(a) -> None:
    client = _boto3_client(a.endpoint, a.threads)
    timer = H.Timer()
    timer.start()
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=a.bucket, Prefix=a.prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []))

    def get(key: str) -> int:
        body = client.get_object(Bucket=a.bucket, Key=key)["Body"]
        n = 0
        while True:
            chunk = body.read(1 << 20)
            if not chunk:
                return n
            n += len(chunk)

    with ThreadPoolExecutor(a.threads) as pool:
        total = sum(pool.map(get, keys))
    timer.report(len(keys), total, threads=a.threads)


def boto3_large(a) -> None:
    client = _boto3_client(a.endpoint, a.threads)
    timer = H.Timer()
    timer.start()
    size = client.head_object(Bucket=a.bucket, Key=a.key)["ContentLength"]

    def get(rng: tuple[int, int]) -> int:
        resp = client.get_object(Bucket=a.bucket, Key=a.key, Range=f"bytes={rng[0]}-{rng[1]}")
        data = resp["Body"].read()
        if len(data) != rng[1] - rng[0] + 1:
            raise RuntimeError(f"range {rng}: got {len(data)} bytes")
        return len(data)

    with ThreadPoolExecutor(a.threads) as pool:
        total = sum(pool.map(get, _ranges(size, a.part_size)))
    timer.report(1, total, threads=a.threads, part_size=a.part_size)


# ---------------------------------------------------------------- s3torchconnector
#
# The s3torchconnector package (it needs torch) is a Python layer over
# s3torchconnectorclient's MountpointS3Client, the Rust/AWS CRT client that does
# the I/O. --api dataset (default) reads through the package's public
# S3MapDataset (from_prefix / from_objects) with the default sequential S3Reader,
# items fetched by a thread pool; --api client drives MountpointS3Client directly
# with the settings the connector passes (8 MiB parts, 10 Gbps throughput target,
# path style), without torch.


def _drain(reader, buf: memoryview) -> int:
    n = 0
    while True:
        k = reader.readinto(buf)
        if not k:
            return n
        n += k


def _s3torch_dataset(a, uri: str, is_prefix: bool, timer: H.Timer, buf_size: int):
    """(number of items, read(i) -> bytes read, api name).

    Imports and client construction happen before timer.start(); the listing after.
    """
    if a.api == "dataset":
        try:
            import s3torchconnector  # needs torch
            from s3torchconnector import S3ClientConfig, S3MapDataset
        except ImportError as e:
            raise SystemExit(f"s3torchconnector unavailable ({e}): run bench/setup.sh without NO_TORCH=1")

        cfg = S3ClientConfig(force_path_style=True)
        make = S3MapDataset.from_prefix if is_prefix else S3MapDataset.from_objects
        ds = make(uri, region=_region(), endpoint=a.endpoint, s3client_config=cfg)
        ds._get_client()  # build the client outside the timed part, like the other clients
        timer.start()
        n = len(ds)  # lists the prefix once (from_objects: no request)
        local = threading.local()

        def read(i: int) -> int:
            buf = getattr(local, "buf", None)
            if buf is None:
                buf = local.buf = memoryview(bytearray(buf_size))
            return _drain(ds[i], buf)

        return n, read, f"s3torchconnector.S3MapDataset {s3torchconnector.__version__}"

    import s3torchconnectorclient
    from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

    native = MountpointS3Client(
        _region(), endpoint=a.endpoint, force_path_style=True, throughput_target_gbps=10.0, part_size=8 * MIB
    )
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    timer.start()
    if is_prefix:
        keys = [i.key for page in native.list_objects(bucket, key) for i in page.object_info]
    else:
        keys = [key]

    def read(i: int) -> int:
        return sum(len(chunk) for chunk in native.get_object(bucket, keys[i]))

    return len(keys), read, f"s3torchconnectorclient.MountpointS3Client {s3torchconnectorclient.__version__}"


def s3torch_small(a) -> None:
    timer = H.Timer()
    n, read, api = _s3torch_dataset(a, f"s3://{a.bucket}/{a.prefix}", True, timer, MIB)
    with ThreadPoolExecutor(a.threads) as pool:
        total = sum(pool.map(read, range(n)))
    timer.report(n, total, threads=a.threads, api=api)


def s3torch_large(a) -> None:
    timer = H.Timer()
    # One sequential GET of the whole object (the connector's default reader); the
    # CRT splits it into concurrent 8 MiB parts.
    _n, read, api = _s3torch_dataset(a, f"s3://{a.bucket}/{a.key}", False, timer, a.buffer)
    total = read(0)
    timer.report(1, total, api=api)


# ---------------------------------------------------------------- file system (FUSE mount)


def fs_small(a) -> None:
    timer = H.Timer()
    timer.start()
    paths = sorted(e.path for e in os.scandir(a.dir) if e.is_file())

    def read(path: str) -> int:
        n = 0
        with open(path, "rb", buffering=0) as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    return n
                n += len(chunk)

    with ThreadPoolExecutor(a.threads) as pool:
        total = sum(pool.map(read, paths))
    timer.report(len(paths), total, threads=a.threads)


def fs_large(a) -> None:
    timer = H.Timer()
    timer.start()
    buf = bytearray(a.buffer)
    view = memoryview(buf)
    total = 0
    with open(a.file, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                break
            total += n
    timer.report(1, total, buffer=a.buffer)


# ---------------------------------------------------------------- main

PROGRAMS = {
    "boto3-small": boto3_small,
    "boto3-large": boto3_large,
    "s3torch-small": s3torch_small,
    "s3torch-large": s3torch_large,
    "fs-small": fs_small,
    "fs-large": fs_large,
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("program", choices=sorted(PROGRAMS))
    p.add_argument("--endpoint")
    p.add_argument("--bucket")
    p.add_argument("--prefix", default="")
    p.add_argument("--key")
    p.add_argument("--dir")
    p.add_argument("--file")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--part-size", type=int, default=8 * MIB)
    p.add_argument("--buffer", type=int, default=16 * MIB)
    p.add_argument("--api", choices=["dataset", "client"], default="dataset", help="s3torch-*: which layer")
    a = p.parse_args(argv)
    PROGRAMS[a.program](a)


if __name__ == "__main__":
    main()
