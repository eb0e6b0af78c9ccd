#!/usr/bin/env python3
"""Storage read benchmark: Stoker against its peers, on one S3-compatible test server.

One command:

    python3 bench/storage.py [--reps 3] [--small 2000] [--large-mib 1024] [--latency-ms 10]
                             [--only stoker,ceiling,...] [--workloads small,large]
                             [--out bench/results/storage.json]

It builds `stoker` and `stoker-testserver` (release; `--no-build` skips that),
generates the data set once in a cache directory, starts the test server with
injected per-request latency, runs every contender `--reps` times on each
workload in the same run, verifies every rep read exactly the data set's bytes,
prints a table and writes a JSON file. See bench/README.md.

Workloads (bucket `bench`):
  small  N objects of ~110 KB (random sizes within +-10%, seeded) under `small/`
  large  one object `large/one.bin` of --large-mib MiB

Contenders:
  stoker      `stoker bench s3://bench/... --json`
  stoker-keys the same, given the small objects' key list (`--keys FILE`) as curl is: no
              listing (large: the object's lookup is not timed either)
  ceiling     curl with SigV4: all GETs in parallel (64 in flight) from a known key list
              (no listing); the large object as 16 concurrent 8 MiB ranged GETs
  boto3       boto3 in a thread pool (32 threads; large: 8 MiB ranged GETs in 16 threads)
  s3torch     Amazon's S3 connector for PyTorch: S3MapDataset items read by 32 threads
              (large: the default sequential reader, one GET split by the CRT into 8 MiB parts)
  s3torch-client  the same through its Rust client (MountpointS3Client) alone, without torch
  s3fs        s3fs-fuse mount, default options, read by 16 threads (large: one sequential
              reader with a 16 MiB buffer)
  s3fs-tuned  the same with -o parallel_count=16,multipart_size=8

Exit status: 0 when the harness ran (even if some contenders failed: they are
reported as failed, with their error), non-zero when the harness itself failed.

Standard library only; the boto3 and s3torch contenders run in the venv made by
bench/setup.sh.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

MIB = 1024 * 1024
BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
CLIENTS = BENCH_DIR / "storage_clients.py"

BUCKET = "bench"
SMALL_PREFIX = "small/"
LARGE_KEY = "large/one.bin"
SMALL_MEAN = 110_000  # bytes; sizes vary +-10% around it
ACCESS_KEY = "stoker-test"
SECRET_KEY = "stoker-test-secret"
REGION = "us-east-1"

CONTENDERS = ["stoker", "stoker-keys", "ceiling", "boto3", "s3torch", "s3torch-client", "s3fs", "s3fs-tuned"]
ALIASES = {"curl": "ceiling", "s3torchconnector": "s3torch", "s3torchconnectorclient": "s3torch-client", "s3fs-fuse": "s3fs"}
WORKLOADS = ["small", "large"]


class HarnessError(Exception):
    """The harness itself failed (as opposed to a contender)."""


class ContenderError(Exception):
    """One contender failed one rep; it is reported, the others still run."""


def log(msg: str) -> None:
    print(f"[storage-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- data set


@dataclass
class DataSet:
    root: Path  # served by the test server; each top-level directory is a bucket
    small_keys: list[str]
    small_bytes: int
    large_bytes: int


def _small_size(seed: int, i: int) -> int:
    r = random.Random(f"stoker-bench-size-{seed}-{i}")
    return int(SMALL_MEAN * (0.9 + 0.2 * r.random()))


def _write_atomic(path: Path, writer: Callable[[object], None]) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        writer(f)
    os.replace(tmp, path)


def prepare_data(cache: Path, n_small: int, large_mib: int, seed: int) -> DataSet:
    """Generates (once) a pool of objects and a server root made of hard links to them.

    Pool: cache/pool/small/NNNNNN.jpg (object i is always the same bytes for a seed)
    and cache/pool/large-<M>MiB-seed<S>.bin. Root: cache/root-s<N>-l<M>-seed<S>/bench/...
    """
    pool_small = cache / "pool" / f"small-seed{seed}"
    pool_small.mkdir(parents=True, exist_ok=True)
    names = [f"{i:06d}.jpg" for i in range(n_small)]
    sizes = [_small_size(seed, i) for i in range(n_small)]
    made = 0
    for i, (name, size) in enumerate(zip(names, sizes)):
        path = pool_small / name
        if path.is_file() and path.stat().st_size == size:
            continue
        data = random.Random(f"stoker-bench-data-{seed}-{i}").randbytes(size)
        _write_atomic(path, lambda f, d=data: f.write(d))
        made += 1
    if made:
        log(f"generated {made} small objects in {pool_small}")

    large = cache / "pool" / f"large-{large_mib}MiB-seed{seed}.bin"
    if not (large.is_file() and large.stat().st_size == large_mib * MIB):
        log(f"generating {large} ({large_mib} MiB)")
        rng = random.Random(f"stoker-bench-large-{seed}")

        def write_large(f) -> None:
            for _ in range(large_mib):
                f.write(rng.randbytes(MIB))

        _write_atomic(large, write_large)

    root = cache / f"root-s{n_small}-l{large_mib}-seed{seed}"
    marker = cache / f"root-s{n_small}-l{large_mib}-seed{seed}.ok"
    if not marker.exists():
        if root.exists():
            shutil.rmtree(root)
        tmp = cache / f"{root.name}.tmp{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / BUCKET / SMALL_PREFIX).mkdir(parents=True)
        (tmp / BUCKET / "large").mkdir(parents=True)
        for name in names:
            os.link(pool_small / name, tmp / BUCKET / SMALL_PREFIX / name)
        os.link(large, tmp / BUCKET / LARGE_KEY)
        os.replace(tmp, root)
        marker.write_text(json.dumps({"small": n_small, "large_mib": large_mib, "seed": seed}))
        log(f"server root ready: {root}")

    # Warm the page cache so the first contender does not pay for the disk.
    for path in [root / BUCKET / LARGE_KEY] + [root / BUCKET / SMALL_PREFIX / n for n in names]:
        with open(path, "rb", buffering=0) as f:
            while f.read(16 * MIB):
                pass

    return DataSet(
        root=root,
        small_keys=[SMALL_PREFIX + n for n in names],
        small_bytes=sum(sizes),
        large_bytes=large_mib * MIB,
    )


# ---------------------------------------------------------------- child processes


@dataclass
class ChildResult:
    returncode: int
    wall_s: float
    cpu_s: float  # user + sys of the child and the descendants it waited for
    maxrss_mib: float
    stdout: str
    stderr: str


_live_children: set[int] = set()


def kill_live_children() -> None:
    """SIGKILLs every child still running (a harness interrupted mid-rep)."""
    for pid in list(_live_children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_child(argv: list[str], env: dict[str, str], timeout: float) -> ChildResult:
    """Runs argv and reaps it with wait4, so its rusage is its own (not the server's)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        except OSError as e:
            raise ContenderError(f"cannot run {argv[0]}: {e}") from e
        _live_children.add(proc.pid)
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
        )


