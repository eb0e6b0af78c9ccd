#!/usr/bin/env bash
# Fuzzes every target, one after another, and fails if any of them finds a crash, a panic, a
# hang (-timeout), an allocation past the cap (-malloc_limit_mb / -rss_limit_mb) or a leak.
# See README.md.
#
#   fuzz/run.sh ci                        what .ci/run does (below)
#   fuzz/run.sh [SECONDS_PER_TARGET]      by hand: default 15 s each, a random seed
#   TARGETS="csv tar" fuzz/run.sh 600
#
# `ci` mode is reproducible: each target starts from its seeds and the committed
# regression inputs only (fuzz/regressions/<target>/, every input that ever failed), in a
# fresh corpus directory, with a fixed libFuzzer seed and a fixed number of executions per
# target (RUNS below: about 10 s each on two cores). So the inputs CI tries are the ones
# `fuzz/run.sh ci` tries here, and a commit whose CI fuzzing would fail fails here first;
# random exploration (new seeds, growing corpora) is for the timed runs by hand.
#
# Installs cargo-fuzz when missing; runs libFuzzer on the stable toolchain with
# RUSTC_BOOTSTRAP=1 (cargo-fuzz passes -Z flags). The corpora of timed runs live in
# fuzz/corpus/<target> (seeded by seeds.py from the repository's fixtures, grown by every
# run, not committed); a failing input is written to fuzz/artifacts/<target>/ and its path
# printed: copy it to fuzz/regressions/<target>/ with the fix.
set -euo pipefail
cd "$(dirname "$0")"

MODE="${1:-15}"
# Executions per target in ci mode (about 10 s each with ASan on two shared cores).
declare -A RUNS=(
  [tar]=40000 [tfrecord]=40000 [tf_example]=50000 [image_header]=400000
  [image_decode]=20000 [parquet]=12000 [jsonl]=40000 [csv]=20000 [audio]=8000
  [url]=400000 [glob]=40000 [spec]=50000 [state]=40000
)
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

if [ "$MODE" = ci ]; then
  CORPORA="$CARGO_TARGET_DIR/ci-corpus"
  rm -rf "$CORPORA"
  STOKER_FUZZ_CORPUS="$CORPORA" python3 seeds.py
  for d in regressions/*/; do
    t=$(basename "$d")
    mkdir -p "$CORPORA/$t"
    cp "$d"* "$CORPORA/$t/"
  done
else
  CORPORA=corpus
  python3 seeds.py
fi

echo "== building the fuzz targets"
start=$(date +%s)
# -a: debug assertions (integer overflow checks included), as in the tests.
nice -n "$NICE" cargo fuzz build -a
echo "built in $(( $(date +%s) - start )) s"
# Cargo keeps every earlier build of a crate that changed beside the new one, so on a machine
# that runs CI again and again this directory grew by about a gigabyte a run (8.7 GB after a
# day here). Only this project's crates and the fuzz binaries change between runs: keep the
# newest build of each and delete the others (third-party crates are left alone, since two
# versions of one of them can both be in use).
python3 prune.py "$CARGO_TARGET_DIR"

failed=()
mkdir -p artifacts
for t in $TARGETS; do
  mkdir -p "$CORPORA/$t" "artifacts/$t"
  log="artifacts/$t.log"
  if [ "$MODE" = ci ]; then
    runs="${RUNS[$t]:-20000}"
    echo "== fuzzing $t: $runs executions from its seeds and regressions, seed 1"
    # -max_total_time is only a backstop for a machine far slower than this one.
    bound=(-seed=1 -runs="$runs" -max_total_time=300)
  else
    echo "== fuzzing $t for ${MODE}s"
    bound=(-max_total_time="$MODE")
  fi
  # -timeout: one input taking longer is a hang; -rss_limit_mb / -malloc_limit_mb: memory
  # a hostile input must not make us take; -max_len: inputs up to 64 KiB.
  t0=$(date +%s)
  if nice -n "$NICE" cargo fuzz run -a "$t" "$CORPORA/$t" -- \
      "${bound[@]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "$t: ok, ${runs:-?} executions in $(( $(date +%s) - t0 )) s, $cov, corpus $(ls "$CORPORA/$t" | wc -l) inputs"
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
echo "fuzzing: every target ran without a failure"
