#!/usr/bin/env python3
"""Data generator and the Python peer readers of the pipeline benchmark (bench/pipeline.py).

Runs in the benchmark venv (.venv-bench: webdataset, tensorflow-cpu, pyarrow, boto3, torch).
Each reader is a subcommand that reads one format's objects from the S3 test server and
prints one JSON line on stdout:

    {"records": N, "bytes": B, "seconds": S, "startup_cpu_s": C, ...}

`seconds` runs from just before the reader builds its dataset / client (imports done) to
the last record; `startup_cpu_s` is the CPU this process had used before that moment
(interpreter start-up, imports), which the harness subtracts from the CPU it measured with
wait4. `bytes` is the size of the objects the reader consumed (every reader reads whole
objects).

Subcommands:
  gen        writes the data set (seeded) under --root/BUCKET/{wds,tfrecord,parquet,jsonl}
  wds        webdataset: wds.WebDataset over `pipe:curl ...` URLs, raw samples
  wds-loader the same dataset in a torch DataLoader (wds.WebLoader) with --workers processes
  tf         tf.data: objects streamed with boto3 into files in /dev/shm (timed), read by
             TFRecordDataset through interleave, parsed with parse_example / parse_single_example
  pyarrow    pyarrow.dataset over pyarrow.fs.S3FileSystem, counting rows of record batches
             (--batch-size N: to_batches(batch_size=N), batches of at most N rows)
             (--pylist: every batch turned into Python rows, one dict per row)
  jsonl      boto3 get_object streams, json.loads per line, --threads objects at a time
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import harness as H  # bench/harness.py (bench/ is on sys.path: this file is run as a script)
from harness import ACCESS_KEY, MIB, REGION, SECRET_KEY, emit


def boto3_client(endpoint: str, pool: int = 32):
    return H.boto3_client(endpoint, pool, s3={"addressing_style": "path"}, retries={"max_attempts": 3})


# ---------------------------------------------------------------- data


def gen_wds(d: str, shards: int, samples: int, mean: int, seed: int) -> None:
    import io
    import tarfile

    os.makedirs(d, exist_ok=True)
    for s in range(shards):
        path = os.path.join(d, f"shard-{s:06d}.tar")
        if os.path.exists(path):
            continue
        rng = random.Random(f"pipe-wds-{seed}-{s}")

        def write(tmp: str) -> None:
            with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tf:
                for i in range(samples):
                    key = f"{s:04d}{i:06d}"
                    size = int(mean * (0.9 + 0.2 * rng.random()))
                    for ext, payload in (("jpg", rng.randbytes(size)), ("cls", str(rng.randrange(1000)).encode())):
                        info = tarfile.TarInfo(f"{key}.{ext}")
                        info.size = len(payload)
                        info.mtime = 1_700_000_000
                        info.mode = 0o644
                        tf.addfile(info, io.BytesIO(payload))

        H.write_atomic(path, write)


def gen_tfrecord(d: str, files: int, records: int, mean: int, seed: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    os.makedirs(d, exist_ok=True)
    for f in range(files):
        path = os.path.join(d, f"part-{f:05d}.tfrecord")
        if os.path.exists(path):
            continue
        rng = random.Random(f"pipe-tfr-{seed}-{f}")

        def write(tmp: str) -> None:
            with tf.io.TFRecordWriter(tmp) as w:
                for _ in range(records):
                    size = int(mean * (0.9 + 0.2 * rng.random()))
                    ex = tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                "data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[rng.randbytes(size)])),
                                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[rng.randrange(1000)])),
                            }
                        )
                    )
                    w.write(ex.SerializeToString())

        H.write_atomic(path, write)


WORDS = "the of and to in is was for on that with by as at from his her an which or be are this had not".split()


def gen_parquet(d: str, files: int, rows: int, row_groups: int, seed: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(d, exist_ok=True)
    per_file = rows // files
    for f in range(files):
        path = os.path.join(d, f"part-{f:05d}.parquet")
        if os.path.exists(path):
            continue
        rng = random.Random(f"pipe-pq-{seed}-{f}")
        base = f * per_file
        table = pa.table(
            {
                "id": pa.array(range(base, base + per_file), pa.int64()),
                "label": pa.array([rng.randrange(1000) for _ in range(per_file)], pa.int32()),
                "score": pa.array([rng.random() for _ in range(per_file)], pa.float64()),
                "weight": pa.array([rng.random() for _ in range(per_file)], pa.float32()),
                "name": pa.array([f"item-{rng.randrange(10**9):09d}" for _ in range(per_file)], pa.string()),
                "text": pa.array([" ".join(rng.choices(WORDS, k=20)) for _ in range(per_file)], pa.string()),
            }
        )
        H.write_atomic(path, lambda tmp: pq.write_table(table, tmp, row_group_size=per_file // row_groups, compression="snappy"))


def gen_jsonl(d: str, files: int, rows: int, seed: int) -> None:
    os.makedirs(d, exist_ok=True)
    per_file = rows // files
    for f in range(files):
        path = os.path.join(d, f"part-{f:05d}.jsonl")
        if os.path.exists(path):
            continue
        rng = random.Random(f"pipe-jsonl-{seed}-{f}")

        def write(tmp: str) -> None:
            with open(tmp, "w") as out:
                for i in range(per_file):
                    rec = {
                        "id": f * per_file + i,
                        "label": rng.randrange(1000),
                        "score": round(rng.random(), 6),
                        "name": f"item-{rng.randrange(10**9):09d}",
                        "text": " ".join(rng.choices(WORDS, k=30)),
                    }
                    out.write(json.dumps(rec) + "\n")

        H.write_atomic(path, write)


def cmd_gen(a: argparse.Namespace) -> None:
    b = os.path.join(a.root, a.bucket)
    gen_wds(os.path.join(b, "wds"), a.wds_shards, a.wds_samples, a.wds_jpg_bytes, a.seed)
    gen_tfrecord(os.path.join(b, "tfrecord"), a.tfr_files, a.tfr_records, a.tfr_bytes, a.seed)
    gen_parquet(os.path.join(b, "parquet"), a.pq_files, a.pq_rows, a.pq_row_groups, a.seed)
    gen_jsonl(os.path.join(b, "jsonl"), a.jsonl_files, a.jsonl_rows, a.seed)
    emit({"ok": True})


# ---------------------------------------------------------------- readers


def curl_pipe_url(endpoint: str, bucket: str, key: str) -> str:
    # What a webdataset user does for a private S3-compatible bucket without the AWS CLI:
    # stream each shard with curl (SigV4-signed), webdataset reads the pipe.
    return (
        f"pipe:curl -s --fail --aws-sigv4 aws:amz:{REGION}:s3 --user {ACCESS_KEY}:{SECRET_KEY} "
        f"-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' {endpoint}/{bucket}/{key}"
    )


def _wds_count(sample: dict) -> int:
    return sum(len(v) for k, v in sample.items() if not k.startswith("__") and isinstance(v, (bytes, bytearray)))


def cmd_wds(a: argparse.Namespace) -> None:
    import webdataset as wds

    startup = H.cpu_self()
    t0 = time.perf_counter()
    urls = [curl_pipe_url(a.endpoint, a.bucket, k) for k in a.keys]
    records = payload = 0
    if a.workers == 0:
        ds = wds.WebDataset(urls, shardshuffle=False)
        for sample in ds:
            records += 1
            payload += _wds_count(sample)
    else:
        ds = wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker)
        loader = wds.WebLoader(ds, batch_size=None, num_workers=a.workers, prefetch_factor=a.prefetch)
        for sample in loader:
            records += 1
            payload += _wds_count(sample)
    seconds = time.perf_counter() - t0
    emit({"records": records, "bytes": a.object_bytes, "payload_bytes": payload, "seconds": seconds,
          "startup_cpu_s": startup, "workers": a.workers})


def cmd_tf(a: argparse.Namespace) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import shutil
    import tempfile
    from concurrent.futures import ThreadPoolExecutor, as_completed

    import tensorflow as tf

    startup = H.cpu_self()
    t0 = time.perf_counter()
    s3 = boto3_client(a.endpoint, a.threads)
    tmp = tempfile.mkdtemp(prefix="stoker-pipe-tf-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    fetched = {"last": 0.0}
    try:
        def fetch(key: str) -> str:
            path = os.path.join(tmp, key.replace("/", "_"))
            body = s3.get_object(Bucket=a.bucket, Key=key)["Body"]
            with open(path, "wb") as f:
                shutil.copyfileobj(body, f, MIB)
            fetched["last"] = time.perf_counter() - t0
            return path

        pool = ThreadPoolExecutor(a.threads)
        futures = [pool.submit(fetch, k) for k in a.keys]

        def paths():
            # Files in the order their downloads finish: parsing overlaps the downloads.
            for fut in as_completed(futures):
                yield fut.result()

        files = tf.data.Dataset.from_generator(paths, output_signature=tf.TensorSpec((), tf.string))
        ds = files.interleave(tf.data.TFRecordDataset, cycle_length=a.cycle, num_parallel_calls=a.cycle, deterministic=False)
        spec = {"data": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
        auto = tf.data.AUTOTUNE
        if a.parse == "batch":
            ds = ds.batch(a.batch).map(lambda x: tf.io.parse_example(x, spec), num_parallel_calls=auto, deterministic=False)
        else:
            ds = ds.map(lambda x: tf.io.parse_single_example(x, spec), num_parallel_calls=auto, deterministic=False).batch(a.batch)
        ds = ds.prefetch(auto)
        records = payload = 0
        for b in ds:
            n = int(b["label"].shape[0])
            records += n
            payload += int(tf.reduce_sum(tf.strings.length(b["data"])))
        seconds = time.perf_counter() - t0
        pool.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    emit({"records": records, "bytes": a.object_bytes, "payload_bytes": payload, "seconds": seconds,
          "startup_cpu_s": startup, "downloads_done_s": fetched["last"], "parse": a.parse, "tf": tf.__version__})


def cmd_pyarrow(a: argparse.Namespace) -> None:
    import pyarrow as pa
    import pyarrow.dataset as pads
    from pyarrow import fs

    startup = H.cpu_self()
    t0 = time.perf_counter()
    host = a.endpoint.split("://", 1)[1]
    s3 = fs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION, endpoint_override=host, scheme="http")
    d = pads.dataset(f"{a.bucket}/{a.prefix.rstrip('/')}", filesystem=s3, format="parquet")
    records = 0
    batches = 0
    for b in d.to_batches(batch_size=a.batch_size) if a.batch_size else d.to_batches():
        batches += 1
        if a.pylist:
            for _row in b.to_pylist():
                records += 1
        else:
            records += b.num_rows
    seconds = time.perf_counter() - t0
    emit({"records": records, "bytes": a.object_bytes, "seconds": seconds, "startup_cpu_s": startup,
          "batches": batches, "pylist": a.pylist, "cpu_count": pa.cpu_count(), "io_threads": pa.io_thread_count()})


def cmd_jsonl(a: argparse.Namespace) -> None:
    from concurrent.futures import ThreadPoolExecutor

    startup = H.cpu_self()
    t0 = time.perf_counter()
    s3 = boto3_client(a.endpoint, a.threads)

    def read(key: str) -> tuple[int, int]:
        body = s3.get_object(Bucket=a.bucket, Key=key)["Body"]
        n = nbytes = 0
        for line in body.iter_lines(chunk_size=MIB):
            if line:
                json.loads(line)
                n += 1
                nbytes += len(line) + 1
        return n, nbytes

    with ThreadPoolExecutor(a.threads) as pool:
        got = list(pool.map(read, a.keys))
    seconds = time.perf_counter() - t0
    emit({"records": sum(g[0] for g in got), "bytes": sum(g[1] for g in got), "seconds": seconds,
          "startup_cpu_s": startup, "threads": a.threads})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("gen")
    g.add_argument("--root", required=True)
    g.add_argument("--bucket", default="pipe")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--wds-shards", type=int, default=16)
    g.add_argument("--wds-samples", type=int, default=500)
    g.add_argument("--wds-jpg-bytes", type=int, default=100_000)
    g.add_argument("--tfr-files", type=int, default=16)
    g.add_argument("--tfr-records", type=int, default=5000)
    g.add_argument("--tfr-bytes", type=int, default=2000)
    g.add_argument("--pq-files", type=int, default=8)
    g.add_argument("--pq-rows", type=int, default=200_000)
    g.add_argument("--pq-row-groups", type=int, default=4)
    g.add_argument("--jsonl-files", type=int, default=8)
    g.add_argument("--jsonl-rows", type=int, default=200_000)
    g.set_defaults(fn=cmd_gen)

    def reader(name: str, fn) -> argparse.ArgumentParser:
        p = sub.add_parser(name)
        p.add_argument("--endpoint", required=True)
        p.add_argument("--bucket", default="pipe")
        p.add_argument("--keys", nargs="*", default=[])
        p.add_argument("--object-bytes", type=int, default=0, help="the objects' total size (reported as bytes)")
        p.set_defaults(fn=fn)
        return p

    p = reader("wds", cmd_wds)
    p.add_argument("--workers", type=int, default=0, help="0: iterate in this process; N: a DataLoader with N workers")
    p.add_argument("--prefetch", type=int, default=2)
    p = reader("wds-loader", cmd_wds)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=2)
    p = reader("tf", cmd_tf)
    p.add_argument("--parse", choices=["batch", "single"], default="batch")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--cycle", type=int, default=4)
    p.add_argument("--threads", type=int, default=16)
    p = reader("pyarrow", cmd_pyarrow)
    p.add_argument("--prefix", default="parquet/")
    p.add_argument("--pylist", action="store_true")
    p.add_argument("--batch-size", type=int, default=0, help="rows per record batch (0: pyarrow's default)")
    p = reader("jsonl", cmd_jsonl)
    p.add_argument("--threads", type=int, default=4)

    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
