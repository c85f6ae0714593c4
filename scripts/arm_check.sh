#!/usr/bin/env bash
# The C++ core on aarch64, tested on an x86-64 Linux host (docs/ARM.md): the kernels are
# cross-compiled with Debian's aarch64-linux-gnu-g++ (-static) into csrc/tests/arm_kernels_test.cc,
# which runs every ARM kernel table against the portable scalar one under qemu-aarch64:
#   -cpu max           every table (neon, dotprod, i8mm), then each forced by ZOI_CPU_ISA; the
#                      scalar table's outputs against the x86-64 build's (bit for bit) and the
#                      native WordPiece tokenizer against ids from the x86-64 zoi._cpu
#   -cpu cortex-a53    Armv8.0 (NEON only): detection must pick neon and refuse dotprod / i8mm
#   -cpu neoverse-n1   dot product, no i8mm: detection must pick dotprod
# The same driver built natively for x86-64 (scalar table only) writes the reference outputs.
# End to end: scripts/arm_engine_export.py compiles the bundled all-MiniLM-L6-v2 INT8 here and
# exports its native plan (the engine's build calls and arrays) with the x86-64 engine's embeddings
# of a few texts; csrc/tests/arm_engine_test.cc replays it into the same csrc/runtime/engine.cc on
# aarch64 and compares (-cpu max: scalar, neon, dotprod, i8mm; -cpu cortex-a53: the detected neon).
# Compiler flags and kernel sources come from CMakeLists.txt; objects are cached outside the tree
# ($ZOI_ARM_CACHE, default ~/.cache/zoi/arm-obj: shared by every clone on the machine), keyed on a
# hash of the compiler, flags, source and headers (a warm run only links and runs the tests).
#
# Usage: scripts/arm_check.sh [--quick] [--cmake] [--no-engine]
#   --quick  fewer shapes and one run per CPU model (the pytest uses the full set)
#   --no-engine  without the end-to-end engine runs (no zoi Python environment needed)
#   --cmake  also cross-build the whole Python extension with CMakeLists.txt (build/arm/cmake;
#            minutes the first time): the proof that `pip install .` configures on aarch64
# Exit status: 0 all passed; 1 a test failed; 3 the toolchain is missing (what to install printed).
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
CMAKE=0
ENGINE=1
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    --cmake) CMAKE=1 ;;
    --no-engine) ENGINE=0 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
B=build/arm
JOBS=${JOBS:-2}
CXX_ARM=${ZOI_ARM_CXX:-aarch64-linux-gnu-g++}
CXX_HOST=${CXX:-g++}
QEMU=${ZOI_QEMU:-qemu-aarch64}
T0=$SECONDS

