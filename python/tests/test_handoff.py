"""stoker.handoff: large arrays through shared segments, worker side and consumer side in one
process (a process can map its own /proc/self/fd entries as a consumer maps a worker's)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from stoker import handoff

pytestmark = pytest.mark.skipif(not handoff.available(), reason="needs Linux memfd")


def _batch(i: int, n: int = 64) -> dict:
    return {
        "x": np.full((n, 3, 64, 64), i, dtype=np.float32) + np.arange(64, dtype=np.float32),
        "label": np.arange(n, dtype=np.int64) + i,  # small: stays in the item
        "name": f"batch {i}",
    }


def test_large_arrays_arrive_equal_writable_and_their_segment_is_reused_once_released():
    pool, maps = handoff.Pool(), handoff.Maps()
    try:
        assert maps.check(pool.probe())
        b = _batch(1)
        packed = pool.pack(b)
        assert set(packed["x"]) == {handoff.KEY}
        assert packed["label"] is b["label"] and packed["name"] == "batch 1"
        got = maps.unpack(packed)
        np.testing.assert_array_equal(got["x"], b["x"])
        assert got["x"].flags.writeable and got["x"].dtype == np.float32
        assert got is packed  # the item is unpacked in place (it is the consumer's)
        seg = got["x"].base
        # While the consumer holds the array the worker takes another segment.
        got2 = maps.unpack(pool.pack(_batch(2)))
        assert got2["x"].base is not seg
        assert len(pool._segments) == 2
        np.testing.assert_array_equal(got["x"], _batch(1)["x"])  # not overwritten
        # Released (every view gone), the first segment takes the next batch.
        view = got["x"][3:5]
        del got, packed, seg
        gc.collect()
        assert pool._segments[0].mm[0] == handoff.BUSY  # a view still holds it
        del view
        gc.collect()
        assert pool._segments[0].mm[0] == handoff.FREE
        got3 = maps.unpack(pool.pack(_batch(3)))
        np.testing.assert_array_equal(got3["x"], _batch(3)["x"])
        assert len(pool._segments) == 2 and pool.sent == 3
    finally:
        maps.close()
        pool.close()


def test_when_every_segment_is_held_arrays_travel_as_they_are():
    pool, maps = handoff.Pool(), handoff.Maps()
    kept = []
    try:
        for i in range(handoff.MAX_SEGMENTS + 3):
            kept.append(maps.unpack(pool.pack(_batch(i, n=32))))
        assert len(pool._segments) == handoff.MAX_SEGMENTS
        assert pool.fallback == 3 and pool.sent == handoff.MAX_SEGMENTS
        for i, b in enumerate(kept):
            np.testing.assert_array_equal(b["x"], _batch(i, n=32)["x"])
        # A batch of another size, once segments are free, replaces the free ones.
        kept.clear()
        gc.collect()
        got = maps.unpack(pool.pack(_batch(0, n=200)))
        np.testing.assert_array_equal(got["x"], _batch(0, n=200)["x"])
        assert len(pool._segments) == 1
    finally:
        maps.close()
        pool.close()


def test_a_reference_to_a_segment_that_is_not_the_worker_s_is_refused():
    pool, maps = handoff.Pool(), handoff.Maps()
    try:
        packed = pool.pack(_batch(1))
        pid, fd, token, dtype, shape, size = packed["x"][handoff.KEY]
        packed["x"][handoff.KEY] = (pid, fd, "00" * 8, dtype, shape, size)
        with pytest.raises(OSError, match="not the worker's segment"):
            maps.unpack(packed)
        assert not maps.check({"pid": os.getpid(), "fd": fd, "token": "11" * 8})
        # A process that does not exist (a worker that died): refused too.
        with pytest.raises(OSError):
            maps.unpack({"x": {handoff.KEY: (2**22 + 12345, fd, token, dtype, shape, size)}})
    finally:
        maps.close()
        pool.close()
