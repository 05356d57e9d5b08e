"""GGUF IQ4_NL / IQ4_XS kept quantized in the codebook layout: repacks bit-exact against gguf.quants, the codebook
kernel on them, shards of mixed types, and a loaded model that keeps every IQ4 weight in that layout."""
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

from hearth.kernels import quant as qkernels
from hearth.weights import apply, dispatch, layouts, prepare, reference
from hearth.weights.gguf import KEPT_NAMES, GGUFBlocks
from hearth.weights.packed import QWeight

_BLOCK = {Q.IQ4_NL: (32, 18), Q.IQ4_XS: (256, 136)}


def _raw(qtype: Q, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random but valid rows: a finite fp16 d per block, every other byte random (IQ4_XS's 6-bit scales included,
    so ls - 32 spans -32 .. 31)."""
    rng = np.random.default_rng(seed)
    block, size = _BLOCK[qtype]
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    raw[:, :, 0:2] = (rng.standard_normal((n, k // block, 1)) * 0.01).astype(np.float16).view(np.uint8)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.IQ4_XS])
def test_iq4_repack_equals_gguf_dequantize(qtype: Q) -> None:
    n, k = 37, 512
    raw = _raw(qtype, n, k)
    blocks = GGUFBlocks(int(qtype), (n, k), torch.from_numpy(raw.copy()))
    assert qtype.name in KEPT_NAMES
    qw = blocks.repack()
    assert layouts.of(qw) is layouts.CODEBOOK_4 and qw.group == 32 and qw.mins is None
    ref = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
    assert torch.equal(reference.dequantize(qw), ref)  # bit for bit
    perm = torch.randperm(n)
    assert torch.equal(reference.dequantize(blocks.index_rows(perm).repack()), ref[perm])
    if qkernels.available():
        assert dispatch.plan(layouts.of(qw), 1, dispatch.caps()) is dispatch.Kernel.CODEBOOK
        assert torch.equal(apply.dequantize_rows(qw, 3, n), ref[3:])  # the C dequantization: the same products
        for m in (1, 3, 40):  # the codebook kernel's rows, and (40) dequantized tiles + torch's GEMM
            x = torch.randn(m, k)
            torch.testing.assert_close(apply.linear(x, qw), F.linear(x, ref), rtol=1e-4, atol=1e-4)


def test_iq4_shards_join_and_other_4bit_shards_stay_apart() -> None:
    """IQ4_NL and IQ4_XS shards of one layer (llama-quantize writes such mixes) share the codebook layout; an IQ4
    shard beside a Q4_K one has no common layout, so the layer goes dense rather than mis-joined."""
    k = 256
    nl = GGUFBlocks(int(Q.IQ4_NL), (8, k), torch.from_numpy(_raw(Q.IQ4_NL, 8, k, 1)))
    xs = GGUFBlocks(int(Q.IQ4_XS), (4, k), torch.from_numpy(_raw(Q.IQ4_XS, 4, k, 2)))
    qw = prepare.pack_parts([nl, xs], "gguf", k, None)
    assert isinstance(qw, QWeight) and qw.codebook is not None
    assert torch.equal(reference.dequantize(qw), torch.cat([nl.dequantize(), xs.dequantize()]))
    rng = np.random.default_rng(3)
    q4k = rng.integers(0, 256, (4, 144), dtype=np.uint8)
    q4k[:, 0:4] = (rng.standard_normal((4, 2)) * 0.01).astype(np.float16).view(np.uint8)
    assert prepare.pack_parts([nl, GGUFBlocks(int(Q.Q4_K), (4, k), torch.from_numpy(q4k))], "gguf", k, None) is None


@pytest.mark.parametrize("qtype,tied", [(Q.IQ4_NL, True), (Q.IQ4_XS, False)])
def test_iq4_model_keeps_its_weights_in_the_codebook_layout(qtype: Q, tied: bool, tmp_path: Path) -> None:
    from hearth import LLM
    from tests.gguf_writer import write_gguf
    from tests.tiny_models import build_checkpoint, tiny_config

    cfg = tiny_config("qwen3", hidden_size=256, intermediate_size=512, tie_word_embeddings=tied)
    folder = build_checkpoint(str(tmp_path / "m"), cfg)
    write_gguf(folder, tmp_path / "m.gguf", qtype)
    model = LLM(str(tmp_path / "m.gguf"), kv_cache_space=0.05).engine.model
    layer = model.model.layers[0]
    for proj in (layer.mlp.down_proj, layer.mlp.gate_up_proj, layer.self_attn.qkv_proj):
        assert proj.qweight is not None and proj.qweight.codebook is not None, proj
    assert model.lm_head_qweight is not None and model.lm_head_qweight.codebook is not None
    assert (model.lm_head_qweight is model.model.embed_tokens.qweight) == tied
