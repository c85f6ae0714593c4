#!/usr/bin/env bash
# The GPU check, in one script (run on the lent H200 through the `device` tool):
#   install/build, GPU tests (kernels compiled + the whole CudaBackend), compute-sanitizer on
#   one forward, the GPU benchmark with its PyTorch peers. Logs and JSON go to $OUT (default
#   ./gpu_out); copy them into bench/results/ (gpu_* files) and commit.
# Usage: scripts/gpu_check.sh [all|test|sanitize|bench|labbench|quick|e2e|arena|decbench|gemv|grouped|clusterhop|decmega|multigpu|multibench|fp8|mega] ...   (several stages may be given)
#   multigpu (explicit only): one engine per GPU end to end (scripts/multigpu_check.py: cuda:N
#   engines, `zoi serve --device cuda --gpus 0`, and --gpus all on two GPUs or more; the CUDA
#   image lacks starlette / uvicorn: carry their wheels in .whl/, see docs/DEPLOY.md);
#   multibench (explicit only): scripts/bench_multigpu.sh (1 GPU vs 2 on zoi serve, Triton, Ray)
#   fp8 (explicit only, sm_89+): FP8 tests compiled, zoi eval --precision fp8, zoi bench fp8/int8/fp16
#   decmega (explicit only, lab): lab/gpu/decode_mega.cu, a persistent Llama-1B decode step vs
#   the weight-read floor, and the product's decode step on the same card
#   mega (explicit only): the CUDA C++ megakernel: nvcc build + ptxas report, its GPU tests, MiniLM
#   1x16 / 1x128 / 8x128 megakernel vs per-op graph vs PyTorch FP16 + CUDA graph (JSON);
#   MEGA_SANITIZE=1 adds compute-sanitizer memcheck + racecheck of a few megakernel forwards
set -u
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
STAGES=${*:-all}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
# the real all-MiniLM-L6-v2 as FP16 (the 90 MB FP32 file does not travel): carry .carry/minilm-fp16
[[ -d .carry/minilm-fp16 && -z "${ZOI_MINILM_DIR:-}" ]] && export ZOI_MINILM_DIR=$PWD/.carry/minilm-fp16
[[ -d .carry/arch-ckpts && -z "${ZOI_ARCH_CKPTS:-}" ]] && export ZOI_ARCH_CKPTS=$PWD/.carry/arch-ckpts
has() { [[ " $STAGES " == *" $1 "* || " $STAGES " == *" all "* ]]; }
log() { echo "== $(date -u +%H:%M:%S) $*"; }

