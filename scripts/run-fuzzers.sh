#!/usr/bin/env bash
# Runs every libFuzzer target briefly from its checked-in seed corpus.
# Usage: scripts/run-fuzzers.sh BUILD_DIR [SECONDS_EACH]
set -euo pipefail
build=${1:?build dir}
secs=${2:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
shopt -s nullglob
targets=("$build"/fuzz/fuzz_*)
[ ${#targets[@]} -gt 0 ] || { echo "run-fuzzers: no fuzz targets in $build/fuzz" >&2; exit 1; }
passed=0
for t in "${targets[@]}"; do
  name=${t##*/fuzz_}
  work=$(mktemp -d)
  seeds="$root/fuzz/corpus/$name"
  echo "fuzz: $name for ${secs}s (seeds: fuzz/corpus/$name)"
  # New inputs go to the temporary dir; the checked-in seeds are read only.
  if ! "$t" -max_total_time="$secs" -seed=1 -print_final_stats=1 -artifact_prefix="$work/" \
      "$work" "$seeds" > "$work/log" 2>&1; then
    tail -40 "$work/log"
    echo "fuzz: $name FAILED; crashing input kept in $work" >&2
    exit 1
  fi
  grep -E "stat::number_of_executed_units" "$work/log" || true
  rm -rf "$work"
  passed=$((passed + 1))
done
echo "fuzz: ${passed} passed, 0 failed"
