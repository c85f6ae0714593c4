#!/usr/bin/env bash
# The environment Triton Inference Server runs from: the nvidia-pytriton wheel (which ships the
# tritonserver binary and the Python backend) pins numpy<2, so it gets its own venv, next to
# .venv. zoi is not built twice: the venv imports this checkout's zoi through .venv's editable
# hook (sources and the native core that scripts/setup.sh built). Cached: re-running with the
# same pins does nothing. Usage: scripts/triton_env.sh [VENV] (default .venv-triton; env
# ZOI_TRITON_VENV).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-${ZOI_TRITON_VENV:-.venv-triton}}
PINS=(
  "nvidia-pytriton==0.7.0"
  "tritonclient[http,grpc]==2.73.0"
  "numpy==1.26.4"
  "tokenizers==0.23.3"
  "safetensors==0.8.0"
  "rich==15.0.0"
  "tqdm==4.70.1"
)
MAIN_SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
HOOK="$MAIN_SITE/_editable_skbc_zoi.py"
[ -f "$HOOK" ] || { echo "triton_env: $HOOK missing: run scripts/setup.sh first" >&2; exit 1; }
WANT="${PINS[*]} | $HOOK"
STAMP="$VENV/.zoi-triton-env"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
PY=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# zoi through .venv's editable hook (its paths are relative to .venv's site-packages)
cat > "$SITE/zoi_checkout.pth" <<PTH
import importlib.util as _u; _s = _u.spec_from_file_location("_editable_skbc_zoi", "$HOOK"); _m = _u.module_from_spec(_s); _s.loader.exec_module(_m)
PTH
# the Python backend's stub for this interpreter (pytriton copies it at run time; we do it once)
DIST="$SITE/pytriton/tritonserver"
VER=$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
cp "$DIST/python_backend_stubs/$VER/triton_python_backend_stub" "$DIST/backends/python/"
chmod +x "$DIST/backends/python/triton_python_backend_stub" "$DIST/bin/tritonserver"
"$VENV/bin/python" -c "import numpy, zoi, zoi._cpu; print('triton env:', numpy.__version__, zoi.__file__, zoi._cpu.active_isa())"
echo "$WANT" > "$STAMP"
