#!/bin/sh
# A/B of csrc/kernels/gemm_amx.cc: REV's version (default HEAD) against the working copy, compiled
# into two namespaces of one binary (lab/cpu/amx_ab.cc) over vnni's packed weights, called
# alternately; prints GOP/s per thread (thread CPU time) and whether the outputs are bit-identical.
#   lab/cpu/amx_ab.sh [REV] [-- threads rounds reps]     (AMX_AB_CASES="M,N,K,mode;..." to pick shapes)
#   lab/cpu/amx_ab.sh [REV] -- micro                     (tile-unit micro-benchmarks)
# REV=WORK: the working copy on both sides, OLD_FLAGS / NEW_FLAGS (-D...) telling them apart;
# NEW_SRC=FILE: FILE instead of the working copy as "new" (e.g. lab/cpu/amx_gemm_pipelined.cc)
set -e
cd "$(dirname "$0")/../.."
REV=${1:-HEAD}
F="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mbmi2 -DZOI_ISA_VNNI"
D=${TMPDIR:-/tmp}/amx_ab.$$
mkdir -p "$D"
if [ "$REV" = "WORK" ]; then cp csrc/kernels/gemm_amx.cc "$D/old_gemm_amx.cc"; else git show "$REV:csrc/kernels/gemm_amx.cc" > "$D/old_gemm_amx.cc"; fi
C="nice -n 10 g++ -std=c++17 -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off $F"
$C -Icsrc/kernels -Icsrc -DZOI_NS=vnni -c csrc/kernels/gemm_int8.cc -o "$D/vnni.o"
$C -mamx-tile -mamx-int8 -DZOI_ISA_AMX -Icsrc/kernels -Icsrc -DZOI_NS=olda $OLD_FLAGS -c "$D/old_gemm_amx.cc" -o "$D/old.o"
$C -mamx-tile -mamx-int8 -DZOI_ISA_AMX -Icsrc/kernels -Icsrc -DZOI_NS=newa $NEW_FLAGS -c "${NEW_SRC:-csrc/kernels/gemm_amx.cc}" -o "$D/new.o"
$C -mamx-tile -mamx-int8 -Icsrc lab/cpu/amx_ab.cc "$D/vnni.o" "$D/old.o" "$D/new.o" -lpthread -o "$D/amx_ab"
shift 1 2>/dev/null || shift $#
[ "$1" = "--" ] && shift
"$D/amx_ab" "$@"
rm -rf "$D"
