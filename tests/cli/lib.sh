# Shared by the CLI end-to-end scripts: counters, a scratch dir, and checks
# that a command fails with exactly one clear stderr line. Source it.
set -uo pipefail
U3M=${U3M_BIN:?U3M_BIN not set}
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# expect_error NAME EXPECTED_SUBSTRING CMD...: nonzero exit, one stderr line containing the text.
# With WANT_RC set, the exit code must equal it (2 = bad input, InputError).
expect_error() {
  local name=$1 want=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ $rc -eq 0 ]; then bad "$name: exit 0"; return; fi
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then bad "$name: timed out (a hang?)"; return; fi
  if [ -n "${WANT_RC:-}" ] && [ $rc -ne "$WANT_RC" ]; then bad "$name: exit $rc, want $WANT_RC"; return; fi
  if [ "$lines" -ne 1 ]; then bad "$name: $lines stderr lines: $(cat "$tmp/err")"; return; fi
  if ! grep -qF -- "$want" "$tmp/err"; then bad "$name: '$want' not in: $(cat "$tmp/err")"; return; fi
  ok
}

# finish LABEL: the closing "N passed, M failed" line and the exit status.
finish() {
  echo "$1: ${pass} passed, ${fail} failed"
  [ "$fail" -eq 0 ]
}
