#!/usr/bin/env bash
# zoi serve vs Triton vs Ray Serve (2 replicas) on the same load, interleaved (the machine may be
# shared: each cycle runs every target once, so drifting load spreads over all of them).
# Usage: scripts/bench_scaleout.sh [CYCLES] [OUT.jsonl]
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
./scripts/triton_env.sh
CYCLES=${1:-2}
OUT=${2:-bench/results/scaleout_cpu.jsonl}
ART=$(mktemp -d)/minilm
zoi compile -o "$ART" > /dev/null
for c in $(seq 1 "$CYCLES"); do
  for t in zoi triton ray; do
    echo "cycle $c: $t" >&2
    zoi bench serve "$ART" --target "$t" --replicas 2 --instances 1 --queue-delay-us 500 \
      -c 1 16 64 -n 600 --rounds 2 --warmup 40 --route kserve -o "$OUT" --json > /dev/null
  done
done
rm -rf "$(dirname "$ART")"
