"""The profiler from Python: ``stoker.profile`` (its verdict, its report files, its trace),
``run.profile()`` on a loop with a step of its own, ``stoker.torch.Dataset.profile`` and
``run(progress=...)``."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import stoker


def spin_3ms(s):
    end = time.perf_counter() + 0.003
    x = 0
    while time.perf_counter() < end:
        x += 1
    s["x"] = x
    return s


def samples(n: int) -> list[dict]:
    return [{"__key__": f"k{i}", "i": i} for i in range(n)]


def test_profile_names_an_expensive_python_function_and_writes_its_report(tmp_path):
    p = (
        stoker.from_samples(samples(300))
        .map(spin_3ms, workers="threads")
        .batch(10)
        .options(threads=2)
    )
    out = tmp_path / "prof"
    prof = stoker.profile(p, seconds=30, out=out)
    v = prof["verdict"]
    assert v["input_bound"] is True, v
    assert v["cause"] == "cpu", v
    assert "spin_3ms" in v["bottleneck"], v
    assert prof["samples"] == 300
    assert {f.name for f in out.iterdir()} == {"profile.json", "report.html", "trace.json"}
    on_disk = json.loads((out / "profile.json").read_text())
    assert on_disk["verdict"]["bottleneck"] == v["bottleneck"]
    html = (out / "report.html").read_text()
    assert "spin_3ms" in html and "<svg" in html
    trace = json.loads((out / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert any(n.startswith("stoker-cpu-") for n in names), names
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "spin_3ms" in e["name"]]
    # The profiled samples: one in eight.
    assert len(spans) == 300 // 8 + 1, len(spans)
    # Two busy threads but about one CPU: the GIL. The change: worker processes.
    assert prof["cpu_s"] < 0.7 * 2 * prof["seconds"], prof["cpu_s"]
    procs = [r for r in v["recommendations"] if "worker processes" in r["change"]]
    assert procs and 'workers="processes"' in procs[0]["python"], v["recommendations"]
    assert procs[0]["expected_gain"] > 1.3, procs


def sleep_3ms(s):
    time.sleep(0.003)
    return s


def test_a_python_function_that_waits_is_told_to_take_more_threads():
    p = stoker.from_samples(samples(300)).map(sleep_3ms, workers="threads").options(threads=2)
    prof = stoker.profile(p, seconds=30, trace=False, out=None)
    v = prof["verdict"]
    assert v["cause"] == "cpu" and "sleep_3ms" in v["bottleneck"], v
    more = [r for r in v["recommendations"] if "more threads" in r["change"]]
    assert more and more[0]["python"] == "p = p.options(threads=8)", v["recommendations"]
    assert not any("worker processes" in r["change"] for r in v["recommendations"]), v


def test_a_loop_slower_than_its_input_is_not_input_bound():
    p = stoker.from_samples(samples(200)).map("random_int", to="r", below=5).batch(4)
    run = p.run()
    for _ in run:
        time.sleep(0.01)
    prof = run.profile()
    v = prof["verdict"]
    assert v["input_bound"] is False, v
    assert v["cause"] == "consumer" and v["bottleneck"] == "consumer", v
    # The loop's own time between items was measured: 50 steps of 10 ms.
    assert prof["consumer"]["step_s"] >= 0.45, prof["consumer"]
    assert prof["consumer"]["items"] == 50
    assert prof["timeline"], "a point every 100 ms"


def test_progress_draws_on_stderr_and_changes_nothing(capsys):
    p = stoker.from_samples(samples(64)).batch(8)
    plain = [list(b["i"]) for b in p.run()]
    with p.run(progress=8) as run:
        shown = [list(b["i"]) for b in run]
        assert run.profile()["samples"] == 64
    assert shown == plain
    err = capsys.readouterr().err
    assert "64 samples" in err and "8/8 items" in err, err


def test_progress_counts_must_be_positive():
    with pytest.raises(ValueError, match="progress"):
        stoker.from_samples(samples(4)).run(progress=0)


def test_torch_dataset_profiles_the_training_loop():
    torch = pytest.importorskip("torch")
    import stoker.torch as st

    ds = st.Dataset(stoker.from_samples(samples(96)).map("random_int", to="r", below=5).batch(8))
    assert ds.profile() is None
    for batch in ds:
        assert isinstance(batch["i"], torch.Tensor)
        time.sleep(0.005)  # the training step
    prof = ds.profile()
    assert prof is not None
    assert prof["samples"] == 96
    assert prof["consumer"]["step_s"] >= 0.05
    assert prof["verdict"]["input_bound"] is False, prof["verdict"]


def test_profile_without_output_or_trace(tmp_path):
    p = stoker.from_samples(samples(50)).map("random_int", to="r", below=5)
    prof = stoker.profile(p, out=None, trace=False, limit=10)
    assert prof["items"] >= 10
    assert set(prof["verdict"]) >= {"input_bound", "bottleneck", "cause", "recommendations"}
    assert isinstance(np.float64(prof["seconds"]), np.floating)
