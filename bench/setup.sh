#!/usr/bin/env bash
# Installs what the storage benchmark's peers need. Idempotent; run as root.
#
#   bash bench/setup.sh            # apt packages + Python venv at .venv-bench
#   SKIP_APT=1 bash bench/setup.sh # only the venv
#   WITH_TORCH=1 bash bench/setup.sh # also s3torchconnector + torch
#
# - apt: s3fs (s3fs-fuse), curl (needs --aws-sigv4, curl >= 7.75), fuse3
# - venv /work/main/.venv-bench (in the repository root; it ignores itself
#   through a .gitignore inside it): boto3, s3torchconnectorclient.
#   WITH_TORCH=1 also installs s3torchconnector (pulls torch, several GB).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${STOKER_BENCH_VENV:-$ROOT/.venv-bench}"
PY="${PYTHON:-python3}"

if [[ -z "${SKIP_APT:-}" ]]; then
  need=()
  command -v s3fs >/dev/null || need+=(s3fs)
  command -v curl >/dev/null || need+=(curl)
  command -v fusermount3 >/dev/null || need+=(fuse3)
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

"$VENV/bin/python" -m pip install --quiet --upgrade pip
# s3torchconnectorclient is the connector's I/O client (Rust, AWS CRT) and needs no
# torch; the full s3torchconnector package adds the torch datasets and pulls torch
# (several GB from PyPI), so it is opt-in.
"$VENV/bin/python" -m pip install --quiet boto3 s3torchconnectorclient
if [[ -n "${WITH_TORCH:-}" ]]; then
  "$VENV/bin/python" -m pip install --quiet s3torchconnector
fi

"$VENV/bin/python" - <<'EOF2'
import importlib.metadata as m
def v(p):
    try:
        return m.version(p)
    except m.PackageNotFoundError:
        return "not installed"
import boto3, s3torchconnectorclient  # noqa: F401  (fail here if broken)
print("setup.sh: ok: " + ", ".join(f"{p} {v(p)}" for p in ("boto3", "s3torchconnectorclient", "s3torchconnector", "torch")))
EOF2
