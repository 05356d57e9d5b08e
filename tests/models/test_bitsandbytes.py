"""bitsandbytes checkpoints written by transformers + bitsandbytes' CPU backend (save_pretrained): NF4 / FP4 (with
and without double-quantized absmax) load to bitsandbytes' own dequantized floats bit for bit, LLM.int8 to its int8
rows, and greedy tokens equal transformers' on the dequantized twin; quantization="bitsandbytes" quantizes a float
checkpoint at load."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from hearth import LLM, SamplingParams
from hearth.layers.quant_linear import QuantLinear
from hearth.weights import activations, layouts
from hearth.weights.packed import unpack_u4
from hearth.weights.reference import dequantize
from tests.models.parity import assert_greedy_parity
from tests.tiny_models import build_checkpoint, hf_greedy, tiny_config

PROMPTS = [[5, 17, 42, 99, 7], list(range(20, 60))]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> str:
    cfg = tiny_config("llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2)
    return build_checkpoint(str(tmp_path_factory.mktemp("bnb") / "float"), cfg)


def _save_bnb(src: str, out: str, deq: str, **bnb) -> dict[str, torch.Tensor]:
    """src quantized by transformers + bitsandbytes, saved to out; deq: the same model with bitsandbytes'
    dequantized weights (fp32). Returns those weights by checkpoint name."""
    import bitsandbytes.functional as F
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    model = AutoModelForCausalLM.from_pretrained(src, quantization_config=BitsAndBytesConfig(**bnb),
                                                 device_map="cpu", dtype=torch.float32)
    model.save_pretrained(out)
    weights = {}
    for name, mod in model.named_modules():
        if name.rsplit(".", 1)[-1] in LINEARS:
            w = mod.weight
            if getattr(w, "quant_state", None) is not None:
                w.quant_state.dtype = torch.float32  # (its floats before any rounding to a compute dtype)
                weights[f"{name}.weight"] = F.dequantize_4bit(w.data, w.quant_state).float()
            else:  # LLM.int8: the int8 rows and their absmax (SCB), as saved
                scb = getattr(w, "SCB", None)
                scb = mod.state.SCB if scb is None else scb
                weights[f"{name}.weight"] = F.int8_vectorwise_dequant(w.data, scb.float())
    dense = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    dense.load_state_dict(weights, strict=False)
    dense.save_pretrained(deq)
    for folder in (out, deq):
        for f in os.listdir(src):
            if f.startswith("tokenizer") or f == "special_tokens_map.json":
                shutil.copy(os.path.join(src, f), folder)
    return weights


def _hearth_qweight(llm: LLM, name: str):
    """The QWeight rows hearth holds for checkpoint tensor `name`."""
    model = llm.engine.model
    parent, proj, _ = name.rsplit(".", 2)
    merged_name, shard = model.merged.get(proj, (proj, None))
    mod = model.get_submodule(f"{parent}.{merged_name}")
    if shard is None:
        return mod.qweight
    start, size = mod.shards[shard]
    return mod.qweight.rows(start, size)


def _hearth_weight(llm: LLM, name: str) -> torch.Tensor:
    """The weight hearth holds for checkpoint tensor `name` (its rows of a merged layer), fp32."""
    model = llm.engine.model
    parent, proj, _ = name.rsplit(".", 2)
    merged_name, shard = model.merged.get(proj, (proj, None))
    mod = model.get_submodule(f"{parent}.{merged_name}")
    w = dequantize(mod.qweight) if isinstance(mod, QuantLinear) and mod.qweight is not None else mod.weight.float()
    if shard is not None:
        start, size = mod.shards[shard]
        w = w[start:start + size]
    return w


@pytest.mark.parametrize("bnb", [
    dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=False),
    dict(load_in_8bit=True),
], ids=["nf4-double-quant", "fp4", "llm-int8"])
def test_bnb_checkpoints_load_as_bitsandbytes_dequantizes_them(float_model: str, tmp_path, monkeypatch,
                                                               bnb: dict) -> None:
    monkeypatch.setattr(activations, "ACTIVATIONS", "float")  # (int8 rows: x rounded as floats, for parity)
    monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", False)
    out, deq = str(tmp_path / "q"), str(tmp_path / "deq")
    weights = _save_bnb(float_model, out, deq, **bnb)
    llm = LLM(out, dtype="float32", kv_cache_space=0.05)
    held = {layouts.of(m.qweight).name for m in llm.engine.model.modules()
            if isinstance(m, QuantLinear) and m.qweight is not None}
    assert held == ({"int8"} if "load_in_8bit" in bnb else {"nf4"})  # kept quantized, not dense
    for name, ref in weights.items():
        got = _hearth_weight(llm, name)
        if "load_in_8bit" in bnb:  # q * (SCB / 127) vs (q * SCB) / 127: each one fp32 rounding of the same value
            torch.testing.assert_close(got, ref, rtol=2.5e-7, atol=0)
        else:
            assert torch.equal(got, ref), name
    del llm
    assert_greedy_parity(out, steps=16, prompts=PROMPTS, expected=hf_greedy(deq, PROMPTS, 16))


def test_quantization_bitsandbytes_quantizes_a_float_checkpoint_at_load(float_model: str) -> None:
    """NF4 at load: each layer's codes and absmax are bitsandbytes' quantize_4bit(nf4, blocksize 64) of its
    checkpoint weight, bit for bit, and the model generates."""
    import bitsandbytes.functional as F
    from safetensors.torch import load_file

    llm = LLM(float_model, quantization="bitsandbytes", kv_cache_space=0.05)
    layers = [m for m in llm.engine.model.modules() if isinstance(m, QuantLinear) and m.qweight is not None]
    assert len(layers) == 8 and {layouts.of(m.qweight).name for m in layers} == {"nf4"}
    assert all(m.qweight.group == 64 for m in layers)
    ckpt = load_file(os.path.join(float_model, "model.safetensors"))
    for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        w = ckpt[name].to(llm.engine.model_config.dtype)
        packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
        qw = _hearth_qweight(llm, name)
        n, k = w.shape
        codes = torch.stack([packed.reshape(-1) >> 4, packed.reshape(-1) & 0x0F], 1).reshape(n, k)
        assert torch.equal(unpack_u4(qw.data), codes), name
        assert torch.equal(qw.scales, state.absmax.reshape(n, k // 64)), name
        assert torch.equal(qw.codebook, state.code.float()), name
    out = llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(temperature=0.0, max_tokens=8,
                                                                           ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 8
