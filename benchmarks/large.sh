#!/bin/bash
# The 7B-class rows (Qwen2.5-7B shape, 7.6B parameters): load time, peak RSS, prefill 512, batch-1 decode and 8 in
# flight, hearth beside llama.cpp on the same GGUFs (hearth also loads the bf16 folder as is and quantized to
# int8 / int4 at load), the machine's read bandwidth measured before and after. Per precision: hearth, llama.cpp,
# hearth again, so a ratio pairs runs minutes apart. One 7B process at a time, each after a bounded wait for the
# memory it needs (the box is shared).
# usage: benchmarks/large.sh [ROUNDS] [VARIANTS]   (VARIANTS: "q4_0 q8_0 bf16"; LARGE_FIRST_ROUND=N to add rounds)
#   then: python benchmarks/summarize_large.py
#   once before: the checkpoint (make_shaped_models.py MODELS --large) and its GGUFs, made here when missing; the
#   bf16 GGUF (15 GB) is only needed for llama.cpp's bf16 row (KEEP_BF16_GGUF=0 deletes it once both are quantized)
set -e
source "$(dirname "$0")/env.sh"
L=qwen2.5-7b-shape
OUT=$RESULTS/large
DEC=${LARGE_DECODE_LEN:-16}  # batch-1 decode tokens, and 8 x (BIN in / BOUT out) in flight
BIN=${LARGE_BATCH_IN:-64}
BOUT=${LARGE_BATCH_OUT:-16}
LOCK=${LARGE_LOCK:-/tmp/hearth-7b.lock}  # one 7B process at a time, also across sessions sharing the box
mkdir -p "$OUT"
[[ -d $MODELS/$L ]] || "$PY" "$SHARED/make_shaped_models.py" "$MODELS" --large
if [[ ! -f $MODELS/$L-Q4_0.gguf || ! -f $MODELS/$L-Q8_0.gguf ]]; then
  [[ -f $MODELS/$L-BF16.gguf ]] || LLAMA_CPP_SRC=$PEERS/llamacpp/llama.cpp "$PEERS/llamacpp/venv/bin/python" \
    "$SHARED/peers/convert_hf_to_gguf_any_bpe.py" "$MODELS/$L" --outtype bf16 --outfile "$MODELS/$L-BF16.gguf"
  for q in Q8_0 Q4_0; do
    [[ -f $MODELS/$L-$q.gguf ]] || "$LLAMA_BIN/llama-quantize" "$MODELS/$L-BF16.gguf" "$MODELS/$L-$q.gguf" $q 2
  done
  [[ ${KEEP_BF16_GGUF:-1} == 1 ]] || rm -f "$MODELS/$L-BF16.gguf"
fi

wait_mem() {  # GiB of MemAvailable to wait for, at most 10 minutes
  local avail
  for _ in $(seq 120); do
    avail=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)
    (( avail >= $1 )) && return 0
    sleep 5
  done
  echo "large.sh: only $avail GiB available after 10 min (need $1): skipped" >&2
  return 1
}
need() { case $1 in bf16) echo 17 ;; q8_0|int8) echo 10 ;; *) echo 6 ;; esac; }
bandwidth() { "$PY" "$HERE/read_bandwidth.py" "$OUT/bw_$1.json"; }
hearth() {  # $1 variant (bf16, q8_0, q4_0: the folder or the GGUF; int8, int4: the folder quantized at load), $2 tag
  local model q=()
  case $1 in int8|int4) model=$MODELS/$L; q=(--quantization "$1") ;; *) model=$(hearth_model $L "$1") ;; esac
  wait_mem "$(need "$1")" || return 0
  # (the 15 GB of bf16 panels pack into memory: a first start, and no second copy of the weights on disk)
  HEARTH_PANEL_CACHE=0 flock "$LOCK" /usr/bin/time -v "$PY" "$HERE/large_hearth.py" "$model" "$OUT/hearth_$1_$2.json" "${q[@]}" \
    --decode-len "$DEC" --batch-in "$BIN" --batch-out "$BOUT" 2> "$OUT/hearth_$1_$2.err" || tail -3 "$OUT/hearth_$1_$2.err"
}
llamacpp() {  # $1 variant, $2 tag: llama-bench (tg; pp512 apart when LLAMA_PP_BIN is another build) and
  # llama-batched-bench (8 in flight, LLAMA_PP_BIN's build), peak RSS of each
  local m=$MODELS/$L-${1^^}.gguf pp=(-p 512)
  [[ -f $m ]] || return 0
  wait_mem "$(need "$1")" || return 0
  if [[ $LLAMA_PP_BIN != "$LLAMA_BIN" ]]; then
    pp=(-p 0)
    flock "$LOCK" /usr/bin/time -v "$LLAMA_PP_BIN/llama-bench" -m "$m" -t 2 -p 512 -n 0 -r 3 -o json \
      > "$OUT/llamacpp_$1_$2_pp.json" 2> "$OUT/llamacpp_$1_$2_pp.err"
  fi
  flock "$LOCK" /usr/bin/time -v "$LLAMA_BIN/llama-bench" -m "$m" -t 2 "${pp[@]}" -n "$DEC" -r 3 -o json \
    > "$OUT/llamacpp_$1_$2_bench.json" 2> "$OUT/llamacpp_$1_$2_bench.err"
  flock "$LOCK" /usr/bin/time -v "$LLAMA_PP_BIN/llama-batched-bench" -m "$m" -t 2 -c 2048 -npp "$BIN" -ntg "$BOUT" \
    -npl 8 --output-format jsonl > "$OUT/llamacpp_$1_$2_batched.jsonl" 2> "$OUT/llamacpp_$1_$2_batched.err"
}
for r in $(seq "${LARGE_FIRST_ROUND:-1}" "${1:-1}"); do
  bandwidth r${r}a
  for v in ${2:-q4_0 q8_0 bf16}; do
    case $v in q4_0) h2=int4 ;; q8_0) h2=int8 ;; *) h2=bf16 ;; esac
    hearth "$v" r${r}a
    llamacpp "$v" r$r
    hearth "$h2" r${r}b
  done
  bandwidth r${r}b
done
