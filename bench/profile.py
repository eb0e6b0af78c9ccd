"""What profiling costs: the same pipeline, in the same run, unprofiled, with the timeline
every run keeps, and under `stoker profile` (the timeline, the trace's spans and the report
written at the end). Medians over `--reps` interleaved repetitions, and the ratios.

    python3 bench/profile.py                  # 2,000 JPEGs, the ImageNet pipeline, 5 reps
    python3 bench/profile.py --images 500 --reps 3

The data: `stoker demo --dir DIR` writes its photograph-like JPEGs as an ImageFolder under
DIR/demo/images; the pipeline reads them as local files (no server: the CPU is the
bottleneck, where a profiler's cost would show). Contenders, each a `stoker` process:

- `off`: `stoker run SPEC --json` with `STOKER_PROFILE_INTERVAL_MS=0` (no timeline);
- `timeline`: `stoker run SPEC --json` (the default: a timeline point every 100 ms);
- `profile`: `stoker profile SPEC --json --out DIR` (timeline, trace spans, report).

Throughput is samples over the process's wall time (start-up, listing and, for `profile`,
writing the report included: all of what profiling costs). Ratios to `off`: of the medians,
and the median of the ratios rep by rep (the three run back to back within a rep, so that
ratio cancels the machine's drift between reps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

log = H.logger("profile")

SPEC = """source = "{root}"
format = "imagefolder"
seed = 42
epochs = {epochs}
shuffle_shards = true

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
[[ops]]
op = "batch"
size = 64

[options]
threads = {threads}
disable = ["cache"]
"""

# Cheap per-sample work, where a per-item cost of profiling would show most: JSON lines
# parsed, a random draw, batches of 256.
CHEAP_SPEC = """source = "{root}"
format = "jsonl"
seed = 42
epochs = 1

[[ops]]
op = "random_int"
to = "r"
below = 10
[[ops]]
op = "batch"
size = 256

[options]
threads = {threads}
disable = ["cache"]
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lines", type=int, default=400_000, help="JSON lines of the cheap workload")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--data-dir", type=Path, default=Path("/tmp/stoker-bench-data/profile"))
    ap.add_argument("--stoker", type=Path, default=H.REPO / "target/release/stoker")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", type=Path, default=H.RESULTS / "profile.json")
    a = ap.parse_args()

    if not a.no_build:
        log("cargo build --release -p stoker")
        subprocess.run(["cargo", "build", "--release", "-p", "stoker"], cwd=H.REPO, check=True)
    root = a.data_dir / "demo" / "images"
    if not root.is_dir() or sum(1 for _ in root.rglob("*.jpg")) < a.images:
        log(f"generating {a.images} JPEGs in {a.data_dir} (stoker demo --dir)")
        subprocess.run(
            [str(a.stoker), "demo", "--images", str(a.images), "--epochs", "1", "--dir", str(a.data_dir), "--json"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    tmp = Path(tempfile.mkdtemp(prefix="stoker-profile-bench-"))
    specs = {"imagenet": tmp / "imagenet.toml", "jsonl": tmp / "jsonl.toml"}
    specs["imagenet"].write_text(SPEC.format(root=root, epochs=a.epochs, threads=a.threads))
    lines = a.data_dir / f"lines-{a.lines}"
    lines.mkdir(parents=True, exist_ok=True)
    for i in range(4):
        f = lines / f"part{i}.jsonl"
        if not f.exists():
            with open(f, "w") as w:
                for j in range(a.lines // 4):
                    w.write(json.dumps({"id": i * 10**7 + j, "text": f"line {j} of part {i}"}) + "\n")
    specs["jsonl"].write_text(CHEAP_SPEC.format(root=lines, threads=a.threads))
    expected = {"imagenet": a.images * a.epochs, "jsonl": a.lines // 4 * 4}

    def run(group: str, contender: str, rep: int) -> dict:
        spec = specs[group]
        env = dict(os.environ)
        if contender == "off":
            env["STOKER_PROFILE_INTERVAL_MS"] = "0"
            cmd = [str(a.stoker), "run", str(spec), "--json"]
        elif contender == "timeline":
            cmd = [str(a.stoker), "run", str(spec), "--json"]
        else:
            cmd = [str(a.stoker), "profile", str(spec), "--json", "--seconds", "600", "--out", str(tmp / f"{group}{rep}")]
        t0 = time.monotonic()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if p.returncode != 0:
            raise H.ContenderError(H.first_line(p.stderr, 300))
        r = json.loads(p.stdout)
        return {"samples": r["samples"], "wall_s": wall, "samples_per_s": r["samples"] / wall}

    contenders = ["off", "timeline", "profile"]
    groups = list(specs)
    trials = H.run_reps(
        a.reps,
        [(g, contenders) for g in groups],
        run,
        expect=lambda g, _c, r: None if r["samples"] == expected[g] else f"{r['samples']} samples",
        on_ok=lambda rep, g, c, r: log(f"rep {rep} {g} {c}: {r['samples_per_s']:.0f} samples/s"),
    )
    if trials.errors:
        for k, e in trials.errors.items():
            log(f"FAILED {k}: {e}")
        return 1
    rows = []
    summary = {}
    for g in groups:
        med = {c: H.median(r["samples_per_s"] for r in trials.reps[(g, c)]) for c in contenders}
        # Within a rep the three ran one after the other: the ratio rep by rep cancels the
        # machine's drift between reps.
        off = [r["samples_per_s"] for r in trials.reps[(g, "off")]]
        paired = {c: H.median(r["samples_per_s"] / o for r, o in zip(trials.reps[(g, c)], off)) for c in contenders}
        summary[g] = {"medians": med, "paired_ratios": paired}
        for c in contenders:
            runs = [r["samples_per_s"] for r in trials.reps[(g, c)]]
            rows.append(
                [g, c, f"{med[c]:.0f}", f"{min(runs):.0f}-{max(runs):.0f}", f"{med[c] / med['off']:.3f}", f"{paired[c]:.3f}"]
            )
    head = ["pipeline", "contender", "median samples/s", "range", "/ off (medians)", "/ off (median of rep pairs)"]
    print(H.text_table(head, rows, right=[2, 3, 4, 5]))
    H.write_json(
        a.out,
        {
            "when": H.now_iso(),
            "args": H.args_dict(a),
            "environment": H.environment(),
            "summary": summary,
            "reps": {f"{g}/{c}": trials.reps[(g, c)] for g in groups for c in contenders},
        },
    )
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
