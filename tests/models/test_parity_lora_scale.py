"""A per-request adapter scale (llama-server's `lora: [{"id", "scale"}]`, LoRARequest.scale): one adapter at scales
1, 0.5 and -1 and the base in ONE batch, each row against the same adapter saved with lora_alpha times that scale
(PEFT's own scaling, which tests/models/test_parity_lora.py holds to transformers); the same prompt under two scales
gets different KV (the prefix cache keys blocks by adapter and scale)."""
from __future__ import annotations

import json
import os
import shutil

from hearth import LLM, SamplingParams
from hearth.lora.request import LoRARequest
from tests.lora_adapters import build_adapter
from tests.tiny_models import build_checkpoint, tiny_config

STEPS = 16
SHARED = list(range(20, 60))
SCALES = (1.0, 0.5, -1.0)


def with_alpha(folder: str, dest: str, alpha: float) -> str:
    shutil.copytree(folder, dest)
    path = os.path.join(dest, "adapter_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "lora_alpha": alpha}, f)
    return dest


def test_a_scale_is_the_adapter_with_alpha_times_it(tmp_path) -> None:
    base = build_checkpoint(str(tmp_path / "base"), tiny_config("llama"))
    folder = build_adapter(base, str(tmp_path / "a"), seed=5, r=4, alpha=8)
    llm = LLM(base, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64, enable_lora=True, max_loras=4)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=5)
    scaled = [LoRARequest("a", 1, folder, scale=s) for s in SCALES]
    got = llm.generate([{"prompt_token_ids": SHARED}] * 4, params, lora_request=[*scaled, None])
    refs = [LoRARequest(f"a{i}", 10 + i, with_alpha(folder, str(tmp_path / f"a{i}"), 8 * s))
            for i, s in enumerate(SCALES[1:])]
    want = llm.generate([{"prompt_token_ids": SHARED}] * 2, params, lora_request=refs)
    outs = [o.outputs[0] for o in got]
    assert len({tuple(o.token_ids) for o in outs}) == 4  # three scales and the base: four continuations
    for out, ref in zip(outs[1:3], want):
        ref = ref.outputs[0]
        assert out.token_ids == ref.token_ids
        for a, b in zip(out.logprobs, ref.logprobs):
            assert abs(a.top[0][1] - b.top[0][1]) < 1e-4
    assert llm.engine.block_manager.num_used_blocks == 0 and llm.engine.lora.users == {}
