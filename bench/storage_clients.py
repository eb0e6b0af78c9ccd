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
    python storage_clients.py s3torch-small --endpoint URL --bucket B --prefix P [--threads 32]
    python storage_clients.py s3torch-large --endpoint URL --bucket B --key K
    python storage_clients.py fs-small      --dir DIR [--threads 16]
    python storage_clients.py fs-large      --file FILE [--buffer BYTES]

Credentials and region come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
AWS_REGION in the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from concurrent.futures import ThreadPoolExecutor

MIB = 1024 * 1024


def _cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _Timer:
    """Marks the start of the timed part and reports at the end."""

    def __init__(self) -> None:
        self.startup_cpu_s = 0.0
        self.t0 = 0.0

    def start(self) -> None:
        self.startup_cpu_s = _cpu_self()
        self.t0 = time.perf_counter()

    def report(self, objects: int, nbytes: int, **extra) -> None:
        seconds = time.perf_counter() - self.t0
        out = {
            "objects": objects,
            "bytes": nbytes,
            "seconds": seconds,
            "startup_cpu_s": self.startup_cpu_s,
            "phase_cpu_s": _cpu_self() - self.startup_cpu_s,
        }
        out.update(extra)
        print(json.dumps(out), flush=True)


def _region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def _ranges(size: int, part: int) -> list[tuple[int, int]]:
    """Inclusive byte ranges covering [0, size) in `part`-sized pieces."""
    return [(s, min(s + part, size) - 1) for s in range(0, size, part)]


# ---------------------------------------------------------------- boto3


def _boto3_client(endpoint: str, pool: int):
    import boto3
    from botocore.config import Config

    cfg = Config(
        max_pool_connections=pool,
        s3={"addressing_style": "path"},
        retries={"max_attempts": 3, "mode": "standard"},
        region_name=_region(),
        signature_version="s3v4",
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=cfg)


def boto3_small(a) -> None:
    client = _boto3_client(a.endpoint, a.threads)
    timer = _Timer()
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
    timer = _Timer()
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
# s3torchconnector's S3Client is a thin Python layer (it needs torch for its
# datasets) over s3torchconnectorclient's MountpointS3Client, the Rust/CRT
# client that does the I/O. We use S3Client when s3torchconnector (and so
# torch) is installed, and otherwise the same MountpointS3Client with the same
# settings S3Client would pass (8 MiB parts, 10 Gbps throughput target).


def _s3torch_client(endpoint: str):
    try:
        from s3torchconnector import S3Client, S3ClientConfig  # needs torch

        client = S3Client(_region(), endpoint=endpoint, s3client_config=S3ClientConfig(force_path_style=True))

        def get_stream(bucket, key, start=None, end=None):
            return client._get_object_stream(bucket, key, start, end)

        def list_stream(bucket, prefix):
            return client.list_objects(bucket, prefix)

        import s3torchconnector

        return get_stream, list_stream, f"s3torchconnector.S3Client {s3torchconnector.__version__}"
    except ImportError:
        import s3torchconnectorclient
        from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

        native = MountpointS3Client(
            _region(),
            endpoint=endpoint,
            force_path_style=True,
            throughput_target_gbps=10.0,
            part_size=8 * MIB,
        )

        def get_stream(bucket, key, start=None, end=None):
            return native.get_object(bucket, key, start, end)

        def list_stream(bucket, prefix):
            return native.list_objects(bucket, prefix)

        return get_stream, list_stream, f"s3torchconnectorclient.MountpointS3Client {s3torchconnectorclient.__version__}"


def s3torch_small(a) -> None:
    get_stream, list_stream, api = _s3torch_client(a.endpoint)
    timer = _Timer()
    timer.start()
    keys = [info.key for page in list_stream(a.bucket, a.prefix) for info in page.object_info]

    def get(key: str) -> int:
        return sum(len(chunk) for chunk in get_stream(a.bucket, key))

    with ThreadPoolExecutor(a.threads) as pool:
        total = sum(pool.map(get, keys))
    timer.report(len(keys), total, threads=a.threads, api=api)


def s3torch_large(a) -> None:
    get_stream, _list, api = _s3torch_client(a.endpoint)
    timer = _Timer()
    timer.start()
    # One sequential GET of the whole object, as the connector's default
    # (sequential) reader does; the CRT splits it into concurrent 8 MiB parts.
    total = sum(len(chunk) for chunk in get_stream(a.bucket, a.key))
    timer.report(1, total, api=api)


# ---------------------------------------------------------------- file system (FUSE mount)


def fs_small(a) -> None:
    timer = _Timer()
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
    timer = _Timer()
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
    a = p.parse_args(argv)
    PROGRAMS[a.program](a)


if __name__ == "__main__":
    main()