missing=()
command -v "$CXX_ARM" >/dev/null || missing+=("g++-aarch64-linux-gnu ($CXX_ARM)")
command -v "$QEMU" >/dev/null || missing+=("qemu-user ($QEMU)")
command -v "$CXX_HOST" >/dev/null || missing+=("g++ ($CXX_HOST)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "arm_check: missing ${missing[*]}" >&2
  echo "arm_check: install with: sudo apt-get install -y --no-install-recommends g++-aarch64-linux-gnu qemu-user" >&2
  echo "arm_check: (scripts/setup.sh does it when run as root)" >&2
  exit 3
fi

OBJ=${ZOI_ARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zoi/arm-obj}
mkdir -p "$B" "$OBJ" "$B/logs"
rm -f "$B"/logs/*.log  # no log of an earlier run is read as this one's
# objects unused for 30 days go (the keys of older sources); a hit refreshes the time below
find "$OBJ" -name '*.o' -mtime +30 -delete 2>/dev/null || true
# one run at a time per tree (pytest-xdist workers, two shells): the runs share build/arm
# (tests/test_arm.py holds the lock itself, through its reading of the results)
if [ -z "${ZOI_ARM_LOCK_HELD:-}" ] && command -v flock >/dev/null; then
  exec 9>"$B/.lock"
  flock 9
fi

# CMakeLists.txt's sets, as shell arrays: ZOI_BASE_FLAGS, ZOI_KERNEL_SOURCES, ZOI_FLAGS_<isa>, ZOI_DEF_<isa>
eval "$(python3 - <<'PY'
import re, shlex
text = open("CMakeLists.txt").read()
text = re.sub(r"#[^\n]*", "", text)
def get(name):
    m = re.search(r"set\(\s*" + name + r"\b([^)]*)\)", text)
    if not m:
        raise SystemExit(f"echo 'arm_check: set({name} ...) not found in CMakeLists.txt' >&2; exit 1")
    return [w.strip('"') for w in m.group(1).split() if w.strip('"')]
out = {"BASE": get("ZOI_BASE_FLAGS"), "KSRC": get("ZOI_KERNEL_SOURCES")}
for isa in ("scalar", "neon", "dotprod", "i8mm"):
    out["FLAGS_" + isa] = get("ZOI_FLAGS_" + isa)
    out["DEF_" + isa] = ["-D" + d for d in get("ZOI_DEF_" + isa)]
for k, v in out.items():
    print(f"{k}=({' '.join(shlex.quote(x) for x in v)})")
PY
)"
# aarch64 builds add -ffp-contract=off to the base flags (CMakeLists.txt's arm64 branch)
BASE_ARM=("${BASE[@]}" -ffp-contract=off)
KFLAGS=(-ffp-contract=off)  # every kernel object (CMakeLists.txt)

# the headers each kind of object includes (a tokenizer header change leaves the kernels cached)
hash_of() { cat "$@" | sha256sum | cut -c1-16; }
H_KERNELS=$(hash_of csrc/isa.h csrc/kernels/*.h csrc/runtime/pool.h)
H_TOKENIZER=$(hash_of csrc/tokenizer/*.h)
H_ALL="$H_KERNELS$H_TOKENIZER"
HDR_HASH=$H_KERNELS
CMDS="$B/commands"
: >"$CMDS"
# obj TARGET NAME CXX SRC FLAGS...: echoes the cached object's path (keyed on the compiler, flags,
# source and $HDR_HASH: paths are relative, so every clone computes the same key); queues its
# compile if absent. The cache is shared: an object is written to a temporary name and renamed
# (two runs compiling the same object both write a complete one), never deleted while fresh
ID_ARM=$("$CXX_ARM" --version | head -1)
ID_HOST=$("$CXX_HOST" --version | head -1)
obj() {
  local target=$1 name=$2 cxx=$3 src=$4
  shift 4
  local key
  key=$( { if [ "$cxx" = "$CXX_ARM" ]; then echo "$ID_ARM"; else echo "$ID_HOST"; fi; echo "$*"; echo "$src"; cat "$src"; echo "$HDR_HASH"; } | sha256sum | cut -c1-16)
  local o="$OBJ/$target/$name.$key.o"
  if [ -f "$o" ]; then
    touch "$o"
  else
    mkdir -p "$OBJ/$target"
    printf '%s\0' "$cxx -std=gnu++17 $* -Icsrc -c $src -o $o.\$\$.tmp && mv $o.\$\$.tmp $o" >>"$CMDS"
  fi
  echo "$o"
}

ARM_OBJS=()
for isa in scalar neon dotprod i8mm; do
  fl="FLAGS_$isa[@]"
  df="DEF_$isa[@]"
  for src in "${KSRC[@]}"; do
    ARM_OBJS+=("$(obj arm "k_${isa}_$(basename "$src" .cc)" "$CXX_ARM" "$src" "${BASE_ARM[@]}" "${KFLAGS[@]}" ${!fl} ${!df} -DZOI_NS=$isa)")
  done
done
for src in csrc/isa.cc csrc/kernels/dispatch.cc csrc/runtime/pool.cc; do
  ARM_OBJS+=("$(obj arm "base_$(basename "$src" .cc)" "$CXX_ARM" "$src" "${BASE_ARM[@]}")")
done
HDR_HASH=$H_TOKENIZER
ARM_OBJS+=("$(obj arm base_wordpiece "$CXX_ARM" csrc/tokenizer/wordpiece.cc "${BASE_ARM[@]}")")
HDR_HASH=$H_ALL
ARM_OBJS+=("$(obj arm base_driver "$CXX_ARM" csrc/tests/arm_kernels_test.cc "${BASE_ARM[@]}")")
HDR_HASH=$H_KERNELS
# the end-to-end driver: the kernels above (not the kernel driver) + the runtime's engine.cc
H_ENGINE=$(hash_of csrc/isa.h csrc/kernels/*.h csrc/runtime/*.h)
HDR_HASH=$H_ENGINE
ENGINE_OBJS=("${ARM_OBJS[@]:0:${#ARM_OBJS[@]}-2}"
  "$(obj arm base_engine "$CXX_ARM" csrc/runtime/engine.cc "${BASE_ARM[@]}")"
  "$(obj arm base_engine_gen "$CXX_ARM" csrc/runtime/engine_gen.cc "${BASE_ARM[@]}")"
  "$(obj arm base_sampler "$CXX_ARM" csrc/runtime/sampler.cc "${BASE_ARM[@]}")"
  "$(obj arm base_engine_driver "$CXX_ARM" csrc/tests/arm_engine_test.cc "${BASE_ARM[@]}")")
HDR_HASH=$H_KERNELS

# the x86-64 reference: the scalar table with the flags of the extension's zoi_k_scalar
X86_OBJS=()
for src in "${KSRC[@]}"; do
  X86_OBJS+=("$(obj x86 "k_scalar_$(basename "$src" .cc)" "$CXX_HOST" "$src" "${BASE[@]}" "${KFLAGS[@]}" ${FLAGS_scalar[@]+"${FLAGS_scalar[@]}"} "${DEF_scalar[@]}" -DZOI_NS=scalar)")
done
X86_OBJS+=("$(obj x86 base_isa "$CXX_HOST" csrc/isa.cc "${BASE[@]}")")
X86_OBJS+=("$(obj x86 base_pool "$CXX_HOST" csrc/runtime/pool.cc "${BASE[@]}")")
HDR_HASH=$H_TOKENIZER
X86_OBJS+=("$(obj x86 base_wordpiece "$CXX_HOST" csrc/tokenizer/wordpiece.cc "${BASE[@]}")")
HDR_HASH=$H_ALL
X86_OBJS+=("$(obj x86 base_driver "$CXX_HOST" csrc/tests/arm_kernels_test.cc "${BASE[@]}" -DZOI_TEST_SCALAR_ONLY)")

NEW=$(tr -cd '\0' <"$CMDS" | wc -c)
if [ "$NEW" -gt 0 ]; then
  echo "arm_check: compiling $NEW objects ($JOBS at a time)"
  if ! xargs -0 -P "$JOBS" -n 1 sh -c 'eval "$1"' _ <"$CMDS" >"$B/logs/compile.log" 2>&1; then
    cat "$B/logs/compile.log" >&2
    echo "arm_check: FAILED to compile" >&2
    exit 1
  fi
fi
link() {  # link OUT CXX FLAGS -- OBJS: relinks when the object list changed
  local out=$1 cxx=$2
  shift 2
  local key
  key=$(echo "$*" | sha256sum | cut -c1-16)
  if [ ! -f "$out" ] || [ "$(cat "$out.key" 2>/dev/null)" != "$key" ]; then
    "$cxx" -o "$out" "$@" -lpthread
    echo "$key" >"$out.key"
  fi
}
link "$B/arm_kernels_test" "$CXX_ARM" -static "${ARM_OBJS[@]}"
link "$B/x86_kernels_test" "$CXX_HOST" "${X86_OBJS[@]}"
[ $ENGINE = 0 ] || link "$B/arm_engine_test" "$CXX_ARM" -static "${ENGINE_OBJS[@]}"
echo "arm_check: built in $((SECONDS - T0)) s"

FIX=csrc/tests/wordpiece_fixture.txt
PASSES=1
[ $QUICK = 1 ] && PASSES=0
# 1. the x86-64 reference (and the tokenizer fixture against the x86-64 driver build)
mkdir -p "$B/export_x86" "$B/export_arm"
rm -f "$B"/export_*/*.bin "$B/ref_x86.bin"  # nothing from an earlier run is read
"$B/x86_kernels_test" --isas scalar --passes 0 --dump "$B/ref_x86.bin" --export-gemm "$B/export_x86" --tok "$FIX" \
  >"$B/logs/x86.log" 2>&1 || { cat "$B/logs/x86.log"; echo "arm_check: FAILED (x86-64 reference build)"; exit 1; }

# the end-to-end plan: exported by this machine's zoi (its engine's embeddings on every x86 ISA)
if [ $ENGINE = 1 ]; then
  PY=${ZOI_PYTHON:-python3}
  [ -z "${ZOI_PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
  rm -f "$B/engine_plan.bin"
  t=$SECONDS
  "$PY" scripts/arm_engine_export.py "$B/engine_plan.bin" >"$B/logs/export.log" 2>&1 ||
    { tail -20 "$B/logs/export.log"; echo "arm_check: FAILED (exporting the engine plan; --no-engine skips it)"; exit 1; }
  echo "arm_check: $(tail -1 "$B/logs/export.log") [$((SECONDS - t)) s]"
fi

# 2. the aarch64 runs, two at a time: NAME CPU ENV ARGS... (BINARY: arm_kernels_test unless named)
RUNS=()
if [ $ENGINE = 1 ]; then
  # the whole MiniLM INT8 forward (the longest runs: first): each ISA forced through the engine's
  # option, then detection on Armv8.0
  RUNS+=("engine-max|max||$B/engine_plan.bin --isas scalar,neon,dotprod,i8mm --expect-active i8mm|arm_engine_test"
    "engine-cortex-a53|cortex-a53||$B/engine_plan.bin --isas active --expect-active neon --expect-refused dotprod,i8mm|arm_engine_test")
fi
RUNS+=(
  "max|max||--isas all --expect-best i8mm --ref $B/ref_x86.bin --tok $FIX --passes $PASSES --export-gemm $B/export_arm"
  "cortex-a53|cortex-a53||--isas all --expect-best neon --expect-unsupported dotprod,i8mm --ref $B/ref_x86.bin --passes 0"
  "neoverse-n1|neoverse-n1||--isas all --expect-best dotprod --expect-unsupported i8mm --quick --passes 0"
)
if [ $QUICK = 0 ]; then
  for isa in neon dotprod i8mm scalar; do
    RUNS+=("max-forced-$isa|max|ZOI_CPU_ISA=$isa|--isas active --expect-active $isa --quick --passes 1")
  done
fi
run_one() {
  IFS='|' read -r name cpu envs args bin <<<"$1"
  local t=$SECONDS
  # shellcheck disable=SC2086
  if env $envs "$QEMU" -cpu "$cpu" "$B/${bin:-arm_kernels_test}" $args >"$B/logs/$name.log" 2>&1; then
    echo "arm_check: $name ($cpu${envs:+, $envs}): $(tail -1 "$B/logs/$name.log") [$((SECONDS - t)) s]"
  else
    echo "arm_check: $name ($cpu${envs:+, $envs}) FAILED [$((SECONDS - t)) s]:"
    grep -E "FAIL|exception|Illegal|signal" "$B/logs/$name.log" | head -20
    tail -1 "$B/logs/$name.log"
    return 1
  fi
}
export -f run_one
export B QEMU
FAILED=0
printf '%s\0' "${RUNS[@]}" | xargs -0 -P "$JOBS" -n 1 bash -c 'run_one "$1"' _ || FAILED=1
echo "arm_check: x86-64 reference: $(tail -1 "$B/logs/x86.log")"

if [ $CMAKE = 1 ]; then
  # the extension itself with CMakeLists.txt's arm64 branch (host Python headers: compiled, not loaded)
  TC="$B/aarch64-toolchain.cmake"
  printf '%s\n' "set(CMAKE_SYSTEM_NAME Linux)" "set(CMAKE_SYSTEM_PROCESSOR aarch64)" \
    "set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)" "set(CMAKE_CXX_COMPILER $CXX_ARM)" >"$TC"
  PY=$(command -v python3)
  [ -x .venv/bin/python ] && PY=$PWD/.venv/bin/python
  cmake -S . -B "$B/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE="$PWD/$TC" \
    -DPython_EXECUTABLE="$PY" -DPython_INCLUDE_DIR="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
    -DCMAKE_NM="$(command -v aarch64-linux-gnu-nm)" >"$B/logs/cmake.log" 2>&1 &&
    cmake --build "$B/cmake" -j "$JOBS" >>"$B/logs/cmake.log" 2>&1 ||
    { tail -30 "$B/logs/cmake.log"; echo "arm_check: FAILED (CMake cross build)"; FAILED=1; }
  [ $FAILED = 1 ] || echo "arm_check: CMake cross build of _cpu: $(ls "$B"/cmake/_cpu*.so)"
fi

if [ $FAILED = 0 ]; then
  echo "arm_check: PASS in $((SECONDS - T0)) s"
else
  echo "arm_check: FAILED in $((SECONDS - T0)) s (logs in $B/logs)"
  exit 1
fi
