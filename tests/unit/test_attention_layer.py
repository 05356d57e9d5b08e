"""hearth.layers.attention.Attention: the kernel path (with its SDPA split) against the torch path on mixed
batches of decodes, chunked-prefill chunks after cached context, and fresh prompts."""

import numpy as np
import pytest
import torch

from hearth import kernels
from hearth.layers import attention as attention_mod
from hearth.layers.attention import Attention, AttentionMetadata, PrefillSeq
from tests.tiny_models import baichuan_alibi_slopes

BS = 16


def make_meta(seqs: list[tuple[int, int]], num_decodes: int, seed: int) -> tuple[AttentionMetadata, int]:
    """seqs: (query_len, context_len) in flat order (the first num_decodes have query_len 1). Random blocks."""
    rng = np.random.default_rng(seed)
    need = [-(-c // BS) for _, c in seqs]
    num_blocks = sum(need) + 4
    perm = rng.permutation(np.arange(1, num_blocks)).astype(np.int32)  # block 0 stays free (torch path pads with it)
    tables = np.zeros((len(seqs), max(need)), np.int32)
    slots, prefills, start, i = [], [], 0, 0
    for s, ((ql, ctx), n) in enumerate(zip(seqs, need)):
        tables[s, :n] = perm[i:i + n]
        i += n
        pos = np.arange(ctx - ql, ctx)
        slots.append(tables[s, pos // BS].astype(np.int64) * BS + pos % BS)
        if s >= num_decodes:
            prefills.append(PrefillSeq(start, ql, ctx, s))
        start += ql
    qstart = np.concatenate([[0], np.cumsum([ql for ql, _ in seqs])]).astype(np.int32)
    meta = AttentionMetadata(torch.from_numpy(np.concatenate(slots)), torch.from_numpy(qstart),
                             torch.tensor([c for _, c in seqs], dtype=torch.int32), torch.from_numpy(tables),
                             num_decodes, prefills)
    return meta, num_blocks


def fill_cache(layer: Attention, meta: AttentionMetadata, num_blocks: int, seed: int) -> None:
    """Random K/V everywhere (the earlier context), block 0 zeroed like the runner does."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, BS, layer.num_kv_heads, layer.head_dim)
    kv = (torch.randn(shape, generator=g), torch.randn(shape, generator=g))
    kv[0][0].zero_()
    kv[1][0].zero_()
    layer.kv_cache = kv


@pytest.mark.skipif(not kernels.available(), reason="hearth kernels unavailable here")
@pytest.mark.parametrize("window,softcap", [(None, None), (20, None), (None, 20.0), (700, None)])
def test_kernel_path_matches_torch_path(window, softcap, monkeypatch):
    monkeypatch.setattr(attention_mod, "SDPA_MIN_PROMPT", 32)  # so the fresh 40-token prompt takes SDPA
    seqs = [(1, 1), (1, 17), (1, 90), (40, 40), (9, 50), (3, 3)]
    meta, num_blocks = make_meta(seqs, 3, seed=1)
    h, hkv, d = 8, 2, 64
    layer = Attention(h, hkv, d, d ** -0.5, sliding_window=window, logit_softcap=softcap)
    fill_cache(layer, meta, num_blocks, seed=2)
    g = torch.Generator().manual_seed(3)
    t = int(meta.query_start_loc[-1])
    q = torch.randn(t, h, d, generator=g)
    k, v = torch.randn(t, hkv, d, generator=g), torch.randn(t, hkv, d, generator=g)
    ids, sdpa = meta.split(window, bool(softcap))
    assert (len(sdpa) == 1) == (softcap is None and window in (None, 700))
    ours = layer(q, k, v, meta)
    layer._kernel = (id(layer.kv_cache[0]), False)  # force the torch path on the same (already written) cache
    ref = layer(q, k, v, AttentionMetadata(meta.slot_mapping, meta.query_start_loc, meta.context_lens,
                                           meta.block_tables, meta.num_decode_tokens, meta.prefills))
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.skipif(not kernels.available(), reason="hearth kernels unavailable here")
def test_bf16_model_and_cache():
    seqs = [(1, 33), (5, 20)]
    meta, num_blocks = make_meta(seqs, 1, seed=4)
    layer = Attention(4, 4, 64, 0.125)
    fill_cache(layer, meta, num_blocks, seed=5)
    layer.kv_cache = tuple(c.to(torch.bfloat16) for c in layer.kv_cache)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(6, 4, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    ours = layer(q, k, v, meta)
    assert ours.dtype == torch.bfloat16 and ours.shape == (6, 256)
    layer._kernel = (id(layer.kv_cache[0]), False)
    ref = layer(q, k, v, AttentionMetadata(meta.slot_mapping, meta.query_start_loc, meta.context_lens,
                                           meta.block_tables, meta.num_decode_tokens, meta.prefills))
    torch.testing.assert_close(ours.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not kernels.available(), reason="hearth kernels unavailable here")
def test_int8_cache_kernel_matches_torch_path():
    seqs = [(1, 40), (1, 7), (12, 12), (6, 60)]
    meta, num_blocks = make_meta(seqs, 2, seed=7)
    layer = Attention(8, 4, 64, 0.125, sliding_window=30)
    fill_cache(layer, meta, num_blocks, seed=8)
    from hearth.kernels.attention import quantize_int8
    k_flat, v_flat = (c.view(-1, 4, 64) for c in layer.kv_cache)
    (kq, ks), (vq, vs) = quantize_int8(k_flat), quantize_int8(v_flat)
    layer.kv_cache = (kq.view(num_blocks, BS, 4, 64), vq.view(num_blocks, BS, 4, 64))
    layer.kv_scales = (ks.view(num_blocks, BS, 4), vs.view(num_blocks, BS, 4))
    g = torch.Generator().manual_seed(9)
    t = int(meta.query_start_loc[-1])
    q = torch.randn(t, 8, 64, generator=g)
    k, v = torch.randn(t, 4, 64, generator=g), torch.randn(t, 4, 64, generator=g)
    ours = layer(q, k, v, meta)
    layer._kernel = (id(layer.kv_cache[0]), False)
    ref = layer(q, k, v, AttentionMetadata(meta.slot_mapping, meta.query_start_loc, meta.context_lens,
                                           meta.block_tables, meta.num_decode_tokens, meta.prefills))
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)


def test_int8_kv_cache_end_to_end(tmp_path):
    """An int8 KV cache through the whole engine, with chunked prefill and prefix-cache hits: greedy tokens and
    logprobs stay close to the float32 cache's."""
    from hearth import LLM, SamplingParams
    from tests.tiny_models import build_checkpoint, tiny_config

    folder = build_checkpoint(str(tmp_path / "m"), tiny_config("llama"))
    shared = list(range(30, 70))
    prompts = [{"prompt_token_ids": shared + tail} for tail in ([5, 6, 7], [300, 301], [9] * 11)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    results = {}
    for kv_dtype in (torch.float32, torch.int8):
        llm = LLM(folder, dtype="float32", kv_cache_space=0.02, max_num_batched_tokens=32,
                  kv_cache_dtype="int8" if kv_dtype == torch.int8 else "auto")
        eng = llm.engine
        assert eng.runner.kv_caches[0][0].dtype == kv_dtype
        llm.generate(prompts[:1], params)  # fills the prefix cache
        results[kv_dtype] = llm.generate(prompts, params)
        assert eng.block_manager.prefix_hits > 0
    for a, b in zip(results[torch.float32], results[torch.int8]):
        ta, tb = a.outputs[0].token_ids, b.outputs[0].token_ids
        assert ta[:6] == tb[:6]
        for la, lb in zip(a.outputs[0].logprobs[:6], b.outputs[0].logprobs[:6]):
            assert abs(la.top[0][1] - lb.top[0][1]) < 0.05




@pytest.mark.parametrize("n", [1, 2, 4, 6, 8, 12, 32, 40, 64])
def test_alibi_slopes_match_baichuan(n: int) -> None:
    ours, ref = attention_mod.alibi_slopes(n), baichuan_alibi_slopes(n)
    assert len(ours) == n and ours == pytest.approx(ref, rel=1e-12)


@pytest.mark.skipif(not kernels.available(), reason="hearth kernels unavailable here")
@pytest.mark.parametrize("hkv,window", [(6, None), (2, 20)])
def test_alibi_kernel_path_matches_torch_path(hkv: int, window: int | None, monkeypatch) -> None:
    monkeypatch.setattr(attention_mod, "SDPA_MIN_PROMPT", 32)  # the fresh 40-token prompt must still skip SDPA
    seqs = [(1, 1), (1, 17), (1, 90), (40, 40), (9, 50), (3, 3)]
    meta, num_blocks = make_meta(seqs, 3, seed=4)
    h, d = 6, 64
    layer = Attention(h, hkv, d, d ** -0.5, sliding_window=window, alibi_slopes=attention_mod.alibi_slopes(h))
    fill_cache(layer, meta, num_blocks, seed=5)
    g = torch.Generator().manual_seed(6)
    t = int(meta.query_start_loc[-1])
    q = torch.randn(t, h, d, generator=g)
    k, v = torch.randn(t, hkv, d, generator=g), torch.randn(t, hkv, d, generator=g)
    ours = layer(q, k, v, meta)
    assert meta.split(window, True)[1] == []  # no SDPA for ALiBi on the kernel path
    layer._kernel = (id(layer.kv_cache[0]), False)  # the torch path on the same (already written) cache
    ref = layer(q, k, v, AttentionMetadata(meta.slot_mapping, meta.query_start_loc, meta.context_lens,
                                           meta.block_tables, meta.num_decode_tokens, meta.prefills))
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
    # And ALiBi matters: without it the output differs.
    plain = Attention(h, hkv, d, d ** -0.5, sliding_window=window)
    plain.kv_cache, plain._kernel = layer.kv_cache, (id(layer.kv_cache[0]), False)
    other = plain(q, k, v, AttentionMetadata(meta.slot_mapping, meta.query_start_loc, meta.context_lens,
                                             meta.block_tables, meta.num_decode_tokens, meta.prefills))
    assert (other - ref).abs().max() > 1e-2
