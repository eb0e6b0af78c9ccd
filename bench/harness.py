"""What the benchmarks in bench/ share: one module, standard library only (Python 3.11).

Every driver (storage.py, mount.py, pipeline.py, ops.py, python.py, epochs.py, ranks.py,
pymap.py) and every peer program it runs in a child process (storage_clients.py,
pipeline_readers.py, ops_readers.py, python_readers.py) imports it as `harness`. A script
run as `python3 bench/NAME.py` has bench/ on sys.path already; the drivers also insert it
so that they can be imported from elsewhere:

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness as H  # noqa: E402

What it offers, by section:

- constants: MIB, the test server's ACCESS_KEY / SECRET_KEY / REGION, BENCH_DIR, REPO,
  RESULTS (bench/results, gitignored), VENV (the venv bench/setup.sh makes).
- failures: HarnessError (the harness failed: exit 2) and ContenderError (one contender
  failed one rep: it is reported as FAILED and the others still run).
- logging: logger(name) -> log(msg), which prints `[name HH:MM:SS] msg` to stderr.
- the repetition loop: rotated(items, rep) (the order rotated by one each rep, so nobody
  always goes first or right after the same neighbour) and run_reps(...), which runs every
  group's contenders `reps` times, interleaved within a rep, checks each result, records
  the first failure of a contender (and skips it from then on), can time the test
  server's CPU around each run and stops when the server died.
- statistics and summaries: median, medians, maxima, median_item; add_ratios (e.g.
  "stoker/peer": the reference contender's rate over each row's, per group), best,
  ratio_text ("2.95x (3.29x; 4.70x)").
- tables: text_table(head, rows, right) (aligned columns, a dashed rule under the head;
  Span rows for FAILED lines), first_line.
- result files: write_json, now_iso, args_dict, machine, environment (host, kernel, CPUs,
  tool versions, the venv's package versions, git commit), version, git_commit,
  package_versions.
- child processes: run_child (wait4 rusage: CPU and peak RSS of the child alone, never the
  test server's; optionally the peak RSS/PSS of its whole process tree sampled from
  /proc), check, last_json, tail, wait_rusage, kill_live_children (every child still
  running, on the way out), /proc readers (proc_cpu_s, proc_tree_cpu_s, proc_status_mib,
  proc_tree, proc_mem).
- mounts: is_mounted, mounted_under, unmount.
- files: write_atomic, warm_page_cache.
- the S3 test server: Server.start(binary, root, latency_ms, log) (waits for its
  STOKER_TESTSERVER_ENDPOINT line; cpu_s(); stop()), client_env (the keys and region in
  AWS_* variables, no proxies, no user AWS config).
- command line: add_arg (the flags every benchmark spells the same: --reps, --only, --out,
  --timeout, --latency-ms, --python, --venv, --server, --stoker, --no-build), pick (a
  comma-separated --only/--workloads list, checked), release_bin, cargo_build, run_main
  (exit codes: 2 harness error, 130 Ctrl-C, 143 SIGTERM, cleanup through `finally`; it
  also caches this module's bytecode, see cache_bytecode).
- the peer side: cpu_self, Timer (start of the timed part: start-up CPU and RSS),
  emit (the one JSON line a peer prints), boto3_client.

A driver typically does:

    log = H.logger("my-bench")
    server = H.Server.start(binary, root, 10, work / "server.log")
    trials = H.run_reps(a.reps, [(workload, contenders)], run, expect=check, server=server,
                        time_server=True, on_ok=..., on_fail=...)
    rows = [summarize(...) for (workload, name), reps in trials.reps.items()]
    H.add_ratios(rows, rate="objects_per_s", group=lambda r: r["workload"], key="stoker_speedup")
    print(H.text_table(head, cells, right={2, 3}))
    H.write_json(a.out, doc)

bench/test_harness.py tests the pure functions (python3 bench/test_harness.py).
"""

from __future__ import annotations

# The peer programs import this module too, and their peak RSS is measured: at module level
# it imports only what a Python process here has loaded anyway (site, argparse); the rest
# (subprocess, signal, statistics, platform, datetime, resource) where it is used.
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    import subprocess
    from typing import Any, Callable, Hashable, Iterable, Sequence

MIB = 1024 * 1024
BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
VENV = Path(os.environ.get("STOKER_BENCH_VENV", REPO / ".venv-bench"))

