"""Baichuan 13B / Baichuan 2 13B (ALiBi, no rotary) vs a hand-written torch reference of their forward pass.

transformers has no Baichuan class and the checkpoints' remote code is never run: the reference below transcribes
Baichuan-13B's modeling (W_pack, RMSNorm, SiLU MLP, scores / sqrt(d) plus its ALiBi mask built as
slopes * key position with -inf above the diagonal, NormHead for Baichuan 2) and recomputes the whole sequence at
every step, so it shares no KV-cache logic with hearth.
"""
import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

from tests.models.parity import PARITY_PROMPTS, assert_greedy_parity
from tests.models.test_parity_baichuan import _repack_as_baichuan
from tests.tiny_models import baichuan_alibi_slopes, build_checkpoint, tiny_config


class Baichuan13BReference:
    def __init__(self, folder: str) -> None:
        with open(os.path.join(folder, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = {k: v.double() for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}
        if self.cfg.get("norm_head"):
            self.w["lm_head.weight"] = torch.nn.functional.normalize(self.w["lm_head.weight"], dim=-1)
        self.heads = self.cfg["num_attention_heads"]
        self.slopes = torch.tensor(baichuan_alibi_slopes(self.heads), dtype=torch.float64)

    def _rms(self, x: torch.Tensor, name: str) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.w[name] * (x * torch.rsqrt(var + self.cfg["rms_norm_eps"]))

    def _alibi_mask(self, n: int) -> torch.Tensor:
        # _gen_alibi_mask: slopes * arange(n) per key, plus -inf strictly above the diagonal. [H, n, n]
        alibi = self.slopes[:, None, None] * torch.arange(n, dtype=torch.float64)[None, None, :]
        causal = torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), 1)
        return causal[None] + alibi

    def logits(self, ids: list[int]) -> torch.Tensor:
        n, hidden, h = len(ids), self.cfg["hidden_size"], self.heads
        d = hidden // h
        x = self.w["model.embed_tokens.weight"][torch.tensor(ids)]
        mask = self._alibi_mask(n)
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            y = self._rms(x, p + "input_layernorm.weight")
            proj = y @ self.w[p + "self_attn.W_pack.weight"].T  # [n, 3 * hidden]
            q, k, v = (t.view(n, h, d).transpose(0, 1) for t in proj.split(hidden, dim=-1))  # [H, n, d]
            scores = q @ k.transpose(1, 2) / math.sqrt(d) + mask
            attn = torch.softmax(scores, dim=-1) @ v  # [H, n, d]
            x = x + attn.transpose(0, 1).reshape(n, hidden) @ self.w[p + "self_attn.o_proj.weight"].T
            y = self._rms(x, p + "post_attention_layernorm.weight")
            gate = torch.nn.functional.silu(y @ self.w[p + "mlp.gate_proj.weight"].T)
            x = x + (gate * (y @ self.w[p + "mlp.up_proj.weight"].T)) @ self.w[p + "mlp.down_proj.weight"].T
        return self._rms(x, "model.norm.weight")[-1] @ self.w["lm_head.weight"].T

    def greedy(self, ids: list[int], steps: int, top: int = 5):
        tokens, tops, ids = [], [], list(ids)
        for _ in range(steps):
            logprobs = torch.log_softmax(self.logits(ids), -1)
            t = logprobs.topk(top)
            tops.append((t.indices.tolist(), t.values.tolist()))
            tokens.append(int(logprobs.argmax()))
            ids.append(tokens[-1])
        return tokens, tops


def _as_13b(folder: str) -> None:
    """13B configs have no max_position_embeddings (that is how Baichuan's code picks ALiBi), only
    model_max_length."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["model_max_length"] = cfg.pop("max_position_embeddings")
    with open(path, "w") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize("heads,norm_head", [(6, True), (4, False)], ids=["baichuan2-13b-6heads", "baichuan-13b"])
def test_greedy_parity_against_reference(heads: int, norm_head: bool, tmp_path) -> None:
    llama_dir = build_checkpoint(str(tmp_path / "llama"), tiny_config(
        "llama", hidden_size=16 * heads, num_attention_heads=heads, num_key_value_heads=heads))
    folder = str(tmp_path / "baichuan13b")
    _repack_as_baichuan(llama_dir, folder, norm_head)
    _as_13b(folder)
    ref = Baichuan13BReference(folder)
    expected = [ref.greedy(p, 32) for p in PARITY_PROMPTS]
    assert_greedy_parity(folder, expected=expected)


def test_torch_path_parity(tmp_path, monkeypatch) -> None:
    """The same without the C++ kernel: the torch fallback's decode and prefill paths carry the bias too."""
    from hearth.kernels import attention as attn_kernel

    monkeypatch.setattr(attn_kernel, "supports", lambda *a: False)
    llama_dir = build_checkpoint(str(tmp_path / "llama"), tiny_config(
        "llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=6))
    folder = str(tmp_path / "baichuan13b")
    _repack_as_baichuan(llama_dir, folder, True)
    _as_13b(folder)
    ref = Baichuan13BReference(folder)
    prompts = PARITY_PROMPTS[:2] + [PARITY_PROMPTS[2][:40]]
    assert_greedy_parity(folder, prompts=prompts, expected=[ref.greedy(p, 16) for p in prompts], steps=16)
