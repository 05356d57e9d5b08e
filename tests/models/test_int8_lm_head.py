"""The LM head of an HF folder quantized at load (hearth.loader.lm_head): int8 per row, the dense head freed, the same
numbers as the int8 reference quantization of the checkpoint's bf16 head, greedy tokens as with the dense head;
HEARTH_QUANT_LM_HEAD=0 and small models keep it dense; the memory-fit estimate counts what the load holds.

A tiny checkpoint is far below SMALL_MODEL_PARAMS, so the tests lower it; FLOAT_HEAD_STEP_ROWS and FLOAT_CHUNK_BYTES
are lowered too, so the head is packed in several steps (and each step in several float chunks), as a real one is."""
from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from hearth import LLM, SamplingParams
from hearth.entrypoints.doctor_model import model_rows
from hearth.kernels import panels
from hearth.loader import memory_fit, model_loader
from hearth.loader.hf_folder import read_hf_config
from hearth.weights import prepare
from hearth.weights.packed import QWeight
from hearth.weights.quantize import quantize_int8
from hearth.weights.reference import dequantize
from tests.tiny_models import build_checkpoint, tiny_config

ENGINE = dict(dtype="bfloat16", kv_cache_space=0.05, threads=1)
PROMPTS = [[5, 6, 7, 8], [100, 3, 250, 17, 9], [42] * 6, [300, 301, 302]]
STEPS = 16
# A greedy token may differ between the two heads only where the dense head's top two logprobs are this close.
NEAR_TIE = 0.02


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("head8")
    return {tied: build_checkpoint(str(root / tied), tiny_config("llama", tie_word_embeddings=tied == "tied"),
                                   dtype=torch.bfloat16) for tied in ("untied", "tied")}


@pytest.fixture
def big_enough(monkeypatch) -> None:
    """Every model counts as large (the head rule applies), and the head packs in 8 steps of 64 rows."""
    monkeypatch.setattr(model_loader, "SMALL_MODEL_PARAMS", 1)
    monkeypatch.setattr(prepare, "FLOAT_HEAD_STEP_ROWS", 64)
    monkeypatch.setattr(prepare, "FLOAT_CHUNK_BYTES", 16 * 4 * 64)  # 16 rows of 64 float32 at a time
    monkeypatch.delenv("HEARTH_QUANT_LM_HEAD", raising=False)


def _bf16_head(folder: str, tied: bool) -> torch.Tensor:
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    return tensors["model.embed_tokens.weight" if tied else "lm_head.weight"]


@pytest.mark.parametrize("quantization", ["int4", "int8", "bitsandbytes"])
@pytest.mark.parametrize("tied", ["untied", "tied"])
def test_head_is_int8_of_the_bf16_head_and_the_dense_one_is_freed(folders, big_enough, quantization: str,
                                                                  tied: str) -> None:
    folder = folders[tied]
    model = LLM(folder, quantization=quantization, **ENGINE).engine.model
    qw = model.lm_head_qweight
    assert isinstance(qw, QWeight) and qw.bits == 8 and qw.codebook is None and qw.shape == (512, 64)
    head = _bf16_head(folder, tied == "tied")
    # bit-exact: the stepped, chunked, re-laid head dequantizes to the one-shot reference quantization's floats
    assert torch.equal(dequantize(qw), dequantize(quantize_int8(head.float())))
    if tied == "tied":  # the embedding stays bf16 rows for its lookups, not bf16 panels for a head it no longer is
        embed = model.model.embed_tokens
        assert embed.weight.dtype == torch.bfloat16 and torch.equal(embed.weight, head) and embed.panels is None
    else:
        assert model.lm_head.weight.numel() == 0


def _greedy(llm: LLM, logprobs: int | None = None) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=logprobs)
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]


