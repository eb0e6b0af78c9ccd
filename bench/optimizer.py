#!/usr/bin/env python3
"""The optimizer's benchmark: the ImageNet training pipeline written the way users write it,
against the same pipeline placed by hand, in the same run, on the same 2,000 JPEGs.

    python3 bench/optimizer.py [--reps 3] [--epochs 2] [--only natural,hand-placed,...]
                               [--old-stoker PATH] [--out bench/results/optimizer.json]
                               [--s3 [--latency-ms 10]]

Data: the 2,000 ImageNet-like JPEGs of bench/ops.py (about 110 KB, 440x430 px, in 10 class
directories), read from local files (page cache warm), and the same JPEGs as 8 WebDataset
tar shards of 250 (`.jpg` + `.cls`). The pipeline: decode, RandomResizedCrop 224,
horizontal flip, float32 CHW normalized (ImageNet mean/std), a shuffle, batches of 64, two
epochs, all cores. Each contender is one `stoker run --json SPEC` process. With `--s3` the
same files come from stoker-testserver on loopback (a bucket each for the tree and the
shards), which waits `--latency-ms` before each response.

Contenders (the shuffle is where the name says; `-off`: the optimizer's shuffle pass off,
so the plan runs as written):
  natural            imagefolder, shuffle(2048) after the transforms (where tf.data users put
                     it): the optimizer makes it a permutation of the objects at the source
  natural-off        the same, as written: a buffer of 2,048 float tensors
  first              imagefolder, shuffle(2048) before the decode
  hand-placed        imagefolder, shuffle_shards = true and no buffer (the docs' way)
  tar-natural        tar shards, shuffle(2048) after the transforms: the optimizer moves the
                     buffer before the decode (encoded records, not float tensors)
  tar-natural-off    the same, as written
  tar-hand-placed    tar shards, shuffle_shards, interleave 4, shuffle(2048) before the decode
With --old-stoker (a `stoker` binary built from an earlier commit), `natural@old` and
`first@old` run the same specs with it: the plans the previous optimizer made.

Reported (medians over reps): images/s from process start, images/s after the first batch,
first batch (s, from process start, listing included), CPU ms per image, peak RSS and PSS of
the process (sampled every 50 ms), and the ratio of each to `hand-placed`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402  (the loop, child processes, tables: bench/harness.py)
import ops as opsbench  # noqa: E402  (the JPEGs)

log = H.logger("optimizer")

CONTENDERS = [
    "natural",
    "natural-off",
    "first",
    "hand-placed",
    "tar-natural",
    "tar-natural-off",
    "tar-hand-placed",
]
OLD = ["natural@old", "first@old"]
SHARDS = 8

TRANSFORMS = """
[[ops]]
op = "decode_image"
field = "jpg"
[[ops]]
op = "random_resized_crop"
field = "jpg"
size = [224, 224]
[[ops]]
op = "random_flip"
field = "jpg"
[[ops]]
op = "image_to_tensor"
field = "jpg"
normalize = "imagenet"
"""
SHUFFLE = """
[[ops]]
op = "shuffle"
buffer = 2048
"""
BATCH = """
[[ops]]
op = "batch"
size = 64
"""


def make_shards(tree: Path) -> Path:
    """The JPEGs of `tree` as WebDataset tar shards (`<key>.jpg`, `<key>.cls`), once."""
    out = tree.parent / f"{tree.name}-tar"
    ok = out.parent / f"{out.name}.ok"  # beside it: everything in the directory is a shard
    if ok.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(tree.rglob("*.jpg"))
    per = (len(files) + SHARDS - 1) // SHARDS
    for s in range(SHARDS):
        with tarfile.open(out / f"shard-{s:03d}.tar", "w") as tar:
            for f in files[s * per:(s + 1) * per]:
                key = f.stem
                tar.add(f, arcname=f"{key}.jpg")
                cls = f.parent.name.encode()
                info = tarfile.TarInfo(f"{key}.cls")
                info.size = len(cls)
                tar.addfile(info, io.BytesIO(cls))
    ok.write_text("ok\n")
    return out


def spec(name: str, tree: Path, shards: Path, epochs: int, s3: bool = False) -> str:
    """The spec of contender `name` (without an @old suffix); with `s3`, its files from the
    test server (a bucket named after each directory)."""
    base = name.split("@")[0]
    tar = base.startswith("tar-")
    where = (lambda d: f"s3://{d.name}/") if s3 else (lambda d: f"file://{d}/")
    head = (
        f'source = "{where(shards)}"\nformat = "tar"\n' if tar
        else f'source = "{where(tree)}"\nformat = "imagefolder"\n'
    )
    head += f"seed = 1\nepochs = {epochs}\n"
    options = f"\n[options]\nthreads = {os.cpu_count()}\n"
    if base in ("natural", "natural-off", "tar-natural", "tar-natural-off"):
        ops = TRANSFORMS + SHUFFLE + BATCH
    elif base == "first":
        ops = SHUFFLE + TRANSFORMS + BATCH
    elif base == "hand-placed":
        head += "shuffle_shards = true\n"
        ops = TRANSFORMS + BATCH
    elif base == "tar-hand-placed":
        head += "shuffle_shards = true\ninterleave = 4\n"
        ops = SHUFFLE + TRANSFORMS + BATCH
    else:
        raise ValueError(name)
    if base.endswith("-off"):
        options += 'disable = ["shuffle"]\n'
    return head + ops + options


def run_one(stoker: Path, spec_path: Path, timeout: float, images: int,
            env: dict[str, str] | None = None) -> SimpleNamespace:
    child = H.run_child([str(stoker), "run", "--json", str(spec_path)], env or dict(os.environ), timeout,
                        sample_memory=True)
    H.check(child, f"stoker run {spec_path.name}")
    doc = H.last_json(child.stdout)
    if doc["samples"] != images:
        raise H.ContenderError(f"{doc['samples']} images, expected {images}")
    first = doc["first_item_s"]
    return SimpleNamespace(**{
        "images": doc["samples"],
        "wall_s": child.wall_s,
        "images_per_s": doc["samples"] / child.wall_s,
        "steady_per_s": (doc["samples"] - 64) / max(doc["seconds"] - first, 1e-9),
        "first_batch_s": first,
        "cpu_ms_per_image": 1000 * child.cpu_s / doc["samples"],
        "peak_rss_mib": child.peak_rss / 2**20,
        "peak_pss_mib": child.peak_pss / 2**20,
        "budget_peak_mib": doc["memory_peak_bytes"] / 2**20,
    })


FIELDS = ["images_per_s", "steady_per_s", "first_batch_s", "cpu_ms_per_image", "peak_rss_mib",
          "peak_pss_mib", "budget_peak_mib"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_arg(ap, "--reps", 3)
    H.add_arg(ap, "--only", "")
    H.add_arg(ap, "--out", H.BENCH_DIR / "results/optimizer.json")
    H.add_arg(ap, "--timeout", 600.0)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--stoker", type=Path, default=None, help="the stoker binary (default: target/release/stoker)")
    ap.add_argument("--old-stoker", type=Path, default=None,
                    help="a stoker binary from an earlier commit: adds natural@old and first@old")
    ap.add_argument("--python", type=Path, default=Path(sys.executable),
                    help="a Python with numpy and Pillow, to generate the JPEGs")
    ap.add_argument("--s3", action="store_true", help="read the files from stoker-testserver on loopback")
    ap.add_argument("--latency-ms", type=float, default=10.0, help="the test server's wait before each response")
    ap.add_argument("--server", type=Path, default=None,
                    help="the stoker-testserver binary (default: target/release/stoker-testserver)")
    a = ap.parse_args(argv)
    known = CONTENDERS + (OLD if a.old_stoker else [])
    names = H.pick(a.only, known, ap.error)
    stoker = a.stoker or H.release_bin("stoker")
    tree = opsbench.prepare_data(a.images, a.python)
    shards = make_shards(tree)
    H.warm_page_cache(list(tree.rglob("*.jpg")) + list(shards.glob("*.tar")))
    work = Path("/tmp/stoker-bench-optimizer")
    work.mkdir(exist_ok=True)
    specs = {}
    for n in names:
        p = work / f"{n.replace('@', '-')}.toml"
        p.write_text(spec(n, tree, shards, a.epochs, a.s3))
        specs[n] = p
    images = a.images * a.epochs
    env = None
    server = None
    if a.s3:
        assert tree.parent == shards.parent
        server = H.Server.start(a.server or H.release_bin("stoker-testserver"), tree.parent, a.latency_ms,
                                work / "server.log")
        env = {**H.client_env(work), "AWS_ENDPOINT_URL": server.endpoint}
        log(f"test server at {server.endpoint} ({a.latency_ms:g} ms a response)")

    def run(_group: str, name: str, _rep: int) -> SimpleNamespace:
        binary = a.old_stoker if name.endswith("@old") else stoker
        return run_one(binary, specs[name], a.timeout, images, env)

    def ok(rep: int, _g: str, name: str, r: SimpleNamespace) -> None:
        log(f"rep {rep} {name}: {r.images_per_s:.0f} images/s, first batch {r.first_batch_s:.2f} s, "
            f"peak RSS {r.peak_rss_mib:.0f} MiB")

    def fail(rep: int, _g: str, name: str, msg: str) -> None:
        log(f"rep {rep} {name}: FAILED {H.first_line(msg, 300)}")

    try:
        trials = H.run_reps(a.reps, [("imagenet", names)], run, on_ok=ok, on_fail=fail)
    finally:
        if server is not None:
            server.stop()
    rows = []
    for n in names:
        reps = trials.reps[("imagenet", n)]
        if not reps:
            rows.append({"name": n, "error": trials.errors.get(("imagenet", n), "no result")})
            continue
        rows.append({"name": n, **H.medians(reps, *FIELDS), "reps": [vars(r) for r in reps]})
    ref = next((r for r in rows if r["name"] == "hand-placed" and "error" not in r), None)
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["name"], "FAILED: " + H.first_line(r["error"], 80)])
            continue
        vs = ""
        if ref is not None and r is not ref:
            vs = (f"{r['images_per_s'] / ref['images_per_s']:.2f}x images/s, "
                  f"{r['peak_rss_mib'] / ref['peak_rss_mib']:.2f}x RSS")
        table.append([
            r["name"], f"{r['images_per_s']:.0f}", f"{r['steady_per_s']:.0f}", f"{r['first_batch_s']:.2f}",
            f"{r['cpu_ms_per_image']:.2f}", f"{r['peak_rss_mib']:.0f}", f"{r['peak_pss_mib']:.0f}",
            f"{r['budget_peak_mib']:.0f}", vs,
        ])
    print(H.text_table(["contender", "images/s", "steady/s", "first batch s", "CPU ms/img", "peak RSS MiB",
                        "peak PSS MiB", "budget peak MiB", "vs hand-placed"], table, right=range(1, 8)))
    H.write_json(a.out, {
        "args": H.args_dict(a),
        "environment": H.environment({"stoker": [str(stoker), "--version"]}),
        "specs": {n: p.read_text() for n, p in specs.items()},
        "rows": rows,
    })
    log(f"results in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
