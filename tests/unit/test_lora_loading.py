"""Reading PEFT LoRA adapters and placing them on hearth's layers: the scale (lora_alpha / r, rsLoRA, alpha_pattern),
per-module A / B landing in the fused qkv / gate_up slices, and every adapter hearth cannot serve refused with one
line naming why (missing folder, rank over the limit, a target the model lacks, another base's shapes, a corrupt
file, modules_to_save, embedding targets, DoRA)."""
from __future__ import annotations

import math
import os

import pytest
import torch

from hearth.config import EngineArgs
from hearth.engine.lora_binding import bind_adapter
from hearth.errors import LoRAError
from hearth.layers.lora import wrap_lora_layers
from hearth.loader.model_loader import load_model
from hearth.lora.peft import read_peft_adapter
from tests.lora_adapters import ab, build_adapter, write_adapter
from tests.tiny_models import build_checkpoint, tiny_config

HIDDEN, INTER, Q, KV = 64, 128, 64, 32  # tiny_config("llama"): 4 heads and 2 kv heads of 16


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("base")), tiny_config("llama"))


@pytest.fixture(scope="module")
def wrapped(base):
    model = load_model(EngineArgs(model=base, dtype="float32")).model
    return model, wrap_lora_layers(model, 2)[1]


def test_a_peft_adapter_reads_with_its_scale(base, tmp_path) -> None:
    folder = build_adapter(base, str(tmp_path / "a"), seed=1, r=4, alpha=8, targets=("q_proj", "down_proj"))
    adapter = read_peft_adapter(folder, max_rank=16)
    assert sorted(adapter.modules) == [f"model.layers.{i}.{m}" for i in range(2)
                                       for m in ("mlp.down_proj", "self_attn.q_proj")]
    q = adapter.modules["model.layers.0.self_attn.q_proj"]
    assert q.a.shape == (4, HIDDEN) and q.b.shape == (Q, 4) and q.scale == 2.0 and adapter.rank == 4


def test_rslora_and_alpha_pattern_scales(tmp_path) -> None:
    mods = {"model.layers.0.self_attn.q_proj": ab(4, HIDDEN, Q), "model.layers.0.mlp.up_proj": ab(4, HIDDEN, INTER)}
    folder = write_adapter(tmp_path / "rs", mods, use_rslora=True, lora_alpha=8, alpha_pattern={"up_proj": 2})
    adapter = read_peft_adapter(folder, max_rank=16)
    assert adapter.modules["model.layers.0.self_attn.q_proj"].scale == 8 / math.sqrt(4)
    assert adapter.modules["model.layers.0.mlp.up_proj"].scale == 2 / math.sqrt(4)


def test_per_module_updates_land_in_the_fused_slices(wrapped, tmp_path) -> None:
    """q and v of the fused qkv (k untouched), up of the fused gate_up: the layer's delta equals each module's."""
    model, layers = wrapped
    q, v, up = ab(4, HIDDEN, Q), ab(2, HIDDEN, KV), ab(4, HIDDEN, INTER)
    folder = write_adapter(tmp_path / "fused", {"model.layers.1.self_attn.q_proj": q,
                                                "model.layers.1.self_attn.v_proj": v,
                                                "model.layers.1.mlp.up_proj": up})
    weights = bind_adapter(read_peft_adapter(folder, 16), model, layers, torch.float32)
    assert sorted(weights) == ["model.layers.1.mlp.gate_up_proj", "model.layers.1.self_attn.qkv_proj"]
    x = torch.randn(3, HIDDEN)
    qkv = weights["model.layers.1.self_attn.qkv_proj"]
    delta = (x @ qkv.a.T) @ qkv.b.T  # [3, Q + 2 KV]
    torch.testing.assert_close(delta[:, :Q], x @ q[0].T @ q[1].T * 2.0)
    assert delta[:, Q:Q + KV].abs().max() == 0
    torch.testing.assert_close(delta[:, Q + KV:], x @ v[0].T @ v[1].T * 4.0)  # rank 2: alpha 8 / 2
    gate_up = weights["model.layers.1.mlp.gate_up_proj"]
    delta = (x @ gate_up.a.T) @ gate_up.b.T
    assert delta[:, :INTER].abs().max() == 0
    torch.testing.assert_close(delta[:, INTER:], x @ up[0].T @ up[1].T * 2.0)


def refused(folder: str, wrapped=None, max_rank: int = 16) -> str:
    with pytest.raises(LoRAError) as e:
        adapter = read_peft_adapter(folder, max_rank)
        if wrapped is not None:
            bind_adapter(adapter, wrapped[0], wrapped[1], torch.float32)
    message = str(e.value)
    assert "\n" not in message and folder in message
    return message


def test_bad_adapters_are_refused_in_one_line(base, wrapped, tmp_path) -> None:
    q = {"model.layers.0.self_attn.q_proj": ab(4, HIDDEN, Q)}
    assert "no such folder" in refused(str(tmp_path / "missing"))
    assert "rank 32" in refused(write_adapter(tmp_path / "rank", {"model.layers.0.self_attn.q_proj":
                                                                  ab(32, HIDDEN, Q)}), max_rank=16)
    lacks = refused(write_adapter(tmp_path / "lacks", {"model.layers.7.self_attn.q_proj": ab(4, HIDDEN, Q)}),
                    wrapped)
    assert "model.layers.7.self_attn.q_proj" in lacks and "does not have" in lacks
    other = refused(write_adapter(tmp_path / "other", {"model.layers.0.self_attn.q_proj": ab(4, 96, 96)}), wrapped)
    assert "another base model" in other and "(4, 96)" in other
    corrupt = write_adapter(tmp_path / "corrupt", q)
    file = os.path.join(corrupt, "adapter_model.safetensors")
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) - 40)
    assert "not a readable safetensors file" in refused(corrupt)
    assert "modules_to_save" in refused(write_adapter(tmp_path / "save", q, modules_to_save=["lm_head"]))
    assert "DoRA" in refused(write_adapter(tmp_path / "dora", q, use_dora=True))
    embed = write_adapter(tmp_path / "embed", {"model.embed_tokens": ab(4, 512, HIDDEN)})
    assert "embed_tokens" in refused(embed)
    os.remove(os.path.join(corrupt, "adapter_config.json"))
    assert "no adapter_config.json" in refused(corrupt)


def test_peft_saves_modules_to_save_and_it_is_refused(base, tmp_path) -> None:
    """PEFT's own folder for an adapter that also trains the LM head: refused by name, not half-applied."""
    folder = build_adapter(base, str(tmp_path / "head"), seed=2, targets=("q_proj",), modules_to_save=["lm_head"])
    assert "modules_to_save" in refused(folder)
