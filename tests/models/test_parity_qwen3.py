"""Qwen3 (q/k RMSNorm per head) vs transformers on tiny random checkpoints."""
import pytest

from tests.models.parity import assert_greedy_parity
from tests.tiny_models import build_checkpoint, tiny_config

CASES = {
    "qwen3": dict(),
    "qwen3-tied-bias": dict(tie_word_embeddings=True, attention_bias=True),
    "qwen3-sliding": dict(use_sliding_window=True, sliding_window=16, max_window_layers=1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_parity(case: str, tmp_path) -> None:
    folder = build_checkpoint(str(tmp_path / case), tiny_config("qwen3", **CASES[case]))
    assert_greedy_parity(folder)
