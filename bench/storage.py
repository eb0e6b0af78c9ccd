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
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402  (the loop, child processes, test server, tables: bench/harness.py)
from harness import ACCESS_KEY, MIB, REGION, SECRET_KEY, ContenderError, HarnessError  # noqa: E402

BENCH_DIR = H.BENCH_DIR
REPO = H.REPO
CLIENTS = BENCH_DIR / "storage_clients.py"

BUCKET = "bench"
SMALL_PREFIX = "small/"
LARGE_KEY = "large/one.bin"
SMALL_MEAN = 110_000  # bytes; sizes vary +-10% around it

CONTENDERS = ["stoker", "stoker-keys", "ceiling", "boto3", "s3torch", "s3torch-client", "s3fs", "s3fs-tuned"]
ALIASES = {"curl": "ceiling", "s3torchconnector": "s3torch", "s3torchconnectorclient": "s3torch-client", "s3fs-fuse": "s3fs"}
WORKLOADS = ["small", "large"]

log = H.logger("storage-bench")


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
        H.write_atomic(path, lambda tmp, d=data: Path(tmp).write_bytes(d))
        made += 1
    if made:
        log(f"generated {made} small objects in {pool_small}")

    large = cache / "pool" / f"large-{large_mib}MiB-seed{seed}.bin"
    if not (large.is_file() and large.stat().st_size == large_mib * MIB):
        log(f"generating {large} ({large_mib} MiB)")
        rng = random.Random(f"stoker-bench-large-{seed}")

        def write_large(tmp: str) -> None:
            with open(tmp, "wb") as f:
                for _ in range(large_mib):
                    f.write(rng.randbytes(MIB))

        H.write_atomic(large, write_large)

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
    H.warm_page_cache([root / BUCKET / LARGE_KEY] + [root / BUCKET / SMALL_PREFIX / n for n in names])

    return DataSet(
        root=root,
        small_keys=[SMALL_PREFIX + n for n in names],
        small_bytes=sum(sizes),
        large_bytes=large_mib * MIB,
    )


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
    child = H.run_child(argv, ctx.env, ctx.args.timeout)
    H.check(child, "stoker bench")
    res = H.last_json(child.stdout)
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
    child = H.run_child(argv, ctx.env, ctx.args.timeout)
    H.check(child, "curl")
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
    child = H.run_child(argv, ctx.env, ctx.args.timeout)
    H.check(child, program)
    res = H.last_json(child.stdout)
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
    H.track_child(proc.pid)
    reader: H.ChildResult | None = None
    res: dict = {}
    try:
        deadline = time.monotonic() + 30
        while not H.is_mounted(mnt):
            if H.wait_rusage(proc, 0) is not None:
                raise ContenderError(f"s3fs exited with {proc.returncode}: {H.tail(log_path.read_text(errors='replace'))}")
            if time.monotonic() > deadline:
                raise ContenderError(f"s3fs did not mount within 30 s: {H.tail(log_path.read_text(errors='replace'))}")
            time.sleep(0.05)
        if workload == "small":
            prog = ["fs-small", "--dir", str(mnt / SMALL_PREFIX.rstrip("/")), "--threads", "16"]
        else:
            prog = ["fs-large", "--file", str(mnt / LARGE_KEY), "--buffer", str(16 * MIB)]
        reader = H.run_child([sys.executable, str(CLIENTS), *prog], ctx.env, ctx.args.timeout)
        H.check(reader, f"reader over s3fs ({log_path})")
        res = H.last_json(reader.stdout)
    finally:
        H.unmount(mnt)
        ru = H.wait_rusage(proc, 15, kill=True)
        H.untrack_child(proc.pid)
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
        sec = H.median(r.seconds for r in reps)
        out.update(
            seconds=sec,
            objects=reps[0].objects,
            bytes=expected_bytes,
            objects_per_s=reps[0].objects / sec,
            mib_per_s=expected_bytes / MIB / sec,
            **H.medians(reps, "client_cpu_s"),
            **H.maxima(reps, "peak_rss_mib"),
            **H.medians(reps, "server_cpu_s", "process_wall_s"),
        )
    return out


