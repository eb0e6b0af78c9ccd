"""Python functions after a sequential stage: on whole batches (``.batch(n).map(fn)``,
``map_batches``) and on samples after a shuffle buffer, in threads and processes mode,
against the S3 test server: NumPy columns, results equal to a serial reference in order,
several calls at once, resume from ``state_dict()``, exceptions with traceback and the
batch's origin."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import stoker
from datasets import MODES, norm, workers, write_shards


def pipeline(s3, prefix: str, shards: int = 3, per: int = 12) -> stoker.Pipeline:
    return (
        stoker.from_url(write_shards(s3, prefix, shards, per), format="tar", **s3.options)
        .map("to_tensor", field="bin", dtype="float32")
        .map("decode_utf8", field="txt")
    )


# Module-level functions (worker processes import them by reference) --------------------


def double_and_count(batch):
    """Columns in, columns out: what a serial reference computes below."""
    return {
        "__key__": batch["__key__"],
        "bin": batch["bin"] * 2,
        "total": batch["bin"].sum(axis=1),
        "n": np.array([len(t) for t in batch["txt"]], dtype=np.int64),
        # What the columns are: read-only NumPy arrays.
        "kinds": [f"{type(batch['bin']).__name__}/{batch['bin'].flags.writeable}"] * len(batch["txt"]),
    }


def reference(batch):
    """The same, from the batch the plain pipeline yields."""
    return {
        "__key__": batch["__key__"],
        "bin": np.asarray(batch["bin"]) * 2,
        "total": np.asarray(batch["bin"]).sum(axis=1),
        "n": np.array([len(t) for t in batch["txt"]], dtype=np.int64),
        "kinds": ["ndarray/False"] * len(batch["txt"]),
    }


def slow_pid(batch):
    """Sleeps (GIL released) and says which process ran it."""
    time.sleep(0.03)
    return {**batch, "pid": [os.getpid()] * len(batch["__key__"])}


def slow_sample(sample):
    time.sleep(0.01)
    return {**sample, "pid": os.getpid()}


def jittered(batch, rng):
    time.sleep(float(rng.uniform(0, 0.01)))
    return {**batch, "noise": rng.normal(size=batch["bin"].shape).astype(np.float32)}


def boom_on_batch(batch):
    if "1-005" in batch["__key__"]:
        raise ValueError("boom on a batch")
    return batch


def drop_odd_first(batch):
    return None if int(batch["bin"][0, 0]) % 2 else batch


def first_even(batch):
    return int(batch["bin"][0, 0]) % 2 == 0


def wrong_rows(batch):
    return {"x": np.zeros(len(batch["x"]) + 1)}


def scalar_column(batch):
    return {"x": 5}


class Overlap:
    """Counts calls under way at once (threads mode: the calls share this process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __call__(self, batch):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.02)  # releases the GIL, as NumPy on large arrays does
        with self.lock:
            self.now -= 1
        return batch


# Batches ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_function_on_batches_gets_numpy_columns_and_equals_a_serial_reference(s3, prefix, mode):
    base = pipeline(s3, prefix).shuffle_shards().shuffle(7).batch(5).seed(3).options(threads=2)
    want = [norm(reference(b)) for b in base]
    got = [norm(b) for b in base.map(double_and_count, **workers(mode))]
    assert len(got) == 8  # 36 samples in batches of 5
    assert got == want


def test_columns_reach_a_function_on_threads_without_a_copy(s3, prefix):
    base = pipeline(s3, prefix, shards=1).batch(4)
    seen = []

    def look(batch):
        seen.append((batch["bin"].base, batch["bin"].__array_interface__["data"][0]))
        return batch

    out = list(base.map(look, workers="threads"))
    assert len(seen) == 3
    # The engine's own stacked buffer (a stoker.Buffer), passed back unchanged: the batch
    # that comes out is the same memory. The threads call the function in the order they
    # finish, not in output order, so the addresses are compared as a set (all three batches
    # are alive in `out`, so no address can be reused).
    assert all(isinstance(owner, stoker.Buffer) for owner, _ in seen)
    assert sorted(at for _, at in seen) == sorted(b["bin"].__array_interface__["data"][0] for b in out)


@pytest.mark.parametrize("mode", MODES)
def test_map_batches_is_batch_then_map(s3, prefix, mode):
    base = pipeline(s3, prefix).seed(1)
    a = base.map_batches(double_and_count, 4, drop_last=True, **workers(mode))
    b = base.batch(4, drop_last=True).map(double_and_count, **workers(mode))
    assert a.explain() == b.explain()
    assert [norm(x) for x in a] == [norm(x) for x in b]
    assert len(list(a)) == 9


