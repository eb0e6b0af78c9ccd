"""Tests of bench/harness.py: its pure functions (rotation, the repetition loop, medians,
ratios, tables, parsing) and, with short-lived Python children, the child-process and
test-server plumbing. Standard library only; no build, no network, a few seconds.

    python3 bench/test_harness.py
    python3 -m pytest bench/test_harness.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402


class Result:
    def __init__(self, value: float, count: int = 10) -> None:
        self.seconds = value
        self.count = count
        self.server_cpu_s = float("nan")


class FakeServer:
    """What run_reps needs of a Server: cpu_s() and check_alive()."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.alive = True

    def cpu_s(self) -> float:
        self.cpu += 0.5
        return self.cpu

    def check_alive(self) -> None:
        if not self.alive:
            raise H.HarnessError("test server died")


class RotationTest(unittest.TestCase):
    def test_same_as_the_scripts_expression(self) -> None:
        for n in range(1, 6):
            names = [f"c{i}" for i in range(n)]
            for rep in range(12):
                k = rep % len(names)
                self.assertEqual(H.rotated(names, rep), names[k:] + names[:k])

    def test_two_alternate(self) -> None:
        self.assertEqual(H.rotated(["a", "b"], 0), ["a", "b"])
        self.assertEqual(H.rotated(["a", "b"], 1), ["b", "a"])
        self.assertEqual(H.rotated(["a", "b"], 2), ["a", "b"])

    def test_empty(self) -> None:
        self.assertEqual(H.rotated([], 3), [])


class RunRepsTest(unittest.TestCase):
    def test_order_and_results(self) -> None:
        calls = []

        def run(g, c, rep):
            calls.append((rep, g, c))
            return Result(rep + 1.0)

        t = H.run_reps(2, [("w1", ["a", "b", "c"]), ("w2", ["a", "b"])], run)
        self.assertEqual(calls, [
            (0, "w1", "a"), (0, "w1", "b"), (0, "w1", "c"), (0, "w2", "a"), (0, "w2", "b"),
            (1, "w1", "b"), (1, "w1", "c"), (1, "w1", "a"), (1, "w2", "b"), (1, "w2", "a"),
        ])
        self.assertEqual(list(t.reps), [("w1", "a"), ("w1", "b"), ("w1", "c"), ("w2", "a"), ("w2", "b")])
        self.assertEqual([r.seconds for r in t.reps[("w1", "a")]], [1.0, 2.0])
        self.assertEqual(t.errors, {})

    def test_failure_is_recorded_and_skipped(self) -> None:
        calls, failed = [], []

        def run(g, c, rep):
            calls.append((rep, c))
            if c == "bad":
                raise KeyError("seconds")
            return Result(1.0, count=9 if c == "short" else 10)

        t = H.run_reps(3, [(None, ["ok", "bad", "short"])], run,
                       expect=lambda g, c, r: None if r.count == 10 else f"{r.count} items, expected 10",
                       on_fail=lambda rep, g, c, err: failed.append((rep, c, err)))
        self.assertEqual(failed, [(0, "bad", "KeyError: 'seconds'"), (0, "short", "9 items, expected 10")])
        self.assertEqual(t.errors, {(None, "bad"): "KeyError: 'seconds'", (None, "short"): "9 items, expected 10"})
        self.assertEqual(len(t.reps[(None, "ok")]), 3)
        self.assertEqual(t.reps[(None, "bad")], [])
        self.assertEqual(t.reps[(None, "short")], [])
        self.assertEqual([c for rep, c in calls if rep > 0], ["ok", "ok"])

    def test_without_skipping(self) -> None:
        n = {"k": 0}

        def run(g, c, rep):
            n["k"] += 1
            if rep == 0:
                raise H.ContenderError("first rep fails")
            return Result(1.0)

        t = H.run_reps(3, [(None, ["x"])], run, skip_failed=False)
        self.assertEqual(n["k"], 3)
        self.assertEqual(len(t.reps[(None, "x")]), 2)
        self.assertEqual(t.errors[(None, "x")], "first rep fails")

    def test_harness_error_and_system_exit_propagate(self) -> None:
        def harness_fails(g, c, rep):
            raise H.HarnessError("no server")

        with self.assertRaises(H.HarnessError):
            H.run_reps(1, [(None, ["x"])], harness_fails)

        def exits(g, c, rep):
            raise SystemExit("wrong sample count")

        with self.assertRaises(SystemExit):
            H.run_reps(1, [(None, ["x"])], exits)

    def test_server_cpu_and_liveness(self) -> None:
        server = FakeServer()
        oks = []
        t = H.run_reps(1, [(None, ["a", "b"])], lambda g, c, rep: Result(1.0), server=server, time_server=True,
                       on_ok=lambda rep, g, c, r: oks.append(c))
        self.assertEqual(oks, ["a", "b"])
        self.assertEqual([r.server_cpu_s for r in t.reps[(None, "a")]], [0.5])
        server.alive = False
        with self.assertRaises(H.HarnessError):
            H.run_reps(1, [(None, ["a"])], lambda g, c, rep: Result(1.0), server=server)

    def test_server_cpu_untouched_without_time_server(self) -> None:
        t = H.run_reps(1, [(None, ["a"])], lambda g, c, rep: Result(1.0), server=FakeServer())
        self.assertNotEqual(t.reps[(None, "a")][0].server_cpu_s, t.reps[(None, "a")][0].server_cpu_s)  # NaN


