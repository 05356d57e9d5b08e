#!/bin/bash
# The school lab, Qwen2.5-0.5B shape Q4_0 GGUF: how many students hearth and llama-server each hold at TTFT p95 <= 2 s
# and the slowest tenth of answers at >= 5 tok/s (hearth bench lab: a shared 250-word course preamble, a 30-word
# question, 128-token answers, 3-10 s to read each). Both get the same text prompts, byte for byte (--prompt-mode
# text: llama-server takes no token ids), and llama-server one slot per student. The two alternate, a round each.
# usage: benchmarks/lab.sh [STUDENTS] [ROUNDS] [SECONDS_PER_LEVEL]    e.g. benchmarks/lab.sh 16,32,64 2 180
set -e
source "$(dirname "$0")/env.sh"
M=$(hearth_model $QW q4_0)
STUDENTS=${1:-16}
MOST=$(tr ',' '\n' <<< "$STUDENTS" | sort -n | tail -1)
load=(--students "$STUDENTS" --duration "${3:-180}" --think-time 3:10 --preamble-len 250 --question-len 30
      --output-len 128 --prompt-mode text --seed 0)
hearth_row() {  # ROUND
  "$HEARTH" bench lab --launch "$HEARTH serve $M --host 127.0.0.1 --port 8011 --max-model-len 2048" \
    --base-url http://127.0.0.1:8011 "${load[@]}" --output-json "$RESULTS/lab_hearth_q4_0_r$1.json" \
    --plot "$RESULTS/lab_hearth_q4_0_r$1.png"
}
llama_row() {  # ROUND; 512 tokens of context per slot: ~280 in + 128 out
  "$HEARTH" bench lab --launch "$LLAMA_BIN/llama-server -m $M --host 127.0.0.1 --port 8090 -t 2 -np $MOST \
    -c $((MOST * 512)) --metrics --no-webui" --base-url http://127.0.0.1:8090 "${load[@]}" \
    --output-json "$RESULTS/lab_llama_q4_0_r$1.json" --plot "$RESULTS/lab_llama_q4_0_r$1.png"
}
bench_meta lab
for r in $(seq "${2:-1}"); do
  if (( r % 2 )); then hearth_row $r; llama_row $r; else llama_row $r; hearth_row $r; fi
done
