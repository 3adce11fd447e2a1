#!/usr/bin/env bash
# scripts/gpu-check.sh [OUT.json]: issue 19's GPU check, in at most 8 minutes on one
# NVIDIA H200 with PyTorch 2.x and CUDA (docs/accelerators.md, "The GPU check").
# Writes one JSON file (default gpu-check.json in the repo root) with:
#   machine     nvidia-smi, python, torch, compilers;
#   steps       every step's exit status, seconds and log tail;
#   cuda_tests  the cuda backend's test suite against the real runtime (U3M_CUDA_TEST_REAL=1);
#   bench_copy  `u3m bench copy --backend cuda` (h2d, d2h, d2d) and whether the largest
#               copies reach 90% of the runtime's own pinned cudaMemcpy;
#   doctor      `u3m doctor --json`;
#   train       a ~1.1B-parameter LLaMA-shaped model in bf16, a few steps untiered and
#               under u3m.torch.offload at a 50% device budget: losses, step-time
#               overhead, peak device memory (scripts/gpu-check-torch.py);
#   generate    greedy generation with u3m's tiered KV cache against the dense one;
#   verdict     each check: pass, fail or not run, with the reason.
# Nothing is assumed to work: a step that fails is recorded and the next one runs.
#
# It needs only what the machine has. The device image has CUDA, PyTorch, CMake and
# ninja but maybe not u3m's C++ build dependencies (fmt, CLI11, GTest, ...), and no
# network. For that case carry Debian's packages along: on a Debian 12 machine with
# apt, `scripts/gpu-check.sh --fetch-deps` downloads them into .gpu-deps/ (a few MB;
# keep it out of git with `echo /.gpu-deps/ >> .git/info/exclude`), and when the
# configure step fails here this script unpacks them (dpkg -x, never into /) and
# configures again against them.
#
# Environment: GPU_CHECK_PYTHON (default: the python3 on PATH, which on the device
# image is the one with torch; /usr/bin/python3 may differ), GPU_CHECK_BUILD (build
# dir, default build/gpu-check), GPU_CHECK_DEPS (default .gpu-deps), GPU_CHECK_BUDGET_S
# (default 480).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=${GPU_CHECK_DEPS:-$ROOT/.gpu-deps}
DEB_PKGS=(libfmt-dev libfmt9 nlohmann-json3-dev libsimdjson-dev libsimdjson14 libcli11-dev
  libgtest-dev libgmock-dev liburing-dev liburing2 libxxhash-dev libxxhash0
  libtomlplusplus-dev libtomlplusplus3 zlib1g-dev pkgconf pkgconf-bin libpkgconf3 pybind11-dev
  libhiredis-dev libhiredis0.14)  # u3m_kv links hiredis (the remote KV tier)

if [ "${1:-}" = "--fetch-deps" ]; then
  dir=${2:-$DEPS}
  mkdir -p "$dir" && cd "$dir" || exit 1
  apt-get download "${DEB_PKGS[@]}" || { echo "gpu-check: apt-get download failed" >&2; exit 1; }
  n=$(find . -maxdepth 1 -name "*.deb" | wc -l)
  echo "gpu-check: $n packages, $(du -sh . | cut -f1) in $dir"
  exit 0
fi

OUT=$(realpath -m "${1:-$ROOT/gpu-check.json}")
BUILD=${GPU_CHECK_BUILD:-$ROOT/build/gpu-check}
PY=${GPU_CHECK_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}
BUDGET=${GPU_CHECK_BUDGET_S:-480}
W=$(mktemp -d)
T0=$(date +%s)
: >"$W/steps.tsv"
left() { echo $((BUDGET - ($(date +%s) - T0))); }