class StatisticsTest(unittest.TestCase):
    def test_medians(self) -> None:
        self.assertEqual(H.median([3, 1, 2]), 2)
        self.assertEqual(H.median(x for x in [4, 1, 3, 2]), 2.5)
        reps = [Result(3.0, 1), Result(1.0, 7), Result(2.0, 4)]
        self.assertEqual(H.medians(reps, "seconds", "count"), {"seconds": 2.0, "count": 4})
        self.assertEqual(list(H.medians(reps, "count", "seconds")), ["count", "seconds"])
        self.assertEqual(H.maxima(reps, "seconds"), {"seconds": 3.0})
        self.assertIs(H.median_item(reps, key=lambda r: r.seconds), reps[2])
        self.assertEqual(H.median_item([Result(1.0), Result(2.0)], key=lambda r: r.seconds).seconds, 2.0)

    def test_add_ratios(self) -> None:
        rows = [
            {"contender": "stoker", "workload": "small", "ok": True, "rate": 100.0},
            {"contender": "peer", "workload": "small", "ok": True, "rate": 25.0},
            {"contender": "ceiling", "workload": "small", "ok": True, "rate": 200.0},
            {"contender": "broken", "workload": "small", "ok": False},
            {"contender": "peer", "workload": "large", "ok": True, "rate": 4.0},  # no stoker row there
        ]
        group = (lambda r: r["workload"])
        H.add_ratios(rows, rate="rate", group=group, key="speedup")
        self.assertEqual([r.get("speedup") for r in rows], [1.0, 4.0, 0.5, None, None])
        H.add_ratios(rows, rate="rate", group=group, key="pct", which=lambda r: r["contender"] == "ceiling", scale=100.0)
        self.assertEqual(rows[2]["pct"], 50.0)
        self.assertNotIn("pct", rows[1])
        H.add_ratios(rows, rate="rate", group=group, key="vs_peer", ref="peer")
        self.assertEqual(rows[0]["vs_peer"], 0.25)

    def test_add_ratios_without_ok_key(self) -> None:
        rows = [{"contender": "stoker", "f": "x", "rps": 30.0}, {"contender": "p", "f": "x", "rps": 10.0},
                {"contender": "q", "f": "x"}]
        H.add_ratios(rows, rate="rps", group=lambda r: r["f"], key="r", ok=lambda r: "rps" in r,
                     which=lambda r: r["contender"] != "stoker")
        self.assertEqual([r.get("r") for r in rows], [None, 3.0, None])

    def test_best_and_ratio_text(self) -> None:
        rows = [{"c": "a", "r": 1.0}, {"c": "b", "r": 3.0}, {"c": "d", "r": 3.0}]
        self.assertEqual(H.best(rows, "r")["c"], "b")
        self.assertIsNone(H.best([], "r"))
        s = {"x": 10.0, "y": 9.0, "z": 4.0}
        r = {"x": 4.0, "y": 3.0, "z": 2.0}
        self.assertEqual(H.ratio_text(s, r, ["x"]), "2.50x")
        self.assertEqual(H.ratio_text(s, r, ["x", "y"]), "2.50x (3.00x)")
        self.assertEqual(H.ratio_text(s, r, ["x", "y", "z"]), "2.50x (3.00x; 2.00x)")


