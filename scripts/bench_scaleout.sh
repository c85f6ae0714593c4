#!/usr/bin/env bash
# zoi serve vs Triton vs Ray Serve on the same load (kserve route, mixed lengths), interleaved:
# each cycle runs every variant once, so a shared machine's drifting load spreads over all.
# Variants: zoi (one engine, all cores), zoi-1t (one engine, 1 thread), triton (1 instance,
# all cores), triton-2i (2 instances x 1 thread), ray (2 replicas x 1 thread), ray-haproxy
# (the same behind Ray's HAProxy ingress).
# Usage: scripts/bench_scaleout.sh [CYCLES] [OUT.jsonl] [VARIANTS...]
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
./scripts/triton_env.sh
CYCLES=${1:-2}
OUT=${2:-bench/results/scaleout_cpu.jsonl}
shift 2 || true
VARIANTS=${*:-zoi zoi-1t triton triton-2i ray}
ART=$(mktemp -d)/minilm
zoi compile -o "$ART" > /dev/null
COMMON=(-c 1 16 64 -n 600 --rounds 2 --warmup 40 --route kserve --queue-delay-us 500 -o "$OUT" --json)
for c in $(seq 1 "$CYCLES"); do
  for v in $VARIANTS; do
    echo "cycle $c: $v" >&2
    case $v in
      zoi) zoi bench serve "$ART" --target zoi "${COMMON[@]}" --server-arg=--served-model-name=zoi ;;
      zoi-1t) ZOI_NUM_THREADS=1 zoi bench serve "$ART" --target zoi "${COMMON[@]}" --server-arg=--served-model-name=zoi-1t ;;
      triton) zoi bench serve "$ART" --target triton --instances 1 "${COMMON[@]}" ;;
      triton-2i) zoi bench serve "$ART" --target triton --instances 2 "${COMMON[@]}" ;;
      ray) zoi bench serve "$ART" --target ray --replicas 2 "${COMMON[@]}" ;;
      ray-haproxy) zoi bench serve "$ART" --target ray --replicas 2 --server-arg=--proxy=haproxy "${COMMON[@]}" ;;
      *) echo "unknown variant $v" >&2; exit 2 ;;
    esac > /dev/null
  done
done
rm -rf "$(dirname "$ART")"