{
log "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | head -3
$PY - <<'PY'
import sys, torch, triton
try:
    import cuda.bindings as cb; v = cb.__version__
except Exception as e:
    v = f"missing ({e})"
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "cuda-bindings", v,
      "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
PY
log "install"
# wheels carried to the device machine (nothing installs from a registry there): pytest-xdist
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/zoi_site .whl/*.whl \
    && export PYTHONPATH=/tmp/zoi_site${PYTHONPATH:+:$PYTHONPATH} && echo "carried wheels: $(ls .whl)"
fi
if $PY -m pip install --no-build-isolation --no-deps -e . >"$OUT/gpu_install.log" 2>&1; then
  echo "pip install -e . ok"
else
  echo "pip install -e . FAILED (tail below); falling back to PYTHONPATH=src"; tail -5 "$OUT/gpu_install.log"
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -c "import zoi, zoi.backends.cuda.backend; print('zoi', zoi.__version__, zoi.__file__)"
} 2>&1 | tee "$OUT/gpu_check_${STAMP}.log"
[[ -z "${PYTHONPATH:-}" ]] && ! $PY -c "import zoi" 2>/dev/null && export PYTHONPATH=$PWD/src

rc=0
if has test || has quick; then
  log "tests (kernels compiled on the GPU + the whole backend)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  # parallel when pytest-xdist is there: the time is mostly Triton compiling, on the CPU
  par=(); $PY -c "import xdist" 2>/dev/null && par=(-n "${TEST_PROCS:-8}")
  ZOI_TRITON_COMPILED=1 timeout "${TEST_TIMEOUT:-400}" $PY -m pytest tests/ops tests/cuda_backend tests/heads/cuda tests/archs/test_cuda_archs.py tests/archs/test_cuda_decoder_archs.py -q -rA -p no:cacheprovider "${par[@]}" 2>&1 \
    | grep -v "^PASSED" | tee -a "$OUT/gpu_check_${STAMP}.log"
  rc=${PIPESTATUS[0]}
  echo "tests exit code $rc" | tee -a "$OUT/gpu_check_${STAMP}.log"
  # the GPU decoder: its kernels compiled, the backend with CUDA graphs, tests/decoder/cuda/test_gpu.py
  ZOI_TRITON_COMPILED=1 timeout "${DEC_TEST_TIMEOUT:-500}" $PY -m pytest tests/decoder/cuda -q -rA -p no:cacheprovider "${par[@]}" 2>&1 \
    | grep -v "^PASSED" | tee -a "$OUT/gpu_check_${STAMP}.log"
  drc=${PIPESTATUS[0]}; [[ $rc -eq 0 ]] && rc=$drc
  echo "decoder tests exit code $drc" | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if [[ " $STAGES " == *" decbench "* ]]; then  # explicit only (not in all): zoi bench --device cuda on the decode workloads
  # zoi-cuda-w8 (weight-only INT8) / -int8 (W8A8) / -fp16 / transformers-cuda-fp16, 8 and 32 streams, the targets in the JSON (written after each row);
  # DECBENCH_ARGS e.g. "--quick" or "--streams 32 --providers zoi-cuda-w8,transformers-cuda-fp16"
  log "decoder benchmark (zoi bench --device cuda)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  timeout "${DECBENCH_TIMEOUT:-580}" $PY -m zoi.bench.cli --device cuda \
    --workloads "${DECBENCH_WORKLOADS:-qwen2.5-0.5b-decode,llama-3.2-1b-decode}" ${DECBENCH_ARGS:-} \
    --out "$OUT/gpu_${STAMP}_cuda_decode.json" 2>&1 | tail -60 | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if [[ " $STAGES " == *" clusterhop "* ]]; then  # explicit only, ~30 s: a dependency hop through L2 vs DSMEM (lab)
  log "cluster hop: L2 counters vs distributed shared memory vs cluster barriers (lab/gpu/cluster_hop.cu)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/zoi_cluster_hop lab/gpu/cluster_hop.cu 2>&1 | tail -5 | tee -a "$OUT/gpu_check_${STAMP}.log"
  timeout "${CLUSTERHOP_TIMEOUT:-60}" /tmp/zoi_cluster_hop ${CLUSTERHOP_ITERS:-2000} 2>&1 \
    | tee "$OUT/gpu_cluster_hop_${STAMP}.jsonl" | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if [[ " $STAGES " == *" decmega "* ]]; then  # explicit only, ~2 min: a persistent decode step (lab)
  log "decmega: persistent decode step, Llama-3.2-1B shapes INT8 (lab/gpu/decode_mega.cu) vs the weight-read floor" | tee -a "$OUT/gpu_check_${STAMP}.log"
  # variants PRODUCER:NSLOT (1: producer and signal warps, 0: thread 0 issues and signals between
  # tiles; the weight ring's depth in 32 KB slots)
  for v in ${DECMEGA_VARIANTS:-1:6}; do
    prod=${v%%:*}; nslot=${v##*:}
    nvcc -O3 -std=c++17 -arch=sm_90a -DPRODUCER=$prod -DNSLOT=$nslot -Xptxas -v -o /tmp/zoi_decode_mega lab/gpu/decode_mega.cu 2>&1 \
      | grep -A2 decode_step | grep -E 'registers|spill' | tee -a "$OUT/gpu_check_${STAMP}.log"
    timeout "${DECMEGA_TIMEOUT:-100}" /tmp/zoi_decode_mega ${DECMEGA_ITERS:-200} 2>&1 \
      | tee -a "$OUT/gpu_decode_mega_${STAMP}.jsonl" | tee -a "$OUT/gpu_check_${STAMP}.log"
    mrc=${PIPESTATUS[0]}; [[ $rc -eq 0 ]] && rc=$mrc
    echo "decode_mega (producer warp $prod, ring $nslot) exit code $mrc" | tee -a "$OUT/gpu_check_${STAMP}.log"
  done
  # the product's decode step on the same card, same run (per-op graph, Triton kernels)
  for prec in ${DECMEGA_PRODUCT:-w8}; do  # weight-only INT8, as the kernel (int8: W8A8)
    timeout "${DECMEGA_PRODUCT_TIMEOUT:-150}" $PY lab/gpu/decode_ab.py --models llama-3.2-1b --variants base \
      --pipeline-only --new 96 --precision "$prec" --out "$OUT/gpu_decode_mega_product_${prec}_${STAMP}.json" 2>&1 \
      | tail -4 | tee -a "$OUT/gpu_check_${STAMP}.log"
  done
fi
if [[ " $STAGES " == *" grouped "* ]]; then  # explicit only, ~2 min: the grouped int8 handoff (lab)
  log "grouped int8 handoff ffn1 -> ffn2 vs linear + quantize + linear (lab/gpu/grouped_handoff.py)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  timeout "${GROUPED_TIMEOUT:-240}" $PY lab/gpu/grouped_handoff.py ${GROUPED_ARGS:-} --out "$OUT/gpu_grouped_handoff_${STAMP}.json" 2>&1 \
    | tail -30 | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if [[ " $STAGES " == *" gemv "* ]]; then  # explicit only, ~6 min: the decoder's decode linears
  log "gemv: decode linear sweep (lab/gpu/sweep_gemv.py), winners into DECODE_TABLE, compiled decoder tests" | tee -a "$OUT/gpu_check_${STAMP}.log"
  timeout "${GEMV_SWEEP_TIMEOUT:-235}" $PY lab/gpu/sweep_gemv.py ${GEMV_SWEEP_ARGS:-} --out "$OUT/gpu_gemv_sweep_${STAMP}.json" 2>&1 \
    | tail -60 | tee -a "$OUT/gpu_check_${STAMP}.log"
  $PY scripts/apply_gemv_table.py "$OUT/gpu_gemv_sweep_${STAMP}.json" 2>&1 | tee -a "$OUT/gpu_check_${STAMP}.log" \
    && cp src/zoi/backends/cuda/kernels/linear_table.py "$OUT/linear_table_${STAMP}.py"
  par=(); $PY -c "import xdist" 2>/dev/null && par=(-n "${TEST_PROCS:-8}")
  ZOI_TRITON_COMPILED=1 timeout "${GEMV_TEST_TIMEOUT:-200}" $PY -m pytest ${GEMV_TESTS:-tests/decoder/cuda} -q -rA -p no:cacheprovider "${par[@]}" 2>&1 \
    | grep -v "^PASSED" | tail -40 | tee -a "$OUT/gpu_check_${STAMP}.log"
  grc=${PIPESTATUS[0]}; [[ $rc -eq 0 ]] && rc=$grc
  echo "gemv decoder tests exit code $grc" | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if [[ " $STAGES " == *" fp8 "* ]]; then  # explicit only (an sm_89+ GPU), ~8 min: the FP8
  log "fp8: tests compiled (kernels vs zoi.numerics.fp8, engine vs the FP8 emulation, real MiniLM)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  ZOI_TRITON_COMPILED=1 timeout "${FP8_TEST_TIMEOUT:-300}" $PY -m pytest tests/cuda_backend/test_fp8.py tests/quant/test_fp8.py tests/test_quantmode.py \
    -q -rA -p no:cacheprovider 2>&1 | grep -v "^PASSED" | tee -a "$OUT/gpu_check_${STAMP}.log"
  frc=${PIPESTATUS[0]}; [[ $rc -eq 0 ]] && rc=$frc
  echo "fp8 tests exit code $frc" | tee -a "$OUT/gpu_check_${STAMP}.log"
  log "fp8: zoi eval FP8 (cuda) vs FP32, every domain" | tee -a "$OUT/gpu_check_${STAMP}.log"
  timeout "${FP8_EVAL_TIMEOUT:-400}" $PY -m zoi.cli eval ${ZOI_MINILM_DIR:-} --precision fp8 --device cuda -q \
    --json "$OUT/gpu_eval_fp8_${STAMP}.json" 2>&1 | tail -30 | tee -a "$OUT/gpu_check_${STAMP}.log"
  log "fp8: zoi bench --device cuda, fp8 vs int8 vs fp16 (minilm 32x128, 256x128)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  ZOI_MINILM_PATH=${ZOI_MINILM_PATH:-${ZOI_MINILM_DIR:-}} timeout "${FP8_BENCH_TIMEOUT:-400}" \
    $PY -m zoi.bench.cli --device cuda --no-rss --providers zoi-cuda-fp8,zoi-cuda-int8,zoi-cuda-fp16 \
    --workloads "${FP8_WORKLOADS:-minilm-32x128,minilm-256x128}" --rounds 5 \
    --out "$OUT/gpu_bench_fp8_${STAMP}.json" 2>&1 | tail -30 | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if [[ " $STAGES " == *" mega "* ]]; then  # explicit only, ~5 min: the CUDA C++ megakernel (docs/MEGAKERNEL.md)
  log "mega: build csrc/cuda/megakernel.cu, GPU tests, MiniLM megakernel vs per-op vs PyTorch FP16 graph" | tee -a "$OUT/gpu_check_${STAMP}.log"
  MK_LOG="$OUT/gpu_megakernel_${STAMP}.ptxas.txt"
  if command -v nvcc >/dev/null; then  # the device's own nvcc: the cubin always matches its driver
    mkdir -p src/zoi/_cuda
    nvcc --version | tail -1 | tee -a "$OUT/gpu_check_${STAMP}.log"
    nvcc -cubin -O3 -std=c++17 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
      -o src/zoi/_cuda/megakernel.cubin csrc/cuda/megakernel.cu >"$MK_LOG" 2>&1
    echo "nvcc exit $?" | tee -a "$MK_LOG" "$OUT/gpu_check_${STAMP}.log"
    cat "$MK_LOG" | tee -a "$OUT/gpu_check_${STAMP}.log"
    command -v cuobjdump >/dev/null && cuobjdump -res-usage src/zoi/_cuda/megakernel.cubin 2>&1 | tail -4 | tee -a "$OUT/gpu_check_${STAMP}.log"
    cp src/zoi/_cuda/megakernel.cubin "$OUT/gpu_megakernel_${STAMP}.cubin" 2>/dev/null
  else
    echo "no nvcc here: the carried src/zoi/_cuda/megakernel.cubin (if any) is used" | tee -a "$OUT/gpu_check_${STAMP}.log"
  fi
  ZOI_TRITON_COMPILED=1 timeout "${MEGA_TEST_TIMEOUT:-330}" $PY -m pytest tests/cuda_backend/test_megakernel_gpu.py \
    -q -rA -p no:cacheprovider --tb=short 2>&1 | grep -v "^PASSED" | tail -80 | tee -a "$OUT/gpu_check_${STAMP}.log"
  mkrc=${PIPESTATUS[0]}; [[ $rc -eq 0 ]] && rc=$mkrc
  echo "megakernel tests exit code $mkrc" | tee -a "$OUT/gpu_check_${STAMP}.log"
  if [[ -n "${MEGA_SANITIZE:-}" ]]; then  # memcheck + racecheck (shared memory) on a few small forwards
    for tool in memcheck racecheck; do
      ZOI_TRITON_COMPILED=1 timeout 240 compute-sanitizer --tool $tool --report-api-errors no --print-limit 20 \
        $PY csrc/cuda/bench_megakernel.py --out /dev/null --sanitize 2>&1 | grep -v "Host Frame" | tail -25 | tee -a "$OUT/gpu_check_${STAMP}.log"
      echo "megakernel $tool exit ${PIPESTATUS[0]}" | tee -a "$OUT/gpu_check_${STAMP}.log"
    done
  fi
  ZOI_TRITON_COMPILED=1 timeout "${MEGA_BENCH_TIMEOUT:-200}" $PY csrc/cuda/bench_megakernel.py ${MEGA_BENCH_ARGS:-} \
    --out "$OUT/gpu_megakernel_${STAMP}.json" 2>&1 | tail -30 | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if has sanitize; then
  log "compute-sanitizer memcheck (one forward per precision)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  # kernel memory errors (API errors reported separately: cuda.bindings probes driver entry points)
  timeout 240 compute-sanitizer --tool memcheck --leak-check no --report-api-errors no --print-limit 50 \
    $PY lab/gpu/bench.py --sanitize > "$OUT/gpu_memcheck.log" 2>&1
  echo "memcheck exit $?" >> "$OUT/gpu_memcheck.log"
  grep -v "Host Frame\|^========= *$" "$OUT/gpu_memcheck.log" | tail -20 | tee -a "$OUT/gpu_check_${STAMP}.log"
  if [[ -n "${API_ERRORS:-}" ]]; then  # the API errors, by kind (run 2: 34 cuGetProcAddress probes)
    timeout 240 compute-sanitizer --tool memcheck --leak-check no --print-limit 200 \
      $PY lab/gpu/bench.py --sanitize > "$OUT/gpu_memcheck_api.log" 2>&1
    grep -o "Program hit [A-Z_]* (error [0-9]*) due to .* on CUDA API call to [a-zA-Z_0-9]*" \
      "$OUT/gpu_memcheck_api.log" | sort | uniq -c | tee -a "$OUT/gpu_check_${STAMP}.log"
  fi
  if [[ -n "${RACECHECK:-}" ]]; then
    log "compute-sanitizer racecheck" | tee -a "$OUT/gpu_check_${STAMP}.log"
    timeout 300 compute-sanitizer --tool racecheck --print-limit 20 \
      $PY lab/gpu/bench.py --sanitize 2>&1 | tail -25 | tee -a "$OUT/gpu_check_${STAMP}.log"
    echo "racecheck exit ${PIPESTATUS[0]}" | tee -a "$OUT/gpu_check_${STAMP}.log"
  fi
fi
if has bench || has quick; then
  log "benchmark" | tee -a "$OUT/gpu_check_${STAMP}.log"
  extra=()
  has quick && ! has bench && extra+=(--quick)
  [[ -n "${BENCH_ARGS:-}" ]] && extra+=(${BENCH_ARGS})
  # the one harness and JSON format: zoi and the PyTorch peers (FP16 eager, FP16 + CUDA graph,
  # torch.compile reduce-overhead) as providers of `zoi bench --device cuda`, each in its own
  # process, same ids (docs/BENCH.md)
  timeout 500 $PY -m zoi.bench.cli --device cuda --out "$OUT/gpu_harness_${STAMP}.json" --no-rss \
    ${BENCH_WORKLOADS:+--workloads "$BENCH_WORKLOADS"} "${extra[@]}" 2>&1 \
    | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if has labbench; then  # lab: per-kernel device times, GEMM TOP/s, in-process peers (its own JSON)
  log "lab benchmark (lab/gpu/bench.py)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  timeout 500 $PY lab/gpu/bench.py --out "$OUT/gpu_bench_${STAMP}.json" ${LAB_ARGS:-} 2>&1 \
    | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if has e2e; then  # texts in host memory -> embeddings in host memory (tokenising included), vs run_packed
  log "end to end: zoi bench text workloads (zoi vs sentence-transformers FP16)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  # the same harness as the CPU rows: every provider in its own process, texts in / embeddings out
  ZOI_MINILM_PATH=${ZOI_MINILM_PATH:-${ZOI_MINILM_DIR:-}} timeout "${E2E_BENCH_TIMEOUT:-420}" \
    $PY -m zoi.cli bench --device cuda --no-rss --load-wait 10 \
    --workloads "${E2E_WORKLOADS:-minilm-text-1x128,minilm-text-32x128,minilm-text-256x128,minilm-text-mixed}" \
    --providers "${E2E_PROVIDERS:-zoi-cuda-fp16,zoi-cuda-int8,st-cuda-fp16}" --calls 50 --rounds 5 \
    --out "$OUT/gpu_e2e_bench_${STAMP}.json" 2>&1 | tail -40 | tee -a "$OUT/gpu_check_${STAMP}.log"
  log "end to end: encode(texts) vs run_packed(ids), one process A/B" | tee -a "$OUT/gpu_check_${STAMP}.log"
  timeout "${E2E_TIMEOUT:-240}" $PY -m zoi.bench.e2e --device cuda --precision "${E2E_PRECISIONS:-fp16}" \
    --shapes "${E2E_SHAPES:-1x128,32x128,256x128,mixed1000}" --reps 10 --rounds 5 ${E2E_ST:+--st} \
    ${ZOI_MINILM_DIR:+--model "$ZOI_MINILM_DIR"} \
    --out "$OUT/gpu_e2e_${STAMP}.json" 2>&1 | tail -40 | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if has arena; then  # the product call: the default max_tokens is the smallest arena within 5% of the best at 256x128
  log "arena sweep (minilm 256x128 at several max_tokens)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  for mt in ${ARENA_SIZES:-8192 16384 32768}; do
    timeout 150 $PY lab/gpu/bench.py --models minilm --shapes 256x128 --no-gemm --no-variants \
      --max-tokens "$mt" --out "$OUT/gpu_arena_${mt}_${STAMP}.json" 2>&1 | tail -6 | tee -a "$OUT/gpu_check_${STAMP}.log"
  done
fi
if [[ " $STAGES " == *" multigpu "* ]]; then  # explicit only: one engine per GPU, any GPU count
  log "multi-GPU serving: cuda:N engines, zoi serve --gpus 0 (and --gpus all with 2+ GPUs)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  timeout "${MULTIGPU_TIMEOUT:-500}" $PY scripts/multigpu_check.py --out "$OUT/gpu_multigpu_check_${STAMP}.json" 2>&1 \
    | tail -40 | tee -a "$OUT/gpu_check_${STAMP}.log"
  mrc=${PIPESTATUS[0]}; [[ $rc -eq 0 ]] && rc=$mrc
  echo "multigpu check exit code $mrc" | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
if [[ " $STAGES " == *" multibench "* ]]; then  # explicit only: 1 GPU vs 2, zoi serve / Triton / Ray
  log "multi-GPU benchmark (scripts/bench_multigpu.sh)" | tee -a "$OUT/gpu_check_${STAMP}.log"
  PYTHON=$PY timeout "${MULTIBENCH_TIMEOUT:-580}" bash scripts/bench_multigpu.sh "${MULTIBENCH_CYCLES:-1}" "$OUT/gpu_multigpu_${STAMP}" 2>&1 \
    | tail -40 | tee -a "$OUT/gpu_check_${STAMP}.log"
fi
log "done (tests rc=$rc)" | tee -a "$OUT/gpu_check_${STAMP}.log"
exit $rc