class TableTest(unittest.TestCase):
    def test_alignment(self) -> None:
        out = H.text_table(["name", "s", "note"], [["a", "1.5", "x"], ["bbbb", "10.25", ""]], right={1})
        self.assertEqual(out.splitlines(), [
            "name      s  note",
            "----  -----  ----",
            "a       1.5  x",
            "bbbb  10.25",
        ])

    def test_span_rows(self) -> None:
        rows = [["stoker", "small", "0.500", "2000.0"], H.Span(["boto3", "small", "FAILED"], "exited with 1: boom")]
        lines = H.text_table(["contender", "workload", "median s", "objects/s"], rows, right=range(2, 4)).splitlines()
        self.assertEqual(lines[0], "contender  workload  median s  objects/s")
        self.assertEqual(lines[1], "---------  --------  --------  ---------")
        self.assertEqual(lines[2], "stoker     small        0.500     2000.0")
        self.assertEqual(lines[3], "boto3      small     FAILED    exited with 1: boom")

    def test_span_text_does_not_widen_columns(self) -> None:
        rows = [["a", "1"], H.Span(["b"], "a very long error message")]
        self.assertEqual(H.text_table(["n", "v"], rows, right={1}).splitlines()[1], "-  -")

    def test_all_right(self) -> None:
        out = H.text_table(["maps", "kind"], [["0", "fn"], ["12", "rename"]], right=range(2))
        self.assertEqual(out.splitlines(), ["maps    kind", "----  ------", "   0      fn", "  12  rename"])

    def test_first_line(self) -> None:
        self.assertEqual(H.first_line("  boom\nmore", 3), "boo")
        self.assertEqual(H.first_line(None, 90), "no result")
        self.assertEqual(H.first_line("", 90), "no result")


class TextTest(unittest.TestCase):
    def test_tail(self) -> None:
        self.assertEqual(H.tail("  short \n"), "short")
        self.assertEqual(H.tail("abcdefgh", 3), "...fgh")

    def test_last_json(self) -> None:
        self.assertEqual(H.last_json('noise\n{"a": 1}\n{"b": 2}\ntrailer\n'), {"b": 2})
        with self.assertRaises(H.ContenderError):
            H.last_json("nothing here")
        with self.assertRaises(H.ContenderError):
            H.last_json('{"a": 1}\n{broken')

    def test_check(self) -> None:
        ok = H.ChildResult(0, 1.0, 0.5, 10.0, "", "")
        H.check(ok, "x")
        bad = H.ChildResult(3, 1.0, 0.5, 10.0, "out", "err text")
        with self.assertRaisesRegex(H.ContenderError, r"^reader exited with 3: err text$"):
            H.check(bad, "reader")
        with self.assertRaisesRegex(H.ContenderError, "out"):
            H.check(H.ChildResult(1, 1.0, 0.5, 10.0, "out", ""), "reader")


