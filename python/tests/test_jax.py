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
    if buf.address % 64 == 0:  # XLA's CPU client shares only 64-byte aligned memory
        assert got["bin"].unsafe_buffer_pointer() == buf.address
    del got
    gc.collect()
    assert buf.exports == 0  # JAX let go of the export (after its copy, or with its array)


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
