"""Reading llama.cpp GGUF LoRA adapters: the PEFT form they come back as (module names, A / B, llama.cpp's scale,
the llama q/k permutation of B undone), and every file hearth cannot serve refused with one line naming it."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from hearth.config import EngineArgs
from hearth.errors import LoRAError
from hearth.loader.lora_adapter import read_adapter
from hearth.loader.model_loader import load_model
from hearth.lora.peft import read_peft_adapter
from tests.gguf_lora_writer import write_gguf_adapter
from tests.gguf_writer import write_gguf
from tests.lora_adapters import build_adapter
from tests.tiny_models import build_checkpoint, tiny_config


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("base")), tiny_config("llama"))


@pytest.fixture(scope="module")
def model(base):
    return load_model(EngineArgs(model=base, dtype="float32")).model


@pytest.fixture(scope="module")
def peft_folder(base, tmp_path_factory) -> str:
    return build_adapter(base, str(tmp_path_factory.mktemp("peft") / "a"), seed=7, r=4, alpha=8,
                         targets=("q_proj", "k_proj", "v_proj", "down_proj"))


def test_a_gguf_adapter_reads_as_its_peft_source(model, base, peft_folder, tmp_path) -> None:
    path = write_gguf_adapter(peft_folder, base, str(tmp_path / "a.gguf"))
    got, want = read_adapter(path, 16, model), read_peft_adapter(peft_folder, 16)
    assert sorted(got.modules) == sorted(want.modules)
    for name, m in want.modules.items():
        torch.testing.assert_close(got.modules[name].a, m.a.float(), rtol=0, atol=0)
        torch.testing.assert_close(got.modules[name].b, m.b.float(), rtol=0, atol=0)  # q/k: un-permuted
        assert got.modules[name].scale == m.scale == 2.0


def write(path, tensors: dict[str, np.ndarray], arch: str = "llama", **kv) -> str:
    """A hand-made GGUF adapter (kv: general.type / adapter.type / adapter.lora.alpha overrides)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.type", kv.get("general_type", "adapter"))
    w.add_string("adapter.type", kv.get("adapter_type", "lora"))
    if "alpha" in kv:
        w.add_float32("adapter.lora.alpha", kv["alpha"])
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def pair(r: int, inp: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    return np.random.randn(r, inp).astype(np.float32), np.random.randn(out, r).astype(np.float32)


def test_without_alpha_the_scale_is_one(model, tmp_path) -> None:
    a, b = pair(2, 64, 64)
    path = write(tmp_path / "a.gguf", {"blk.1.ffn_down.weight.lora_a": pair(2, 128, 64)[0],
                                       "blk.1.ffn_down.weight.lora_b": b, "blk.0.attn_output.weight.lora_a": a,
                                       "blk.0.attn_output.weight.lora_b": b})
    adapter = read_adapter(path, 16, model)
    assert sorted(adapter.modules) == ["model.layers.0.self_attn.o_proj", "model.layers.1.mlp.down_proj"]
    assert {m.scale for m in adapter.modules.values()} == {1.0}


def refused(path: str, model, max_rank: int = 16) -> str:
    with pytest.raises(LoRAError) as e:
        read_adapter(path, max_rank, model)
    message = str(e.value)
    assert "\n" not in message and path in message
    return message


def test_files_hearth_cannot_serve_are_refused(model, base, peft_folder, tmp_path) -> None:
    write_gguf(base, tmp_path / "model.gguf")
    assert "not a LoRA adapter" in refused(str(tmp_path / "model.gguf"), model)
    other = write_gguf_adapter(peft_folder, base, str(tmp_path / "qwen.gguf"), arch_name="qwen2")
    assert "'qwen2' model" in refused(other, model)
    assert "--max-lora-rank 2" in refused(write_gguf_adapter(peft_folder, base, str(tmp_path / "r.gguf")), model, 2)
    (tmp_path / "x.bin").write_bytes(b"not an adapter at all")
    assert "not a GGUF adapter" in refused(str(tmp_path / "x.bin"), model)
    good = write_gguf_adapter(peft_folder, base, str(tmp_path / "good.gguf"))
    (tmp_path / "cut.gguf").write_bytes(open(good, "rb").read()[:200])
    assert "truncated" in refused(str(tmp_path / "cut.gguf"), model)
    a, b = pair(2, 64, 64)
    assert "embedding or LM head" in refused(write(tmp_path / "e.gguf", {"token_embd.weight.lora_a": a,
                                                                         "token_embd.weight.lora_b": b}), model)
    assert "norm" in refused(write(tmp_path / "n.gguf", {"blk.0.attn_norm.weight": np.ones(64, np.float32)}), model)
    assert "not both" in refused(write(tmp_path / "h.gguf", {"blk.0.attn_q.weight.lora_a": a}), model)
    assert "not a LoRA adapter" in refused(write(tmp_path / "t.gguf", {"blk.0.attn_q.weight.lora_a": a,
                                                                       "blk.0.attn_q.weight.lora_b": b},
                                                 adapter_type="control_vector"), model)


def test_an_adapter_for_another_base_is_refused_when_bound(base, model, tmp_path) -> None:
    """Same architecture, other shapes (a down_proj of 100 inputs, this model's has 128): the binding's one line."""
    from hearth.engine.lora_binding import bind_adapter
    from hearth.layers.lora import wrap_lora_layers

    wrapped = load_model(EngineArgs(model=base, dtype="float32")).model
    layers = wrap_lora_layers(wrapped, 1)[1]
    a, b = pair(2, 100, 64)
    path = write(tmp_path / "other.gguf", {"blk.0.ffn_down.weight.lora_a": a, "blk.0.ffn_down.weight.lora_b": b})
    with pytest.raises(LoRAError, match="does not fit this model") as e:
        bind_adapter(read_adapter(path, 16, wrapped), wrapped, layers, torch.float32)
    assert path in str(e.value) and "\n" not in str(e.value)
