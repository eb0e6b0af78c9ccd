#!/usr/bin/env bash
# Fuzzes every target for SECONDS_PER_TARGET seconds (default 15), one after another, and
# fails if any of them finds a crash, a panic, a hang (-timeout), an allocation past the
# cap (-malloc_limit_mb / -rss_limit_mb) or a leak. See README.md.
#
#   fuzz/run.sh [SECONDS_PER_TARGET]      TARGETS="csv tar" fuzz/run.sh 600
#
# Installs cargo-fuzz when missing; runs libFuzzer on the stable toolchain with
# RUSTC_BOOTSTRAP=1 (cargo-fuzz passes -Z flags). The corpora live in fuzz/corpus/<target>
# (seeded by seeds.py from the repository's fixtures, grown by every run, not committed);
# a failing input is written to fuzz/artifacts/<target>/ and its path printed.
set -euo pipefail
cd "$(dirname "$0")"

SECS="${1:-15}"
export RUSTC_BOOTSTRAP=1
# The instrumented build (every dependency with coverage and AddressSanitizer) takes 10-20
# minutes from nothing on two cores and a minute or two after a change, so it lives outside
# the checkout, where every clone on this machine (CI's fresh ones included) reuses it.
# STOKER_FUZZ_TARGET_DIR (or CARGO_TARGET_DIR) puts it elsewhere.
export CARGO_TARGET_DIR="${STOKER_FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:-$HOME/.cache/stoker/fuzz-target}}"
mkdir -p "$CARGO_TARGET_DIR"
# Niceness for shared machines (NICE=0 to run at normal priority).
NICE="${NICE:-10}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked --version 0.13.2
fi

ALL=$(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^stoker-fuzz$')
TARGETS="${TARGETS:-$ALL}"

python3 seeds.py

echo "== building the fuzz targets"
start=$(date +%s)
# -a: debug assertions (integer overflow checks included), as in the tests.
nice -n "$NICE" cargo fuzz build -a
echo "built in $(( $(date +%s) - start )) s"

failed=()
mkdir -p artifacts
for t in $TARGETS; do
  echo "== fuzzing $t for ${SECS}s"
  mkdir -p "corpus/$t" "artifacts/$t"
  log="artifacts/$t.log"
  # -timeout: one input taking longer is a hang; -rss_limit_mb / -malloc_limit_mb: memory
  # a hostile input must not make us take; -max_len: inputs up to 64 KiB.
  if nice -n "$NICE" cargo fuzz run -a "$t" "corpus/$t" -- \
      -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "$t: ok, ${runs:-?} executions in ${SECS}s, $cov, corpus $(ls "corpus/$t" | wc -l) inputs"
  else
    echo "$t: FAILED; the end of $log:"
    tail -n 40 "$log"
    failed+=("$t")
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzzing found problems in: ${failed[*]} (inputs in fuzz/artifacts/<target>/)"
  exit 1
fi
echo "fuzzing: every target ran ${SECS}s without a failure"
