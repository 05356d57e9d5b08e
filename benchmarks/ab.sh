#!/bin/bash
# Before/after speed of a change, Qwen2.5-0.5B shape, bf16 folder and Q4_0 GGUF: batch-1 decode (16 in / 64 out),
# 8 and 32 in flight (128 in / 64 out), one 512-token prefill. The two checkouts alternate ABBA, a round each, so
# drift on a shared machine falls on both sides.
# usage: BENCH_BEFORE=/path/to/before-checkout [BENCH_AFTER=this checkout] benchmarks/ab.sh [ROUNDS]
set -e
source "$(dirname "$0")/env.sh"
BEFORE=${BENCH_BEFORE:?set BENCH_BEFORE to a checkout of the before commit (git worktree add --detach DIR COMMIT)}
AFTER=${BENCH_AFTER:-$(cd "$HERE/.." && pwd)}
side_rows() {  # side_rows before|after ROUND
  local tree=$BEFORE; [[ $1 == after ]] && tree=$AFTER
  export PYTHONPATH=$tree
  bench_meta "ab_$1"
  for v in bf16 q4_0; do
    m=$(hearth_model $QW $v) out=$RESULTS/ab_${v}_$1_r$2
    "$HEARTH" bench latency "$m" --input-len 16 --output-len 64 --batch-size 1 --num-iters 3 --warmup 1 \
      --max-model-len 1024 --kv-cache-space 1 --output-json "${out}_b1.json"
    for n in 8 32; do
      "$HEARTH" bench throughput "$m" --input-len 128 --output-len 64 --num-prompts $n --max-num-seqs $n \
        --max-model-len 4096 --kv-cache-space 2 --output-json "${out}_n$n.json"
    done
    "$HEARTH" bench latency "$m" --input-len 512 --output-len 2 --batch-size 1 --num-iters 2 --warmup 1 \
      --max-model-len 4096 --kv-cache-space 1 --output-json "${out}_p512.json"
  done
}
for r in $(seq "${1:-3}"); do
  if (( r % 2 )); then side_rows before $r; side_rows after $r; else side_rows after $r; side_rows before $r; fi
done