def _tail(text: str, n: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def last_json(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    raise ContenderError(f"no JSON result on stdout: {_tail(stdout, 500)!r}")


def check(child: ChildResult, what: str) -> None:
    if child.returncode != 0:
        raise ContenderError(f"{what} exited with {child.returncode}: {_tail(child.stderr or child.stdout)}")


# ---------------------------------------------------------------- test server


class Server:
    def __init__(self, argv: list[str], log_path: Path, ready_timeout: float = 60.0):
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
                raise HarnessError(f"test server exited with {self.proc.returncode}; log: {log_path}\n{_tail(log_path.read_text(errors='replace'))}")
            if time.monotonic() > deadline:
                self.stop()
                raise HarnessError(f"test server printed no STOKER_TESTSERVER_ENDPOINT line within {ready_timeout:.0f} s; log: {log_path}")
            time.sleep(0.02)
        self.endpoint = box["endpoint"].rstrip("/")

    def cpu_s(self) -> float:
        """CPU used so far by the server and its descendants, from /proc (we must not reap them)."""
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
        if self.proc.pid not in stats:
            return float("nan")
        tree, total, frontier = {self.proc.pid}, 0.0, [self.proc.pid]
        while frontier:
            pid = frontier.pop()
            total += stats[pid][1]
            for child, (ppid, _cpu) in stats.items():
                if ppid == pid and child not in tree:
                    tree.add(child)
                    frontier.append(child)
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


# ---------------------------------------------------------------- contenders


@dataclass
class Ctx:
    args: argparse.Namespace
    data: DataSet
    endpoint: str
    env: dict[str, str]
    stoker: Path
    venv_python: Path
    work: Path  # scratch directory for config files and mount points

    def expected(self, workload: str) -> tuple[int, int]:
        if workload == "small":
            return len(self.data.small_keys), self.data.small_bytes
        return 1, self.data.large_bytes


@dataclass
class Rep:
    """What one contender measured in one rep (a successful one)."""

    seconds: float  # time reading, from first request to last byte (see README)
    process_wall_s: float
    client_cpu_s: float
    peak_rss_mib: float
    objects: int
    bytes: int
    server_cpu_s: float = float("nan")
    extra: dict = field(default_factory=dict)


def c_stoker(ctx: Ctx, workload: str, keys: bool = False) -> Rep:
    url = f"s3://{BUCKET}/{SMALL_PREFIX}" if workload == "small" else f"s3://{BUCKET}/{LARGE_KEY}"
    argv = [str(ctx.stoker), "bench", url, "--endpoint", ctx.endpoint, "--json", *ctx.args.stoker_arg]
    if keys and workload == "small":
        key_file = ctx.work / "small-keys.txt"
        key_file.write_text("".join(k[len(SMALL_PREFIX):] + "\n" for k in ctx.data.small_keys))
        argv += ["--keys", str(key_file)]
    child = run_child(argv, ctx.env, ctx.args.timeout)
    check(child, "stoker bench")
    res = last_json(child.stdout)
    # `seconds` is the first epoch's reads. A prefix's listing runs during them and is in
    # it; one object's lookup is not: add it (unless given the keys, as curl is, in
    # which case the lookup is not part of the work), so stoker is timed like the others:
    # first request to last byte.
    seconds = float(res["seconds"]) + (0.0 if keys else float(res.get("list_seconds", 0.0)))
    return Rep(
        seconds=seconds,
        process_wall_s=child.wall_s,
        client_cpu_s=child.cpu_s,
        peak_rss_mib=child.maxrss_mib,
        objects=int(res["objects"]),
        bytes=int(res["bytes"]),
        extra={k: v for k, v in res.items() if k not in ("objects", "bytes", "seconds")},
    )


def c_stoker_keys(ctx: Ctx, workload: str) -> Rep:
    return c_stoker(ctx, workload, keys=True)


def _curl_block(url: str, out_range: str | None) -> str:
    lines = [
        f'url = "{url}"',
        'output = "/dev/null"',
        f'user = "{ACCESS_KEY}:{SECRET_KEY}"',
        f'aws-sigv4 = "aws:amz:{REGION}:s3"',
        # S3 servers require this header; curl before 8.x does not send it by itself.
        'header = "x-amz-content-sha256: UNSIGNED-PAYLOAD"',
        r'write-out = "%{http_code} %{size_download}\n"',
        "silent",
        "show-error",
    ]
    if out_range:
        lines.append(f'range = "{out_range}"')
    return "\n".join(lines) + "\n"


def c_ceiling(ctx: Ctx, workload: str) -> Rep:
    base = f"{ctx.endpoint}/{BUCKET}/"
    if workload == "small":
        blocks = [_curl_block(base + key, None) for key in ctx.data.small_keys]
        parallel, want_code = ctx.args.ceiling_parallel, "200"
    else:
        part = 8 * MIB
        size = ctx.data.large_bytes
        blocks = [_curl_block(base + LARGE_KEY, f"{s}-{min(s + part, size) - 1}") for s in range(0, size, part)]
        parallel, want_code = 16, "206"
    cfg = ctx.work / f"curl-{workload}.cfg"
    cfg.write_text("next\n".join(blocks))
    argv = ["curl", "--parallel", "--parallel-max", str(parallel), "--parallel-immediate", "-K", str(cfg)]
    child = run_child(argv, ctx.env, ctx.args.timeout)
    check(child, "curl")
    codes: dict[str, int] = {}
    nbytes = 0
    lines = [ln.split() for ln in child.stdout.splitlines() if ln.strip()]
    for fields in lines:
        codes[fields[0]] = codes.get(fields[0], 0) + 1
        nbytes += int(fields[1])
    if set(codes) != {want_code} or len(lines) != len(blocks):
        raise ContenderError(f"curl: expected {len(blocks)} x HTTP {want_code}, got {codes}")
    return Rep(
        seconds=child.wall_s,
        process_wall_s=child.wall_s,
        client_cpu_s=child.cpu_s,
        peak_rss_mib=child.maxrss_mib,
        objects=len(blocks) if workload == "small" else 1,
        bytes=nbytes,
        extra={"requests": len(blocks), "parallel": parallel},
    )


def _python_client(ctx: Ctx, python: Path, program: str, extra_args: list[str], workload: str) -> Rep:
    if not python.exists():
        raise ContenderError(f"{python} not found: run bench/setup.sh")
    argv = [str(python), str(CLIENTS), program, *extra_args]
    child = run_child(argv, ctx.env, ctx.args.timeout)
    check(child, program)
    res = last_json(child.stdout)
    return Rep(
        seconds=float(res["seconds"]),
        process_wall_s=child.wall_s,
        client_cpu_s=child.cpu_s - float(res.get("startup_cpu_s", 0.0)),
        peak_rss_mib=child.maxrss_mib,
        objects=int(res["objects"]),
        bytes=int(res["bytes"]),
        extra={k: v for k, v in res.items() if k not in ("objects", "bytes", "seconds")},
    )


def _s3_args(workload: str, small_threads: int, large_threads: int | None) -> list[str]:
    if workload == "small":
        return ["--bucket", BUCKET, "--prefix", SMALL_PREFIX, "--threads", str(small_threads)]
    args = ["--bucket", BUCKET, "--key", LARGE_KEY, "--part-size", str(8 * MIB)]
    if large_threads:
        args += ["--threads", str(large_threads)]
    return args


def c_boto3(ctx: Ctx, workload: str) -> Rep:
    return _python_client(
        ctx, ctx.venv_python, f"boto3-{workload}", ["--endpoint", ctx.endpoint, *_s3_args(workload, 32, 16)], workload
    )


def c_s3torch(ctx: Ctx, workload: str) -> Rep:
    return _python_client(
        ctx, ctx.venv_python, f"s3torch-{workload}",
        ["--endpoint", ctx.endpoint, "--api", "dataset", *_s3_args(workload, 32, None)], workload,
    )


def c_s3torch_client(ctx: Ctx, workload: str) -> Rep:
    return _python_client(
        ctx, ctx.venv_python, f"s3torch-{workload}",
        ["--endpoint", ctx.endpoint, "--api", "client", *_s3_args(workload, 32, None)], workload,
    )


def _is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def _unmount(path: Path) -> None:
    for argv in (["fusermount3", "-u", str(path)], ["fusermount", "-u", str(path)], ["umount", str(path)], ["umount", "-l", str(path)]):
        if not _is_mounted(path):
            return
        if shutil.which(argv[0]):
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _reap(proc: subprocess.Popen, timeout: float):
    """Waits up to `timeout` s for proc with wait4; its rusage, or None if still running (or reaped before)."""
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
            return ru
        if time.monotonic() >= deadline:
            if timeout <= 0:
                return None
            proc.kill()
            _pid, status, ru = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return ru
        time.sleep(0.02)


def _s3fs(ctx: Ctx, workload: str, tuned: bool) -> Rep:
    if not shutil.which("s3fs"):
        raise ContenderError("s3fs not installed: run bench/setup.sh")
    passwd = ctx.work / "s3fs.passwd"
    passwd.write_text(f"{ACCESS_KEY}:{SECRET_KEY}\n")
    passwd.chmod(0o600)
    mnt = Path(tempfile.mkdtemp(prefix="s3fs-", dir=ctx.work))
    opts = [f"url={ctx.endpoint}", "use_path_request_style", f"passwd_file={passwd}", f"endpoint={REGION}"]
    if tuned:
        opts += ["parallel_count=16", "multipart_size=8"]
    # -f: stay in the foreground as our child, so wait4 gives its CPU and peak RSS.
    argv = ["s3fs", BUCKET, str(mnt), "-f", "-o", ",".join(opts)]
    log_path = ctx.work / f"s3fs-{workload}.log"
    with open(log_path, "wb") as s3fs_log:
        proc = subprocess.Popen(argv, stdout=s3fs_log, stderr=s3fs_log, stdin=subprocess.DEVNULL, env=ctx.env)
    _live_children.add(proc.pid)
    reader: ChildResult | None = None
    res: dict = {}
    try:
        deadline = time.monotonic() + 30
        while not _is_mounted(mnt):
            if _reap(proc, 0) is not None:
                raise ContenderError(f"s3fs exited with {proc.returncode}: {_tail(log_path.read_text(errors='replace'))}")
            if time.monotonic() > deadline:
                raise ContenderError(f"s3fs did not mount within 30 s: {_tail(log_path.read_text(errors='replace'))}")
            time.sleep(0.05)
        if workload == "small":
            prog = ["fs-small", "--dir", str(mnt / SMALL_PREFIX.rstrip("/")), "--threads", "16"]
        else:
            prog = ["fs-large", "--file", str(mnt / LARGE_KEY), "--buffer", str(16 * MIB)]
        reader = run_child([sys.executable, str(CLIENTS), *prog], ctx.env, ctx.args.timeout)
        check(reader, f"reader over s3fs ({log_path})")
        res = last_json(reader.stdout)
    finally:
        _unmount(mnt)
        ru = _reap(proc, 15)
        _live_children.discard(proc.pid)
        try:
            mnt.rmdir()
        except OSError:
            pass
    assert reader is not None
    if ru is None:
        raise ContenderError("s3fs: could not collect the daemon's resource usage")
    assert reader is not None and ru is not None
    s3fs_cpu = ru.ru_utime + ru.ru_stime
    s3fs_rss = ru.ru_maxrss / 1024
    return Rep(
        seconds=float(res["seconds"]),
        process_wall_s=reader.wall_s,
        client_cpu_s=(reader.cpu_s - float(res.get("startup_cpu_s", 0.0))) + s3fs_cpu,
        peak_rss_mib=reader.maxrss_mib + s3fs_rss,
        objects=int(res["objects"]),
        bytes=int(res["bytes"]),
        extra={
            "s3fs_cpu_s": s3fs_cpu,
            "s3fs_rss_mib": s3fs_rss,
            "reader_rss_mib": reader.maxrss_mib,
            "options": ",".join(o for o in opts if not o.startswith("passwd_file")),
        },
    )


def c_s3fs(ctx: Ctx, workload: str) -> Rep:
    return _s3fs(ctx, workload, tuned=False)


def c_s3fs_tuned(ctx: Ctx, workload: str) -> Rep:
    return _s3fs(ctx, workload, tuned=True)


RUNNERS: dict[str, Callable[[Ctx, str], Rep]] = {
    "stoker": c_stoker,
    "stoker-keys": c_stoker_keys,
    "ceiling": c_ceiling,
    "boto3": c_boto3,
    "s3torch": c_s3torch,
    "s3torch-client": c_s3torch_client,
    "s3fs": c_s3fs,
    "s3fs-tuned": c_s3fs_tuned,
}


# ---------------------------------------------------------------- results


def summarize(name: str, workload: str, reps: list[Rep], error: str | None, expected_bytes: int) -> dict:
    out: dict = {"contender": name, "workload": workload, "ok": error is None and bool(reps), "error": error}
    out["reps"] = [
        {
            "seconds": r.seconds,
            "process_wall_s": r.process_wall_s,
            "client_cpu_s": r.client_cpu_s,
            "peak_rss_mib": r.peak_rss_mib,
            "server_cpu_s": r.server_cpu_s,
            "objects": r.objects,
            "bytes": r.bytes,
            **({"extra": r.extra} if r.extra else {}),
        }
        for r in reps
    ]
    if out["ok"]:
        sec = statistics.median(r.seconds for r in reps)
        out.update(
            seconds=sec,
            objects=reps[0].objects,
            bytes=expected_bytes,
            objects_per_s=reps[0].objects / sec,
            mib_per_s=expected_bytes / MIB / sec,
            client_cpu_s=statistics.median(r.client_cpu_s for r in reps),
            peak_rss_mib=max(r.peak_rss_mib for r in reps),
            server_cpu_s=statistics.median(r.server_cpu_s for r in reps),
            process_wall_s=statistics.median(r.process_wall_s for r in reps),
        )
    return out


def add_ratios(results: list[dict]) -> None:
    """stoker_speedup = stoker's throughput / contender's (same bytes, so = contender s / stoker s)."""
    stoker = {r["workload"]: r for r in results if r["contender"] == "stoker" and r["ok"]}
    for r in results:
        s = stoker.get(r["workload"])
        if r["ok"] and s:
            r["stoker_speedup"] = s["objects_per_s"] / r["objects_per_s"]
            if r["contender"] == "ceiling":
                r["stoker_pct_of_ceiling"] = 100.0 * s["objects_per_s"] / r["objects_per_s"]
    keyed = {r["workload"]: r for r in results if r["contender"] == "stoker-keys" and r["ok"]}
    for r in results:
        k = keyed.get(r["workload"])
        if r["ok"] and k and r["contender"] == "ceiling":
            r["stoker_keys_pct_of_ceiling"] = 100.0 * k["objects_per_s"] / r["objects_per_s"]


def table(results: list[dict]) -> str:
    head = ["contender", "workload", "median s", "objects/s", "MiB/s", "client CPU s", "peak RSS MiB", "server CPU s", "vs stoker"]
    rows = [head]
    for r in results:
        if not r["ok"]:
            err = (r["error"] or "no result").strip().splitlines()
            rows.append([r["contender"], r["workload"], "FAILED", err[0][:90] if err else "", "", "", "", "", ""])
            continue
        if r["contender"] == "stoker":
            vs = "-"
        elif r["contender"] == "ceiling" and "stoker_pct_of_ceiling" in r:
            vs = f"stoker = {r['stoker_pct_of_ceiling']:.0f}% of ceiling"
            if "stoker_keys_pct_of_ceiling" in r:
                vs += f" (stoker-keys {r['stoker_keys_pct_of_ceiling']:.0f}%)"
        elif "stoker_speedup" in r:
            vs = f"stoker {r['stoker_speedup']:.2f}x"
        else:
            vs = "n/a"
        rows.append(
            [
                r["contender"],
                r["workload"],
                f"{r['seconds']:.3f}",
                f"{r['objects_per_s']:.1f}",
                f"{r['mib_per_s']:.1f}",
                f"{r['client_cpu_s']:.2f}",
                f"{r['peak_rss_mib']:.0f}",
                f"{r['server_cpu_s']:.2f}",
                vs,
            ]
        )
    ok_rows = [row for row in rows if row[2] != "FAILED"]
    widths = [max(len(row[i]) for row in (rows if i < 3 else ok_rows)) for i in range(len(head))]
    lines = []
    for k, row in enumerate(rows):
        if row[2] == "FAILED":
            lines.append("  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3])
        else:
            lines.append("  ".join(c.rjust(widths[i]) if 2 <= i <= 7 else c.ljust(widths[i]) for i, c in enumerate(row)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unavailable"


def environment(ctx: Ctx) -> dict:
    env = {
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "curl": _version(["curl", "--version"]),
        "s3fs": _version(["s3fs", "--version"]),
        "stoker": _version([str(ctx.stoker), "--version"]),
    }
    if ctx.venv_python.exists():
        probe = (
            "import importlib.metadata as m\n"
            "for p in ('boto3','s3torchconnector','s3torchconnectorclient','torch'):\n"
            "    try: print(p, m.version(p))\n"
            "    except m.PackageNotFoundError: print(p, 'not-installed')\n"
        )
        out = subprocess.run([str(ctx.venv_python), "-c", probe], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            k, v = line.split()
            env[k] = v
    commit = git_commit()
    if commit:
        env["git_commit"] = commit
    return env


# ---------------------------------------------------------------- main


def add_common_args(p: argparse.ArgumentParser) -> None:
    """The options bench/storage.py and bench/mount.py share: data, server and binaries."""
    p.add_argument("--reps", type=int, default=3, help="repetitions per contender and workload (median reported)")
    p.add_argument("--small", type=int, default=2000, help="number of ~110 KB objects (files) in the small workloads")
    p.add_argument("--large-mib", type=int, default=1024, help="size of the large object (file) in MiB")
    p.add_argument("--latency-ms", type=float, default=10, help="latency the test server adds to each request")
    p.add_argument("--ceiling-parallel", type=int, default=64, help="curl's transfers in flight for the small objects")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("STOKER_BENCH_DATA", "/tmp/stoker-bench-data")),
                   help="cache for the generated data (reused across runs, shared by both benchmarks)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-build", action="store_true", help="do not run cargo build --release")
    p.add_argument("--target-dir", type=Path, default=None,
                   help="cargo target dir holding release/stoker and release/stoker-testserver (default: $CARGO_TARGET_DIR or ./target)")
    p.add_argument("--stoker", type=Path, default=None, help="stoker binary (default: <target>/release/stoker)")
    p.add_argument("--server", type=Path, default=None, help="test server binary (default: <target>/release/stoker-testserver)")
    p.add_argument("--server-arg", action="append", default=[], help="extra argument for the test server (repeatable)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed curl read of the data before the first rep")


def git_commit() -> str | None:
    """HEAD of this checkout, for the results file."""
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--only", default="", help=f"comma-separated contenders (default all: {','.join(CONTENDERS)})")
    p.add_argument("--workloads", default="small,large", help="comma-separated workloads: small,large")
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "storage.json", help="JSON results file")
    p.add_argument("--stoker-arg", action="append", default=[], help="extra argument for `stoker bench` (repeatable), e.g. --stoker-arg=--concurrency=64")
    p.add_argument("--venv", type=Path, default=Path(os.environ.get("STOKER_BENCH_VENV", REPO / ".venv-bench")),
                   help="venv with boto3 and s3torchconnector (bench/setup.sh makes it)")
    p.add_argument("--timeout", type=float, default=600, help="seconds before one rep of one contender is killed")
    a = p.parse_args(argv)
    names = [ALIASES.get(n.strip(), n.strip()) for n in a.only.split(",") if n.strip()] or list(CONTENDERS)
    bad = [n for n in names if n not in RUNNERS]
    if bad:
        p.error(f"unknown contender(s) {bad}; choose from {CONTENDERS}")
    a.contenders = [n for n in CONTENDERS if n in names]
    a.workload_list = [w.strip() for w in a.workloads.split(",") if w.strip()]
    bad = [w for w in a.workload_list if w not in WORKLOADS]
    if bad:
        p.error(f"unknown workload(s) {bad}; choose from {WORKLOADS}")
    if a.reps < 1 or a.small < 1 or a.large_mib < 1:
        p.error("--reps, --small and --large-mib must be positive")
    return a


def client_env(work: Path) -> dict[str, str]:
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


def preflight(ctx: Ctx) -> None:
    """One signed GET with curl: the server answers and accepts our credentials."""
    url = f"{ctx.endpoint}/{BUCKET}/{ctx.data.small_keys[0]}"
    out = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--user", f"{ACCESS_KEY}:{SECRET_KEY}",
         "--aws-sigv4", f"aws:amz:{REGION}:s3", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", url],
        capture_output=True, text=True, env=ctx.env, timeout=60,
    )
    if out.stdout.strip() != "200":
        raise HarnessError(f"preflight GET {url} answered {out.stdout.strip() or '-'} {out.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    target = a.target_dir or Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    if not target.is_absolute():
        target = REPO / target
    stoker = a.stoker or target / "release" / "stoker"
    server_bin = a.server or target / "release" / "stoker-testserver"

    if not a.no_build:
        log("cargo build --release -p stoker -p stoker-testserver")
        r = subprocess.run(["cargo", "build", "--release", "-p", "stoker", "-p", "stoker-testserver"], cwd=REPO)
        if r.returncode != 0:
            raise HarnessError("cargo build failed (use --no-build with --stoker/--server to use existing binaries)")
    if not server_bin.exists():
        raise HarnessError(f"test server binary not found: {server_bin}")
    if "stoker" in a.contenders and not stoker.exists():
        log(f"warning: {stoker} not found; the stoker contender will fail")

    a.data_dir.mkdir(parents=True, exist_ok=True)
    data = prepare_data(a.data_dir, a.small, a.large_mib, a.seed)
    log(f"data: {len(data.small_keys)} small objects ({data.small_bytes / MIB:.1f} MiB), large {data.large_bytes / MIB:.0f} MiB, root {data.root}")

    work = Path(tempfile.mkdtemp(prefix="stoker-bench-"))
    server = None
    try:
        server_argv = [str(server_bin), "--root", str(data.root), "--host", "127.0.0.1", "--port", "0",
                       "--latency-ms", f"{a.latency_ms:g}", "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY,
                       *a.server_arg]
        server = Server(server_argv, work / "server.log")
        log(f"test server at {server.endpoint} (latency {a.latency_ms:g} ms), log {work / 'server.log'}")
        ctx = Ctx(args=a, data=data, endpoint=server.endpoint, env=client_env(work), stoker=stoker,
                  venv_python=a.venv / "bin" / "python", work=work)
        preflight(ctx)

        if not a.no_warmup:
            # One untimed read of every workload by the ceiling client: the data is in
            # the page cache and the server's ETag cache is filled before anyone is timed,
            # so the first contender of the first rep does not pay for a cold start.
            for w in a.workload_list:
                log(f"warm-up: {w} (untimed)")
                c_ceiling(ctx, w)
        reps: dict[tuple[str, str], list[Rep]] = {(c, w): [] for c in a.contenders for w in a.workload_list}
        errors: dict[tuple[str, str], str] = {}
        for rep in range(a.reps):
            for w in a.workload_list:
                n_exp, b_exp = ctx.expected(w)
                # Rotate who goes first each rep: on a shared machine, running right
                # after another contender (or first) is not the same, and a fixed order
                # would bias the medians.
                k = rep % len(a.contenders)
                for c in a.contenders[k:] + a.contenders[:k]:
                    if (c, w) in errors:
                        continue
                    cpu0 = server.cpu_s()
                    try:
                        r = RUNNERS[c](ctx, w)
                        if r.bytes != b_exp or r.objects != n_exp:
                            raise ContenderError(f"read {r.objects} objects / {r.bytes} bytes, expected {n_exp} / {b_exp}")
                    except HarnessError:
                        raise
                    except Exception as e:  # a contender's failure, whatever it is, is reported
                        if not isinstance(e, ContenderError):
                            e = ContenderError(f"{type(e).__name__}: {e}")
                        errors[(c, w)] = str(e)
                        log(f"rep {rep + 1}/{a.reps} {c:10s} {w:5s} FAILED: {_tail(str(e), 400)}")
                        continue
                    r.server_cpu_s = server.cpu_s() - cpu0
                    reps[(c, w)].append(r)
                    log(f"rep {rep + 1}/{a.reps} {c:10s} {w:5s} {r.seconds:8.3f} s  cpu {r.client_cpu_s:6.2f} s  "
                        f"rss {r.peak_rss_mib:6.0f} MiB  server cpu {r.server_cpu_s:6.2f} s")
                    if server.proc.poll() is not None:
                        raise HarnessError(f"test server died (exit {server.proc.returncode}); log {work / 'server.log'}")

        results = [summarize(c, w, reps[(c, w)], errors.get((c, w)), ctx.expected(w)[1])
                   for w in a.workload_list for c in a.contenders]
        add_ratios(results)
        doc = {
            "benchmark": "storage",
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": {
                "reps": a.reps, "small_objects": a.small, "small_bytes": data.small_bytes,
                "large_mib": a.large_mib, "latency_ms": a.latency_ms, "seed": a.seed,
                "endpoint": server.endpoint, "stoker_args": a.stoker_arg, "server_args": a.server_arg,
            },
            "environment": environment(ctx),
            "definitions": {
                "seconds": "median over reps of the client's read time (first request, listing included, to last byte; "
                           "interpreter start-up excluded for Python clients; curl: process wall time)",
                "client_cpu_s": "median user+sys CPU of the client process tree (wait4), less interpreter start-up; "
                                "s3fs: reader + s3fs daemon",
                "peak_rss_mib": "max over reps of the client's peak RSS (s3fs: reader + daemon)",
                "server_cpu_s": "median CPU the test server used during the rep",
                "stoker_speedup": "stoker objects/s / contender objects/s (same workload, same bytes)",
                "stoker_pct_of_ceiling": "stoker objects/s as a percentage of the ceiling's (curl)",
                "stoker_keys_pct_of_ceiling": "the same for stoker-keys: stoker given the key list curl is given (no listing)",
            },
            "results": results,
        }
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=2) + "\n")
        print()
        print(f"storage benchmark: {a.small} x ~110 KB objects, one {a.large_mib} MiB object, "
              f"{a.latency_ms:g} ms server latency, median of {a.reps} rep(s), {os.cpu_count()} CPUs")
        print(table(results))
        print(f"\nresults: {a.out}")
        return 0
    finally:
        # Interrupted mid-rep: unmount what is still mounted, then stop what still runs.
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f if line.split()[1].startswith(str(work) + "/")]
        for mnt in mounts:
            _unmount(Path(mnt))
        kill_live_children()
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        sys.exit(main())
    except HarnessError as e:
        log(f"harness error: {e}")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
