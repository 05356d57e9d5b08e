"""OLMo (non-parametric LayerNorm, clip_qkv) and OLMo 2 (post-norms, whole-projection q/k norms) vs transformers."""
import pytest

from tests.models.parity import assert_greedy_parity
from tests.tiny_models import build_checkpoint, tiny_config

CASES = {
    "olmo": dict(family="olmo"),
    "olmo-clip-qkv": dict(family="olmo", clip_qkv=0.5),
    "olmo2": dict(family="olmo2"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_parity(case: str, tmp_path) -> None:
    kwargs = dict(CASES[case])
    folder = build_checkpoint(str(tmp_path / case), tiny_config(kwargs.pop("family"), **kwargs))
    assert_greedy_parity(folder)
