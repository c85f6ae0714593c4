#!/usr/bin/env bash
# One GPU against two, on the same load, for zoi serve, Triton and Ray Serve.
# Run on a machine with two GPUs (device kind nvidia-h200-x2); with one GPU only the 1-GPU
# variants run (a smoke test of the script). Each variant serves one fp16 artifact with one
# engine per GPU:
#   zoi-g0 / zoi-g01        zoi serve --device cuda --gpus 0 | 0,1
#   triton-g0 / triton-g01  zoi export triton --gpus 0 | 0,1 (an instance group per GPU)
#   ray-g0 / ray-g01        zoi deploy ray --gpus 0 | 0,1 (a replica per GPU, num_gpus 1)
# and takes the same load: `zoi bench serve` (kserve route, K texts of MIN..MAX words per
# request, concurrency levels CONC, N requests per level, 2 rounds), variants interleaved over
# CYCLES so drifting load biases none. Rows go to PREFIX.jsonl; PREFIX.json gets the summary
# (2 GPUs / 1 GPU throughput per path and concurrency, p99 of each; target >= 1.8x, p99 no
# worse), by scripts/bench_multigpu_summary.py. A path whose server is missing here (no Triton
# environment, no ray) is skipped and named in the summary. NCCL_NVLS_ENABLE=0 (no NCCL used).
# Usage: scripts/bench_multigpu.sh [CYCLES] [PREFIX] [VARIANTS...]
#   env: MODEL (HF folder; default $ZOI_MINILM_DIR, else the bundled MiniLM), PRECISION (fp16),
#        CONC ("16 64"), K (32), N (400), MIN_WORDS (40), MAX_WORDS (200), VARIANT_TIMEOUT (420)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
if [[ -z "${PYTHON:-}" && -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
CYCLES=${1:-2}
PREFIX=${2:-bench/results/multigpu_$(date -u +%Y%m%dT%H%MZ)}
shift 2 2>/dev/null || shift $#
VARIANTS=${*:-zoi-g0 zoi-g01 triton-g0 triton-g01 ray-g0 ray-g01}
MODEL=${MODEL:-${ZOI_MINILM_DIR:-}}
PRECISION=${PRECISION:-fp16}
mkdir -p "$(dirname "$PREFIX")"
NGPU=$($PY -c "from zoi.backends.devices import visible_gpu_count as n; print(n())")
echo "bench_multigpu: $NGPU GPU(s); model ${MODEL:-bundled MiniLM} $PRECISION; variants: $VARIANTS" >&2
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader >&2 2>/dev/null || true
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ART=$TMP/artifact
$PY -m zoi.cli compile ${MODEL:+"$MODEL"} --device cuda --precision "$PRECISION" -o "$ART" >&2 || {
  echo "bench_multigpu: compiling the artifact failed" >&2; exit 1; }
SKIPPED=()
have_triton=1; have_ray=1
scripts/triton_env.sh >"$TMP/triton_env.log" 2>&1 || { have_triton=0; SKIPPED+=("triton: scripts/triton_env.sh failed ($(tail -1 "$TMP/triton_env.log"))"); }
$PY -c "import ray.serve" 2>/dev/null || { have_ray=0; SKIPPED+=("ray: ray[serve] is not installed for $PY"); }
COMMON=(-c ${CONC:-16 64} -n "${N:-400}" -k "${K:-32}" --min-words "${MIN_WORDS:-40}"
        --max-words "${MAX_WORDS:-200}" --rounds 2 --warmup 20 --route kserve --queue-delay-us 500
        -o "$PREFIX.jsonl" --json)
for c in $(seq 1 "$CYCLES"); do
  for v in $VARIANTS; do
    path=${v%%-g*}; ids=${v##*-g}; gpus=$(echo "$ids" | sed 's/./&,/g; s/,$//')
    need=${#ids}
    if (( need > NGPU )); then
      [[ $c == 1 ]] && SKIPPED+=("$v: needs $need GPUs, $NGPU here"); continue
    fi
    case $path in
      zoi) args=(--target zoi "--server-arg=--served-model-name=$v") ;;
      triton) (( have_triton )) || continue; args=(--target triton --instances 1) ;;
      ray) (( have_ray )) || continue; args=(--target ray) ;;
      *) echo "unknown variant $v" >&2; exit 2 ;;
    esac
    echo "== cycle $c: $v (--gpus $gpus) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    timeout "${VARIANT_TIMEOUT:-420}" $PY -m zoi.cli bench serve "$ART" "${args[@]}" --gpus "$gpus" \
      "${COMMON[@]}" > "$TMP/$v.$c.json" 2> "$TMP/$v.$c.log"
    rc=$?
    tail -3 "$TMP/$v.$c.log" >&2
    (( rc == 0 )) || echo "bench_multigpu: $v cycle $c exit $rc" >&2
  done
done
printf '%s\n' "${SKIPPED[@]}" > "$TMP/skipped.txt"
$PY scripts/bench_multigpu_summary.py "$PREFIX.jsonl" --skipped "$TMP/skipped.txt" --out "$PREFIX.json"