# step NAME CAP_S CMD...: runs CMD under a timeout of min(CAP_S, what is left less 15 s
# for the report), output in $W/NAME.log; records name, exit status, seconds.
step() {
  local name=$1 cap=$2; shift 2
  local t rc s
  s=$(date +%s)
  t=$(($(left) - 15))
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 5 ]; then
    printf '%s\t%s\t%s\n' "$name" "skipped: out of time" 0 >>"$W/steps.tsv"
    return 124
  fi
  echo "gpu-check: $name (up to ${t}s)" >&2
  timeout -k 10 "$t" "$@" >"$W/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" $(($(date +%s) - s)) >>"$W/steps.tsv"
  return $rc
}

# --- the machine
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
    --format=csv,noheader 2>&1 | head -4
  echo "python: $PY"
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -1
  command -v nvcc >/dev/null && nvcc --version | tail -1
  g++ --version 2>&1 | head -1
  cmake --version 2>&1 | head -1
  echo "cores $(nproc), $(free -g | awk '/Mem:/ {print $2}') GiB"
} >"$W/machine.txt" 2>&1

# The CUDA runtime the backend should load: the toolkit's, else the one pip put beside torch.
if [ -z "${U3M_CUDART_LIBRARY:-}" ]; then
  for c in /usr/local/cuda/lib64/libcudart.so /usr/local/cuda/targets/x86_64-linux/lib/libcudart.so \
    $(ls /usr/local/cuda*/lib64/libcudart.so.* 2>/dev/null) \
    $("$PY" -c 'import os, nvidia; print(" ".join(os.path.join(r, f) for p in nvidia.__path__ for r, _, fs in os.walk(p) for f in fs if f.startswith("libcudart.so")))' 2>/dev/null); do
    [ -e "$c" ] && { export U3M_CUDART_LIBRARY=$c; break; }
  done
fi
echo "U3M_CUDART_LIBRARY=${U3M_CUDART_LIBRARY:-unset, the backend searches}" >>"$W/machine.txt"

# --- build: u3m, the cuda backend's tests and the Python extension, against this python
GEN=Ninja
command -v ninja >/dev/null || GEN="Unix Makefiles"
ARGS=(-S "$ROOT" -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DU3M_BENCH=OFF
  -DU3M_PYTHON_TESTS=OFF -DPython_EXECUTABLE="$PY" -DU3M_PYTHON="$PY")
