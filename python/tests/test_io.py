"""stoker.io.open: a seekable, read-only file over one object, for np.load and pyarrow."""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import stoker
from datasets import npy


def test_np_load_reads_an_array_from_s3(s3, prefix):
    arr = np.random.default_rng(0).standard_normal((300, 257)).astype(np.float32)
    url = s3.put(f"{prefix}x.npy", npy(arr))
    with stoker.io.open(url, **s3.options) as f:
        got = np.load(f)
    np.testing.assert_array_equal(got, arr)


def test_pyarrow_reads_parquet_through_it(s3, prefix):
    table = pa.table({"a": list(range(5000)), "b": [f"v{i}" for i in range(5000)]})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=1000)
    url = s3.put(f"{prefix}t.parquet", sink.getvalue().to_pybytes())
    with stoker.io.open(url, **s3.options) as f:
        got = pq.read_table(f, columns=["b"])
    assert got.column("b").to_pylist() == [f"v{i}" for i in range(5000)]


def test_seek_tell_read_behave_like_a_local_file(s3, prefix, tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 17)
    url = s3.put(f"{prefix}blob.bin", data)
    local = tmp_path / "blob.bin"
    local.write_bytes(data)
    # Small parts so that reads cross part boundaries.
    remote = stoker.io.open(url, part_size="256KiB", **s3.options)
    with remote, open(local, "rb") as ref:
        assert isinstance(remote, io.BufferedReader)
        assert remote.seekable() and remote.readable() and not remote.writable()
        for offset, whence, n in [
            (0, 0, 10),
            (1_000_000, 0, 300_000),
            (-5, 2, 100),
            (-2_000_000, 1, 1),
            (len(data) + 10, 0, 5),
            (123, 0, -1),
        ]:
            assert remote.seek(offset, whence) == ref.seek(offset, whence)
            assert remote.read(n) == ref.read(n)
            assert remote.tell() == ref.tell()
        with pytest.raises(ValueError):
            remote.seek(-1)
    assert remote.closed
    with pytest.raises(ValueError):
        remote.read(1)
    raw = stoker.io.open(url, buffering=0, **s3.options)
    assert isinstance(raw, stoker.io.ObjectFileIO) and raw.size == len(data)
    buf = bytearray(1000)
    raw.seek(500)
    n = raw.readinto(buf)
    assert 0 < n <= 1000 and bytes(buf[:n]) == data[500 : 500 + n]
    assert raw.readall() == data[500 + n :]
    raw.close()


def test_text_mode_and_local_paths(tmp_path):
    p = tmp_path / "lines.txt"
    p.write_text("één\ntwo\n", encoding="utf-8")
    with stoker.io.open(str(p), "r", encoding="utf-8") as f:
        assert f.readlines() == ["één\n", "two\n"]
    with stoker.io.open(p.as_uri()) as f:
        assert f.read() == p.read_bytes()
    with pytest.raises(ValueError, match="reads only"):
        stoker.io.open(str(p), "wb")


def test_a_missing_object_is_file_not_found(s3, prefix):
    url = f"s3://data/{prefix}nope.npy"
    with pytest.raises(FileNotFoundError, match=url.replace(".", r"\.")) as e:
        stoker.io.open(url, **s3.options)
    assert e.value.object == url
