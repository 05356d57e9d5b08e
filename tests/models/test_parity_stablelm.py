"""StableLM (LayerNorm, partial rotary, qkv bias, per-head q/k norms, parallel residual) vs transformers."""
import pytest

from tests.models.parity import assert_greedy_parity
from tests.tiny_models import build_checkpoint, tiny_config

CASES = {
    "stablelm": dict(),  # partial_rotary_factor 0.25 by default
    "stablelm2-qkv-bias": dict(use_qkv_bias=True),
    "stablelm-qk-norm-parallel": dict(qk_layernorm=True, use_parallel_residual=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_parity(case: str, tmp_path) -> None:
    folder = build_checkpoint(str(tmp_path / case), tiny_config("stablelm", **CASES[case]))
    assert_greedy_parity(folder)
