#!/usr/bin/env bash
# The C++ core's tests (tests/cpu, which drive zoi._cpu through Python) run once against a
# build with AddressSanitizer + UndefinedBehaviorSanitizer. The sanitized module is built in
# build/sanitize and put in place of zoi._cpu for this run only (sitecustomize), the installed
# one is left alone. Any ASan or UBSan report fails the run (leak checking is off: CPython
# itself "leaks" at exit). torch is hidden (its own libraries are not built for ASan), so the
# per-op tests' cuda cases skip and only the C++ core is exercised.
# Usage: scripts/sanitize.sh [pytest args, default tests/cpu tests/ops + the paged attention kernels and the decoder on the engine]
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
B=build/sanitize
# ccache, where installed (scripts/setup.sh installs it), makes a fresh clone's ASan build (77
# objects, ~5 min on 2 cores) a cache hit when the sources did not change; the objects are the
# same either way. base_dir: paths are hashed relative to the clone, wherever it is; the -g
# builds' working directory is not hashed (it only names where the debug info was made)
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
fi
cmake -S . -B "$B" -G Ninja -DZOI_SANITIZE=ON -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v python)" "${LAUNCHER[@]}" >/dev/null
cmake --build "$B" -j "${JOBS:-2}"
SO=$(ls "$PWD/$B"/_cpu*.so)
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
cat >"$SITE/sitecustomize.py" <<PY
import importlib.util, sys
sys.modules["torch"] = None  # import torch -> ImportError: the cuda cases skip
spec = importlib.util.spec_from_file_location("zoi._cpu", "$SO")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
sys.modules["zoi._cpu"] = mod
import zoi  # noqa: E402  (its lazy attributes would not see sys.modules)
zoi._cpu = mod
PY
LOG=$(mktemp -d)
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:exitcode=86:log_path=$LOG/asan"
# exitcode 86: a sanitizer stopped the process. UBSan beside a preloaded ASan may not honour
# log_path, so pytest captures at sys level only (--capture=sys): reports go to the terminal
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=86:log_path=$LOG/ubsan"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
python -c "import zoi._cpu as c, sys; assert '$B' in c.__file__, c.__file__; print('sanitized core:', c.__file__, c.active_isa())"
ARGS=("$@"); [ ${#ARGS[@]} -gt 0 ] || ARGS=(tests/cpu tests/ops tests/decoder/test_cpu_backend.py)
set +e
# test_alloc preloads its own malloc counter, which cannot sit beside ASan's allocator; its
# peak-RSS bound measures zoi's pages, which ASan's shadow memory and quarantine inflate (both
# run, asserted, in make test's main pytest run on every ISA)
# two workers (one per core): the sanitized tests take ~2 min of a CI run's budget on one
python -m pytest -q -n "${JOBS:-2}" --dist loadfile -p no:cacheprovider --capture=sys \
  --deselect tests/cpu/test_alloc.py::test_zero_allocations_in_steady_state \
  --deselect tests/cpu/test_alloc.py::test_engine_rss_is_weights_plus_touched_rows "${ARGS[@]}"
rc=$?
set -e
if ls "$LOG"/* >/dev/null 2>&1; then
  echo "sanitizer reports:"; cat "$LOG"/*; exit 1
fi
[ $rc -ne 86 ] || echo "a sanitizer stopped the run (exit 86): its report is printed above"
echo "sanitizer log files: 0 (pytest exit $rc)"
exit $rc
