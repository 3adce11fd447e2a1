#!/usr/bin/env bash
# End-to-end checks of `u3m trace ...` against the built binary: every sample
# ET imports, stats JSON carries the documented fields, formats round-trip, and
# bad input ends in one clear error line with a nonzero exit.
source "$(dirname "$0")/lib.sh"
SRC=${U3M_SOURCE_DIR:?U3M_SOURCE_DIR not set}

json_field() { $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval('d'+sys.argv[2]))" "$1" "$2"; }

# --- every checked-in ET sample imports, and stats has the documented fields
for f in "$SRC"/data/pytorch-et/*.json.gz; do
  n=$(basename "$f" .json.gz)
  if "$U3M" trace import "$f" -o "$tmp/$n.u3mt" 2>"$tmp/err"; then ok; else bad "import $n: $(cat "$tmp/err")"; continue; fi
  "$U3M" trace stats "$tmp/$n.u3mt" --json >"$tmp/$n.json" || { bad "stats $n"; continue; }
  for k in events ops tensors bytes_unique iterations op_classes jobs; do
    if $PY -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if sys.argv[2] in d else 1)" "$tmp/$n.json" "$k"; then ok; else bad "stats $n lacks $k"; fi
  done
  ev=$(json_field "$tmp/$n.json" '["events"]')
  [ "$ev" -gt 0 ] && ok || bad "$n: no events"
  # binary -> jsonl -> binary keeps the counts
  "$U3M" trace convert "$tmp/$n.u3mt" -o "$tmp/$n.jsonl" 2>/dev/null &&
    "$U3M" trace convert "$tmp/$n.jsonl" -o "$tmp/$n.2.u3mt" 2>/dev/null &&
    "$U3M" trace stats "$tmp/$n.2.u3mt" --json >"$tmp/$n.2.json" || bad "$n: convert round trip failed"
  [ "$(json_field "$tmp/$n.2.json" '["events"]')" = "$ev" ] && ok || bad "$n: events changed in round trip"
  # the binary form is a fraction of the JSON-lines form
  b=$(stat -c %s "$tmp/$n.u3mt"); j=$(stat -c %s "$tmp/$n.jsonl")
  [ $((b * 4)) -lt "$j" ] && ok || bad "$n: binary $b B not < 1/4 of JSONL $j B"
done

# --- malformed input: one clear line, nonzero exit
head -c 5000 "$SRC/data/pytorch-et/linear_et.json.gz" >"$tmp/trunc.json.gz"
expect_error "truncated gzip" "truncated" "$U3M" trace import "$tmp/trunc.json.gz" -o "$tmp/x.u3mt"
printf '{"schema": "9.9.9", "nodes": []}' >"$tmp/schema.json"
expect_error "unknown schema" "9.9.9" "$U3M" trace import "$tmp/schema.json" -o "$tmp/x.u3mt"
printf '{\n  "schema": "1.0.1",\n  "nodes": [\n    {"name": oops}\n  ]\n}\n' >"$tmp/syntax.json"
expect_error "JSON error line" "line 4" "$U3M" trace import "$tmp/syntax.json" -o "$tmp/x.u3mt"
printf '{"u3m_trace": 1}\n{"job": "j"}\n{"tensor": {"name": "x", "bytes": -5}}\n' >"$tmp/neg.jsonl"
expect_error "negative size" "neg.jsonl:3: field 'bytes'" "$U3M" trace stats "$tmp/neg.jsonl"
printf 'hello\n' >"$tmp/junk.txt"
expect_error "unknown format" "unrecognised format" "$U3M" trace stats "$tmp/junk.txt"
head -c 100 "$tmp/linear_et.u3mt" >"$tmp/cut.u3mt"
expect_error "truncated binary" "truncated" "$U3M" trace stats "$tmp/cut.u3mt"
expect_error "missing file" "does_not_exist" "$U3M" trace stats "$tmp/does_not_exist.u3mt"

mkdir -p "$tmp/adir"
expect_error "directory as input" "is a directory" "$U3M" trace stats "$tmp/adir"
# A failed import must not destroy an existing output, nor convert its own input.
cp "$tmp/linear_et.u3mt" "$tmp/keep.u3mt"
expect_error "failed import keeps output" "9.9.9" "$U3M" trace import "$tmp/schema.json" -o "$tmp/keep.u3mt"
cmp -s "$tmp/linear_et.u3mt" "$tmp/keep.u3mt" && ok || bad "failed import changed the existing output"
expect_error "convert onto itself" "also the input" "$U3M" trace convert "$tmp/keep.u3mt" -o "$tmp/keep.u3mt"
cmp -s "$tmp/linear_et.u3mt" "$tmp/keep.u3mt" && ok || bad "convert onto itself changed the file"
expect_error "convert refuses ET" "use 'u3m trace import'" "$U3M" trace convert "$SRC/data/pytorch-et/linear_et.json.gz" -o "$tmp/y.u3mt"
expect_error "--job only for ET" "--job" "$U3M" trace import "$tmp/keep.u3mt" --job x -o "$tmp/y.u3mt"
expect_error "output dir missing" "cannot create" "$U3M" trace convert "$tmp/keep.u3mt" -o "$tmp/no/such/dir.u3mt"

# --- help texts exist for every trace command
for c in import convert stats gen; do
  "$U3M" trace $c --help >"$tmp/help" 2>&1 && grep -q "Usage" "$tmp/help" && ok || bad "trace $c --help"
done

finish cli
