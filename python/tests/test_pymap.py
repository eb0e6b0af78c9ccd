"""Python functions as operators: ``Pipeline.map(fn)`` / ``.filter(fn)`` on the engine's
threads and in worker processes (shared memory), against the S3 test server: value
round-trips, equality with native pipelines, drops, errors with traceback and origin, a
worker that dies, no leaked processes or shared memory, resume and pickling."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import stoker
from datasets import MODES, norm, tar_shard, workers, write_shards


def tar_pipeline(s3, prefix: str, **kw) -> stoker.Pipeline:
    return (
        stoker.from_url(write_shards(s3, prefix, **kw), format="tar", **s3.options)
        .map("to_tensor", field="bin", dtype="float32")
    )


# Module-level functions (worker processes import them by reference) --------------------


def identity(s):
    return s


def text_and_length(s):
    """What the native ``len`` + ``decode_utf8`` do, and an array op."""
    out = dict(s)
    out["n"] = len(s["txt"])
    out["txt"] = bytes(s["txt"]).decode("utf-8")
    out["bin"] = s["bin"] * 2
    return out


def odd_dropped(s):
    return None if int(s["bin"][0]) % 2 else s


def even(s):
    return int(s["bin"][0]) % 2 == 0


def every_output_type(s):
    return {
        "bytearray": bytearray(b"ba"),
        "memoryview": memoryview(b"mv"),
        "bytes": b"by",
        "bool": True,
        "tuple": (1, "two", b"3"),
        "scalar": np.float32(1.5),
        "f16": np.ones((2, 2), dtype=np.float16),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
        "none": None,
    }


def returns_object(s):
    return {"x": object()}


def returns_list(s):
    return [1, 2]


def boom(s):
    if s["__key__"] == "0-003":
        raise ValueError("boom on purpose")
    return s


def dies(s):
    if s["__key__"] == "0-005":
        os.kill(os.getpid(), signal.SIGKILL)
    return s


def with_pid(s):
    return {**s, "pid": os.getpid()}


def with_addresses(s):
    return {
        **s,
        "x_at": s["x"].__array_interface__["data"][0],
        "b_at": np.frombuffer(s["b"], dtype=np.uint8).__array_interface__["data"][0],
        "part": s["x"][1:],
    }


def plus_one(s):
    return {"big": s["big"] + 1, "same": s["big"]}


# Values -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_every_value_type_round_trips_unchanged(mode):
    sample = {
        "bytes": b"\x00\x01\xff",
        "empty": b"",
        "str": "héllo",
        "int": -(2**62),
        "float": 2.5,
        "none": None,
        "list": [1, "a", b"x", [2.0, None]],
        "u8": np.arange(5, dtype=np.uint8),
        "i16": np.arange(6, dtype=np.int16).reshape(2, 3),
        "i32": np.arange(4, dtype=np.int32),
        "i64": np.arange(4, dtype=np.int64) - 2,
        "f16": np.ones(3, dtype=np.float16),
        "f32": np.linspace(0, 1, 7, dtype=np.float32),
        "f64": np.array(np.pi),
        "zero": np.zeros((0, 3), dtype=np.float32),
    }
    p = stoker.from_samples([sample, {**sample, "int": 7}])
    plain = [norm(s) for s in p]
    mapped = [norm(s) for s in p.map(identity, **workers(mode))]
    assert mapped == plain
    # The function sees what the iterator yields.
    assert isinstance(next(iter(p))["bytes"], memoryview)


@pytest.mark.parametrize("mode", MODES)
def test_returned_values_become_sample_fields(mode):
    (out,) = list(stoker.from_samples([{"x": 1}]).map(every_output_type, **workers(mode)))
    assert bytes(out["bytearray"]) == b"ba" and bytes(out["memoryview"]) == b"mv"
    assert bytes(out["bytes"]) == b"by"
    assert out["bool"] == 1
    assert out["tuple"][:2] == [1, "two"] and bytes(out["tuple"][2]) == b"3"
    assert out["scalar"].shape == () and float(out["scalar"]) == 1.5
    assert out["f16"].dtype == np.float16 and out["f16"].shape == (2, 2)
    np.testing.assert_array_equal(out["fortran"], np.arange(6, dtype=np.int32).reshape(2, 3))
    assert out["none"] is None


@pytest.mark.parametrize("mode", MODES)
def test_an_unsupported_result_names_the_field_and_the_type(mode):
    p = stoker.from_samples([{"x": 1}])
    with pytest.raises(stoker.DataError, match=r"field ['\"]x['\"].*object") as e:
        list(p.map(returns_object, **workers(mode)))
    assert "returns_object" in str(e.value)
    with pytest.raises(stoker.DataError, match="returned a list|not list"):
        list(p.map(returns_list, **workers(mode)))


def address(v) -> int:
    return np.frombuffer(v, dtype=np.uint8).__array_interface__["data"][0]


@pytest.mark.parametrize("mode", MODES)
def test_fields_passed_through_unchanged_are_not_copied(mode):
    # from_samples keeps its tensors and bytes, so every run hands out the same memory.
    p = stoker.from_samples([{"x": np.arange(8, dtype=np.float32), "b": b"abcdef"}])
    (plain,) = list(p)
    (out,) = list(p.map(with_addresses, **workers(mode)))
    assert address(out["x"]) == address(plain["x"])
    assert address(out["b"]) == address(plain["b"])
    if mode == "threads":
        assert out["x_at"] == address(plain["x"]) and out["b_at"] == address(plain["b"])
    # A part of an array is a new tensor of its own.
    np.testing.assert_array_equal(out["part"], np.arange(1, 8, dtype=np.float32))
    assert address(out["part"]) != address(plain["x"]) + 4


# Equality with native pipelines, drops, filters -----------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_output_equals_the_native_equivalent_in_order(s3, prefix, mode):
    base = tar_pipeline(s3, prefix).shuffle_shards().interleave(2).seed(5)
    native = [
        {**norm(s), "bin": norm(np.asarray(s["bin"]) * 2)}
        for s in base.map("len", field="txt", to="n").map("decode_utf8", field="txt")
    ]
    python = [norm(s) for s in base.map(text_and_length, **workers(mode))]
    assert len(python) == 30
    assert python == native


@pytest.mark.parametrize("mode", MODES)
def test_none_drops_a_sample_and_filter_keeps_the_true_ones(s3, prefix, mode):
    p = tar_pipeline(s3, prefix)
    kept = [int(s["bin"][0]) for s in p.map(odd_dropped, **workers(mode))]
    assert kept == [int(s["bin"][0]) for s in p if int(s["bin"][0]) % 2 == 0]
    assert kept and all(v % 2 == 0 for v in kept)
    assert [int(s["bin"][0]) for s in p.filter(even, **workers(mode))] == kept


@pytest.mark.parametrize("mode", MODES)
def test_explain_names_the_python_stage(mode):
    p = stoker.from_samples([{"x": 1}]).map(identity, **workers(mode))
    expected = "py_map(identity, processes=2)" if mode == "processes" else "py_map(identity, threads)"
    assert expected in p.explain()
    assert "py_filter(even" in p.filter(even, **workers(mode)).explain()


def slow_pid(s):
    time.sleep(0.1)
    return {**s, "pid": os.getpid()}


def test_processes_default_to_the_run_threads_whenever_they_are_set():
    # The pool's size is decided when the run starts, by the run's engine threads: set
    # before or after the map, 4 threads on this 2-core machine make up to 4 workers.
    samples = [{"x": i} for i in range(16)]
    after = stoker.from_samples(samples).map(slow_pid, workers="processes").options(threads=4)
    assert "py_map(slow_pid, processes=auto)" in after.explain()
    before = stoker.from_samples(samples).options(threads=4).map(slow_pid, workers="processes")
    for p in (after, before):
        out = list(p)
        assert [s["x"] for s in out] == list(range(16))
        assert 2 < len({s["pid"] for s in out}) <= 4
    # An explicit count is kept whatever the threads.
    fixed = stoker.from_samples(samples).map(slow_pid, processes=1).options(threads=4)
    assert "py_map(slow_pid, processes=1)" in fixed.explain()
    assert len({s["pid"] for s in fixed}) == 1


# Errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_an_exception_is_a_data_error_with_traceback_and_origin(s3, prefix, mode):
    url = write_shards(s3, prefix, shards=1)
    p = stoker.from_url(url, format="tar", **s3.options).map(boom, **workers(mode))
    with pytest.raises(stoker.DataError) as e:
        list(p)
    msg = str(e.value)
    assert "Traceback (most recent call last)" in msg
    assert 'raise ValueError("boom on purpose")' in msg and "ValueError: boom on purpose" in msg
    assert "boom" in e.value.stage
    assert e.value.object == f"{url}shard-0.tar" and e.value.object in msg
    assert e.value.record == 3 and "record 3" in msg
    # The function's own exception is the cause (unpickled from a worker process).
    cause = e.value.__cause__
    assert type(cause) is ValueError and cause.args == ("boom on purpose",)
    # errors="skip" skips just that sample.
    run = p.options(errors="skip").run()
    assert len(list(run)) == 9
    assert run.stats()["skipped"] == 1


def test_a_worker_that_dies_is_an_error_naming_the_sample_not_a_hang(s3, prefix):
    url = write_shards(s3, prefix, shards=1)
    p = stoker.from_url(url, format="tar", **s3.options).map(dies, processes=2)
    result: dict[str, object] = {}

    def consume() -> None:
        try:
            result["items"] = list(p)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            result["error"] = e

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "the run hangs after a worker died"
    err = result.get("error")
    assert isinstance(err, stoker.DataError), result
    assert "died" in str(err) and "SIGKILL" in str(err)
    assert err.object == f"{url}shard-0.tar" and err.record == 5
    # The next run gets new workers.
    assert len(list(stoker.from_url(url, format="tar", **s3.options).map(identity, processes=2))) == 10


def own_shm() -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"stoker-{os.getpid()}-"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_no_process_or_shared_memory_outlives_a_run(s3, prefix):
    p = tar_pipeline(s3, prefix).map(with_pid, processes=2)
    pids = {s["pid"] for s in p}
    assert pids and os.getpid() not in pids
    assert [pid for pid in pids if alive(pid)] == []
    assert own_shm() == []
    assert multiprocessing.active_children() == []

    # An iterator dropped early.
    it = iter(p.options(threads=2))
    first = next(it)
    assert alive(first["pid"])
    assert own_shm() != []
    del it, first
    gc.collect()
    assert own_shm() == []
    assert multiprocessing.active_children() == []

    # A run closed early, and a run that ended with an error.
    run = p.run()
    next(run)
    run.close()
    assert own_shm() == [] and multiprocessing.active_children() == []
    with pytest.raises(stoker.DataError):
        list(stoker.from_url(write_shards(s3, prefix + "b/", shards=1), format="tar", **s3.options).map(boom, processes=2))
    assert own_shm() == [] and multiprocessing.active_children() == []


def test_a_large_tensor_survives_the_round_trip_through_processes(s3, prefix):
    big = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    s3.put(f"{prefix}big.tar", tar_shard([{"__key__": "a", "big": big.tobytes()}, {"__key__": "b", "big": (big * 3).tobytes()}]))
    p = (
        stoker.from_url(f"s3://data/{prefix}big.tar", format="tar", **s3.options)
        .map("to_tensor", field="big", dtype="float32")
        .map(plus_one, processes=2)
    )
    out = list(p)
    assert len(out) == 2
    np.testing.assert_array_equal(out[0]["same"], big)
    np.testing.assert_array_equal(out[0]["big"], big + 1)
    np.testing.assert_array_equal(out[1]["same"], big * 3)
    np.testing.assert_array_equal(out[1]["big"], big * 3 + 1)


# Resume and pickling ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_resume_is_exact_with_a_python_map(s3, prefix, mode):
    p = (
        tar_pipeline(s3, prefix)
        .shuffle_shards()
        .interleave(2)
        .map(text_and_length, **workers(mode))
        .shuffle(8)
        .batch(4)
        .epochs(2)
        .seed(11)
    )
    full = [norm(b) for b in p]
    for stop in (1, 7, 13):
        run = p.run()
        head = [norm(next(run)) for _ in range(stop)]
        state = run.state_dict()
        del run
        rest = [norm(b) for b in p.resume(state)]
        assert head + rest == full
    assert [norm(b) for b in p.load_state_dict(state)] == full[13:]


def jitter(s, rng):
    """A random augmentation written with the generator a seeded map is given."""
    out = dict(s)
    out["bin"] = s["bin"] + rng.normal(size=s["bin"].shape).astype(np.float32)
    out["coin"] = int(rng.integers(0, 1 << 30))
    return out


def seeded_pipeline(s3, prefix: str, mode: str, threads: int = 2, seed: int = 5) -> stoker.Pipeline:
    return (
        tar_pipeline(s3, prefix)
        .shuffle_shards()
        .interleave(2)
        .map(jitter, seeded=True, **workers(mode))
        .epochs(2)
        .seed(seed)
        .options(threads=threads)
    )


def test_a_seeded_function_draws_the_same_for_a_sample_whatever_runs_it(s3, prefix):
    runs = {
        (mode, threads): [norm(s) for s in seeded_pipeline(s3, prefix, mode, threads)]
        for mode in MODES
        for threads in (1, 3)
    }
    first = runs[("threads", 1)]
    assert len(first) == 60
    for key, out in runs.items():
        assert out == first, f"{key} drew differently"
    coins = [s["coin"] for s in first]
    # Per sample and per epoch: 30 samples, 2 epochs, all draws distinct.
    assert len(set(coins)) == 60
    other = [norm(s) for s in seeded_pipeline(s3, prefix, "threads", seed=6)]
    assert [s["coin"] for s in other] != coins
    assert "py_map(jitter, threads, seeded)" in seeded_pipeline(s3, prefix, "threads").explain()


@pytest.mark.parametrize("mode", MODES)
def test_resume_repeats_a_seeded_function_s_draws(s3, prefix, mode):
    p = seeded_pipeline(s3, prefix, mode).shuffle(8).batch(4)
    full = [norm(b) for b in p]
    run = p.run()
    head = [norm(next(run)) for _ in range(9)]
    state = run.state_dict()
    del run
    assert head + [norm(b) for b in p.resume(state)] == full
    q = pickle.loads(pickle.dumps(p))
    assert [norm(b) for b in q] == full


@pytest.mark.parametrize("mode", MODES)
def test_a_pipeline_with_a_python_map_pickles(s3, prefix, mode):
    p = tar_pipeline(s3, prefix).map(text_and_length, **workers(mode)).filter(even, **workers(mode))
    q = pickle.loads(pickle.dumps(p))
    assert q.explain() == p.explain()
    assert [norm(s) for s in q] == [norm(s) for s in p]


def test_a_function_that_does_not_pickle_is_refused_by_processes_at_map_time():
    p = stoker.from_samples([{"x": 1}])

    def local(s):
        return s

    for fn in (lambda s: s, local):
        with pytest.raises(TypeError, match='module-level function, or workers="threads"'):
            p.map(fn, workers="processes")
        # The default (auto) keeps it on the engine's threads.
        assert "threads)" in p.map(fn).explain()
    # Threads take any callable.
    assert [s["x"] for s in p.map(lambda s: {"x": s["x"] + 1}, workers="threads")] == [2]
    with pytest.raises(ValueError, match="workers"):
        p.map(identity, workers="fibers")


# Threads: the GIL --------------------------------------------------------------------------------


def test_threads_mode_with_several_engine_threads_and_python_threads(s3, prefix):
    p = tar_pipeline(s3, prefix, shards=4, per=25).map(text_and_length, workers="threads").options(threads=4)
    expected = sorted(s["n"] for s in p)
    run = p.run()
    got: list[int] = []
    lock = threading.Lock()

    def consume() -> None:
        for s in run:
            with lock:
                got.append(s["n"])

    threads = [threading.Thread(target=consume, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert sorted(got) == expected
    # Dropping runs mid-way while engine threads call Python does not deadlock.
    for _ in range(5):
        it = iter(p)
        next(it)
        del it
    assert len(list(p.take(3))) == 3


SLOW_CHILD = textwrap.dedent(
    """
    import sys, time, stoker
    import signal
    # A child started from a background job inherits SIGINT ignored: restore Python's own.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def slow(s):
        time.sleep(0.2)
        return s

    if __name__ == "__main__":
        mode = sys.argv[1]
        kw = {"workers": "threads"} if mode == "threads" else {"processes": 2}
        p = stoker.from_samples([{"x": i} for i in range(1000)]).map(slow, **kw).options(threads=2)
        run = p.run()
        next(run)
        try:
            print("READY", flush=True)
            for _ in run:
                pass
            print("NOT INTERRUPTED", flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
        run.state_dict()
        print("STATE", flush=True)
    """
)


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_interrupts_a_run_with_a_python_map_and_the_process_exits(tmp_path, mode):
    script = tmp_path / "child.py"
    script.write_text(SLOW_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "READY"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert out.split() == ["INTERRUPTED", "STATE"], err
    assert child.returncode == 0, err


def busy_pid(s):
    """Plain Python for about 2 ms: it holds the GIL."""
    end = time.perf_counter() + 0.002
    n = 0
    while time.perf_counter() < end:
        n += 1
    return {**s, "pid": os.getpid()}


def sleepy_pid(s):
    """Waits 2 ms with the GIL released (as NumPy on large arrays, decoders and I/O do)."""
    time.sleep(0.002)
    return {**s, "pid": os.getpid()}


def cheap_pid(s):
    return {**s, "pid": os.getpid()}


BIG = np.arange(1 << 20, dtype=np.float32)


def busy_big_pid(s):
    """Plain Python for about 0.5 ms, returning a 4 MB array: it holds the GIL, but a
    worker process would spend longer moving the array than the call takes."""
    end = time.perf_counter() + 0.0005
    n = 0
    while time.perf_counter() < end:
        n += 1
    return {**s, "pid": os.getpid(), "big": BIG}


@pytest.mark.parametrize(
    "fn, where, why",
    [
        (busy_pid, "processes", "worker processes: it holds the GIL"),
        (sleepy_pid, "threads", "threads: it releases the GIL"),
        (cheap_pid, "threads", "threads: its calls are cheap"),
        (busy_big_pid, "threads", "threads: it holds the GIL, but moving its sample and result"),
    ],
)
def test_auto_workers_choose_threads_or_processes_from_the_first_calls(fn, where, why):
    samples = [{"x": i} for i in range(96)]
    p = stoker.from_samples(samples).map(fn).options(threads=2)
    assert f"py_map({fn.__name__}, auto)" in p.explain()
    run = p.run()
    out = list(run)
    assert [s["x"] for s in out] == list(range(96))
    assert why in run.explain(), run.explain()
    # The first calls ran on the engine's threads (this process); the rest where chosen
    # (past the 64 calls after which it has chosen at the latest, and the few under way
    # when it did).
    later = {s["pid"] for s in out[72:]}
    if where == "processes":
        assert os.getpid() not in later and len(later) >= 1
    else:
        assert later == {os.getpid()}
    # The same outputs as either mode given explicitly (pids aside).
    def plain(rows):
        def value(k, v):
            if k == "big":  # 4 MB: its shape and ends
                return v.shape, float(v[0]), float(v[-1])
            return 0 if k == "pid" else v

        return [{k: value(k, v) for k, v in s.items()} for s in rows]

    for mode in ("threads", "processes"):
        forced = plain(stoker.from_samples(samples).map(fn, workers=mode))
        assert forced == plain(out)


def test_auto_workers_keep_a_function_that_does_not_pickle_on_threads():
    p = stoker.from_samples([{"x": i} for i in range(4)]).map(lambda s: {**s, "y": s["x"] * 2})
    assert "<lambda>, threads)" in p.explain()
    assert [s["y"] for s in p] == [0, 2, 4, 6]


CALLS = []


def double_x(s):
    CALLS.append(1)
    return {**s, "y": np.asarray(s["x"]) * 2.0}


def test_a_batch_safe_function_before_a_batch_runs_once_per_batch_with_the_same_batches():
    samples = [{"x": np.arange(4, dtype=np.float32) + i} for i in range(32)]

    def batches(**options):
        CALLS.clear()
        p = stoker.from_samples(samples).map(double_x, workers="threads", batch_safe=True).batch(8)
        p = p.options(**options)
        out = [{k: np.array(v) for k, v in b.items()} for b in p]
        return p, out, len(CALLS)

    p, moved, calls = batches()
    assert "moved py_map(double_x, threads, batch_safe) after batch(8)" in p.explain(), p.explain()
    assert calls == 4
    q, per_sample, calls = batches(disable=["batching"])
    assert "moved" not in q.explain()
    assert calls == 32
    assert len(moved) == len(per_sample) == 4
    for a, b in zip(moved, per_sample):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
        assert a["y"].shape == (8, 4)


def none_for_seven(s):
    return None if 7 in np.asarray(s["x"]).ravel() else s


def test_a_batch_safe_function_may_not_drop_and_is_not_seeded_nor_a_filter():
    p = stoker.from_samples([{"x": np.array([i])} for i in range(10)])
    with pytest.raises(stoker.DataError, match="declared batch_safe"):
        list(p.map(none_for_seven, workers="threads", batch_safe=True).batch(4))
    with pytest.raises(ValueError, match="unseeded"):
        p.map(double_x, seeded=True, batch_safe=True)
    with pytest.raises(ValueError, match="a filter drops"):
        p.filter(double_x, batch_safe=True)
