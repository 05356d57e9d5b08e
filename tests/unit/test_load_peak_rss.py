"""A load's peak RSS stays near its weights: quantizing at load goes a chunk of rows at a time (exactly the whole
layer's result), and the huge-page copy frees each old storage as it goes. The memory tests run in a fresh
subprocess, whose peak (VmHWM, reset through clear_refs) only that step moves."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hearth.weights import prepare
from hearth.weights.packed import QWeight


def _fields(qw: QWeight) -> list[torch.Tensor]:
    return [t for t in (qw.data, qw.scales, qw.mins) if t is not None]


@pytest.mark.parametrize("scheme, group", [("int8", None), ("int4", 32), ("int4", 128), ("nf4", None)])
def test_chunked_quantization_is_exactly_the_whole_layers(monkeypatch, scheme: str, group: int | None) -> None:
    torch.manual_seed(0)
    parts = [torch.randn(37, 256).to(torch.bfloat16), torch.randn(64, 256).to(torch.bfloat16)]
    layout = "int4" if scheme == "int4" else scheme
    args = (group,) if group else ()
    whole = prepare.pack("float", layout, torch.cat([p.float() for p in parts]), *args)
    monkeypatch.setattr(prepare, "FLOAT_CHUNK_BYTES", 10 * 256 * 4)  # 10 rows a chunk: uneven against both parts
    chunked = prepare.pack_parts(parts, scheme, 256, group, final=False)
    assert chunked is not None and chunked.shape == whole.shape == (101, 256)
    for a, b in zip(_fields(chunked), _fields(whole), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def _peak_growth(body: str, tmp_path) -> dict:
    """Run body in a fresh Python (it defines `setup()` -> state, and `step(state)`); returns the bytes of RSS
    before the step, the peak growth during it, and what step returned."""
    script = textwrap.dedent("""
        import json, sys
        import torch

        def status(key):
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
        """) + textwrap.dedent(body) + textwrap.dedent("""
        state = setup()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # (VmHWM := VmRSS)
        before = status("VmRSS")
        out = step(state)
        print(json.dumps({"before": before, "growth": status("VmHWM") - before, "out": out}))
        """)
    path = tmp_path / "probe.py"
    path.write_text(script)
    res = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    if "clear_refs" in res.stderr:
        pytest.skip("this kernel does not let a process reset its VmHWM")
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_huge_page_copy_frees_each_storage_as_it_goes(tmp_path) -> None:
    from hearth.weights import hugepages

    if not hugepages.enabled():
        pytest.skip("no transparent huge pages here")
    r = _peak_growth("""
        from torch import nn
        from hearth.platform import keep_freed_memory
        from hearth.weights import hugepages
        from hearth.weights.packed import QWeight

        MB = 1 << 20
        def setup():
            keep_freed_memory()  # (the engine's malloc settings: freed heap stays unless trimmed)
            hugepages._TRIM_STEP, hugepages._BUDGET_S, hugepages._MIN_RATE = 32 * MB, 60.0, 0.0
            root = nn.Module()
            root.layers = nn.ModuleList()
            for _ in range(8):  # 8 x 32 MiB of int8, every page written
                lin = nn.Module()
                lin.qweight = QWeight(8, 4096, torch.ones(8192, 4096, dtype=torch.int8), torch.ones(8192, 1), None)
                root.layers.append(lin)
            return root

        def step(root):
            return hugepages.move_to_hugepages(root)
        """, tmp_path)
    weights = 8 * (32 << 20)
    if r["out"] < weights:
        pytest.skip("the huge-page copy stopped early (a busy machine): nothing to compare")
    # The arena replaces the old storages as they are freed: before, the old ones all lived until the end (2x).
    assert r["growth"] < 0.5 * weights, r


def test_a_big_storage_is_never_copied(tmp_path) -> None:
    """A storage of _IN_PLACE_BYTES or more (a 7B's LM head) collapses into huge pages where it is: the pass adds
    no second copy of it (copied, it was the peak of a 7B GGUF load), and its tensors keep their addresses."""
    from hearth.weights import hugepages

    if not hugepages.enabled():
        pytest.skip("no transparent huge pages here")
    r = _peak_growth("""
        from torch import nn
        from hearth.platform import keep_freed_memory
        from hearth.weights import hugepages
        from hearth.weights.packed import QWeight

        MB = 1 << 20
        def setup():
            keep_freed_memory()
            hugepages._BUDGET_S, hugepages._MIN_RATE = 60.0, 0.0
            root = nn.Module()
            root.lm_head_qweight = QWeight(8, 4096, torch.ones(24576, 4096, dtype=torch.int8), torch.ones(24576, 1),
                                           None)  # 96 MiB, every page written
            return root

        def step(root):
            ptr = root.lm_head_qweight.data.data_ptr()
            moved = hugepages.move_to_hugepages(root)
            return [moved, root.lm_head_qweight.data.data_ptr() == ptr, int(root.lm_head_qweight.data[::512].sum())]
        """, tmp_path)
    moved, same, total = r["out"]
    assert same and total == 48 * 4096, r
    assert r["growth"] < 16 << 20, r  # (copied, it grew by 96 MiB)


def test_the_gguf_head_gives_freed_heap_back_before_its_storage(tmp_path) -> None:
    """Freed heap left by the layers stays resident (the engine's malloc settings) and the head's one big storage
    fits none of its holes: packing the head trims first, so RSS never holds both (a 7B GGUF load peaked there)."""
    r = _peak_growth("""
        from gguf import GGMLQuantizationType
        from hearth.platform import keep_freed_memory
        from hearth.weights import gguf, prepare

        MB = 1 << 20
        def setup():
            keep_freed_memory()
            head = gguf.GGUFBlocks(int(GGMLQuantizationType.Q8_0), (16384, 4096),
                                   torch.zeros(16384, 4096 // 32 * 34, dtype=torch.uint8))  # 68 MiB of blocks
            held = [torch.ones(4 * MB, dtype=torch.uint8) for _ in range(64)]
            del held[::2]  # 128 MiB freed in 4 MiB holes, between live chunks
            return head, held

        def step(state):
            head, _ = state
            return prepare.head_weight(head).nbytes()
        """, tmp_path)
    # Without the trim the 128 MiB of holes stay and the head's storage and its steps add on top (> 2x the head).
    assert r["growth"] < r["out"], r


def test_int4_at_load_peak_stays_near_the_weights(tmp_path) -> None:
    """A bf16 folder quantized to int4 at load: the peak grows by the int4 weights and a chunk's transients, not by
    a layer's float32 copy and its quantizer temporaries per layer (nor the heap they leave behind)."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    from tests.tiny_models import tiny_tokenizer

    folder = tmp_path / "ckpt"
    h, inter, layers, vocab = 1024, 4096, 3, 512
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256, bos_token_id=0,
                      eos_token_id=1, tie_word_embeddings=False, torch_dtype="bfloat16",
                      architectures=["LlamaForCausalLM"])
    cfg.save_pretrained(folder)
    tiny_tokenizer(vocab).save_pretrained(folder)
    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": rnd(vocab, h), "lm_head.weight": rnd(vocab, h),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                    p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)}
        tensors |= {p + f"self_attn.{n}_proj.weight": rnd(h, h) for n in "qkvo"}
        tensors |= {p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
                    p + "mlp.down_proj.weight": rnd(h, inter)}
    save_file(tensors, str(folder / "model.safetensors"))
    del tensors
    r = _peak_growth(f"""
        from hearth.config import EngineArgs
        from hearth.loader.model_loader import load_model
        from hearth.platform import keep_freed_memory
        from hearth.weights import prepare

        def setup():
            keep_freed_memory()
            # chunks as small beside these layers as the default is beside a 7B's
            prepare.FLOAT_CHUNK_BYTES = 1 << 20
            from hearth.tokenizer import Tokenizer
            Tokenizer.from_folder({str(folder)!r}, None)  # (its imports: transformers, a big share of a small load)
            from hearth.kernels import quant
            quant.available()  # (the kernel library's own pages)
            return EngineArgs(model={str(folder)!r}, quantization="int4", max_model_len=256)

        def step(args):
            loaded = load_model(args)
            return sum(t.numel() * t.element_size() for t in loaded.model.state_dict().values())
        """, tmp_path)
    # (the state dict counts int4 data, scales and mins, the dense embedding, head and norms)
    weights = r["out"]
    fp32_gate_up = 2 * inter * h * 4
    # (besides: a layer's checkpoint pages until it is packed, the model's own buffers). Before: each layer's fp32
    # copy, the cat of its shards, two quantizer temporaries of it, and the heap they left (about 10x the weights).
    limit = weights + 2 * fp32_gate_up
    assert r["growth"] < limit, {**r, "limit": limit}


@pytest.mark.parametrize("qtype", ["Q6_K", "Q8_0", "Q4_0"])
def test_gguf_head_packed_in_steps_is_exactly_the_whole_heads(monkeypatch, qtype: str) -> None:
    """A GGUF LM head is packed a step of rows at a time (so its file pages go back as it goes): the same tiles,
    panels or rows, scales and mins as in one go, with a last step shorter than the others."""
    import gguf as gguf_py
    import numpy as np

    from hearth.weights.gguf import GGUFBlocks

    q = gguf_py.GGMLQuantizationType[qtype]
    n, k = 200, 512
    rng = np.random.default_rng(0)
    if qtype == "Q6_K":  # (gguf.quants cannot quantize Q6_K: valid random blocks, finite fp16 d)
        raw = rng.integers(0, 256, (n, k // 256, 210), dtype=np.uint8)
        raw[:, :, 208:210] = (rng.standard_normal((n, k // 256, 1)) * 0.01).astype(np.float16).view(np.uint8)
        raw = raw.reshape(n, -1)
    else:
        raw = gguf_py.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), q)
    head = GGUFBlocks(int(q), (n, k), torch.from_numpy(np.ascontiguousarray(raw)))
    whole = prepare.head_weight(head)
    monkeypatch.setattr(prepare, "HEAD_STEP_ROWS", 64)
    stepped = prepare.head_weight(head)
    assert (stepped.bits, stepped.group, stepped.tiled, stepped.panel_rows) == (
        whole.bits, whole.group, whole.tiled, whole.panel_rows)
    for a, b in zip(_fields(stepped), _fields(whole), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


needs_panels = pytest.mark.skipif(not prepare.dispatch.panels_take(8, 32, 256),
                                  reason="the VNNI panels do not run here")


@needs_panels
@pytest.mark.parametrize("scheme, group", [("int8", None), ("int4", 32), ("int4", 128)])
def test_float_shards_stream_into_the_panels_the_rows_path_makes(monkeypatch, scheme: str, group: int | None) -> None:
    """Quantized at load straight into VNNI panels (chunks of whole panels, across shard boundaries, a ragged last
    panel): the same bytes as quantizing the whole layer to rows and re-laying them."""
    from hearth.weights import relayout

    torch.manual_seed(1)
    parts = [torch.randn(100, 256).to(torch.bfloat16), torch.randn(37, 256).to(torch.bfloat16),
             torch.randn(64, 256).to(torch.bfloat16)]
    args = (group,) if group else ()
    want = relayout.to_panels(prepare.pack("float", scheme, torch.cat([p.float() for p in parts]), *args))
    monkeypatch.setattr(prepare, "FLOAT_CHUNK_BYTES", 64 * 256 * 4)  # one panel a chunk
    got = prepare.pack_parts(parts, scheme, 256, group)
    assert got is not None and got.panel_rows == 201 and got.shape == want.shape
    for a, b in zip(_fields(got), _fields(want), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@needs_panels
def test_quantizing_into_panels_holds_no_plain_rows(tmp_path) -> None:
    """A layer quantized at load adds about its panels to the peak, not its plain rows and their concatenated copy
    beside them (the int8-at-load 7B peaked there: ~2x the layer's int8 bytes over its weights)."""
    r = _peak_growth("""
        from hearth.platform import keep_freed_memory
        from hearth.weights import prepare

        def setup():
            keep_freed_memory()
            prepare.FLOAT_CHUNK_BYTES = 4 << 20  # (the quantizer's float temporaries: a few chunks)
            return [torch.ones(8192, 8192, dtype=torch.bfloat16), torch.ones(8192, 8192, dtype=torch.bfloat16)]

        def step(parts):
            qw = prepare.pack_parts(parts, "int8", 8192, None)
            return [qw.panel_rows, qw.data.nbytes]
        """, tmp_path)
    rows, nbytes = r["out"]
    assert rows == 16384 and nbytes == 128 << 20
    # (the rows path: 128 MiB of chunks + 128 MiB concatenated, then the panels)
    assert r["growth"] < nbytes + (96 << 20), r  # (the rows path: 750 MiB here)
