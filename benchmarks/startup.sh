#!/bin/bash
# Start-up: `hearth serve FILE` to the first 200 from /health (TinyLlama-1.1B shape: Q8_0 and Q4_0 GGUFs, bf16
# folder), then one short request; 3 starts each, in this order.
# usage: benchmarks/startup.sh [STARTS]
set -e
source "$(dirname "$0")/env.sh"
bench_meta startup
for i in $(seq "${1:-3}"); do
  for v in q8_0 q4_0 bf16; do
    "$HEARTH" bench serve --launch "$HEARTH serve $(hearth_model $TL $v) --port 8012 --max-model-len 2048" \
      --base-url http://127.0.0.1:8012 --num-prompts 1 --max-concurrency 1 --input-len 16 --output-len 1 \
      --tokenizer "$MODELS/$TL" --warmup 0 --output-json "$RESULTS/startup_${v}_$i.json"
  done
done