# The test server's defaults (crates/stoker-testserver/src/options.rs).
ACCESS_KEY = "stoker-test"
SECRET_KEY = "stoker-test-secret"
REGION = "us-east-1"


class HarnessError(Exception):
    """The harness itself failed (as opposed to a contender)."""


class ContenderError(Exception):
    """One contender failed one rep; it is reported, the others still run."""


# ---------------------------------------------------------------- logging


def logger(name: str) -> Callable[[str], None]:
    """A log function printing `[name HH:MM:SS] msg` to stderr (stdout stays for results)."""

    def log(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return log


# ---------------------------------------------------------------- the repetition loop


def rotated(items: Sequence, rep: int) -> list:
    """`items` rotated left by `rep` (mod its length): rep 0 as given, rep 1 from the second.

    On a shared machine running first, or right after a given neighbour, is not the same,
    and a fixed order would bias the medians."""
    items = list(items)
    if not items:
        return []
    k = rep % len(items)
    return items[k:] + items[:k]


class Trials:
    """What run_reps collected, keyed by (group, contender)."""

    def __init__(self, reps: dict[tuple, list], errors: dict[tuple, str]) -> None:
        self.reps = reps  # the successful results, in rep order
        self.errors = errors  # the (first, or with skip_failed=False last) failure


def run_reps(
    n_reps: int,
    groups: Iterable[tuple[Hashable, Sequence[str]]],
    run: Callable[[Any, str, int], Any],
    *,
    expect: Callable[[Any, str, Any], str | None] | None = None,
    server: "Server | None" = None,
    time_server: bool = False,
    on_ok: Callable[[int, Any, str, Any], None] | None = None,
    on_fail: Callable[[int, Any, str, str], None] | None = None,
    skip_failed: bool = True,
) -> Trials:
    """Runs every contender of every group `n_reps` times.

    Each rep visits the groups in order (e.g. workloads, formats) and runs each group's
    contenders once, in the group's order rotated by the rep (see rotated()).
    `run(group, contender, rep)` returns one result; `expect(group, contender, result)`
    returns why the result is wrong (wrong counts), or None. Any exception but a
    HarnessError (which propagates) is that contender's failure: recorded in
    Trials.errors, passed to `on_fail(rep, group, contender, message)`, and with
    `skip_failed` the contender is not run again in that group. With `server` the loop
    stops with a HarnessError when the test server has exited; with `time_server` too,
    each result's `server_cpu_s` is set to the server's CPU during its run.
    `on_ok(rep, group, contender, result)` is called after each success (logging).
    """
    groups = [(g, list(cs)) for g, cs in groups]
    trials = Trials(reps={(g, c): [] for g, cs in groups for c in cs}, errors={})
    for rep in range(n_reps):
        for g, cs in groups:
            for c in rotated(cs, rep):
                key = (g, c)
                if skip_failed and key in trials.errors:
                    continue
                cpu0 = server.cpu_s() if server is not None and time_server else None
                try:
                    r = run(g, c, rep)
                    problem = expect(g, c, r) if expect is not None else None
                    if problem:
                        raise ContenderError(problem)
                except HarnessError:
                    raise
                except Exception as e:  # a contender's failure, whatever it is, is reported
                    if not isinstance(e, ContenderError):
                        e = ContenderError(f"{type(e).__name__}: {e}")
                    trials.errors[key] = str(e)
                    if on_fail is not None:
                        on_fail(rep, g, c, str(e))
                    continue
                if cpu0 is not None:
                    r.server_cpu_s = server.cpu_s() - cpu0
                trials.reps[key].append(r)
                if on_ok is not None:
                    on_ok(rep, g, c, r)
                if server is not None:
                    server.check_alive()
    return trials


# ---------------------------------------------------------------- statistics and summaries


def median(values: Iterable[float]) -> float:
    """statistics.median of any iterable (a generator too)."""
    import statistics

    return statistics.median(list(values))


def medians(items: Sequence, *fields: str) -> dict[str, float]:
    """{field: median over items of item.field}, in the order of `fields`."""
    return {f: median(getattr(x, f) for x in items) for f in fields}


def maxima(items: Sequence, *fields: str) -> dict[str, float]:
    """{field: max over items of item.field}, in the order of `fields`."""
    return {f: max(getattr(x, f) for x in items) for f in fields}


def median_item(items: Sequence, key: Callable[[Any], float]):
    """The item at the median of `key` (the upper one of the middle two for an even count)."""
    return sorted(items, key=key)[len(items) // 2]


def add_ratios(
    rows: list[dict],
    *,
    rate: str,
    group: Callable[[dict], Hashable],
    key: str,
    ref: str = "stoker",
    ok: Callable[[dict], bool] = lambda r: r.get("ok", True),
    which: Callable[[dict], bool] = lambda r: True,
    scale: float = 1.0,
) -> None:
    """Sets `row[key] = scale * ref_row[rate] / row[rate]` on every `ok` row that `which`
    selects, where ref_row is the `ok` row of contender `ref` in the same group.

    E.g. rate="objects_per_s", group=workload, key="stoker_speedup": "stoker 2.10x" (above
    1: stoker is faster); scale=100 gives stoker's rate as a percentage of the row's."""
    refs: dict[Hashable, dict] = {}
    for r in rows:
        if r["contender"] == ref and ok(r):
            refs.setdefault(group(r), r)
    for r in rows:
        s = refs.get(group(r))
        if s is not None and ok(r) and which(r):
            r[key] = scale * s[rate] / r[rate]


def best(rows: Iterable[dict], rate: str) -> dict | None:
    """The row with the highest `rate` (the first of equals), None if there are none."""
    rows = list(rows)
    return max(rows, key=lambda r: r[rate]) if rows else None


def ratio_text(ref: dict, row: dict, keys: Sequence[str]) -> str:
    """ref/row for each key, as '2.95x' or '2.95x (3.29x; 4.70x)' (the first key outside)."""
    parts = [f"{ref[k] / row[k]:.2f}x" for k in keys]
    return parts[0] + (f" ({'; '.join(parts[1:])})" if len(parts) > 1 else "")


# ---------------------------------------------------------------- tables


class Span:
    """A table row whose `cells` are aligned (left) like the first columns and whose `text`
    follows them unaligned: a FAILED row with its error in place of the figures."""

    def __init__(self, cells: Sequence[str], text: str) -> None:
        self.cells = list(cells)
        self.text = text


def text_table(head: Sequence[str], rows: Sequence[Sequence[str] | Span], right: Iterable[int] = ()) -> str:
    """Columns two spaces apart, each as wide as its widest cell, right-aligned if its index
    is in `right` (else left), trailing blanks stripped; a rule of dashes under the head."""
    right = set(right)
    cells = [list(head)] + [r.cells if isinstance(r, Span) else list(r) for r in rows]
    widths = [max((len(row[i]) for row in cells if i < len(row)), default=0) for i in range(len(head))]
    lines = []
    for k, row in enumerate([head, *rows]):
        if isinstance(row, Span):
            lines.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(row.cells)) + "  " + row.text)
        else:
            lines.append("  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                                   for i, c in enumerate(row)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def first_line(text: str | None, n: int, default: str = "no result") -> str:
    """The first line of an error message, cut at n characters (for a FAILED row)."""
    lines = (text or default).strip().splitlines()
    return lines[0][:n] if lines else ""


# ---------------------------------------------------------------- result files


def now_iso(utc: bool = True) -> str:
    """The time now to the second, ISO 8601 (UTC with its offset, or local without)."""
    import datetime as _dt

    now = _dt.datetime.now(_dt.timezone.utc) if utc else _dt.datetime.now()
    return now.isoformat(timespec="seconds")


def args_dict(a: argparse.Namespace) -> dict[str, str]:
    """The parsed command line, every value as a string (for the results file)."""
    return {k: str(v) for k, v in vars(a).items()}


def machine() -> dict:
    import platform

    return {"cpus": os.cpu_count(), "platform": platform.platform()}


def write_json(path: Path, doc: Any, *, indent: int = 2, newline: bool = True) -> None:
    """Writes doc as JSON to path (its directory created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent) + ("\n" if newline else ""))


def version(argv: list[str]) -> str:
    """The first line `argv` (e.g. [tool, '--version']) prints, or 'unavailable'."""
    import subprocess

    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unavailable"


def git_commit() -> str | None:
    """HEAD of this checkout, for the results file."""
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def package_versions(python: Path, packages: Sequence[str]) -> dict[str, str]:
    """{package: version or 'not-installed'} as the interpreter `python` sees them ({} if it is missing)."""
    import subprocess

    if not python.exists():
        return {}
    probe = (
        "import importlib.metadata as m\n"
        f"for p in {tuple(packages)!r}:\n"
        "    try: print(p, m.version(p))\n"
        "    except m.PackageNotFoundError: print(p, 'not-installed')\n"
    )
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    env = {}
    for line in out.stdout.splitlines():
        k, v = line.split()
        env[k] = v
    return env


def environment(tools: dict[str, list[str] | None] | None = None, *, extra: dict | None = None,
                python: Path | None = None, packages: Sequence[str] = ()) -> dict:
    """The machine and software of a run: host, kernel, cpus, python, then each tool's
    version (`tools`: name -> argv, None for 'unavailable'), `extra`, the packages of the
    venv's `python`, and the git commit."""
    import platform

    env: dict = {
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    for name, argv in (tools or {}).items():
        env[name] = version(argv) if argv else "unavailable"
    env.update(extra or {})
    if python is not None and packages:
        env.update(package_versions(python, packages))
    commit = git_commit()
    if commit:
        env["git_commit"] = commit
    return env


# ---------------------------------------------------------------- child processes


class ChildResult:
    """What run_child measured of one child process."""

    def __init__(self, returncode: int, wall_s: float, cpu_s: float, maxrss_mib: float, stdout: str, stderr: str,
                 peak_rss: int = 0, peak_pss: int = 0) -> None:
        self.returncode = returncode
        self.wall_s = wall_s
        self.cpu_s = cpu_s  # user + sys of the child and the descendants it waited for
        self.maxrss_mib = maxrss_mib  # wait4's ru_maxrss: the largest single process of the tree
        self.stdout = stdout
        self.stderr = stderr
        self.peak_rss = peak_rss  # bytes, summed over the process tree, max over time (sample_memory)
        self.peak_pss = peak_pss  # the same for PSS


_live_children: set[int] = set()


def track_child(pid: int) -> None:
    """Registers a child for kill_live_children (a daemon started by hand)."""
    _live_children.add(pid)


def untrack_child(pid: int) -> None:
    _live_children.discard(pid)


def kill_live_children() -> None:
    """SIGKILLs every child still running (a harness interrupted mid-rep)."""
    import signal

    for pid in list(_live_children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def proc_tree(pid: int) -> list[int]:
    """pid and its descendants, from /proc/PID/task/*/children."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return seen


def proc_mem(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in bytes, from /proc/PID/smaps_rollup ((0, 0) if gone)."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


def proc_cpu_s(pid: int) -> float:
    """user + sys CPU seconds of one running process (/proc/PID/stat; OSError if gone)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_tree_cpu_s(pid: int) -> float:
    """CPU used so far by pid and its descendants, from /proc (for a process we must not
    reap, such as the test server); NaN if pid is gone."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (ppid, cpu seconds)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            stats[int(d.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, IndexError, ValueError):
            continue
    if pid not in stats:
        return float("nan")
    tree, total, frontier = {pid}, 0.0, [pid]
    while frontier:
        p = frontier.pop()
        total += stats[p][1]
        for child, (ppid, _cpu) in stats.items():
            if ppid == p and child not in tree:
                tree.add(child)
                frontier.append(child)
    return total


def proc_status_mib(pid: int | str, field: str) -> float:
    """A kB field of /proc/PID/status (e.g. VmRSS, VmHWM; pid 'self') in MiB; NaN if absent."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def run_child(argv: list[str], env: dict[str, str], timeout: float, *, sample_memory: bool = False,
              interval: float = 0.05) -> ChildResult:
    """Runs argv to its end (killed after `timeout` s) and reaps it with wait4, so its
    rusage is its own (not the test server's, also our child).

    With `sample_memory`, the summed RSS and PSS of its whole process tree are sampled
    every `interval` s, or less often where a sample is costly (the sampler uses at most
    2% of a core) (peak_rss, peak_pss). A timeout leaves exit status 124 (if it had
    none) and a note at the end of stderr. ContenderError if argv cannot be started."""
    import subprocess

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        except OSError as e:
            raise ContenderError(f"cannot run {argv[0]}: {e}") from e
        _live_children.add(proc.pid)
        peak = [0, 0]
        done = threading.Event()
        sampler = None
        if sample_memory:
            def sample() -> None:
                while not done.is_set():
                    t = time.perf_counter()
                    rss = pss = 0
                    for p in proc_tree(proc.pid):
                        r, s = proc_mem(p)
                        rss, pss = rss + r, pss + s
                    peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
                    # The kernel walks every page table of the tree for smaps_rollup: for
                    # Ray's processes (each mapping the object store) one sample costs
                    # milliseconds, and every 50 ms it took a tenth of 2 cores from the
                    # contender. At most 2% of a core goes to sampling.
                    done.wait(max(interval, 50 * (time.perf_counter() - t)))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
        box: dict[str, object] = {}

        def reap() -> None:
            box["r"] = os.wait4(proc.pid, 0)
            box["t"] = time.perf_counter()

        waiter = threading.Thread(target=reap, daemon=True)
        waiter.start()
        waiter.join(timeout)
        if waiter.is_alive():
            proc.kill()
            waiter.join()
        done.set()
        if sampler is not None:
            sampler.join()
        _live_children.discard(proc.pid)
        _pid, status, ru = box["r"]  # type: ignore[misc]
        proc.returncode = os.waitstatus_to_exitcode(status)  # stop Popen from reaping again
        wall = box["t"] - t0  # type: ignore[operator]
        out.seek(0)
        err.seek(0)
        rc = proc.returncode
        stderr = err.read().decode(errors="replace")
        if wall >= timeout:
            rc = 124 if rc == 0 else rc
            stderr += f"\n[harness] killed after {timeout:.0f} s timeout"
        return ChildResult(
            returncode=rc,
            wall_s=wall,
            cpu_s=ru.ru_utime + ru.ru_stime,
            maxrss_mib=ru.ru_maxrss / 1024,  # KiB on Linux
            stdout=out.read().decode(errors="replace"),
            stderr=stderr,
            peak_rss=peak[0],
            peak_pss=peak[1],
        )


def wait_rusage(proc: subprocess.Popen, timeout: float, *, kill: bool = False):
    """Waits up to `timeout` s for proc (started by hand, e.g. a mount daemon) with wait4;
    its rusage once it has exited, else None (with `kill`, a positive timeout ends in
    SIGKILL and its rusage). None too if it was reaped before."""
    if proc.returncode is not None:
        return None
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            _live_children.discard(proc.pid)
            return ru
        if time.monotonic() >= deadline:
            if not kill or timeout <= 0:
                return None
            proc.kill()
            _pid, status, ru = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            _live_children.discard(proc.pid)
            return ru
        time.sleep(0.02)


def tail(text: str, n: int = 1500) -> str:
    """The last n characters of text, stripped ('...' in front when cut)."""
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def last_json(stdout: str) -> dict:
    """The last line of stdout that is a JSON object (what a peer or `stoker ... --json` printed)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    raise ContenderError(f"no JSON result on stdout: {tail(stdout, 500)!r}")


def check(child: ChildResult, what: str, n: int = 1500) -> None:
    """ContenderError unless the child exited 0 (with the end of its stderr, else stdout)."""
    if child.returncode != 0:
        raise ContenderError(f"{what} exited with {child.returncode}: {tail(child.stderr or child.stdout, n)}")


# ---------------------------------------------------------------- mounts


def is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def mounted_under(path: Path) -> list[str]:
    """Mount points at or below path."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return [m for m in points if m == str(path) or m.startswith(str(path) + "/")]


def unmount(path: Path) -> None:
    """fusermount3 -u, fusermount -u, umount, umount -l: until it is no longer mounted."""
    import subprocess

    for argv in (["fusermount3", "-u", str(path)], ["fusermount", "-u", str(path)], ["umount", str(path)],
                 ["umount", "-l", str(path)]):
        if not is_mounted(path):
            return
        if shutil.which(argv[0]):
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---------------------------------------------------------------- files


def write_atomic(path: str | Path, write: Callable[[str], None]) -> None:
    """write(tmp) writes a temporary file next to path, which then replaces path."""
    tmp = f"{path}.tmp{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)


def warm_page_cache(paths: Iterable[Path]) -> None:
    """Reads every file once, so the server answers from memory for every contender."""
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(16 * MIB):
                pass


# ---------------------------------------------------------------- the S3 test server


def client_env(work: Path) -> dict[str, str]:
    """This environment without proxies and AWS_* variables, plus the test server's keys and
    region, plain HTTP allowed, and AWS config files that do not exist (under `work`)."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_REGION=REGION,
        AWS_DEFAULT_REGION=REGION,
        AWS_ALLOW_HTTP="true",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(work / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(work / "no-aws-credentials"),
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


class Server:
    """stoker-testserver as our child: started, its endpoint read from its first stdout line."""

    def __init__(self, argv: list[str], log_path: Path, ready_timeout: float = 60.0):
        import subprocess

        self.log_path = log_path
        self.log_file = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log_file, stdin=subprocess.DEVNULL)
        self.endpoint = ""
        box: dict[str, str] = {}

        def read() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").strip()
                if line.startswith("STOKER_TESTSERVER_ENDPOINT="):
                    box["endpoint"] = line.split("=", 1)[1]
                    break
            # Keep draining so the server never blocks on a full pipe.
            for _ in self.proc.stdout:
                pass

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + ready_timeout
        while "endpoint" not in box:
            if self.proc.poll() is not None:
                self.log_file.close()
                raise HarnessError(f"test server exited with {self.proc.returncode}; log: {log_path}\n"
                                   f"{tail(log_path.read_text(errors='replace'))}")
            if time.monotonic() > deadline:
                self.stop()
                raise HarnessError(f"test server printed no STOKER_TESTSERVER_ENDPOINT line within "
                                   f"{ready_timeout:.0f} s; log: {log_path}")
            time.sleep(0.02)
        self.endpoint = box["endpoint"].rstrip("/")

    @classmethod
    def start(cls, binary: Path | str, root: Path | str, latency_ms: float, log_path: Path,
              extra: Sequence[str] = ()) -> "Server":
        """`binary --root ROOT --host 127.0.0.1 --port 0 --latency-ms L` with the harness's keys, plus `extra`."""
        argv = [str(binary), "--root", str(root), "--host", "127.0.0.1", "--port", "0",
                "--latency-ms", f"{latency_ms:g}", "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY,
                *extra]
        return cls(argv, log_path)

    def cpu_s(self) -> float:
        """CPU used so far by the server and its descendants, from /proc (we must not reap them)."""
        return proc_tree_cpu_s(self.proc.pid)

    def check_alive(self) -> None:
        """HarnessError if the server has exited."""
        if self.proc.poll() is not None:
            raise HarnessError(f"test server died (exit {self.proc.returncode}); log {self.log_path}")

    def stop(self) -> None:
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


# ---------------------------------------------------------------- command line

_COMMON_ARGS: dict[str, dict] = {
    "--reps": dict(type=int, help="repetitions of every contender (the median is reported)"),
    "--only": dict(help="comma-separated contenders (default: all)"),
    "--out": dict(type=Path, help="JSON results file"),
    "--timeout": dict(type=float, help="seconds before one rep of one contender is killed"),
    "--latency-ms": dict(type=float, help="latency the test server adds to each request"),
    "--python": dict(type=Path, help="the Python of the venv made by bench/setup.sh (the peers run in it)"),
    "--venv": dict(type=Path, help="venv made by bench/setup.sh"),
    "--server": dict(type=Path, help="stoker-testserver binary"),
    "--stoker": dict(type=Path, help="stoker binary"),
    "--no-build": dict(action="store_true", help="do not run cargo build --release"),
}


def add_arg(p: argparse.ArgumentParser, flag: str, default: Any = None, **overrides) -> None:
    """Adds one of the flags the benchmarks share (--reps, --only, --out, --timeout,
    --latency-ms, --python, --venv, --server, --stoker, --no-build) with its usual type and
    help; `overrides` replace either (e.g. help=...)."""
    kw = {**_COMMON_ARGS[flag], **overrides}
    if kw.get("action") != "store_true":
        kw["default"] = default
    p.add_argument(flag, **kw)


def pick(text: str, known: Iterable[str], error: Callable[[str], Any], *, what: str = "contender",
         aliases: dict[str, str] | None = None, default: Iterable[str] | None = None,
         keep_order: bool = False) -> list[str]:
    """The names of a comma-separated list (e.g. --only), aliases resolved, each checked
    against `known` (else error(message), e.g. ArgumentParser.error). Empty: `default`
    (None: all of `known`). In the order of `known`, or with keep_order as given."""
    known = list(known)
    aliases = aliases or {}
    names = [aliases.get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
    if not names:
        names = list(known if default is None else default)
    bad = [n for n in names if n not in known]
    if bad:
        error(f"unknown {what}(s) {bad}; choose from {known}")
    return names if keep_order else [n for n in known if n in names]


def release_bin(name: str, target_dir: Path | None = None) -> Path:
    """<target>/release/<name>; target: target_dir, else $CARGO_TARGET_DIR, else ./target
    (relative to the repository root)."""
    target = target_dir or Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    if not target.is_absolute():
        target = REPO / target
    return target / "release" / name


def cargo_build(log: Callable[[str], None], packages: Sequence[str] = ("stoker", "stoker-testserver")) -> None:
    """cargo build --release -p ... in the repository; HarnessError if it fails."""
    import subprocess

    argv = ["cargo", "build", "--release", *[x for p in packages for x in ("-p", p)]]
    log(" ".join(argv))
    if subprocess.run(argv, cwd=REPO).returncode != 0:
        raise HarnessError("cargo build failed (use --no-build with --stoker/--server to use existing binaries)")


def cache_bytecode() -> None:
    """Writes this module's bytecode to bench/__pycache__ (gitignored) unless it is up to date,
    even under PYTHONDONTWRITEBYTECODE: the peers import this module and their peak RSS is
    measured; compiling it from source would add about 2 MiB to a small reader's peak."""
    try:
        from importlib.util import cache_from_source

        pyc = cache_from_source(__file__)
        if os.path.exists(pyc) and os.stat(pyc).st_mtime >= os.stat(__file__).st_mtime:
            return
        import py_compile

        py_compile.compile(__file__, cfile=pyc, doraise=True)
    except Exception:  # noqa: BLE001 - a read-only checkout: the peers compile it themselves
        pass


def run_main(main: Callable[[], int | None], log: Callable[[str], None] | None = None) -> None:
    """sys.exit(main()), with SIGTERM turned into exit 143 (so `finally` blocks stop the
    server and the children), a HarnessError logged and exit 2, Ctrl-C exit 130. First
    cache_bytecode()."""
    import signal

    cache_bytecode()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        code = main()
    except HarnessError as e:
        (log or logger("bench"))(f"harness error: {e}")
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


# ---------------------------------------------------------------- the peer side


def cpu_self() -> float:
    """user + sys CPU seconds this process has used."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def emit(obj: dict) -> None:
    """The one JSON line a peer program prints on stdout (the harness reads it with last_json)."""
    print(json.dumps(obj), flush=True)


class Timer:
    """Marks the start of a peer's timed part: the CPU and RSS it had used before (interpreter
    start-up, imports, client construction), which the harness subtracts."""

    def __init__(self) -> None:
        self.startup_cpu_s = 0.0
        self.startup_rss_mib = 0.0
        self.t0 = 0.0

    def start(self) -> None:
        self.startup_rss_mib = proc_status_mib("self", "VmRSS")
        self.startup_cpu_s = cpu_self()
        self.t0 = time.perf_counter()

    def seconds(self) -> float:
        """Seconds since start()."""
        return time.perf_counter() - self.t0

    def report(self, objects: int, nbytes: int, **extra) -> None:
        """emit()s objects, bytes, seconds, startup_cpu_s, phase_cpu_s, startup_rss_mib and `extra`."""
        seconds = self.seconds()
        out = {
            "objects": objects,
            "bytes": nbytes,
            "seconds": seconds,
            "startup_cpu_s": self.startup_cpu_s,
            "phase_cpu_s": cpu_self() - self.startup_cpu_s,
            "startup_rss_mib": self.startup_rss_mib,
        }
        out.update(extra)
        emit(out)


def boto3_client(endpoint: str, pool: int = 32, *, keys: bool = True, region: str = REGION, **config):
    """A boto3 S3 client of `endpoint` with `pool` connections; `keys`: the test server's
    keys (else from the environment); `config`: more botocore Config settings."""
    import boto3
    from botocore.config import Config

    creds = {"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY} if keys else {}
    return boto3.client("s3", endpoint_url=endpoint, region_name=region,
                        config=Config(max_pool_connections=pool, **config), **creds)
