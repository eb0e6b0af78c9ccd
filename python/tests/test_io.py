"""stoker.io.open: a seekable, read-only file over one object, for np.load, pyarrow, PIL and
torch.load."""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

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


def _image_bytes(fmt: str, mode: str) -> tuple[bytes, np.ndarray]:
    y, x = np.mgrid[0:300, 0:401]
    rgb = np.stack([x % 256, (y * 3) % 256, (x + y) % 256], -1).astype(np.uint8)
    img = Image.fromarray(rgb).convert(mode)
    out = io.BytesIO()
    img.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue(), np.asarray(img)


@pytest.mark.parametrize("fmt,mode", [("JPEG", "RGB"), ("PNG", "RGBA"), ("PNG", "L")])
def test_pil_opens_an_image_through_it(s3, prefix, fmt, mode):
    data, pixels = _image_bytes(fmt, mode)
    url = s3.put(f"{prefix}img.{fmt.lower()}", data)
    # Small parts: PIL reads the header, seeks, and reads the rest in pieces across them.
    with stoker.io.open(url, part_size="16KiB", **s3.options) as f:
        with Image.open(f) as im:
            assert im.format == fmt and im.mode == mode and im.size == (401, 300)
            got = np.asarray(im.convert(mode))
    with Image.open(io.BytesIO(data)) as ref:
        want = np.asarray(ref.convert(mode))
    np.testing.assert_array_equal(got, want)
    if fmt == "PNG":  # lossless: the pixels written
        np.testing.assert_array_equal(got, pixels)


def test_torch_load_reads_a_checkpoint_through_it(s3, prefix):
    import torch

    g = torch.Generator().manual_seed(0)
    state = {
        "weight": torch.randn(64, 33, generator=g),
        "bias": torch.arange(33, dtype=torch.int64),
        "half": torch.randn(7, generator=g).to(torch.bfloat16),
        "step": 1234,
        "nested": {"lr": 0.125, "ids": [1, 2, 3]},
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    url = s3.put(f"{prefix}ckpt.pt", buf.getvalue())
    with stoker.io.open(url, part_size="8KiB", **s3.options) as f:
        got = torch.load(f, weights_only=True)
    assert set(got) == set(state)
    for k in ("weight", "bias", "half"):
        assert got[k].dtype == state[k].dtype and got[k].shape == state[k].shape
        assert torch.equal(got[k], state[k]), k
    assert got["step"] == 1234 and got["nested"] == {"lr": 0.125, "ids": [1, 2, 3]}
    # The legacy (non-zip) format seeks differently; it loads too.
    buf = io.BytesIO()
    torch.save(state["weight"], buf, _use_new_zipfile_serialization=False)
    url = s3.put(f"{prefix}legacy.pt", buf.getvalue())
    with stoker.io.open(url, **s3.options) as f:
        assert torch.equal(torch.load(f, weights_only=True), state["weight"])


def test_ls_lists_a_level_everything_below_or_one_object(s3, prefix, tmp_path):
    s3.put(f"{prefix}ls/a.jpg", b"aa")
    s3.put(f"{prefix}ls/b.txt", b"bbb")
    s3.put(f"{prefix}ls/sub/c.jpg", b"c")
    base = f"s3://data/{prefix}ls/"
    level = stoker.io.ls(base, **s3.options)
    assert [e.get("prefix") for e in level if "prefix" in e] == [f"{prefix}ls/sub/"]
    objects = [e for e in level if "key" in e]
    assert [(e["key"], e["size"], e["url"]) for e in objects] == [
        (f"{prefix}ls/a.jpg", 2, base + "a.jpg"),
        (f"{prefix}ls/b.txt", 3, base + "b.txt"),
    ]
    assert all(e["etag"] and e["last_modified_ms"] > 0 for e in objects)
    every = stoker.io.ls(base, recursive=True, **s3.options)
    assert [e["key"] for e in every] == [f"{prefix}ls/{k}" for k in ("a.jpg", "b.txt", "sub/c.jpg")]
    jpgs = stoker.io.ls(base, glob="**/*.jpg", **s3.options)
    assert [e["url"] for e in jpgs] == [base + "a.jpg", base + "sub/c.jpg"]
    assert [e["size"] for e in stoker.io.ls(base + "b.txt", **s3.options)] == [3]
    assert stoker.io.ls(f"s3://data/{prefix}nothing/", **s3.options) == []
    # Local directories the same way.
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"xyz")
    assert [e["size"] for e in stoker.io.ls(tmp_path / "d", recursive=True)] == [3]
    with pytest.raises(FileNotFoundError):
        stoker.io.ls("s3://no-such-bucket/x/", **s3.options)