@pytest.mark.parametrize("tied", ["untied", "tied"])
def test_greedy_tokens_equal_the_dense_heads(folders, big_enough, monkeypatch, tied: str) -> None:
    folder = folders[tied]
    int8 = LLM(folder, quantization="int4", **ENGINE)
    assert int8.engine.model.lm_head_qweight is not None
    got = [o.token_ids for o in _greedy(int8)]
    del int8
    monkeypatch.setenv("HEARTH_QUANT_LM_HEAD", "0")
    dense = LLM(folder, quantization="int4", **ENGINE)
    assert dense.engine.model.lm_head_qweight is None
    want = _greedy(dense, logprobs=2)
    for i, (g, w) in enumerate(zip(got, want)):
        step = next((s for s, (a, b) in enumerate(zip(g, w.token_ids)) if a != b), None)
        if step is not None:  # only at a near tie of the dense head (the same context up to that step)
            top = w.logprobs[step].top
            assert top[0][1] - top[1][1] < NEAR_TIE, f"prompt {i} step {step}: {top} is no near tie"


def test_env_off_keeps_the_dense_head(folders, big_enough, monkeypatch) -> None:
    monkeypatch.setenv("HEARTH_QUANT_LM_HEAD", "0")
    model = LLM(folders["untied"], quantization="int4", **ENGINE).engine.model
    assert model.lm_head_qweight is None
    head = model.lm_head  # bf16 rows, or bf16 panels where they run (panel_pack), as before
    dense = head.weight if head.panels is None else panels.gather_rows(head.panels[0], torch.arange(512))
    assert torch.equal(dense, _bf16_head(folders["untied"], False))


def test_small_models_unquantized_and_pooling_loads_keep_the_dense_head(folders, monkeypatch) -> None:
    monkeypatch.delenv("HEARTH_QUANT_LM_HEAD", raising=False)
    assert LLM(folders["untied"], quantization="int4", **ENGINE).engine.model.lm_head_qweight is None  # below 200M
    assert "LM head" not in "\n".join(model_rows(folders["untied"]))
    monkeypatch.setattr(model_loader, "SMALL_MODEL_PARAMS", 1)
    assert LLM(folders["untied"], **ENGINE).engine.model.lm_head_qweight is None  # no --quantization
    pooled = LLM(folders["tied"], quantization="int4", runner="pooling", **ENGINE).engine.model
    assert pooled.lm_head_qweight is None  # (embeddings only: no int8 copy of a head nobody reads)


@pytest.mark.parametrize("tied", ["untied", "tied"])
def test_memory_fit_counts_the_int8_head_the_load_holds(folders, big_enough, tied: str) -> None:
    folder = folders[tied]
    fp = memory_fit.footprint(folder, read_hf_config(folder))
    assert (fp.head, fp.head_rows, fp.head_tied) == (512 * 64, 512, tied == "tied")
    qw = LLM(folder, quantization="int4", **ENGINE).engine.model.lm_head_qweight
    added = fp.weight_bytes("int4", 2, True) - fp.weight_bytes("int4", 2)
    assert added == qw.nbytes() - (0 if tied == "tied" else 2 * fp.head)  # in place of bf16, or beside the table
    assert fp.weight_bytes("dense", 2, True) == fp.weight_bytes("dense", 2)  # (no at-load scheme: no int8 head)
    assert "LM head quantized at load to int8" in "\n".join(model_rows(folder))  # (doctor: the same rule)


def test_tensor_parallel_keeps_the_whole_int8_head_on_rank_0(folders, big_enough) -> None:
    """The head stays whole under tensor parallelism (as a GGUF head): rank 0 computes the logits from its int8 head,
    the same tokens as one rank. (The spawned worker ranks run the layers only and read SMALL_MODEL_PARAMS afresh.)"""
    one = LLM(folders["untied"], quantization="int8", **ENGINE)
    want = [o.token_ids for o in _greedy(one)]
    del one
    llm = LLM(folders["untied"], quantization="int8", tensor_parallel_size=2, **ENGINE)
    model = llm.engine.model
    assert model.lm_head_qweight is not None and model.lm_head_qweight.shape == (512, 64)
    assert [o.token_ids for o in _greedy(llm)] == want
