"""Gemma 1/2/3 (text) vs transformers on tiny random checkpoints; windows of 16 so the 60-token prompt crosses."""
import pytest

from tests.models.parity import assert_greedy_parity
from tests.tiny_models import build_checkpoint, tiny_config

CASES = {
    "gemma": dict(family="gemma", tie_word_embeddings=True),
    "gemma2": dict(family="gemma2", tie_word_embeddings=True),  # softcaps 50 / 30 by default
    "gemma2-tight-caps": dict(family="gemma2", attn_logit_softcapping=1.0, final_logit_softcapping=2.0),
    "gemma2-nocap": dict(family="gemma2", attn_logit_softcapping=None, final_logit_softcapping=None),
    "gemma3": dict(family="gemma3", tie_word_embeddings=True),
    "gemma3-linear-rope": dict(family="gemma3", rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_parity(case: str, tmp_path) -> None:
    kwargs = dict(CASES[case])
    folder = build_checkpoint(str(tmp_path / case), tiny_config(kwargs.pop("family"), **kwargs))
    assert_greedy_parity(folder)