class CommandLineTest(unittest.TestCase):
    def error(self, msg: str) -> None:
        raise ValueError(msg)

    def test_pick(self) -> None:
        known = ["stoker", "ceiling", "boto3"]
        self.assertEqual(H.pick("", known, self.error), known)
        self.assertEqual(H.pick("boto3, curl", known, self.error, aliases={"curl": "ceiling"}), ["ceiling", "boto3"])
        self.assertEqual(H.pick("boto3,stoker", known, self.error, keep_order=True), ["boto3", "stoker"])
        self.assertEqual(H.pick("", known, self.error, default=["boto3"]), ["boto3"])
        self.assertEqual(H.pick("", known, self.error, default=()), [])
        with self.assertRaisesRegex(ValueError, r"unknown workload\(s\) \['huge'\]; choose from"):
            H.pick("small,huge", ["small"], self.error, what="workload")

    def test_add_arg(self) -> None:
        import argparse

        p = argparse.ArgumentParser()
        H.add_arg(p, "--reps", 3)
        H.add_arg(p, "--timeout", 900)
        H.add_arg(p, "--out", Path("/tmp/x.json"))
        H.add_arg(p, "--only", "a,b", help="which")
        H.add_arg(p, "--no-build")
        a = p.parse_args([])
        self.assertEqual((a.reps, a.timeout, a.out, a.only, a.no_build), (3, 900, Path("/tmp/x.json"), "a,b", False))
        a = p.parse_args(["--reps", "5", "--timeout", "2.5", "--out", "o.json", "--no-build"])
        self.assertEqual((a.reps, a.timeout, a.out, a.no_build), (5, 2.5, Path("o.json"), True))

    def test_release_bin(self) -> None:
        self.assertEqual(H.release_bin("stoker", Path("/t")), Path("/t/release/stoker"))
        self.assertEqual(H.release_bin("stoker", Path("rel")), H.REPO / "rel" / "release" / "stoker")


