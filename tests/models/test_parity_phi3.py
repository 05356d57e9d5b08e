"""Phi-3 (fused qkv/gate_up in the checkpoint, LongRoPE, partial rotary) vs transformers on tiny checkpoints."""
import pytest

from tests.models.parity import assert_greedy_parity
from tests.tiny_models import build_checkpoint, tiny_config

# head_dim 16 -> 8 rotary frequencies. The original context (48) is shorter than the long prompt (60), which
# runs on the long factors, and longer than the short prompts ever get (<= 41 tokens), which stay on the short.
# "phi3-longrope-switch" (original 32) has the short prompts cross the switch while decoding: hearth keeps their
# short-factor keys and rotates new tokens with the long factors, as transformers' forward does (the reference is a
# plain forward loop). NOTE: transformers' generate() instead drops the cache at the switch and recomputes.
LONGROPE = dict(max_position_embeddings=256, original_max_position_embeddings=48,
                rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                 "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 4.0, 5.0],
                                 "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0]})

CASES = {
    "phi3": dict(),
    "phi3-sliding": dict(sliding_window=16),
    "phi3-longrope": LONGROPE,
    "phi3-longrope-switch": {**LONGROPE, "original_max_position_embeddings": 32},
    "phi3-partial-rotary": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.5}, tie_word_embeddings=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_parity(case: str, tmp_path) -> None:
    folder = build_checkpoint(str(tmp_path / case), tiny_config("phi3", **CASES[case]))
    assert_greedy_parity(folder)
