#!/bin/bash
# Batch-1 decode against llama.cpp on the same files: llama-bench tg64 (2 threads, 3 repetitions), then hearth bench
# latency (16 in / 64 out, median of 3). hearth takes the bf16 folder for the BF16 rows, the same GGUF otherwise.
# usage: benchmarks/batch1.sh [ROUNDS]
set -e
source "$(dirname "$0")/env.sh"
bench_meta batch1
for r in $(seq "${1:-1}"); do
  for m in $QW $TL; do
    for v in bf16 q8_0 q4_0; do
      "$LLAMA_BIN/llama-bench" -m "$MODELS/$m-${v^^}.gguf" -t 2 -p 0 -n 64 -r 3 -o json \
        > "$RESULTS/batch1_${m}_${v}_r${r}_llamacpp.json" 2> /dev/null
      "$HEARTH" bench latency "$(hearth_model $m $v)" --input-len 16 --output-len 64 --batch-size 1 --num-iters 3 \
        --warmup 1 --max-model-len 1024 --kv-cache-space 1 --output-json "$RESULTS/batch1_${m}_${v}_r${r}_hearth.json"
    done
  done
done
