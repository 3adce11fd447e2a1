#!/usr/bin/env bash
# Runs every libFuzzer target from its checked-in seed corpus and reports,
# per target and in total, the executions done.
# Usage: scripts/run-fuzzers.sh BUILD_DIR [SECONDS_EACH] [RUNS_EACH]
#   SECONDS_EACH (default 20): time per target (`make test` keeps it brief).
#   RUNS_EACH: stop each target after this many executions instead (with
#   SECONDS_EACH 0: no time limit), e.g. 1000000 for the offline campaign.
# FUZZ_ONLY=a,b runs only those targets; FUZZ_NICE=N runs them under nice -n N.
# A crash, a sanitizer report, an input slower than 10 s (a hang) or one
# over 2 GiB of memory fails the target; its input is kept and the script
# goes on to the next target, then exits 1.
set -euo pipefail
build=${1:?build dir}
secs=${2:-20}
runs=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
shopt -s nullglob
targets=("$build"/fuzz/fuzz_*)
[ ${#targets[@]} -gt 0 ] || { echo "run-fuzzers: no fuzz targets in $build/fuzz" >&2; exit 1; }
limits=(-timeout=10 -rss_limit_mb=2048)
[ "$secs" != 0 ] && limits+=(-max_total_time="$secs")
[ -n "$runs" ] && limits+=(-runs="$runs")
nice_cmd=()
[ -n "${FUZZ_NICE:-}" ] && nice_cmd=(nice -n "$FUZZ_NICE")
passed=0 failed=0 total=0
for t in "${targets[@]}"; do
  name=${t##*/fuzz_}
  if [ -n "${FUZZ_ONLY:-}" ] && [[ ",$FUZZ_ONLY," != *",$name,"* ]]; then continue; fi
  work=$(mktemp -d)
  seeds="$root/fuzz/corpus/$name"
  [ -d "$seeds" ] || { echo "fuzz: $name has no seed corpus fuzz/corpus/$name" >&2; exit 1; }
  start=$(date +%s)
  # New inputs go to the temporary dir; the checked-in seeds are read only.
  if "${nice_cmd[@]}" "$t" "${limits[@]}" -seed=1 -print_final_stats=1 \
      -artifact_prefix="$work/" "$work" "$seeds" >"$work/log" 2>&1; then
    ok=1
  else
    ok=0
  fi
  wall=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -1)
  execs=${execs:-0}
  total=$((total + execs))
  if [ $ok = 1 ]; then
    echo "fuzz: $name: $execs executions in ${wall} s (${rate:-?}/s), no finding"
    passed=$((passed + 1))
    rm -rf "$work"
  else
    tail -40 "$work/log"
    echo "fuzz: $name FAILED after $execs executions; the input and log are kept in $work" >&2
    failed=$((failed + 1))
  fi
done
echo "fuzz: total $total executions; ${passed} targets passed, ${failed} failed"
[ $failed -eq 0 ]
