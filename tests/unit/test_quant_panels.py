"""Quantized weights in VNNI panels (csrc/quant_panel.cpp, relayout.to_panels): an exact re-lay, and a GEMM that gives
the dequantized weights times the int8 / int8x2-rounded activations for every row count."""
import pytest
import torch

from hearth.kernels import quant as qkernels
from hearth.layers.quant_linear import QuantLinear
from hearth.weights import activations
from hearth.weights import apply
from hearth.weights import dispatch
from hearth.weights import gguf as gguf_w
from hearth.weights import layouts
from hearth.weights import packed
from hearth.weights import prepare
from hearth.weights import quantize
from hearth.weights import reference
from hearth.weights import relayout

def panels_run(bits: int) -> bool:
    """The panel GEMM runs here for weights of `bits` (int4: AVX2 or AVX512-VNNI; int8: AVX512-VNNI)."""
    return qkernels.available() and dispatch.panels_take(bits, 32, 256)


needs_kernels = pytest.mark.skipif(not qkernels.available(), reason="hearth's kernels do not run here")
needs_panels = pytest.mark.skipif(not panels_run(4), reason="the panel GEMM does not run here")
needs_int8_panels = pytest.mark.skipif(not panels_run(8), reason="int8 panels need AVX512-VNNI (AVX2: int4 only)")


def _formats(n: int, k: int) -> dict[str, packed.QWeight]:
    g = torch.Generator().manual_seed(n * 7 + k)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0, :32] *= 40  # one loud block: its scale must stay its own
    i8, i4 = quantize.quantize_int8(w), quantize.quantize_int4(w, 32)
    q8 = quantize.quantize_int8(w, 32)
    fmts = {
        "int8-per-channel": i8,
        "q8_0 (fp16 scales, group 32)": packed.QWeight(8, 32, q8.data, q8.scales.half(), None),
        "int4-g32 (mins)": i4,
        "q4_0 (symmetric, fp16)": packed.QWeight(4, 32, i4.data, i4.scales.half(), None),
        "q4_1 (fp16 mins)": packed.QWeight(4, 32, i4.data, i4.scales.half(), i4.mins.half()),
    }
    if k % 128 == 0:
        fmts["int4-g128"] = quantize.quantize_int4(w, 128)
    if n % 4 == 0 and k % 64 == 0:
        fmts["q4_0 in 4-row tiles"] = relayout.tile_rows4(fmts["q4_0 (symmetric, fp16)"])
    return fmts


def _here(fmts: dict[str, packed.QWeight]) -> dict[str, packed.QWeight]:
    """The formats whose panels the GEMM runs on this CPU (every one with AVX512-VNNI; int4 on AVX2)."""
    return {name: qw for name, qw in fmts.items() if panels_run(qw.bits)}


