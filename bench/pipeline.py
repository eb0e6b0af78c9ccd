#!/usr/bin/env python3
"""Pipeline benchmark: Stoker's record readers against the Python reader of each format,
on the same objects, from the same S3-compatible test server, in the same run; and the
engine's own per-sample overhead.

One command:

    python3 bench/pipeline.py [--reps 3] [--latencies 10,0] [--formats wds,tfrecord,parquet,jsonl]
                              [--only stoker,wds,...] [--no-engine | --engine]
                              [--out bench/results/pipeline.json]

It generates the data set once (seeded, cached under /tmp/stoker-bench-data/pipeline), starts
`stoker-testserver --latency-ms L` on it for each latency, and for every format runs each
contender `--reps` times (contenders interleaved within a rep, the order rotated by one
each rep), checks every rep read every record, prints a table of medians and writes a JSON
file. The engine section runs crates/stoker-pipeline/examples/engine_overhead.rs (built
with `cargo build --release -p stoker-pipeline --example engine_overhead`). See
bench/README.md ("Pipeline benchmark").

Formats (bucket `pipe`) and contenders:
  wds       16 tar shards x 500 samples (`jpg` ~100 KB + `cls`)
            stoker: format = "tar";  wds: webdataset.WebDataset over `pipe:curl ...` URLs, one
            process;  wds-loader: the same dataset in wds.WebLoader (a torch DataLoader), 4 workers
  tfrecord  16 files x 5000 tf.train.Example (`data` ~2 KB bytes, `label` int64)
            stoker: format = "tfrecord", parse_examples = true;  tf-batch / tf-single: boto3
            streams each object to /dev/shm (timed, overlapped), TFRecordDataset via interleave(4),
            batch(256) + parse_example, or parse_single_example + batch(256)
  parquet   8 files x 4 row groups, 200,000 rows (int64, int32, float64, float32, 2 strings)
            stoker: format = "parquet", `batch` of --pq-batch rows (1024), interleave 1: the
            columnar path (row groups straight into batches);  stoker-rows: the same batch,
            interleave --interleave, columnar = false: every row a sample, then collated;
            pyarrow: pyarrow.dataset over S3FileSystem, to_batches(batch_size=--pq-batch),
            rows of record batches counted;  pyarrow-pylist: the same, every batch to Python rows
  jsonl     8 files, 200,000 lines (5 fields)
            stoker: format = "jsonl";  jsonl: boto3 streams (4 at a time), json.loads per line

Standard library only; the Python contenders run in the venv made by bench/setup.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402  (the loop, child processes, test server, tables: bench/harness.py)
from harness import MIB, ContenderError, HarnessError  # noqa: E402

BENCH_DIR = H.BENCH_DIR
REPO = H.REPO
READERS = BENCH_DIR / "pipeline_readers.py"
BUCKET = "pipe"

FORMATS = {
    # format: (prefix, object suffix, stoker format, python contenders)
    "wds": ("wds/", ".tar", "tar", ["wds", "wds-loader"]),
    "tfrecord": ("tfrecord/", ".tfrecord", "tfrecord", ["tf-batch", "tf-single"]),
    "parquet": ("parquet/", ".parquet", "parquet", ["stoker-rows", "pyarrow", "pyarrow-pylist"]),
    "jsonl": ("jsonl/", ".jsonl", "jsonl", ["jsonl"]),
}

log = H.logger("pipeline-bench")


# ---------------------------------------------------------------- data


@dataclass
class FormatData:
    keys: list[str]
    bytes: int
    records: int


def data_config(a: argparse.Namespace) -> dict:
    return {
        "seed": a.seed, "wds_shards": a.wds_shards, "wds_samples": a.wds_samples, "wds_jpg_bytes": 100_000,
        "tfr_files": a.tfr_files, "tfr_records": a.tfr_records, "tfr_bytes": 2000,
        "pq_files": 8, "pq_rows": a.pq_rows, "pq_row_groups": 4, "jsonl_files": 8, "jsonl_rows": a.jsonl_rows,
    }


def prepare_data(a: argparse.Namespace, python: Path) -> tuple[Path, dict[str, FormatData]]:
    cfg = data_config(a)
    name = "root-" + "-".join(f"{v}" for v in cfg.values())
    root = a.data_dir / name
    marker = a.data_dir / f"{name}.ok"
    if not marker.exists():
        log(f"generating the data set in {root} (once)")
        argv = [str(python), str(READERS), "gen", "--root", str(root), "--bucket", BUCKET, "--seed", str(a.seed),
                "--wds-shards", str(a.wds_shards), "--wds-samples", str(a.wds_samples),
                "--tfr-files", str(a.tfr_files), "--tfr-records", str(a.tfr_records),
                "--pq-rows", str(a.pq_rows), "--jsonl-rows", str(a.jsonl_rows)]
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise HarnessError(f"data generation failed: {H.tail(r.stderr)}")
        marker.write_text(json.dumps(cfg) + "\n")
    records = {
        "wds": a.wds_shards * a.wds_samples,
        "tfrecord": a.tfr_files * a.tfr_records,
        "parquet": a.pq_rows // 8 * 8,
        "jsonl": a.jsonl_rows // 8 * 8,
    }
    out = {}
    for fmt, (prefix, suffix, _sf, _c) in FORMATS.items():
        d = root / BUCKET / prefix
        files = sorted(p for p in d.iterdir() if p.name.endswith(suffix))
        out[fmt] = FormatData(keys=[prefix + p.name for p in files], bytes=sum(p.stat().st_size for p in files),
                              records=records[fmt])
        # Into the page cache: the server answers from memory for every contender.
        H.warm_page_cache(files)
    return root, out


# ---------------------------------------------------------------- contenders


@dataclass
class Ctx:
    args: argparse.Namespace
    data: dict[str, FormatData]
    endpoint: str
    env: dict[str, str]
    stoker: Path
    python: Path
    work: Path


@dataclass
class Rep:
    seconds: float
    process_wall_s: float
    cpu_s: float
    peak_rss_mib: float
    records: int
    bytes: int
    server_cpu_s: float = float("nan")
    extra: dict = field(default_factory=dict)


def stoker_spec(ctx: Ctx, fmt: str, rows: bool = False) -> Path:
    """The spec of the `stoker` contender (for parquet: batches on the columnar path), or
    with `rows` of `stoker-rows` (parquet: the same batches, every row a sample first)."""
    prefix, suffix, sformat, _c = FORMATS[fmt]
    columnar = fmt == "parquet" and not rows
    lines = [
        f'source = "s3://{BUCKET}/{prefix}"',
        f'glob = "*{suffix}"',
        f'format = "{sformat}"',
        # The columnar path reads one file at a time (it opens the next ones ahead).
        f"interleave = {1 if columnar else ctx.args.interleave}",
    ]
    if fmt == "tfrecord":
        lines += ["", "[format_options]", "parse_examples = true"]
    if fmt == "parquet":
        lines += ["", "[[ops]]", 'op = "batch"', f"size = {ctx.args.pq_batch}"]
    options = []
    if ctx.args.stoker_threads:
        options.append(f"threads = {ctx.args.stoker_threads}")
    if fmt == "parquet":
        options.append(f"columnar = {'true' if columnar else 'false'}")
    if options:
        lines += ["", "[options]", *options]
    path = ctx.work / f"{fmt}{'-rows' if rows else ''}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def c_stoker(ctx: Ctx, fmt: str, rows: bool = False) -> Rep:
    spec = stoker_spec(ctx, fmt, rows)
    argv = [str(ctx.stoker), "run", str(spec), "--json", "--endpoint", ctx.endpoint, *ctx.args.stoker_arg]
    child = H.run_child(argv, ctx.env, ctx.args.timeout)
    H.check(child, "stoker run")
    res = H.last_json(child.stdout)
    return Rep(
        seconds=float(res["seconds"]),
        process_wall_s=child.wall_s,
        cpu_s=child.cpu_s,
        peak_rss_mib=child.maxrss_mib,
        records=int(res["samples"]),
        bytes=ctx.data[fmt].bytes,
        extra={"bytes_read": res.get("bytes_read"), "peak_rss_bytes": res.get("peak_rss_bytes"),
               "stages": res.get("stages"), "autotune": res.get("autotune"),
               "memory_peak_bytes": res.get("memory_peak_bytes"), "consumer_wait_s": res.get("consumer_wait_s")},
    )


def _python(ctx: Ctx, fmt: str, program: str, extra: list[str]) -> Rep:
    if not ctx.python.exists():
        raise ContenderError(f"{ctx.python} not found: run bench/setup.sh")
    d = ctx.data[fmt]
    argv = [str(ctx.python), str(READERS), program, "--endpoint", ctx.endpoint, "--bucket", BUCKET,
            "--object-bytes", str(d.bytes), "--keys", *d.keys, *extra]
    env = dict(ctx.env, TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore")
    child = H.run_child(argv, env, ctx.args.timeout)
    H.check(child, program)
    res = H.last_json(child.stdout)
    return Rep(
        seconds=float(res["seconds"]),
        process_wall_s=child.wall_s,
        cpu_s=child.cpu_s - float(res.get("startup_cpu_s", 0.0)),
        peak_rss_mib=child.maxrss_mib,
        records=int(res["records"]),
        bytes=int(res["bytes"]),
        extra={k: v for k, v in res.items() if k not in ("records", "bytes", "seconds")},
    )


RUNNERS = {
    "stoker": c_stoker,
    "stoker-rows": lambda ctx, f: c_stoker(ctx, f, rows=True),
    "wds": lambda ctx, f: _python(ctx, f, "wds", ["--workers", "0"]),
    "wds-loader": lambda ctx, f: _python(ctx, f, "wds-loader", ["--workers", str(ctx.args.wds_workers)]),
    "tf-batch": lambda ctx, f: _python(ctx, f, "tf", ["--parse", "batch", "--cycle", str(ctx.args.interleave)]),
    "tf-single": lambda ctx, f: _python(ctx, f, "tf", ["--parse", "single", "--cycle", str(ctx.args.interleave)]),
    "pyarrow": lambda ctx, f: _python(ctx, f, "pyarrow", ["--prefix", FORMATS[f][0],
                                                          "--batch-size", str(ctx.args.pq_batch)]),
    "pyarrow-pylist": lambda ctx, f: _python(ctx, f, "pyarrow", ["--prefix", FORMATS[f][0], "--pylist",
                                                                 "--batch-size", str(ctx.args.pq_batch)]),
    "jsonl": lambda ctx, f: _python(ctx, f, "jsonl", ["--threads", str(ctx.args.interleave)]),
}


# ---------------------------------------------------------------- summary


def summarize(fmt: str, latency: float, contender: str, reps: list[Rep], error: str | None, d: FormatData) -> dict:
    row: dict = {"format": fmt, "latency_ms": latency, "contender": contender, "reps": len(reps)}
    if error:
        row["error"] = error
    if not reps:
        return row
    secs = [r.seconds for r in reps]
    med = H.median(secs)
    row.update(
        seconds=med,
        records_per_s=d.records / med,
        mib_per_s=d.bytes / MIB / med,
        **H.medians(reps, "cpu_s"),
        **H.maxima(reps, "peak_rss_mib"),
        **H.medians(reps, "server_cpu_s"),
        seconds_per_rep=secs,
        process_wall_s=[r.process_wall_s for r in reps],
        cpu_per_rep=[r.cpu_s for r in reps],
    )
    # The extra fields of the median rep (stoker: its per-stage busy/wait seconds).
    row["median_rep_extra"] = H.median_item(reps, key=lambda r: r.seconds).extra
    return row


def add_ratios(rows: list[dict]) -> None:
    """stoker_ratio on each peer's row: stoker's records/s over the peer's (same format and
    latency); on every stoker contender's row (stoker-rows too): its records/s over the best peer's."""
    def group(r: dict) -> tuple:
        return r["format"], r["latency_ms"]

    def ok(r: dict) -> bool:
        return "records_per_s" in r

    def peer(r: dict) -> bool:
        return not r["contender"].startswith("stoker")

    H.add_ratios(rows, rate="records_per_s", group=group, key="stoker_ratio", ok=ok, which=peer)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(group(r), []).append(r)
    for g in groups.values():
        best = H.best((r for r in g if ok(r) and peer(r)), "records_per_s")
        for s in (r for r in g if ok(r) and not peer(r)):
            if best:
                s["best_peer"] = best["contender"]
                s["stoker_ratio_vs_best_peer"] = s["records_per_s"] / best["records_per_s"]


def table(rows: list[dict]) -> str:
    head = ["format", "lat ms", "contender", "median s", "records/s", "MiB/s", "CPU s", "RSS MiB", "srv CPU s", "stoker/peer"]
    out = []
    for r in rows:
        if "records_per_s" not in r:
            out.append([r["format"], f"{r['latency_ms']:g}", r["contender"], "FAILED", "", "", "", "", "",
                        H.tail(r.get("error", ""), 60)])
            continue
        if r["contender"].startswith("stoker"):
            ratio = f"{r['stoker_ratio_vs_best_peer']:.2f}x best ({r['best_peer']})" if "best_peer" in r else "-"
        else:
            ratio = f"{r['stoker_ratio']:.2f}x" if "stoker_ratio" in r else "-"
        out.append([r["format"], f"{r['latency_ms']:g}", r["contender"], f"{r['seconds']:.3f}",
                    f"{r['records_per_s']:.0f}", f"{r['mib_per_s']:.1f}", f"{r['cpu_s']:.2f}",
                    f"{r['peak_rss_mib']:.0f}", f"{r['server_cpu_s']:.2f}", ratio])
    return H.text_table(head, out, right={3, 4, 5, 6, 7, 8})


def stage_table(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        if not r["contender"].startswith("stoker") or "median_rep_extra" not in r:
            continue
        ex = r["median_rep_extra"]
        lines.append(f"{r['contender']} {r['format']} ({r['latency_ms']:g} ms), median rep {r['seconds']:.3f} s, "
                     f"bytes_read {ex.get('bytes_read')}, peak RSS {(ex.get('peak_rss_bytes') or 0) / MIB:.0f} MiB, "
                     f"consumer wait {ex.get('consumer_wait_s') or 0:.2f} s:")
        for s in ex.get("stages") or []:
            lines.append(f"    {s['name']:<40} in {s['items_in']:>8} out {s['items_out']:>8}  busy {s['busy_s']:7.2f} s"
                         f"  wait {s['wait_s']:7.2f} s")
    return "\n".join(lines)


# ---------------------------------------------------------------- engine overhead


def run_engine(a: argparse.Namespace) -> dict:
    exe = a.engine_bin
    if not exe.exists():
        return {"error": f"{exe} not found: CARGO_TARGET_DIR={exe.parent.parent.parent} cargo build --release "
                         f"-p stoker-pipeline --example engine_overhead"}
    argv = [str(exe), "--samples", str(a.engine_samples), "--reps", str(a.engine_reps)]
    log("engine overhead: " + " ".join(argv))
    child = H.run_child(argv, dict(os.environ), max(a.timeout, 1800))
    if child.returncode != 0:
        return {"error": f"engine_overhead exited with {child.returncode}: {H.tail(child.stderr)}", "argv": argv}
    lines = [json.loads(ln) for ln in child.stdout.splitlines() if ln.startswith("{")]
    return {"argv": argv, "wall_s": child.wall_s, "cpu_s": child.cpu_s, "peak_rss_mib": child.maxrss_mib,
            "cases": [x for x in lines if "scaling" not in x], "scaling": [x for x in lines if "scaling" in x]}


def engine_table(eng: dict) -> str:
    if "error" in eng:
        return f"engine overhead: FAILED: {eng['error']}"
    scale = {(s["kind"], s["maps"], s["batch"]): s["ratio"] for s in eng["scaling"]}
    head = ["maps", "kind", "batch", "threads", "median s", "samples/s", "ns/sample", "1->2 scaling"]
    out = []
    for c in sorted(eng["cases"], key=lambda c: (c["maps"], c["kind"], c["batch"], c["threads"])):
        sc = scale.get((c["kind"], c["maps"], c["batch"])) if c["threads"] == 2 else None
        out.append([str(c["maps"]), c["kind"], str(c["batch"] or "-"), str(c["threads"]), f"{c['seconds']:.3f}",
                    f"{c['samples_per_s']:.0f}", f"{c['ns_per_sample']:.0f}", f"{sc:.2f}x" if sc else ""])
    return H.text_table(head, out, right=range(len(head)))


# ---------------------------------------------------------------- main


def environment(a: argparse.Namespace, stoker: Path, python: Path) -> dict:
    return H.environment({"curl": ["curl", "--version"], "stoker": [str(stoker), "--version"]},
                         extra={"stoker_binary": str(stoker)}, python=python,
                         packages=("webdataset", "tensorflow-cpu", "tensorflow", "pyarrow", "boto3", "torch", "numpy"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_arg(ap, "--reps", 3)
    ap.add_argument("--latencies", default="10,0", help="server latencies to run, ms (comma list); default 10,0")
    ap.add_argument("--formats", default=",".join(FORMATS))
    H.add_arg(ap, "--only", "", help="contenders to run (comma list; default all)")
    ap.add_argument("--engine", action="store_true", help="run only the engine-overhead section")
    ap.add_argument("--no-engine", action="store_true", help="skip the engine-overhead section")
    ap.add_argument("--engine-samples", type=int, default=1_000_000)
    ap.add_argument("--engine-reps", type=int, default=3)
    ap.add_argument("--engine-bin", type=Path,
                    default=Path(os.environ.get("CARGO_TARGET_DIR", "/work/target-bench")) / "release" / "examples" / "engine_overhead")
    ap.add_argument("--interleave", type=int, default=4, help="stoker's interleave, and the peers' parallel streams")
    ap.add_argument("--stoker-threads", type=int, default=0, help="stoker's [options] threads (0: its default)")
    ap.add_argument("--stoker-arg", action="append", default=[], help="extra argument for `stoker run` (repeatable)")
    ap.add_argument("--wds-workers", type=int, default=4)
    ap.add_argument("--wds-shards", type=int, default=16)
    ap.add_argument("--wds-samples", type=int, default=500)
    ap.add_argument("--tfr-files", type=int, default=16)
    ap.add_argument("--tfr-records", type=int, default=5000)
    ap.add_argument("--pq-rows", type=int, default=200_000)
    ap.add_argument("--pq-batch", type=int, default=1024,
                    help="parquet: rows per batch of stoker's `batch` and of pyarrow's to_batches")
    ap.add_argument("--jsonl-rows", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=1)
    H.add_arg(ap, "--stoker", Path(os.environ.get("STOKER_BIN", REPO / "target/release/stoker")))
    H.add_arg(ap, "--server", Path(os.environ.get("STOKER_TESTSERVER_BIN", REPO / "target/release/stoker-testserver")))
    H.add_arg(ap, "--venv", H.VENV)
    ap.add_argument("--data-dir", type=Path, default=Path("/tmp/stoker-bench-data/pipeline"))
    H.add_arg(ap, "--out", H.RESULTS / "pipeline.json")
    H.add_arg(ap, "--timeout", 600)
    a = ap.parse_args(argv)
    a.format_list = H.pick(a.formats, FORMATS, ap.error, what="format", default=(), keep_order=True)
    a.latency_list = [float(x) for x in a.latencies.split(",") if x]
    a.only_set = set(H.pick(a.only, RUNNERS, ap.error, default=()))
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    python = a.venv / "bin" / "python"
    doc: dict = {"benchmark": "pipeline", "date": H.now_iso(),
                 "config": {"reps": a.reps, "latencies_ms": a.latency_list, "interleave": a.interleave,
                            "stoker_threads": a.stoker_threads or "default", "wds_workers": a.wds_workers,
                            "data": data_config(a), "engine_samples": a.engine_samples, "engine_reps": a.engine_reps},
                 "environment": environment(a, a.stoker, python)}
    rows: list[dict] = []
    if not a.engine:
        rows = run_formats(a, python, doc)
    eng = None
    if not a.no_engine:
        eng = run_engine(a)
        doc["engine"] = eng
    doc["results"] = rows
    doc["definitions"] = {
        "seconds": "median over reps of the reader's time: stoker: `seconds` of `stoker run --json` (run() to the "
                   "last sample, listing included); Python: from building the dataset/client (imports done) to the "
                   "last record (no listing for wds, tf, jsonl: they get the key list)",
        "records_per_s": "records of the format / median seconds",
        "mib_per_s": "size of the format's objects / median seconds",
        "cpu_s": "median user+sys CPU of the reader's process tree (wait4), less the Python start-up and imports",
        "stoker_ratio": "stoker records/s / this contender's records/s (same format and latency)",
    }
    H.write_json(a.out, doc)
    print()
    if rows:
        d = doc["config"]["data"]
        print(f"pipeline benchmark: median of {a.reps} rep(s), {os.cpu_count()} CPUs, stoker interleave {a.interleave}; "
              f"wds {d['wds_shards']}x{d['wds_samples']}, tfrecord {d['tfr_files']}x{d['tfr_records']}, "
              f"parquet {d['pq_rows']} rows, jsonl {d['jsonl_rows']} lines")
        print(table(rows))
        print()
        print(stage_table(rows))
    if eng is not None:
        print()
        print(f"engine overhead: {a.engine_samples} in-memory samples, median of {a.engine_reps} rep(s), autotune off")
        print(engine_table(eng))
    print(f"\nresults: {a.out}")
    return 0


def run_formats(a: argparse.Namespace, python: Path, doc: dict) -> list[dict]:
    if not a.server.exists():
        raise HarnessError(f"test server binary not found: {a.server}")
    a.data_dir.mkdir(parents=True, exist_ok=True)
    root, data = prepare_data(a, python)
    doc["config"]["data_root"] = str(root)
    doc["config"]["objects"] = {f: {"objects": len(d.keys), "bytes": d.bytes, "records": d.records} for f, d in data.items()}
    for f in a.format_list:
        d = data[f]
        log(f"data {f}: {len(d.keys)} objects, {d.bytes / MIB:.1f} MiB, {d.records} records")
    rows: list[dict] = []
    for latency in a.latency_list:
        work = Path(tempfile.mkdtemp(prefix="stoker-pipe-bench-"))
        server = None
        try:
            server = H.Server.start(a.server, root, latency, work / "server.log")
            log(f"test server at {server.endpoint} (latency {latency:g} ms)")
            ctx = Ctx(args=a, data=data, endpoint=server.endpoint, env=H.client_env(work), stoker=a.stoker,
                      python=python, work=work)
            contenders = {f: [c for c in ["stoker", *FORMATS[f][3]] if not a.only_set or c in a.only_set]
                          for f in a.format_list}
            # One untimed read of each format by stoker: the server's caches (ETags) are warm.
            for f in a.format_list:
                try:
                    c_stoker(ctx, f)
                except ContenderError as e:
                    log(f"warm-up {f}: stoker failed: {H.tail(str(e), 300)}")

            def expect(f: str, c: str, r: Rep) -> str | None:
                return f"read {r.records} records, expected {data[f].records}" if r.records != data[f].records else None

            def ok(rep: int, f: str, c: str, r: Rep) -> None:
                log(f"{latency:g} ms rep {rep + 1}/{a.reps} {f:8s} {c:14s} {r.seconds:8.3f} s "
                    f"{r.records / r.seconds:9.0f} rec/s  cpu {r.cpu_s:6.2f} s  rss {r.peak_rss_mib:5.0f} MiB  "
                    f"server cpu {r.server_cpu_s:5.2f} s")

            def failed(rep: int, f: str, c: str, err: str) -> None:
                log(f"{latency:g} ms rep {rep + 1}/{a.reps} {f:8s} {c:14s} FAILED: {H.tail(err, 400)}")

            # A format's contenders interleaved within a rep, the order rotated each rep.
            trials = H.run_reps(a.reps, [(f, contenders[f]) for f in a.format_list],
                                lambda f, c, _rep: RUNNERS[c](ctx, f), expect=expect, server=server,
                                time_server=True, on_ok=ok, on_fail=failed)
            group = [summarize(f, latency, c, trials.reps[(f, c)], trials.errors.get((f, c)), data[f])
                     for f in a.format_list for c in contenders[f]]
            add_ratios(group)
            rows += group
        finally:
            H.kill_live_children()
            if server is not None:
                server.stop()
            shutil.rmtree(work, ignore_errors=True)
    return rows


if __name__ == "__main__":
    H.run_main(main, log)