def add_ratios(results: list[dict]) -> None:
    """stoker_speedup = stoker's throughput / contender's (same bytes, so = contender s / stoker s);
    on the ceiling's row also stoker's (and stoker-keys') throughput as a percentage of it."""
    by_workload, ceiling = (lambda r: r["workload"]), (lambda r: r["contender"] == "ceiling")
    H.add_ratios(results, rate="objects_per_s", group=by_workload, key="stoker_speedup")
    H.add_ratios(results, rate="objects_per_s", group=by_workload, key="stoker_pct_of_ceiling", which=ceiling, scale=100.0)
    H.add_ratios(results, rate="objects_per_s", group=by_workload, key="stoker_keys_pct_of_ceiling", ref="stoker-keys",
                 which=ceiling, scale=100.0)


def vs_stoker(r: dict) -> str:
    """The "vs stoker" cell of a row (storage and mount tables)."""
    if r["contender"] == "stoker":
        return "-"
    if r["contender"] == "ceiling" and "stoker_pct_of_ceiling" in r:
        vs = f"stoker = {r['stoker_pct_of_ceiling']:.0f}% of ceiling"
        if "stoker_keys_pct_of_ceiling" in r:
            vs += f" (stoker-keys {r['stoker_keys_pct_of_ceiling']:.0f}%)"
        return vs
    if "stoker_speedup" in r:
        return f"stoker {r['stoker_speedup']:.2f}x"
    return "n/a"


def table(results: list[dict]) -> str:
    head = ["contender", "workload", "median s", "objects/s", "MiB/s", "client CPU s", "peak RSS MiB", "server CPU s", "vs stoker"]
    rows: list = []
    for r in results:
        if not r["ok"]:
            rows.append(H.Span([r["contender"], r["workload"], "FAILED"], H.first_line(r["error"], 90)))
            continue
        rows.append([
            r["contender"], r["workload"], f"{r['seconds']:.3f}", f"{r['objects_per_s']:.1f}", f"{r['mib_per_s']:.1f}",
            f"{r['client_cpu_s']:.2f}", f"{r['peak_rss_mib']:.0f}", f"{r['server_cpu_s']:.2f}", vs_stoker(r),
        ])
    return H.text_table(head, rows, right=range(2, 8))


def environment(ctx: Ctx) -> dict:
    return H.environment(
        {"curl": ["curl", "--version"], "s3fs": ["s3fs", "--version"], "stoker": [str(ctx.stoker), "--version"]},
        python=ctx.venv_python, packages=("boto3", "s3torchconnector", "s3torchconnectorclient", "torch"),
    )


# ---------------------------------------------------------------- main


def add_common_args(p: argparse.ArgumentParser) -> None:
    """The options bench/storage.py and bench/mount.py share: data, server and binaries."""
    H.add_arg(p, "--reps", 3, help="repetitions per contender and workload (median reported)")
    p.add_argument("--small", type=int, default=2000, help="number of ~110 KB objects (files) in the small workloads")
    p.add_argument("--large-mib", type=int, default=1024, help="size of the large object (file) in MiB")
    H.add_arg(p, "--latency-ms", 10)
    p.add_argument("--ceiling-parallel", type=int, default=64, help="curl's transfers in flight for the small objects")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("STOKER_BENCH_DATA", "/tmp/stoker-bench-data")),
                   help="cache for the generated data (reused across runs, shared by both benchmarks)")
    p.add_argument("--seed", type=int, default=1)
    H.add_arg(p, "--no-build")
    p.add_argument("--target-dir", type=Path, default=None,
                   help="cargo target dir holding release/stoker and release/stoker-testserver (default: $CARGO_TARGET_DIR or ./target)")
    H.add_arg(p, "--stoker", help="stoker binary (default: <target>/release/stoker)")
    H.add_arg(p, "--server", help="test server binary (default: <target>/release/stoker-testserver)")
    p.add_argument("--server-arg", action="append", default=[], help="extra argument for the test server (repeatable)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed curl read of the data before the first rep")


