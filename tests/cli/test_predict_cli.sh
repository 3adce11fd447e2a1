#!/usr/bin/env bash
# End-to-end checks of `u3m predict eval` against the built binary: bad
# predictor lists and repeated traces end in one clear error line (exit 2),
# --json --diagnose prints one valid JSON object whose "horizons" are the ones
# scored, and --help shows the defaults.
source "$(dirname "$0")/lib.sh"
WANT_RC=2  # every error here is bad input

# A small generated mixed trace (two jobs, both switch directions).
"$U3M" trace gen --model tiny --workload mixed -o "$tmp/m.u3mt" >/dev/null 2>"$tmp/err" ||
  { echo "FAIL: trace gen: $(cat "$tmp/err")"; exit 1; }
T="$tmp/m.u3mt"

expect_error unknown "unknown predictor 'nope'" "$U3M" predict eval "$T" --predictors nope
expect_error empty-list "empty name" "$U3M" predict eval "$T" --predictors ""
expect_error trailing-comma "empty name at position 2" "$U3M" predict eval "$T" --predictors lru,
expect_error leading-comma "empty name at position 1" "$U3M" predict eval "$T" --predictors ,lru
expect_error twice "'u3m' is listed twice" "$U3M" predict eval "$T" --predictors u3m,u3m
expect_error same-trace "given twice" "$U3M" predict eval "$T" "$T" --predictors lru
expect_error same-trace-other-spelling "given twice" "$U3M" predict eval "$T" "$tmp/./m.u3mt" --predictors lru

# Values that leave nothing to score name their flag (issue 14).
expect_error horizon-zero "--horizon-ops: must be between 1 and" "$U3M" predict eval "$T" --horizon-ops 0
expect_error warmup-all "--warmup-iterations: 1000000 excludes every decision point" \
  "$U3M" predict eval "$T" --predictors lru --warmup-iterations 1000000
expect_error switch-zero "--switch-ops" "$U3M" predict eval "$T" --switch-ops 0
# An ET whose only node is its own parent is an error, not an empty trace.
echo '{"schema": "1.0.1", "nodes": [{"id": 1, "name": "x", "parent": 1}]}' >"$tmp/self.json"
expect_error self-parent "node id 1 ('x') is its own parent" "$U3M" trace import "$tmp/self.json" -o "$tmp/self.u3mt"
# The old name of the default still works, with a note (Note [Predictor names]).
if "$U3M" predict eval "$T" --predictors u3m-seq --json >"$tmp/a.json" 2>"$tmp/err" &&
  grep -qF "'u3m-seq' is an old name of 'u3m'" "$tmp/err" &&
  $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if list(d["predictors"])==["u3m"] and "per_job" in d["predictors"]["u3m"] else 1)' "$tmp/a.json"; then
  ok
else bad "u3m-seq alias: $(cat "$tmp/err")"; fi

# --json --diagnose: one valid JSON object, the diagnosis inside it.
if "$U3M" predict eval "$T" --predictors lru,oracle --json --diagnose >"$tmp/d.json" 2>"$tmp/err"; then
  if $PY - "$tmp/d.json" "$T" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["per_trace"][sys.argv[2]]
assert set(t["diagnosis"]) == {"lru", "oracle"}, t["diagnosis"].keys()
assert t["diagnosis"]["lru"]["tables"], "empty diagnosis"
assert d["horizons"] == ["8", "64", "iteration"], d["horizons"]
for k in ("precision", "recall", "f1", "recall_known", "f1_known", "recall_ceiling",
          "precision_count", "recall_count", "f1_count", "warmup_events", "ns_per_event"):
    assert k in d["predictors"]["lru"], k
o = d["predictors"]["oracle"]
assert abs(o["recall"] - o["recall_ceiling"]) < 1e-12, o
PYEOF
  then ok; else bad "--json --diagnose: not the documented JSON"; fi
else bad "--json --diagnose failed: $(cat "$tmp/err")"; fi

# --window-delta scores the headline horizon only, and the JSON says so.
if "$U3M" predict eval "$T" --predictors lru --json --window-delta --horizon-ops 32 >"$tmp/w.json" 2>"$tmp/err" &&
  $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["horizons"]==["32"] and list(d["predictors"]["lru"]["horizons"])==["32"] else 1)' "$tmp/w.json"; then
  ok
else bad "--window-delta horizons: $(cat "$tmp/err") $(head -c 300 "$tmp/w.json")"; fi

# --help shows the defaults.
"$U3M" predict eval --help >"$tmp/help" 2>&1
for want in "--horizon-ops UINT=64" "--warmup-iterations UINT=1" "--switch-ops UINT=64"; do
  if grep -qF -- "$want" "$tmp/help"; then ok; else bad "--help lacks '$want'"; fi
done

finish "predict CLI"
