#!/bin/bash
# llama.cpp built for AVX2 only (no AVX-512, no AVX-VNNI, no AMX), beside the native build: the peer for hearth's
# forced AVX2 mode (HEARTH_KERNELS_ISA=avx2) on an AVX-512 machine, so the AVX2 kernels of both can be compared on
# one box. Same source as ../shared/bench/peers/setup_llama_cpp.sh (the llama-cpp-python 0.3.36 sdist).
# usage: benchmarks/llama_avx2.sh        -> $PEERS/llamacpp/llama.cpp/build-avx2/bin/{llama-bench,llama-batched-bench}
set -e
source "$(dirname "$0")/env.sh"
DIR=$PEERS/llamacpp
mkdir -p "$DIR" && cd "$DIR"
if [[ ! -d llama.cpp ]]; then
  python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d sdist
  tar xzf sdist/llama_cpp_python-0.3.36.tar.gz
  ln -sfn llama_cpp_python-0.3.36/vendor/llama.cpp llama.cpp
fi
cmake -S llama.cpp -B llama.cpp/build-avx2 -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON \
  -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF \
  -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
  -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF
cmake --build llama.cpp/build-avx2 -j2 --target llama-bench llama-batched-bench llama-quantize
# What it runs: llama-bench prints its CPU features line (AVX512 = 0 expected).
"llama.cpp/build-avx2/bin/llama-bench" --help >/dev/null 2>&1 || true
echo "AVX2-only llama.cpp in $DIR/llama.cpp/build-avx2/bin"