def binaries(a: argparse.Namespace, log: Callable[[str], None] = log) -> tuple[Path, Path]:
    """(stoker, stoker-testserver) from --stoker/--server/--target-dir; builds them unless --no-build."""
    stoker = a.stoker or H.release_bin("stoker", a.target_dir)
    server_bin = a.server or H.release_bin("stoker-testserver", a.target_dir)
    if not a.no_build:
        H.cargo_build(log)
    if not server_bin.exists():
        raise HarnessError(f"test server binary not found: {server_bin}")
    return stoker, server_bin


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    H.add_arg(p, "--only", "", help=f"comma-separated contenders (default all: {','.join(CONTENDERS)})")
    p.add_argument("--workloads", default="small,large", help="comma-separated workloads: small,large")
    H.add_arg(p, "--out", H.RESULTS / "storage.json")
    p.add_argument("--stoker-arg", action="append", default=[], help="extra argument for `stoker bench` (repeatable), e.g. --stoker-arg=--concurrency=64")
    H.add_arg(p, "--venv", H.VENV, help="venv with boto3 and s3torchconnector (bench/setup.sh makes it)")
    H.add_arg(p, "--timeout", 600)
    a = p.parse_args(argv)
    a.contenders = H.pick(a.only, CONTENDERS, p.error, aliases=ALIASES)
    a.workload_list = H.pick(a.workloads, WORKLOADS, p.error, what="workload", default=(), keep_order=True)
    if a.reps < 1 or a.small < 1 or a.large_mib < 1:
        p.error("--reps, --small and --large-mib must be positive")
    return a


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
    stoker, server_bin = binaries(a)
    if "stoker" in a.contenders and not stoker.exists():
        log(f"warning: {stoker} not found; the stoker contender will fail")

    a.data_dir.mkdir(parents=True, exist_ok=True)
    data = prepare_data(a.data_dir, a.small, a.large_mib, a.seed)
    log(f"data: {len(data.small_keys)} small objects ({data.small_bytes / MIB:.1f} MiB), large {data.large_bytes / MIB:.0f} MiB, root {data.root}")

    work = Path(tempfile.mkdtemp(prefix="stoker-bench-"))
    server = None
    try:
        server = H.Server.start(server_bin, data.root, a.latency_ms, work / "server.log", a.server_arg)
        log(f"test server at {server.endpoint} (latency {a.latency_ms:g} ms), log {work / 'server.log'}")
        ctx = Ctx(args=a, data=data, endpoint=server.endpoint, env=H.client_env(work), stoker=stoker,
                  venv_python=a.venv / "bin" / "python", work=work)
        preflight(ctx)

        if not a.no_warmup:
            # One untimed read of every workload by the ceiling client: the data is in
            # the page cache and the server's ETag cache is filled before anyone is timed,
            # so the first contender of the first rep does not pay for a cold start.
            for w in a.workload_list:
                log(f"warm-up: {w} (untimed)")
                c_ceiling(ctx, w)

        def expect(w: str, c: str, r: Rep) -> str | None:
            n_exp, b_exp = ctx.expected(w)
            if r.bytes != b_exp or r.objects != n_exp:
                return f"read {r.objects} objects / {r.bytes} bytes, expected {n_exp} / {b_exp}"
            return None

        def ok(rep: int, w: str, c: str, r: Rep) -> None:
            log(f"rep {rep + 1}/{a.reps} {c:10s} {w:5s} {r.seconds:8.3f} s  cpu {r.client_cpu_s:6.2f} s  "
                f"rss {r.peak_rss_mib:6.0f} MiB  server cpu {r.server_cpu_s:6.2f} s")

        def failed(rep: int, w: str, c: str, err: str) -> None:
            log(f"rep {rep + 1}/{a.reps} {c:10s} {w:5s} FAILED: {H.tail(err, 400)}")

        # Every contender on each workload, interleaved within a rep, the order rotated each rep.
        trials = H.run_reps(a.reps, [(w, a.contenders) for w in a.workload_list],
                            lambda w, c, _rep: RUNNERS[c](ctx, w), expect=expect, server=server, time_server=True,
                            on_ok=ok, on_fail=failed)

        results = [summarize(c, w, trials.reps[(w, c)], trials.errors.get((w, c)), ctx.expected(w)[1])
                   for w in a.workload_list for c in a.contenders]
        add_ratios(results)
        doc = {
            "benchmark": "storage",
            "date": H.now_iso(),
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
        H.write_json(a.out, doc)
        print()
        print(f"storage benchmark: {a.small} x ~110 KB objects, one {a.large_mib} MiB object, "
              f"{a.latency_ms:g} ms server latency, median of {a.reps} rep(s), {os.cpu_count()} CPUs")
        print(table(results))
        print(f"\nresults: {a.out}")
        return 0
    finally:
        # Interrupted mid-rep: unmount what is still mounted, then stop what still runs.
        for mnt in H.mounted_under(work):
            H.unmount(Path(mnt))
        H.kill_live_children()
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    H.run_main(main, log)
