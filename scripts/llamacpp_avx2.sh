#!/usr/bin/env bash
# llama.cpp (llama-cpp-python, the decode peer of `zoi bench`) built for AVX2 only, into its own
# target folder, for AVX2-vs-AVX2 decode figures on a machine that also has AVX-512 (the
# registry's source build is native: it would use AVX-512 / VNNI there). ~8 min on 2 cores.
#   scripts/llamacpp_avx2.sh [DIR]   (default .llamacpp-avx2)
#   ZOI_CPU_ISA=avx2 PYTHONPATH=DIR zoi bench --workloads smollm2-135m-decode,qwen2.5-0.5b-decode \
#     --providers zoi-w8a8,llamacpp-q8_0 --streams 1
# The build's llama_print_system_info() (recorded in the bench JSON as "system") must list no AVX512.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.llamacpp-avx2}
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  .venv/bin/pip install --no-cache-dir --no-deps --target "$DIR" llama-cpp-python==0.3.36 diskcache==5.6.3 gguf==0.19.0
PYTHONPATH=$DIR .venv/bin/python -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
