#!/usr/bin/env bash
# The runtime's soak (issue 14), a benchmark-style run, not part of CI:
# threads acquire, release, prefetch and evict on the real stack with random
# faults of every class under the SSD store, for MINUTES, under
# ThreadSanitizer. Prints operations done, faults injected and detected, and
# bytes lost; exits non-zero if a byte was read back wrong without an error,
# or TSan reported a race.
# Usage: scripts/soak.sh MINUTES [u3m_soak flags...]   (e.g. scripts/soak.sh 10 --threads 6)
set -euo pipefail
minutes=${1:?usage: scripts/soak.sh MINUTES [u3m_soak flags]}
shift
case "$minutes" in
  ''|*[!0-9.]*) echo "soak: MINUTES must be a number, got '$minutes'" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh >/dev/null
cmake --preset tsan >/dev/null
cmake --build --preset tsan --target u3m_soak -j "$(nproc)"
# halt_on_error: a race ends the run with TSan's report and a non-zero exit.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  build/tsan/tests/engine/u3m_soak --minutes "$minutes" "$@"