@pytest.mark.parametrize("n,k", [(64, 256), (200, 96), (130, 4352)])
def test_panels_round_trip_exactly(n: int, k: int) -> None:
    for name, qw in _formats(n, k).items():
        p = relayout.to_panels(qw)
        assert p.shape == (n, k) and layouts.of(p).code in (layouts.PANELS_INT8.code, layouts.PANELS_INT4.code), name
        assert torch.equal(reference.dequantize(p), reference.dequantize(qw)), name
        # the torch form, a panel at a time: the same bytes as the kernel library's packer (where it runs)
        assert torch.equal(relayout.to_panels(qw, chunk=1, kernel=False).data, p.data), name
        assert p.nbytes() <= relayout.untile_rows4(qw).nbytes() * (-(-n // 64) * 64) / n + 1, name


@needs_panels
@pytest.mark.parametrize("n,k", [(200, 256), (130, 4352)])  # (4352 = 68 blocks: two K blocks of the kernel)
@pytest.mark.parametrize("act", ["panels", "panels2"])
def test_panel_gemm_equals_dequantized_reference(n: int, k: int, act: str) -> None:
    """Every row count (tile tails 1-5, two row tiles, a prompt-sized M), bias, padded last panel; rows of a big call
    bit-identical to the same rows alone (a prompt's last token recomputed alone gets the same numbers)."""
    rounding = activations.quantize_x if act == "panels" else activations.quantize_x2
    g = torch.Generator().manual_seed(1)
    bias = torch.randn(n, generator=g)
    for name, qw in _here(_formats(n, k)).items():
        p = relayout.to_panels(qw)
        w = reference.dequantize(qw).double()
        for m in (1, 5, 8, 13, 70):
            x = (torch.randn(m, k, generator=g) * 2).to(torch.bfloat16)
            got = apply.run_panels(x, p, bias, 0 if act == "panels" else x.shape[0], bf16=False)
            want = rounding(x.float()).double() @ w.t() + bias.double()
            err = ((got.double() - want).abs().max() / want.abs().max()).item()
            assert err < 2e-6, f"{name} M={m}: relative error {err:.2e}"
            if m == 13:
                alone = apply.run_panels(x[7:8].contiguous(), p, bias, 0 if act == "panels" else 1, bf16=False)
                assert torch.equal(alone, got[7:8]), name


@needs_panels
@pytest.mark.parametrize("split", [0, 3, 5])
def test_bf16_output_equals_rounded_fp32(split: int, monkeypatch) -> None:
    """bf16 x on panels gets its result rounded to bf16 in the kernel (the last K block; earlier ones' partial sums
    in fp32 scratch): bit-identical to the fp32 result's .to(bfloat16), int8x2 rows before `split`, int8 after."""
    monkeypatch.setattr(activations, "int8_from", lambda m, activations=None: split)
    monkeypatch.setattr(activations, "ACTIVATIONS", "int8x2")
    g = torch.Generator().manual_seed(5)
    bias = torch.randn(130, generator=g)
    for k in (96, 4352):  # one K block; several (int4: 3 of <= 32 blocks of 32, int8: 5 of <= 16)
        for name, qw in _here(_formats(130, k)).items():
            p = relayout.to_panels(qw)
            x = (torch.randn(5, k, generator=g) * 2).to(torch.bfloat16)
            want = torch.cat([apply.run_panels(x[:split], p, bias, x[:split].shape[0], bf16=False),
                              apply.run_panels(x[split:], p, bias, 0, bf16=False)]).to(torch.bfloat16)
            got = apply.linear(x, p, bias)
            assert got.dtype == torch.bfloat16 and torch.equal(got, want), (name, k)


@needs_panels
def test_int8x2_is_closer_than_int8() -> None:
    """The two-term activations give a result within ~amax / 64516 of fp32 x; one term within ~amax / 254."""
    w = torch.randn(128, 512) * 0.05
    qw = relayout.to_panels(quantize.quantize_int8(w) if panels_run(8) else quantize.quantize_int4(w, 32))
    x = torch.randn(4, 512)
    exact = x.double() @ reference.dequantize(qw).double().t()
    e1 = (apply.run_panels(x, qw, None, 0, bf16=False).double() - exact).abs().max().item()
    e2 = (apply.run_panels(x, qw, None, x.shape[0], bf16=False).double() - exact).abs().max().item()
    assert e2 < e1 / 50


@needs_panels
@pytest.mark.parametrize("act_name", ["int8x2", "int8"])
@pytest.mark.parametrize("scheme", ["int8", "int4-g32", "int4"])
def test_quant_linear_uses_panels(scheme: str, act_name: str, monkeypatch) -> None:
    """QuantLinear re-lays its weight at load where the panel GEMM runs for its bits; the layer's output equals the plain rows' kernels within
    fp32 summation order, with the activation rounding activations.ACTIVATIONS names at the call (as the rows read it)."""
    monkeypatch.setattr(activations, "ACTIVATIONS", act_name)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(192, 512, generator=g) * 0.05
    lin = QuantLinear(512, 192, scheme=scheme)
    lin.load_shard("weight", None, w)
    if not panels_run(lin.qweight.bits):  # (int8 on AVX2: rows or tiles, the dot kernels)
        assert not lin.qweight.panel_rows
        return
    assert lin.qweight.panel_rows == 192 and lin.weight.data_ptr() == lin.qweight.data.data_ptr()
    plain = relayout.from_panels(lin.qweight)
    for m in (1, 3):
        x = torch.randn(m, 512, generator=g)
        want = apply.run(x, plain, None)  # the row kernels with the same activations
        torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,k", [(200, 256), (130, 96)])
def test_lookup_from_panels_equals_rows(n: int, k: int) -> None:
    """A tied head's table in panels: embedding lookups gather the same floats as the plain rows give, in order,
    repeated ids included; an id past the table is an IndexError like F.embedding's."""
    ids = torch.tensor([0, n - 1, 63, 64, 5, 5, 130 % n, 31, 32, 47, 48])
    for name, qw in _formats(n, k).items():
        want = reference.dequantize(qw)[ids]
        assert torch.equal(apply.dequantize_gather(relayout.to_panels(qw), ids), want), name
    with pytest.raises(IndexError):
        apply.dequantize_gather(relayout.to_panels(qw), torch.tensor([n]))


@needs_panels
def test_float_activations_after_load_name_the_fix(monkeypatch) -> None:
    """Panels take int8 / int8x2 activations only: switching activations.ACTIVATIONS to float after the load is an error
    that names the setting to use before loading, not a silent other rounding."""
    lin = QuantLinear(256, 64, scheme="int8" if panels_run(8) else "int4-g32")
    lin.load_shard("weight", None, torch.randn(64, 256))
    assert lin.qweight.panel_rows
    monkeypatch.setattr(activations, "ACTIVATIONS", "float")
    with pytest.raises(RuntimeError, match="HEARTH_QUANT_ACT=float"):
        lin(torch.randn(2, 256))


def _run_staggered(llm, a: list[int], b: list[int] | None, steps: int) -> list:
    """A alone for two steps, then (if b) B's prompt joins while A decodes; A's tokens and top logprobs."""
    from hearth import SamplingParams

    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, logprobs=3)
    eng.add_request("a", a, params)
    got: list = []
    for i in range(200):  # (bounded)
        if i == 2 and b is not None:
            eng.add_request("b", b, params)
        for out in eng.step():
            if out.request_id == "a":
                got += [(t, lp.top) for t, lp in zip(out.new_token_ids, out.new_logprobs)]
        if not eng.has_unfinished_requests():
            break
    return got


@needs_int8_panels
@pytest.mark.parametrize("layer_path", [False, True])
def test_prompt_rows_take_int8_and_generated_rows_do_not_notice(tmp_path, monkeypatch, layer_path: bool) -> None:
    """HEARTH_QUANT_ACT=auto on an 8-bit model: a step's prompt rows take single-term int8 on int8x2 panels, its
    generated rows int8x2, so a sequence's decode gives the same tokens and logprobs whether or not a prompt shares its
    steps (both in the C decode program and the layer path)."""
    from hearth import LLM
    from hearth.models.blocks import DecoderModel
    from tests.tiny_models import build_checkpoint, tiny_config

    monkeypatch.setattr(activations, "ACTIVATIONS", "int8x2")
    monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", True)
    monkeypatch.setattr(activations, "ONE_TERM_MIN_WEIGHTS", 0)  # (a tiny model: one term only from this size)
    if layer_path:
        monkeypatch.setattr(DecoderModel, "_decode_program", lambda self: None)
    folder = build_checkpoint(str(tmp_path / "q"), tiny_config("llama", num_hidden_layers=2))
    llm = LLM(folder, kv_cache_space=0.05, enable_prefix_caching=False, dtype="float32", quantization="int8")
    assert all(q.activations is None for q in _qweights(llm))  # (8-bit: not the 4-bit models' int8 everywhere)
    a, b = [5, 17, 42, 99, 7, 3], list(range(30, 70))
    alone = _run_staggered(llm, a, None, 8)
    calls: list[tuple[int, int]] = []  # (rows, of which int8x2) per panel call
    real = apply.run_panels
    monkeypatch.setattr(apply, "run_panels", lambda x, qw, bias, split, *a: calls.append((x.shape[0], split))
                        or real(x, qw, bias, split, *a))
    mixed = _run_staggered(llm, a, b, 8)
    assert mixed == alone
    if layer_path:  # the step where B's 40 prompt rows ran beside A's decode row: split 1 + 40
        assert (41, 1) in calls
    # prompt rows are rounded differently: B's logprobs alone differ from an all-int8x2 run of the same engine
    monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", False)
    all_x2 = _run_staggered(llm, b, None, 4)
    monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", True)
    assert _run_staggered(llm, b, None, 4) != all_x2


def _qweights(llm) -> list[packed.QWeight]:
    from hearth.weights import hugepages

    return [q for q in hugepages.held(llm.engine.model) if isinstance(q, packed.QWeight)]


def _q(bits: int, n: int, k: int) -> packed.QWeight:
    w = torch.randn(n, k) * 0.05
    return quantize.quantize_int8(w, 32) if bits == 8 else quantize.quantize_int4(w, 32)


def test_auto_rounds_mostly_4bit_models_to_int8(monkeypatch) -> None:
    """HEARTH_QUANT_ACT=auto: a model whose quantized weights are mostly 4-bit (by count) takes single-term int8 in
    every quantized linear but its LM head (the logits); a mostly 8-bit one, or another setting, keeps ACTIVATIONS."""
    monkeypatch.setattr(activations, "ACTIVATIONS", "int8x2")
    monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", True)
    body, other, head = [_q(4, 256, 512) for _ in range(2)], _q(8, 512, 256), _q(8, 1024, 256)
    small = 2 * 256 * 512 + 512 * 256  # the body's weights, each counted once
    # A model too small for one term takes int8x2 for every row of every linear, its head's included.
    monkeypatch.setattr(activations, "ONE_TERM_MIN_WEIGHTS", small + 1)
    tiny = [_q(4, 256, 512), _q(4, 256, 512), _q(8, 512, 256), _q(8, 1024, 256)]
    assert activations.set_model_activations(tiny, tiny[-1]) == "int8x2"
    assert all(q.activations == "int8x2" for q in tiny)
    monkeypatch.setattr(activations, "ONE_TERM_MIN_WEIGHTS", small)
    assert activations.set_model_activations(body + [other, other, head], head) == "int8"  # (each counts once)
    assert all(q.activations == "int8" for q in body + [other]) and head.activations is None
    mostly_8 = [_q(4, 256, 512), _q(8, 512, 256), _q(8, 256, 256)]
    monkeypatch.setattr(activations, "ONE_TERM_MIN_WEIGHTS", 0)
    assert activations.set_model_activations(mostly_8) is None and all(q.activations is None for q in mostly_8)
    monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", False)  # HEARTH_QUANT_ACT=int8x2
    fresh = [_q(4, 256, 512)]
    assert activations.set_model_activations(fresh) is None and fresh[0].activations is None


@pytest.mark.parametrize("layer_path", [False, True])
def test_auto_4bit_model_runs_int8_everywhere(tmp_path, monkeypatch, layer_path: bool) -> None:
    """A 4-bit model loaded under auto gives exactly what HEARTH_QUANT_ACT=int8 gives (tokens and logprobs, prompt
    and decode rows, C decode program and layer path alike), and not what int8x2 gives. (Its head is dense here.)"""
    from hearth import LLM, SamplingParams
    from hearth.models.blocks import DecoderModel
    from tests.tiny_models import build_checkpoint, tiny_config

    if layer_path:
        monkeypatch.setattr(DecoderModel, "_decode_program", lambda self: None)
    folder = build_checkpoint(str(tmp_path / "q"), tiny_config("llama", num_hidden_layers=2))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=3)

    monkeypatch.setattr(activations, "ONE_TERM_MIN_WEIGHTS", 0)  # (a tiny model: one term only from this size)

    def run(act_name: str, auto: bool) -> tuple[list, list]:
        monkeypatch.setattr(activations, "ACTIVATIONS", act_name)
        monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", auto)
        llm = LLM(folder, kv_cache_space=0.05, dtype="float32", quantization="int4-g32")
        assert all(q.activations == ("int8" if auto else None) for q in _qweights(llm))
        out = llm.generate([{"prompt_token_ids": [5, 17, 42, 99, 7, 3] * 3}], params)[0]
        return ([(lp.token_id, lp.top) for lp in out.prompt_logprobs[1:]],
                [(t, lp.top) for t, lp in zip(out.outputs[0].token_ids, out.outputs[0].logprobs)])

    auto = run("int8x2", True)
    assert auto == run("int8", False)
    assert auto != run("int8x2", False)