PYBIND=$("$PY" -m pybind11 --cmakedir 2>/dev/null) && ARGS+=(-Dpybind11_DIR="$PYBIND")
USED_DEPS=false
configure() { step configure 120 cmake "${ARGS[@]}" "$@"; }
if ! configure; then
  if ls "$DEPS"/*.deb >/dev/null 2>&1; then
    D=$W/deps
    mkdir -p "$D"
    for f in "$DEPS"/*.deb; do
      if command -v dpkg >/dev/null; then
        dpkg -x "$f" "$D"
      else  # a .deb is an ar archive around data.tar.*
        (cd "$D" && ar x "$f" && tar -xf data.tar.* && rm -f data.tar.* control.tar.* debian-binary)
      fi
    done
    export CMAKE_PREFIX_PATH="$D/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    export PKG_CONFIG_PATH="$D/usr/lib/x86_64-linux-gnu/pkgconfig:$D/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR=$D
    export LD_LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    command -v pkg-config >/dev/null || ARGS+=(-DPKG_CONFIG_EXECUTABLE="$D/usr/bin/pkgconf")
    [ -n "$PYBIND" ] || ARGS+=(-Dpybind11_DIR="$D/usr/lib/cmake/pybind11")
    USED_DEPS=true
    rm -f "$BUILD/CMakeCache.txt"
    mv "$W/configure.log" "$W/configure-without-deps.log"
    configure ||
      { rm -f "$BUILD/CMakeCache.txt"; configure -DU3M_PYTHON_MODULE=OFF; }
  else
    rm -f "$BUILD/CMakeCache.txt"
    configure -DU3M_PYTHON_MODULE=OFF  # maybe only the Python headers were missing
  fi
fi
step build 300 cmake --build "$BUILD" -j"$(nproc)" --target u3m test_backend_cuda
step build_python 120 cmake --build "$BUILD" -j"$(nproc)" --target u3m_python
U3M=$BUILD/apps/u3m/u3m

# --- the cuda backend's suite on the real runtime (the tests that steer the double skip)
[ -x "$BUILD/tests/mem/test_backend_cuda" ] &&
  step cuda_tests 90 env U3M_CUDA_TEST_REAL=1 "$BUILD/tests/mem/test_backend_cuda" \
    --gtest_output=json:"$W/cuda_tests.json"

# --- copies against the runtime's own pinned cudaMemcpy, and doctor
[ -x "$U3M" ] && step bench_copy 90 "$U3M" bench copy --backend cuda --json --ops h2d,d2h,d2d \
  --sizes 1M,16M,64M,256M --seconds 30 --rounds 11
[ -x "$U3M" ] && step doctor 60 "$U3M" doctor --json --python "$PY"

# --- PyTorch on CUDA through the public API, one process per phase
export PYTHONPATH="$BUILD/python:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
TORCH=("$PY" "$ROOT/scripts/gpu-check-torch.py")
step train_untiered 90 "${TORCH[@]}" train --mode untiered --out "$W/train_untiered.json"
step train_offload 150 "${TORCH[@]}" train --mode offload --out "$W/train_offload.json"
step generate 60 "${TORCH[@]}" generate --out "$W/generate.json"

# --- the report
"$PY" - "$W" "$OUT" "$T0" "$BUDGET" "$USED_DEPS" <<'EOF'
import json, os, sys, time
w, out, t0, budget, used_deps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "true"
def read(name):
    p = os.path.join(w, name)
    return open(p, errors="replace").read() if os.path.exists(p) else None
def load(name, start="{"):
    text = read(name)
    if text is None or start not in text:
        return None
    try:
        return json.loads(text[text.index(start):])
    except ValueError:
        return None
steps = []
for line in (read("steps.tsv") or "").splitlines():
    name, rc, secs = line.split("\t")
    log = read(name + ".log") or ""
    steps.append({"name": name, "rc": int(rc) if rc.lstrip("-").isdigit() else rc,
                  "seconds": int(secs), "log_tail": log[-1500:]})
rc = {s["name"]: s["rc"] for s in steps}
def why(name):
    if name not in rc:
        return "an earlier step it needs failed"
    if isinstance(rc[name], str):
        return f"step {name} {rc[name]}"
    return f"step {name} exit {rc[name]}" + (" (timed out or killed)" if rc[name] in (124, 137) else "")
report = {"script": "scripts/gpu-check.sh", "issue": 19,
          "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
          "wall_s": int(time.time()) - t0, "budget_s": budget,
          "measured": "on this machine, now; every figure below is measured unless marked nominal",
          "machine": (read("machine.txt") or "").strip().splitlines(),
          "build": {"deps_bundle_used": used_deps}, "steps": steps}
verdict = {}

tests = load("cuda_tests.json")
if tests:
    cases = [c for s in tests.get("testsuites", []) for c in s.get("testsuite", [])]
    failed = [f"{c['classname']}.{c['name']}: " + " | ".join(x.get("failure", "")[:300] for x in c.get("failures", []))
              for c in cases if c.get("failures")]
    skipped = [c for c in cases if c.get("result") == "SKIPPED" or c.get("status") == "NOTRUN"]
    report["cuda_tests"] = {"total": len(cases), "failed": len(failed), "skipped": len(skipped),
                            "passed": len(cases) - len(failed) - len(skipped), "failures": failed}
    verdict["cuda_tests"] = "pass" if not failed and rc.get("cuda_tests") == 0 else "fail"
else:
    verdict["cuda_tests"] = "not run: " + why("cuda_tests")

bench = load("bench_copy.log")
if bench:
    report["bench_copy"] = bench
    largest = max(r["size"] for r in bench["results"])
    at = {r["op"]: r for r in bench["results"] if r["size"] == largest}
    report["bench_copy_summary"] = {
        "size": largest,
        "test_double": bench.get("test_double"),  # true: the u3m double, not hardware
        "ratio_to_cudaMemcpy": {op: r["ratio"] for op, r in at.items()},
        "vs_link_nominal": {op: r["vs_link"] for op, r in at.items()},
        "bar": "u3m's stream copies reach >= 90% of the runtime's own pinned cudaMemcpy"}
    verdict["copy_90pct"] = ("pass" if all(r["ratio"] >= 0.9 for r in at.values()) else "fail") + (
        " (on the u3m test double, not hardware)" if bench.get("test_double") else "")
else:
    verdict["copy_90pct"] = "not run: " + why("bench_copy")
report["doctor"] = load("doctor.log")

un, off = load("train_untiered.json"), load("train_offload.json")
train = {"untiered": un, "offload": off}
tol = 1e-2  # relative, per step: bf16 keeps 8 significant bits (2^-7 = 0.8%) and steps compound
train["loss_tolerance"] = {"relative": tol, "why": "bf16 has 8 significant bits; up to one "
                           "ulp-scale difference per step from a different reduction order"}
if un and off and un.get("losses") and off.get("losses"):
    n = min(len(un["losses"]), len(off["losses"]))
    rel = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(un["losses"][:n], off["losses"][:n])]
    train["max_relative_loss_diff"] = max(rel)
    train["losses_bitwise_equal"] = un["losses"][:n] == off["losses"][:n]
    if un.get("step_time_s") and off.get("step_time_s"):
        train["step_time_overhead"] = off["step_time_s"] / un["step_time_s"] - 1
    train["peak_device_bytes"] = {"untiered": un.get("memory"), "offload": off.get("memory")}
    # Copies on u3m's streams vs compute, past the first step (Note [Offload on CUDA]).
    steps_after_first = (off.get("overlap_per_step") or [])[1:]
    if steps_after_first:
        keys = ("step_s", "copy_busy_s", "copy_hidden_s", "stall_s", "release_sync_s", "h2d_bytes", "d2h_bytes")
        total = {k: sum(x[k] for x in steps_after_first) for k in keys}
        total["copy_hidden_fraction"] = (total["copy_hidden_s"] / total["copy_busy_s"]
                                         if total["copy_busy_s"] > 0 else None)
        train["overlap_after_first_step"] = total
    complete = n == un["config"]["steps"] == len(off["losses"])
    verdict["offload_losses"] = "pass" if complete and max(rel) <= tol else "fail"
else:
    verdict["offload_losses"] = "fail: " + ((off or {}).get("error", {}).get("message") or why("train_offload"))
# The offload's tiers must be on the GPU itself: a CUDA model opens the cuda backend.
backend = (off or {}).get("u3m_backend")
train["u3m_backend"] = backend
if backend:
    verdict["offload_on_cuda_backend"] = ("pass" if backend.get("name") == "cuda" and not backend.get("test_double")
                                          else f"fail: the offload opened {backend.get('name')}")
else:
    verdict["offload_on_cuda_backend"] = "not run: " + why("train_offload")
report["train"] = train
gen = load("generate.json")
report["generate"] = gen
if gen and "tokens_equal" in gen:
    verdict["tiered_kv_generation"] = "pass" if gen["tokens_equal"] else "fail: tokens differ"
else:
    verdict["tiered_kv_generation"] = "fail: " + ((gen or {}).get("error", {}).get("message") or why("generate"))
report["verdict"] = verdict
with open(out, "w") as f:
    json.dump(report, f, indent=2)
print(json.dumps(verdict, indent=2))
EOF
echo "gpu-check: wrote $OUT in $(($(date +%s) - T0)) s" >&2