class FilesTest(unittest.TestCase):
    def test_write_json_and_atomic(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "sub" / "r.json"
            H.write_json(path, {"a": [1]})
            self.assertEqual(path.read_text(), '{\n  "a": [\n    1\n  ]\n}\n')
            H.write_json(path, {"a": 1}, indent=1, newline=False)
            self.assertEqual(path.read_text(), '{\n "a": 1\n}')
            target = Path(d) / "x.bin"
            H.write_atomic(target, lambda tmp: Path(tmp).write_bytes(b"abc"))
            self.assertEqual(target.read_bytes(), b"abc")
            self.assertEqual(sorted(p.name for p in Path(d).iterdir()), ["sub", "x.bin"])
            H.warm_page_cache([target])

    def test_records(self) -> None:
        import argparse

        self.assertRegex(H.now_iso(), r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$")
        self.assertRegex(H.now_iso(utc=False), r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$")
        self.assertEqual(H.args_dict(argparse.Namespace(a=1, out=Path("/x"))), {"a": "1", "out": "/x"})
        self.assertEqual(set(H.machine()), {"cpus", "platform"})
        env = H.environment({"none": None, "py": [sys.executable, "--version"]}, extra={"k": "v"})
        self.assertEqual(list(env)[:7], ["host", "kernel", "cpus", "python", "none", "py", "k"])
        self.assertEqual(env["none"], "unavailable")
        self.assertTrue(env["py"].startswith("Python 3"))
        self.assertEqual(H.version(["/nonexistent-tool"]), "unavailable")

    def test_client_env(self) -> None:
        env = H.client_env(Path("/w"))
        self.assertEqual((env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], env["AWS_REGION"]),
                         (H.ACCESS_KEY, H.SECRET_KEY, H.REGION))
        self.assertEqual(env["AWS_CONFIG_FILE"], "/w/no-aws-config")
        self.assertFalse([k for k in env if k.lower().endswith("_proxy") and k.lower() != "no_proxy"])
        self.assertEqual(env["NO_PROXY"], "127.0.0.1,localhost")


class ChildProcessTest(unittest.TestCase):
    env = dict(os.environ, PYTHONPATH=str(H.BENCH_DIR))

    def test_run_child(self) -> None:
        code = "import sys; print('x'); print('{\"n\": 3}'); print('err', file=sys.stderr); sys.exit(0)"
        r = H.run_child([sys.executable, "-c", code], self.env, 60)
        self.assertEqual(r.returncode, 0)
        self.assertEqual(H.last_json(r.stdout), {"n": 3})
        self.assertEqual(r.stderr.strip(), "err")
        self.assertGreater(r.wall_s, 0)
        self.assertGreater(r.maxrss_mib, 1)
        self.assertEqual((r.peak_rss, r.peak_pss), (0, 0))

    def test_sample_memory_and_exit_code(self) -> None:
        code = "import sys, time; b = bytearray(50 << 20); time.sleep(0.3); sys.exit(4)"
        r = H.run_child([sys.executable, "-c", code], self.env, 60, sample_memory=True, interval=0.02)
        self.assertEqual(r.returncode, 4)
        if Path("/proc/self/smaps_rollup").exists():
            self.assertGreater(r.peak_rss, 50 << 20)
            self.assertGreater(r.peak_pss, 0)

    def test_timeout(self) -> None:
        r = H.run_child([sys.executable, "-c", "import time; time.sleep(30)"], self.env, 0.5)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("killed after", r.stderr)
        self.assertLess(r.wall_s, 20)

    def test_cannot_start(self) -> None:
        with self.assertRaisesRegex(H.ContenderError, "cannot run"):
            H.run_child(["/nonexistent/binary"], self.env, 5)

    def test_peer_side(self) -> None:
        code = textwrap.dedent("""
            import harness as H
            t = H.Timer()
            t.start()
            t.report(2, 10, threads=4)
            H.emit({"cpu": H.cpu_self() > 0})
        """)
        r = H.run_child([sys.executable, "-c", code], self.env, 60)
        H.check(r, "peer")
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        self.assertEqual(list(lines[0]), ["objects", "bytes", "seconds", "startup_cpu_s", "phase_cpu_s",
                                          "startup_rss_mib", "threads"])
        self.assertEqual((lines[0]["objects"], lines[0]["bytes"], lines[0]["threads"]), (2, 10, 4))
        self.assertEqual(lines[1], {"cpu": True})

    def test_wait_rusage(self) -> None:
        import subprocess

        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        H.track_child(proc.pid)
        self.assertIsNone(H.wait_rusage(proc, 0))
        ru = H.wait_rusage(proc, 0.2, kill=True)
        self.assertIsNotNone(ru)
        self.assertIsNotNone(proc.returncode)
        self.assertIsNone(H.wait_rusage(proc, 1))  # reaped already
        H.kill_live_children()  # nothing left to kill

    def test_proc_readers(self) -> None:
        self.assertGreater(H.proc_status_mib("self", "VmRSS"), 1)
        self.assertNotEqual(H.proc_status_mib("self", "NoSuchField"), H.proc_status_mib("self", "NoSuchField"))
        self.assertGreaterEqual(H.proc_cpu_s(os.getpid()), 0)
        self.assertGreaterEqual(H.proc_tree_cpu_s(os.getpid()), 0)
        self.assertIn(os.getpid(), H.proc_tree(os.getpid()))


FAKE_SERVER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("starting", flush=True)
print("STOKER_TESTSERVER_ENDPOINT=http://127.0.0.1:9/", flush=True)
while True:
    time.sleep(0.1)
"""


class ServerTest(unittest.TestCase):
    def test_start_and_stop(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            server = H.Server([sys.executable, "-c", FAKE_SERVER], Path(d) / "server.log")
            try:
                self.assertEqual(server.endpoint, "http://127.0.0.1:9")
                self.assertGreaterEqual(server.cpu_s(), 0)
                server.check_alive()
            finally:
                server.stop()
            self.assertIsNotNone(server.proc.returncode)
            with self.assertRaises(H.HarnessError):
                server.check_alive()

    def test_exits_before_ready(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            code = "import sys; print('bad flag', file=sys.stderr); sys.exit(2)"
            with self.assertRaisesRegex(H.HarnessError, "test server exited with 2"):
                H.Server([sys.executable, "-c", code], Path(d) / "server.log")

    def test_start_argv(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            # A "binary" that prints its argv as the endpoint line, then waits.
            fake = Path(d) / "fake-server"
            fake.write_text("#!" + sys.executable + "\nimport sys, time\n"
                            "print('STOKER_TESTSERVER_ENDPOINT=' + ' '.join(sys.argv[1:]), flush=True)\n"
                            "time.sleep(30)\n")
            fake.chmod(0o755)
            server = H.Server.start(fake, "/data", 10.0, Path(d) / "server.log", ["--fast-etags"])
            try:
                self.assertEqual(server.endpoint, "--root /data --host 127.0.0.1 --port 0 --latency-ms 10 "
                                                  f"--access-key {H.ACCESS_KEY} --secret-key {H.SECRET_KEY} --fast-etags")
            finally:
                server.stop()


if __name__ == "__main__":
    unittest.main()
