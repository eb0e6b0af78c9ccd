"""Small writers of the formats Stoker reads, for the tests: WebDataset tar (the tarfile
module, as webdataset's TarWriter writes), TFRecord framing (with CRC32C), JSONL, CSV and
NumPy arrays. Parquet is written by pyarrow in the tests themselves."""

from __future__ import annotations

import io
import json
import struct
import tarfile
from collections.abc import Iterable, Mapping

import numpy as np

FIXTURES = __import__("pathlib").Path(__file__).resolve().parents[2] / (
    "crates/stoker-formats/tests/fixtures"
)


def tar_shard(samples: Iterable[Mapping[str, bytes]]) -> bytes:
    """A WebDataset shard: each sample's fields as members ``KEY.FIELD``, in order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for s in samples:
            key = s["__key__"]
            for field, data in s.items():
                if field == "__key__":
                    continue
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = len(data)
                info.mtime = 1700000000
                tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(records: Iterable[bytes]) -> bytes:
    """TFRecord framing: length, masked CRC of the length, data, masked CRC of the data."""
    out = bytearray()
    for r in records:
        length = struct.pack("<Q", len(r))
        out += length + struct.pack("<I", masked_crc(length)) + r
        out += struct.pack("<I", masked_crc(r))
    return bytes(out)


def jsonl(rows: Iterable[object]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def npy(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, arr)
    return out.getvalue()


# Shared by the tests of Python functions (test_pymap.py, test_pybatch.py) ------------------

MODES = ["threads", "processes"]


def workers(mode: str) -> dict[str, object]:
    """The `map` arguments that run a function in `mode` (processes: a pool of 2)."""
    return {"workers": "processes", "processes": 2} if mode == "processes" else {"workers": "threads"}


def norm(v: object) -> object:
    """A value in a comparable form (memoryviews as bytes, arrays as dtype, shape, bytes)."""
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items()}
    if isinstance(v, (memoryview, bytes, bytearray)):
        return ("bytes", bytes(v))
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, list):
        return [norm(x) for x in v]
    return v


def write_shards(s3, prefix: str, shards: int = 3, per: int = 10) -> str:
    """`shards` tar shards of `per` samples (`txt`, and `bin`: 16 float32) on the S3 test
    server under `prefix`; returns their prefix URL."""
    for k in range(shards):
        data = tar_shard(
            {
                "__key__": f"{k}-{i:03d}",
                "txt": f"text {k} {i} {'x' * i}".encode(),
                "bin": (np.arange(16, dtype=np.float32) + 100 * k + i).tobytes(),
            }
            for i in range(per)
        )
        s3.put(f"{prefix}shard-{k}.tar", data)
    return f"s3://data/{prefix}"
