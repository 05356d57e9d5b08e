"""Pooling pieces on their own: pooling math, config parsing, the --task/--runner flags, the engine's pooling
batch (token budget, abort, a failed pass frees its KV blocks)."""
import pytest
import torch

from hearth import LLM, PoolingParams
from hearth.layers.pooler import PoolerConfig, pool, read_sentence_transformers_config
from tests.tiny_encoders import build_bert
from tests.tiny_models import build_checkpoint, tiny_config


def test_pool_over_flat_rows() -> None:
    hidden = torch.arange(12, dtype=torch.float32).view(6, 2)  # sequences of 1, 3 and 2 rows
    lens = [1, 3, 2]
    assert pool(hidden, lens, "CLS").tolist() == [[0, 1], [2, 3], [8, 9]]
    assert pool(hidden, lens, "LAST").tolist() == [[0, 1], [6, 7], [10, 11]]
    assert pool(hidden, lens, "MEAN").tolist() == [[0, 1], [4, 5], [9, 10]]


def test_pooler_config_parse() -> None:
    assert PoolerConfig.parse('{"pooling_type": "mean", "normalize": false}') == PoolerConfig("MEAN", False)
    with pytest.raises(ValueError, match="pooling_type must be one of"):
        PoolerConfig.parse({"pooling_type": "MAX"})
    with pytest.raises(ValueError, match="unknown keys"):
        PoolerConfig.parse({"pooling": "MEAN"})
    with pytest.raises(ValueError, match="not valid JSON"):
        PoolerConfig.parse("{mean")


def test_sentence_transformers_folder(tmp_path) -> None:
    assert read_sentence_transformers_config(build_bert(str(tmp_path / "m"))) == PoolerConfig("MEAN", True)
    cls = build_bert(str(tmp_path / "c"), pooling="cls", normalize=False)
    assert read_sentence_transformers_config(cls) == PoolerConfig("CLS", False)
    assert read_sentence_transformers_config(str(tmp_path)) is None


def test_task_flag_maps_to_runner() -> None:
    from hearth.entrypoints.cli import build_parser, engine_args_from

    def runner(*flags: str) -> str:
        return engine_args_from(build_parser().parse_args(["serve", "m", *flags])).runner

    assert runner() == "auto"
    assert runner("--task", "embed") == runner("--task", "score") == runner("--runner", "pooling") == "pooling"
    assert runner("--task", "generate") == "generate"


def test_encoder_cannot_generate(tmp_path) -> None:
    folder = build_bert(str(tmp_path / "bert"))
    with pytest.raises(ValueError, match="cannot generate text"):
        LLM(folder, runner="generate", threads=1)


@pytest.fixture(scope="module")
def qwen3_pooling(tmp_path_factory) -> LLM:
    folder = build_checkpoint(str(tmp_path_factory.mktemp("q3") / "q3"), tiny_config("qwen3"))
    return LLM(folder, runner="pooling", dtype="float32", threads=1, kv_cache_space=0.02, max_num_batched_tokens=32)


def test_budget_abort_and_failed_pass(qwen3_pooling: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = qwen3_pooling.engine
    for i in range(4):
        engine.add_request(f"r{i}", list(range(1, 13)), PoolingParams())  # 12 tokens each, a 32-token budget
    engine.abort_request("r1")
    assert [o.request_id for o in engine.step()] == ["r0", "r2"]
    assert [o.request_id for o in engine.step()] == ["r3"] and not engine.has_unfinished_requests()
    engine.add_request("long", list(range(1, 60)), PoolingParams())  # past the budget: runs alone, unsplit
    (out,) = engine.step()
    assert out.num_prompt_tokens == 59 and out.pooled.shape == (64,)

    def boom(*args, **kwargs):
        raise RuntimeError("forward failed")

    engine.add_request("bad", list(range(1, 40)), PoolingParams())
    monkeypatch.setattr(engine.model, "forward", boom)
    with pytest.raises(RuntimeError):
        engine.step()
    assert engine.block_manager.num_used_blocks == 0  # the pass's blocks went back
    engine.abort_request("bad")
    assert not engine.has_unfinished_requests()
