#!/usr/bin/env bash
# Installs the Debian packages u3m needs to build, test and demo. Idempotent:
# it only calls apt-get when something is missing.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev          # ASan/UBSan/TSan builds and libFuzzer
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libsimdjson-dev libfmt-dev libxxhash-dev zlib1g-dev
  liburing-dev libtomlplusplus-dev
  redis-server libhiredis-dev        # the remote KV tier (src/kv/remote_tier.cpp) and its tests
  prometheus-cpp-dev                # /metrics (src/observe)
  python3 python3-dev python3-torch python3-numpy pybind11-dev   # python3-dev: Python.h for the extension
  fio                               # reference bandwidth for `u3m bench ssd`
  python3-matplotlib chromium       # `u3m report` plots; its test renders the page headless
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
