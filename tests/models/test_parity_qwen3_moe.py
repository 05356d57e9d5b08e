"""Qwen3-MoE vs transformers on tiny random checkpoints (one case with a dense layer among the sparse)."""
import pytest

from tests.models.parity import assert_greedy_parity
from tests.tiny_models import build_checkpoint, tiny_config

CASES = {
    "qwen3-moe": dict(),
    "qwen3-moe-norm-topk-dense-layer": dict(norm_topk_prob=True, mlp_only_layers=[0]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_parity(case: str, tmp_path) -> None:
    folder = build_checkpoint(str(tmp_path / case), tiny_config("qwen3_moe", **CASES[case]))
    assert_greedy_parity(folder)
