#!/bin/bash
# hearth against llama.cpp on AVX2: on an AVX2-only CPU both natively; on an AVX-512 host hearth in forced AVX2 mode
# (HEARTH_KERNELS_ISA=avx2) against an AVX2-only llama.cpp (benchmarks/llama_avx2.sh). The same Q4_0 GGUF, Qwen2.5-0.5B shape: batch-1 decode (16 in / 64 out), decode at 8 and 32 in flight (128 in /
# 64 out: hearth bench latency --batch-size N against llama-batched-bench's S_TG), one 512-token prefill (against
# llama-bench pp512); TinyLlama shape Q8_0 (int8 weights throughout) at batch 1 and 8 in flight (128 in / 32 out).
# The two alternate, a round each; each side records what ISA it ran.
# usage: benchmarks/avx2.sh [ROUNDS]
set -e
source "$(dirname "$0")/env.sh"
M=$(hearth_model $QW q4_0)
T=$(hearth_model $TL q8_0)  # TinyLlama shape Q8_0: int8 weights throughout
if grep -qw avx512f /proc/cpuinfo; then  # an AVX-512 host: both sides held to AVX2
  export HEARTH_KERNELS_ISA=avx2
  LLAMA_AVX2=${LLAMA_AVX2_BIN:-$PEERS/llamacpp/llama.cpp/build-avx2/bin}
else  # an AVX2-only CPU: both native (llama.cpp's GGML_NATIVE build is its AVX2 build here)
  LLAMA_AVX2=${LLAMA_AVX2_BIN:-$LLAMA_BIN}
fi
hearth_rows() {  # ROUND
  local out=$RESULTS/avx2_hearth_r$1
  "$HEARTH" bench latency "$M" --input-len 16 --output-len 64 --batch-size 1 --num-iters 3 --warmup 1 \
    --max-model-len 1024 --kv-cache-space 1 --output-json "${out}_b1.json"
  for n in 8 32; do
    "$HEARTH" bench latency "$M" --input-len 128 --output-len 64 --batch-size $n --num-iters 2 --warmup 1 \
      --max-model-len 1024 --max-num-seqs $n --kv-cache-space 2 --output-json "${out}_n$n.json"
  done
  "$HEARTH" bench latency "$M" --input-len 512 --output-len 2 --batch-size 1 --num-iters 2 --warmup 1 \
    --max-model-len 1024 --kv-cache-space 1 --output-json "${out}_p512.json"
  "$HEARTH" bench latency "$T" --input-len 16 --output-len 32 --batch-size 1 --num-iters 3 --warmup 1 \
    --max-model-len 1024 --kv-cache-space 1 --output-json "${out}_tl_b1.json"
  "$HEARTH" bench latency "$T" --input-len 128 --output-len 32 --batch-size 8 --num-iters 2 --warmup 1 \
    --max-model-len 1024 --max-num-seqs 8 --kv-cache-space 2 --output-json "${out}_tl_n8.json"
}
llama_rows() {  # ROUND
  local out=$RESULTS/avx2_llama_r$1
  "$LLAMA_AVX2/llama-bench" -m "$M" -t 2 -p 512 -n 64 -r 3 -o json > "${out}_bench.json"
  "$LLAMA_AVX2/llama-batched-bench" -m "$M" -t 2 -c 8192 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 8,32 \
    --output-format jsonl > "${out}_batched.jsonl" 2> /dev/null
  "$LLAMA_AVX2/llama-bench" -m "$T" -t 2 -p 0 -n 32 -r 3 -o json > "${out}_tl_bench.json"
  "$LLAMA_AVX2/llama-batched-bench" -m "$T" -t 2 -c 4096 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 8 \
    --output-format jsonl > "${out}_tl_batched.jsonl" 2> /dev/null
}
bench_meta avx2
"$PY" -c "from hearth.platform import cpu_info; print('hearth:', cpu_info().summary())" > "$RESULTS/avx2_isa.txt"
echo "llama.cpp: $(grep -E '^GGML_(NATIVE|AVX2|AVX512|AVX_VNNI|AMX_INT8):' "$LLAMA_AVX2/../CMakeCache.txt" | tr '\n' ' ')" \
  >> "$RESULTS/avx2_isa.txt"
for r in $(seq "${1:-2}"); do
  if (( r % 2 )); then hearth_rows $r; llama_rows $r; else llama_rows $r; hearth_rows $r; fi
done
