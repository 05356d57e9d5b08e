"""The memory-fit estimate: weights per option from tensor headers, KV bytes per token equal to what the engine
allocates, `hearth doctor MODEL`'s table, and the one-line refusal at load when a model does not fit."""
from __future__ import annotations

import pytest
import torch

from hearth import LLM
from hearth.kv_sizing import HEADROOM_BYTES
from hearth.engine.model_runner import ModelRunner
from hearth.entrypoints.doctor_model import model_rows
from hearth.loader import memory_fit
from hearth.errors import LoadError
from hearth.loader.hf_folder import read_hf_config
from tests.tiny_models import build_checkpoint, tiny_config


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("fit") / "m"), tiny_config("llama"), dtype=torch.bfloat16)


def test_footprint_counts_the_projections_and_the_engines_kv(folder: str) -> None:
    cfg = read_hf_config(folder)
    fp = memory_fit.footprint(folder, cfg)
    h, i, layers, kv = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], 2 * 16
    assert fp.linear == layers * (h * h + 2 * h * kv + h * h + 3 * h * i)  # q, k, v, o, gate, up, down
    assert fp.weight_bytes("dense", 2) == fp.stored_bytes  # (a bf16 checkpoint as stored)
    assert fp.weight_bytes("int4") < fp.weight_bytes("int8") < fp.weight_bytes("dense", 2)
    llm = LLM(folder, dtype="bfloat16", kv_cache_space=0.05)
    per_block = ModelRunner.kv_bytes_per_block(llm.engine.model, 16, torch.bfloat16)
    assert fp.kv_per_token == per_block // 16
    assert fp.kv_per_token_int8 == ModelRunner.kv_bytes_per_block(llm.engine.model, 16, torch.int8) // 16


def test_doctor_lists_every_option_and_what_fits(folder: str, monkeypatch) -> None:
    fp = memory_fit.footprint(folder, read_hf_config(folder))
    monkeypatch.setattr(memory_fit, "available_bytes", lambda: HEADROOM_BYTES + fp.weight_bytes("int8")
                        + 100 * fp.kv_per_token)
    rows = "\n".join(model_rows(folder))
    assert "float32" in rows and "bf16 / fp16" in rows and "int4 (group 128)" in rows
    bf16_row = next(r for r in rows.splitlines() if r.startswith("bf16"))
    assert "does not fit" in bf16_row
    int8_row = next(r for r in rows.splitlines() if r.startswith("int8")).split()
    assert int8_row[2:4] == ["100", "100"]  # KV tokens, max context (below the model's 256)


def test_a_model_that_does_not_fit_is_refused_with_the_numbers(folder: str, monkeypatch) -> None:
    monkeypatch.setattr(memory_fit, "available_bytes", lambda: HEADROOM_BYTES + 1000)
    with pytest.raises(LoadError, match=r"does not fit in memory: its weights need 0\.\d MiB \(dense\) \+ 1\.0 GiB "
                                        r"headroom, and 1\.0 GiB is available.*--quantization int4") as e:
        LLM(folder, dtype="bfloat16", kv_cache_space=0.05)
    assert "\n" not in str(e.value)
