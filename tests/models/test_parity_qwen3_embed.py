"""A decoder as an embedder (vLLM's --runner pooling): a tiny random Qwen3 vs transformers' Qwen3Model, last-token
and mean pooling; and pooling requests beside generation in one engine, holding no KV blocks afterwards."""
import pytest
import torch

from hearth import LLM, PoolingParams, SamplingParams
from tests.tiny_models import build_checkpoint, tiny_config

# Mixed lengths, across KV block boundaries (block size 16).
PROMPTS = [[5, 9, 13], list(range(10, 50)), [7], list(range(100, 117)), [3, 1, 4, 1, 5, 9, 2, 6]]
ARGS = dict(dtype="float32", threads=1, kv_cache_space=0.02, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("qwen3e") / "qwen3"), tiny_config("qwen3"))


def hf_embeddings(folder: str, prompts: list[list[int]], pooling: str) -> torch.Tensor:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()  # Qwen3Model: hidden states after norm
    out = []
    with torch.no_grad():
        for ids in prompts:
            hidden = model(torch.tensor([ids])).last_hidden_state[0]
            out.append(hidden[-1] if pooling == "LAST" else hidden.mean(0))
    return torch.nn.functional.normalize(torch.stack(out), dim=-1)


@pytest.mark.parametrize("pooling", ["LAST", "MEAN"])
def test_decoder_embedding_parity(qwen3: str, pooling: str) -> None:
    llm = LLM(qwen3, runner="pooling", pooler_config={"pooling_type": pooling}, **ARGS)
    outs = llm.embed(PROMPTS)  # 85 tokens over a 64-token budget: two forward passes
    ours = torch.tensor([o.outputs.embedding for o in outs])
    torch.testing.assert_close(ours, hf_embeddings(qwen3, PROMPTS, pooling), atol=1e-5, rtol=1e-4)
    assert llm.engine.block_manager.num_used_blocks == 0
    with pytest.raises(ValueError, match="--runner pooling"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))


def test_pooling_beside_generation_in_one_engine(qwen3: str) -> None:
    llm = LLM(qwen3, **ARGS)  # the generate runner also answers embeddings (last token, normalized)
    engine = llm.engine
    engine.add_request("gen", list(range(20, 60)), SamplingParams(max_tokens=8, ignore_eos=True, temperature=0))
    tokens = [t for out in engine.step() for t in out.new_token_ids]  # the prompt is in: it holds KV blocks
    held = engine.block_manager.num_used_blocks
    assert held > 0
    for i, ids in enumerate(PROMPTS):
        engine.add_request(f"e{i}", ids, PoolingParams())
    pooled = {}
    for _ in range(20):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.pooled is not None:
                pooled[out.request_id] = out.pooled
            else:
                tokens.extend(out.new_token_ids)
        if len(pooled) == len(PROMPTS):
            # every pooling request finished, and the generation still holds just its own blocks
            assert engine.block_manager.num_used_blocks <= held + 1
    assert len(pooled) == len(PROMPTS) and len(tokens) == 8
    assert engine.block_manager.num_used_blocks == 0
    ours = torch.stack([pooled[f"e{i}"] for i in range(len(PROMPTS))])
    torch.testing.assert_close(ours, hf_embeddings(qwen3, PROMPTS, "LAST"), atol=1e-5, rtol=1e-4)
    # the generated tokens are those of the same request run alone
    alone = llm.generate([list(range(20, 60))], SamplingParams(max_tokens=8, ignore_eos=True, temperature=0))[0]
    assert alone.outputs[0].token_ids == tokens
