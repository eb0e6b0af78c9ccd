"""Several Python threads on one run, Ctrl-C during a blocked iteration, fork(), the GIL
during a blocked iteration, and memory with a slow consumer."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import stoker


def test_several_threads_share_one_run_and_each_item_goes_to_one(s3, prefix):
    n = 400
    for i in range(n):
        s3.put(f"{prefix}{i:04d}.txt", str(i).encode())
    run = (
        stoker.from_url(f"s3://data/{prefix}", format="files", **s3.options)
        .map("parse_int", field="txt")
        .run()
    )
    seen: list[list[int]] = [[] for _ in range(4)]
    stats_seen: list[int] = []
    errors: list[BaseException] = []

    def consume(k: int) -> None:
        try:
            for sample in run:
                seen[k].append(sample["txt"])
                if k == 0 and len(seen[0]) % 10 == 0:
                    stats_seen.append(run.stats()["samples"])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    everything = sorted(sum(seen, []))
    assert everything == list(range(n))
    assert stats_seen == sorted(stats_seen)
    assert run.stats()["samples"] == n


CHILD = textwrap.dedent(
    """
    import sys, time, stoker
    import signal
    # A child started from a background job inherits SIGINT ignored: restore Python's own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    endpoint = sys.argv[1]
    p = stoker.from_url("s3://data/" + sys.argv[2], format="files", endpoint=endpoint,
                        access_key="stoker-test", secret_key="stoker-test-secret",
                        region="us-east-1", allow_http=True)
    run = p.run()
    print("READY", flush=True)
    try:
        next(run)
        print("NOT INTERRUPTED", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", time.monotonic(), flush=True)
    # The run goes on after the interrupt: nothing was lost.
    print("COUNT", sum(1 for _ in run), flush=True)
    """
)


def test_ctrl_c_interrupts_a_blocked_iteration_and_loses_nothing(s3, prefix):
    delay_ms = 8000
    n = 5
    for i in range(n):
        s3.put(f"{prefix}slow/obj-{i}", b"x")
    # Every GET of these objects (not the listing) waits delay_ms before it is answered.
    s3.control(f"fault?kind=delay&ms={delay_ms}&method=GET&times={n}&path={prefix}slow/obj-")
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, s3.endpoint, f"{prefix}slow/"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "READY"
        time.sleep(0.5)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().split()
        assert line[0] == "INTERRUPTED", (line, child.stderr.read() if line == [] else "")
        interrupted_after = float(line[1]) - sent
        rest, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert rest.split() == ["COUNT", str(n)]
        # The request it was blocked on takes delay_ms; the interrupt came well before.
        assert interrupted_after < delay_ms / 1000 / 2, interrupted_after
    finally:
        s3.control("clear")


def test_a_child_forked_after_stoker_threads_started_refuses_to_start_more(s3, prefix):
    # The engine's locks (parking_lot) keep one process-wide table of parked threads; a
    # child forked while Stoker's threads exist inherits entries of threads it does not
    # have, and its first new threads corrupt the heap (reproduced: free(): invalid
    # pointer, panics in parking_lot). So the child refuses instead of starting threads.
    for i in range(5):
        s3.put(f"{prefix}{i}.txt", f"{i}".encode())
    p = stoker.from_url(f"s3://data/{prefix}", format="files", **s3.options).map(
        "parse_int", field="txt"
    )
    parent_run = p.run()
    first = next(parent_run)["txt"]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        code = 1
        try:
            report = []
            for attempt in (
                lambda: next(parent_run),
                lambda: p.run(),
                lambda: stoker.io.open(f"s3://data/{prefix}4.txt", **s3.options),
            ):
                try:
                    attempt()
                    report.append("usable")
                except RuntimeError as e:
                    msg = str(e)
                    report.append(
                        "another process"
                        if "another process" in msg
                        else "forked" if "forked from one in which" in msg else msg
                    )
            os.write(w, "|".join(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as pipe:
        report = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == "another process|forked|forked"
    assert [first] + [s["txt"] for s in parent_run] == list(range(5))


FORK_BEFORE_THREADS = """
import os, sys, stoker
opts = eval(sys.argv[2])
p = stoker.from_url(sys.argv[1], format="files", **opts).map("parse_int", field="txt")
pid = os.fork()  # no Stoker thread has started in this process yet
if pid == 0:
    code = 1
    try:
        got = [s["txt"] for s in p]
        with stoker.io.open(sys.argv[1] + "4.txt", **opts) as f:
            data = f.read().decode()
        print("child", got, data, flush=True)
        code = 0
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
print("parent", [s["txt"] for s in p], os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_before_any_stoker_thread_runs_pipelines_and_reads_objects(s3, prefix):
    for i in range(5):
        s3.put(f"{prefix}{i}.txt", f"{i}".encode())
    out = subprocess.run(
        [sys.executable, "-c", FORK_BEFORE_THREADS, f"s3://data/{prefix}", repr(s3.options)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["child [0, 1, 2, 3, 4] 4", "parent [0, 1, 2, 3, 4] 0"]


def test_a_blocked_next_releases_the_gil(s3, prefix):
    # One object whose GET the server holds back for a second: the first next() blocks on
    # the network. A pure-Python thread counting meanwhile must run at about its free rate
    # (with the GIL held through the wait it would not count at all; with the GIL taken
    # back for every 50 ms signal check it would reach a small fraction).
    s3.put(f"{prefix}slow/obj-0.bin", b"x")
    count = [0]
    stop = threading.Event()

    def counter() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            count[0] = n

    t = threading.Thread(target=counter, daemon=True)
    t.start()
    try:
        time.sleep(0.05)
        # Calibration: the counter's rate while this thread sleeps (GIL free).
        c0, t0 = count[0], time.monotonic()
        time.sleep(0.4)
        free_rate = (count[0] - c0) / (time.monotonic() - t0)
        s3.control(f"fault?kind=delay&ms=1000&method=GET&times=1&path={prefix}slow/obj-")
        run = stoker.from_url(f"s3://data/{prefix}slow/", format="files", **s3.options).run()
        c0, t0 = count[0], time.monotonic()
        sample = next(run)
        blocked = time.monotonic() - t0
        counted = count[0] - c0
    finally:
        stop.set()
        t.join()
        s3.control("clear")
    assert bytes(sample["bin"]) == b"x"
    assert blocked > 0.5, f"next() did not wait for the delayed GET ({blocked:.2f} s)"
    rate = counted / blocked
    assert rate > 0.3 * free_rate, (
        f"the counting thread ran at {rate:.0f}/s during next(), {free_rate:.0f}/s when free: "
        "next() held the GIL while it waited"
    )


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


MiB = 1 << 20


def _make_mib(sample):
    return {"x": np.full(MiB, sample["i"] % 251, np.uint8)}


@pytest.mark.parametrize("growth", ["read", "native-op", "python-map"])
def test_a_slow_consumer_keeps_memory_within_the_budget(s3, prefix, growth):
    # 96 samples of 1 MiB by the time they are batched, through an 8 MiB budget, to a
    # consumer that sleeps per batch: the source must stop, whether the MiB was read from
    # storage ("read"), or made by an operator from a small sample (a resize, as a decode
    # makes a JPEG larger; a Python function).
    n, limit = 96, 8 * MiB
    if growth == "read":
        for i in range(n):
            s3.put(f"{prefix}{i:03d}.bin", np.full(MiB, i % 251, np.uint8).tobytes())
        p = stoker.from_url(f"s3://data/{prefix}", **s3.options).map("to_tensor", field="bin", dtype="uint8")
        field = "bin"
    elif growth == "native-op":
        tiny = [{"x": np.full((2, 2, 4), i % 251, np.uint8)} for i in range(n)]
        p = stoker.from_samples(tiny).map("resize", field="x", size=[512, 512])  # 512*512*4 = 1 MiB
        field = "x"
    else:
        p = stoker.from_samples([{"i": i} for i in range(n)]).map(_make_mib, workers="threads")
        field = "x"
    p = p.batch(4).options(memory_limit=limit)
    gc.collect()
    base = peak_rss = _rss()
    ahead = 0
    run = p.run()
    for k, batch in enumerate(run):
        assert batch[field].shape[0] == 4 and batch[field][:, 0].ravel()[0] == (4 * k) % 251
        stats = run.stats()
        # Samples the source has produced that the consumer has not taken yet.
        ahead = max(ahead, stats["stages"][0]["items_out"] - stats["samples"])
        held, peak, lim = (stats["memory"][f] for f in ("held", "peak", "limit"))
        # What was read stays within the limit; what operators add to samples already
        # admitted is charged when it happens, past the limit if need be (the sample is in
        # memory either way), and stops the source until the budget is back under it.
        assert lim == limit and peak <= (limit if growth == "read" else 3 * limit), peak
        del batch
        time.sleep(0.03)
        peak_rss = max(peak_rss, _rss())
    assert k == n // 4 - 1
    grew = peak_rss - base
    assert ahead * MiB <= 2 * limit, (
        f"{ahead} samples of 1 MiB were in flight at once with a {limit // MiB} MiB budget "
        f"(budget peak {run.stats()['memory']['peak']} bytes)"
    )
    assert grew < n * MiB // 2, f"RSS grew by {grew / MiB:.0f} MiB for {n} MiB of data through {limit // MiB} MiB"