@pytest.mark.parametrize("mode", MODES)
def test_batch_functions_run_in_parallel_in_order(s3, prefix, mode):
    p = pipeline(s3, prefix).shuffle_shards().batch(3).seed(8).options(threads=3)
    one = [norm({k: v for k, v in b.items() if k != "pid"}) for b in p.options(threads=1).map(slow_pid, **workers(mode))]
    out = list(p.map(slow_pid, **workers(mode)))
    assert [norm({k: v for k, v in b.items() if k != "pid"}) for b in out] == one
    assert [norm(b) for b in p] == one  # slow_pid changes nothing else
    pids = {pid for b in out for pid in b["pid"]}
    if mode == "processes":
        # Several worker processes served the batches: calls overlapped.
        assert len(pids) >= 2, pids
    else:
        assert pids == {os.getpid()}


def test_batch_functions_on_threads_overlap():
    p = stoker.from_samples([{"x": i} for i in range(60)]).shuffle(8).batch(2).options(threads=3, autotune=False)
    f = Overlap()
    assert len(list(p.map(f, workers="threads"))) == 30
    assert 2 <= f.most <= 3, f.most


@pytest.mark.parametrize("mode", MODES)
def test_a_seeded_function_on_batches_draws_the_same_whatever_runs_it(s3, prefix, mode):
    p = pipeline(s3, prefix).shuffle(6).batch(4).seed(5)
    one = [norm(b) for b in p.options(threads=1).map(jittered, seeded=True, workers="threads")]
    got = [norm(b) for b in p.options(threads=3).map(jittered, seeded=True, **workers(mode))]
    assert got == one


@pytest.mark.parametrize("mode", MODES)
def test_resume_mid_epoch_is_exact_with_a_function_on_batches(s3, prefix, mode):
    p = (
        pipeline(s3, prefix)
        .shuffle_shards()
        .interleave(2)
        .shuffle(5)
        .batch(4)
        .map(jittered, seeded=True, **workers(mode))
        .shuffle(3)
        .epochs(2)
        .seed(11)
        .options(threads=3)
    )
    full = [norm(b) for b in p]
    assert len(full) == 18
    for stop in (0, 1, 5, 9, 13, 17):
        run = p.run()
        head = [norm(next(run)) for _ in range(stop)]
        state = run.state_dict()
        del run
        rest = [norm(b) for b in p.resume(state)]
        assert head + rest == full, stop


@pytest.mark.parametrize("mode", MODES)
def test_an_exception_on_a_batch_has_the_traceback_and_the_batch_s_origin(s3, prefix, mode):
    url = write_shards(s3, prefix, per=10)
    p = (
        stoker.from_url(url, format="tar", **s3.options)
        .map("to_tensor", field="bin", dtype="float32")
        .batch(4)
        .map(boom_on_batch, **workers(mode))
    )
    with pytest.raises(stoker.DataError) as e:
        list(p)
    msg = str(e.value)
    assert "Traceback (most recent call last)" in msg and "ValueError: boom on a batch" in msg
    assert "boom_on_batch" in e.value.stage and e.value.kind == "operator"
    # Samples 12..15 (1-002 .. 1-005): the batch's first sample is shard 1, record 2.
    assert e.value.object == f"{url}shard-1.tar" and e.value.record == 2
    assert "on a batch of 4 samples" in msg
    run = p.options(errors="skip").run()
    assert len(list(run)) == 7
    assert run.stats()["skipped"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_none_drops_a_batch_and_filter_keeps_the_true_ones(s3, prefix, mode):
    p = pipeline(s3, prefix).batch(3)
    kept = [norm(b) for b in p if int(b["bin"][0, 0]) % 2 == 0]
    assert 0 < len(kept) < 12
    assert [norm(b) for b in p.map(drop_odd_first, **workers(mode))] == kept
    assert [norm(b) for b in p.filter(first_even, **workers(mode))] == kept


@pytest.mark.parametrize("mode", MODES)
def test_a_result_must_keep_the_batch_s_rows(mode):
    p = stoker.from_samples([{"x": i} for i in range(4)]).batch(2)
    with pytest.raises(stoker.DataError, match="must hold 2 rows") as e:
        list(p.map(wrong_rows, **workers(mode)))
    assert "wrong_rows" in str(e.value)
    with pytest.raises(stoker.DataError, match="must hold 2 rows"):
        list(p.map(scalar_column, **workers(mode)))


def test_explain_shows_the_parallel_stage_after_the_batch():
    p = stoker.from_samples([{"x": 1}]).shuffle(4).batch(2).map(double_and_count, processes=2)
    plan = p.explain()
    assert "  batch(2)\n  workers: map[py_map(double_and_count, processes=2)] (in order)\n" in plan
    assert "runs on the workers too" in plan


# Samples after a shuffle buffer -------------------------------------------------------------


def test_a_function_after_a_shuffle_runs_in_several_processes_in_order(s3, prefix):
    p = pipeline(s3, prefix).shuffle(10).seed(2).options(threads=2)
    plain = [norm(s) for s in p]
    out = list(p.map(slow_sample, processes=2))
    assert [norm({k: v for k, v in s.items() if k != "pid"}) for s in out] == plain
    assert len({s["pid"] for s in out}) == 2
    assert "  shuffle(10)\n  workers: map[py_map(slow_sample, processes=2)] (in order)\n" in p.map(
        slow_sample, processes=2
    ).explain()
