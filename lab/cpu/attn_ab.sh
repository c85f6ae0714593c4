#!/bin/sh
# A/B of csrc/kernels/attention.cc: REV's version (default HEAD) against the working copy.
# lab/cpu/attn_ab.sh [vnni|avx512|avx2|scalar] [REV] -- [attn_ab args: B L heads d reps rounds prec same]
# EXTRA (env): more compiler flags for the working copy (e.g. EXTRA=-DZOI_ATTN_NQ=8)
set -e
cd "$(dirname "$0")/../.."
ISA=${1:-vnni}; REV=${2:-HEAD}
case $ISA in
  vnni) F="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mbmi2 -DZOI_ISA_VNNI" ;;
  avx512) F="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mbmi2 -DZOI_ISA_AVX512" ;;
  avx2) F="-mavx2 -mfma -mbmi2 -DZOI_ISA_AVX2" ;;
  scalar) F="-DZOI_ISA_SCALAR" ;;
esac
D=${TMPDIR:-/tmp}/attn_ab.$$
mkdir -p "$D"
git show "$REV:csrc/kernels/attention.cc" > "$D/old_attention.cc"
git show "$REV:csrc/kernels/simd.h" > "$D/simd.h"
git show "$REV:csrc/kernels/np_sum.h" > "$D/np_sum.h"
for h in attention_i8.h attention_amx.h; do  # the opt-in items, where REV has them
  git show "$REV:csrc/kernels/$h" > "$D/$h" 2>/dev/null || rm -f "$D/$h"
done
cp csrc/kernels/kernels.h "$D/kernels.h"
C="g++ -std=c++17 -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off $F"
$C -Icsrc -I"$D" -DZOI_NS=olda -c "$D/old_attention.cc" -o "$D/old.o"
$C $EXTRA -Icsrc -DZOI_NS=newa -c csrc/kernels/attention.cc -o "$D/new.o"
$C -Icsrc -c csrc/isa.cc -o "$D/isa.o"  # attention_amx.h: cpu_features, amx_permission
$C -Icsrc lab/cpu/attn_ab.cc "$D/old.o" "$D/new.o" "$D/isa.o" -o "$D/attn_ab"
shift 2 2>/dev/null || shift $#
[ "$1" = "--" ] && shift
"$D/attn_ab" "$@"
[ -n "$KEEP" ] && cp "$D/attn_ab" "$KEEP"
rm -rf "$D"
