"""JAX through DLPack (stoker.jax)."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np

import stoker
import stoker.jax as sj
from datasets import tar_shard


def test_batches_reach_jax_through_dlpack(s3, prefix):
    members = [
        {"__key__": f"{i}", "bin": np.full(8, i, dtype=np.float32).tobytes(), "cls": b"%d" % i}
        for i in range(6)
    ]
    url = s3.put(f"{prefix}a.tar", tar_shard(members))
    p = (
        stoker.from_url(url, format="tar", **s3.options)
        .map("to_tensor", field="bin", dtype="float32", shape=[2, 4])
        .map("parse_int", field="cls")
        .batch(3)
    )
    batches = list(p)
    buf = batches[0]["bin"].base
    got = sj.to_jax(batches[0])
    assert isinstance(got["bin"], jax.Array) and got["bin"].shape == (3, 2, 4)
    assert got["bin"].dtype == jnp.float32 and got["cls"].tolist() == [0, 1, 2]
    np.testing.assert_array_equal(np.asarray(got["bin"]), batches[0]["bin"])
    # A stacked batch starts on a 64-byte boundary, which XLA's CPU client needs to take
    # it without a copy (docs/python.md, JAX).
    assert buf.address % 64 == 0, buf.address % 64
    assert got["bin"].unsafe_buffer_pointer() == buf.address
    del got
    gc.collect()
    assert buf.exports == 0  # JAX let go of the export (after its copy, or with its array)


def test_every_stacked_batch_is_aligned_and_reaches_jax_without_a_copy():
    # Batches kept alive (no buffer reused), small ones from the heap and large ones that
    # glibc maps (which start 16 bytes into a page): the engine pads each so that its data
    # starts on a 64-byte boundary, and XLA's CPU client then shares every one. A tensor
    # that is not 64-byte aligned (a single sample's) is copied by XLA: the check that
    # "shared" means something.
    p = (
        stoker.from_samples([{"x": np.full(8, i, np.float32).tobytes()} for i in range(192)])
        .map("to_tensor", field="x", dtype="float32")
        .batch(3)
    )
    batches = list(p)  # 64 batches of 3 x 8 float32 (96 bytes), all alive
    large = list(
        stoker.from_samples([{"x": np.full(1 << 16, i, np.float32).tobytes()} for i in range(8)])
        .map("to_tensor", field="x", dtype="float32")
        .batch(2)
    )  # 4 batches of 512 KiB
    for k, b in enumerate(batches + large):
        buf = b["x"].base
        assert buf.exclusive  # a stacked batch: exported as it is, no copy on our side
        assert buf.address % 64 == 0, (k, buf.address % 64)
        got = sj.to_jax(b)["x"]
        assert got.shape == b["x"].shape and got.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(got), b["x"])
        assert got.unsafe_buffer_pointer() == buf.address, k
        del got
    gc.collect()
    assert all(b["x"].base.exports == 0 for b in batches + large)
    # An export 16 bytes off a 64-byte boundary is copied by XLA.
    raw = np.zeros(256, np.uint8)
    start = (-raw.ctypes.data) % 64 + 16
    off = raw[start : start + 128].view(np.float32)
    assert off.ctypes.data % 64 == 16
    assert jax.dlpack.from_dlpack(off).unsafe_buffer_pointer() != off.ctypes.data


def test_bfloat16_and_shared_memory_reach_jax():
    import ml_dtypes

    # A from_samples tensor is shared with the pipeline's samples: copied before export.
    kept = stoker.from_samples([{"x": np.arange(4, dtype=np.int32)}])  # keeps its samples
    sample = next(iter(kept))
    assert not sample["x"].base.exclusive
    got = sj.to_jax(sample)["x"]
    assert got.dtype == jnp.int32 and got.tolist() == [0, 1, 2, 3]
    assert got.unsafe_buffer_pointer() != sample["x"].base.address
    assert sample["x"].base.exports == 0
    # bfloat16 arrives as bfloat16 (NumPy sees its raw words).
    raw = np.arange(5, dtype=ml_dtypes.bfloat16).view(np.uint16).tobytes()
    p = stoker.from_samples([{"b": raw}]).map("to_tensor", field="b", dtype="bfloat16", shape=[5])
    got = sj.to_jax(next(iter(p)))["b"]
    assert got.dtype == jnp.bfloat16
    assert np.asarray(got).astype(np.float32).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