def _gguf_blocks(ggml_type: int, n: int, k: int, rng):
    nbytes = gguf_w.KEPT_TYPES[ggml_type][2]
    raw = rng.integers(0, 256, size=(n, k // 32, nbytes), dtype="uint8")
    raw[:, :, 0:2] = rng.uniform(0.001, 0.1, size=(n, k // 32, 1)).astype("float16").view("uint8")
    if ggml_type == 3:  # Q4_1's min
        raw[:, :, 2:4] = rng.uniform(-0.1, 0.0, size=(n, k // 32, 1)).astype("float16").view("uint8")
    return gguf_w.GGUFBlocks(ggml_type, (n, k), torch.from_numpy(raw.reshape(n, -1)))


@needs_kernels
@pytest.mark.parametrize("ggml_type", [8, 2, 3])  # Q8_0, Q4_0, Q4_1
def test_panels_straight_from_gguf_blocks_equal_the_repacked_path(ggml_type: int) -> None:
    """A layer's GGUF shards packed straight from the file's blocks: byte for byte what repacking each shard to plain
    rows, concatenating and re-laying gives; a shard before the last that leaves a panel part-filled takes that path."""
    import numpy as np

    rng = np.random.default_rng(ggml_type)
    for rows in ([128, 64, 70], [200], [64, 64]):
        parts = [_gguf_blocks(ggml_type, n, 256, rng) for n in rows]
        got = gguf_w.panels_from_blocks(parts)
        want = relayout.to_panels(prepare.cat([p.repack() for p in parts]))
        assert got is not None and got.panel_rows == want.panel_rows == sum(rows)
        assert torch.equal(got.data, want.data) and torch.equal(got.scales, want.scales)
        assert (got.mins is None and want.mins is None) or torch.equal(got.mins, want.mins)
    assert gguf_w.panels_from_blocks([_gguf_blocks(ggml_type, n, 256, rng) for n in (70, 64)]) is None
