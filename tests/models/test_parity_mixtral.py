"""Mixtral (top-2 of 4 experts, renormalized) vs transformers on tiny random checkpoints."""
import pytest
import torch

from hearth.layers.moe import SparseMoE
from tests.models.parity import assert_greedy_parity
from tests.tiny_models import build_checkpoint, tiny_config

CASES = {
    "mixtral": dict(),
    "mixtral-sliding": dict(sliding_window=16, num_local_experts=6),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_parity(case: str, tmp_path) -> None:
    folder = build_checkpoint(str(tmp_path / case), tiny_config("mixtral", **CASES[case]))
    assert_greedy_parity(folder)


def test_grouped_experts_match_per_token_loop() -> None:
    torch.manual_seed(0)
    moe = SparseMoE(8, 16, num_experts=5, top_k=2, renormalize=True)
    for p in moe.parameters():
        p.data.normal_(0, 0.3)
    x = torch.randn(11, 8)
    probs = torch.softmax(moe.gate(x), -1)
    w, idx = probs.topk(2, -1)
    w = w / w.sum(-1, keepdim=True)
    ref = torch.stack([sum(w[t, k] * moe.experts[int(idx[t, k])](x[t:t + 1])[0] for k in range(2)) for t in range(11)])
    torch.testing.assert_close(moe(x), ref, rtol=1e-5, atol=1e-6)
