"""How the quantized kernels round x: the process-wide setting, the per-step prompt rows, the per-model choice.

Three roundings (HEARTH_QUANT_ACT=float|int8|int8x2, or auto):
  "int8x2"  two int8 terms per block of 32: d1 = amax / 127, q1 = round(x / d1), d2 = d1 / 254,
            q2 = round((x - 254 d2 q1) / d2), so x ~ d2 * (254 q1 + q2) within amax / 64516 (quantize_x2 is the
            bit-exact reference). Two integer dot chains on the same unpacked weights, combined exactly in int32.
  "int8"    one int8 term per block of 32 (llama.cpp's Q8 activations; quantize_x is the reference): half the integer
            work, but moves logprobs several times as much as int8x2 and can flip near ties.
  "float"   x stays fp32 and weights are dequantized in registers: the dequantized float model's results up to
            summation order, compute-bound.
auto (the default) is int8x2, except: prompt rows on VNNI panels take one term (prompts are compute-bound, where the
second term costs as much as the first; see prompt_rows), and a model whose quantized weights are mostly 4-bit takes
one term for every row but its LM head's (the weights' own rounding swamps int8's; see set_model_activations).
"""
from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterable, Iterator

import torch

from hearth import envs
from hearth.weights.packed import QWeight

# A forced process-wide rounding ("int8x2", "int8" or "float") and auto flag, for tests and tools; None: what
# HEARTH_QUANT_ACT says (rounding(), auto()).
ACTIVATIONS: str | None = None
AUTO_ACTIVATIONS: bool | None = None


@functools.cache
def _from_env() -> tuple[str, bool]:
    """HEARTH_QUANT_ACT, read at the first quantized call rather than at import; then kept, so every layer of the
    process rounds alike (the load re-lays weights for the rounding it saw)."""
    setting = envs.quant_activations()
    return ("int8x2" if setting == "auto" else setting), setting == "auto"


def rounding() -> str:
    """The process-wide rounding of x for the integer kernels: "int8x2", "int8" or "float"."""
    return ACTIVATIONS if ACTIVATIONS is not None else _from_env()[0]


def auto() -> bool:
    """HEARTH_QUANT_ACT=auto: prompt rows and mostly-4-bit models may take single-term int8 (see the module doc)."""
    return AUTO_ACTIVATIONS if AUTO_ACTIVATIONS is not None else _from_env()[1]


# Set while a step that carries prompt tokens runs (prompt_rows).
_prompt = threading.local()


def of(qw: QWeight) -> str:
    """The rounding qw's kernels take: its own (set per model), else the process-wide rounding()."""
    return qw.activations or rounding()


def in_prompt() -> bool:
    """Whether the running forward pass carries prompt tokens (prompt_rows)."""
    return getattr(_prompt, "on", False)


@contextlib.contextmanager
def prompt_rows(generated: int = 0, total: int | None = None) -> Iterator[None]:
    """Mark a forward pass that carries prompt tokens. Where the fp32-x GEMM runs its rows take it whatever their
    count (dispatch.plan), so a prompt's last token recomputed alone after a prefix-cache hit gets exactly the numbers
    it had inside its full prefill (the GEMM's per-row sums do not depend on the other rows), and a repeated seeded
    request samples the same tokens.

    The step's first `generated` of its `total` rows (None: any count) are generated tokens (decodes, speculative
    verification); with auto() the others, prompt rows, take single-term int8 on int8x2 VNNI panels, and
    each row's rounding depends only on whether it is a prompt token, not on what runs beside it. Linears whose row
    count is not `total` (MoE experts' token subsets) keep int8x2 for every row."""
    prev = getattr(_prompt, "on", False), getattr(_prompt, "generated", 0), getattr(_prompt, "total", None)
    _prompt.on, _prompt.generated, _prompt.total = True, generated, total
    try:
        yield
    finally:
        _prompt.on, _prompt.generated, _prompt.total = prev


def int8_from(m: int, activations: str | None = None) -> int:
    """Rows [0, result) of an m-row panel call in int8x2, the rest in single-term int8 (see prompt_rows); weights
    whose `activations` set_model_activations made "int8x2" (a model too small for one term) keep every row."""
    if activations == "int8x2" or not (auto() and rounding() == "int8x2" and getattr(_prompt, "on", False)):
        return m
    total = _prompt.total
    return min(m, _prompt.generated) if total is None or total == m else m


# One int8 term for a whole model only from this many quantized weights (outside the LM head): see one_term_pays.
ONE_TERM_MIN_WEIGHTS = 200_000_000


def one_term_pays(weights: int) -> bool:
    """Whether a mostly-4-bit model of `weights` quantized weights takes one int8 term for every row (auto).

    Decided by measurement, not by bit width alone: in a model this small a decode step is mostly per-layer overhead
    (attention, norms, the head), so halving the integer dots buys little, while its logits are the least averaged
    and near ties flip: SmolLM2-135M Q4_1 with one term leaves its fp32 reference's greedy answers on many chat
    prompts (tests/e2e/test_default_answers.py), with int8x2 on none. Qwen2.5-0.5B keeps one term, where it is a
    clear gain with many sequences in flight."""
    return weights >= ONE_TERM_MIN_WEIGHTS


def set_model_activations(qweights: Iterable[QWeight], head: QWeight | None = None, ranks: int = 1) -> str | None:
    """HEARTH_QUANT_ACT=auto: a model whose quantized weights are mostly 4-bit (by count) rounds x to single-term int8
    for every row of every quantized linear (each QWeight.activations = "int8") but its LM head `head`; returns
    "int8", or None where rounding() stays (models mostly of 8-bit or 6-bit weights, or another setting). A model
    too small for one term (one_term_pays) takes int8x2 for every row of every linear, prompt rows and head
    included (each QWeight.activations = "int8x2"; returns "int8x2").

    Why: there int8's rounding of x is lost in the 4-bit rounding of the weights (about 1% of its KL), and it halves
    the integer work of decode steps of many rows. Per model, not per step: a sequence's tokens do not depend on
    what runs beside it. The head keeps rounding(): its outputs are the logits themselves, where a near tie decides
    a greedy token. ranks: tensor-parallel ranks, each holding 1/ranks of the weights (the choice is the whole
    model's, as one rank makes it)."""
    unique = [q for q in {id(q): q for q in qweights}.values() if q is not head]
    total = sum(q.shape[0] * q.shape[1] for q in unique)
    four = sum(q.shape[0] * q.shape[1] for q in unique if q.bits == 4)
    if not (auto() and rounding() == "int8x2"):
        return None
    if not one_term_pays(total * ranks):  # two terms for every row, prompt rows and the head's included (see int8_from)
        for q in unique + ([head] if head is not None else []):
            q.activations = "int8x2"
        return "int8x2"
    if 2 * four <= total:
        return None
    for q in unique:
        q.activations = "int8"
    return "int8"


def quantize_x(x: torch.Tensor) -> torch.Tensor:
    """Reference of the "int8" rounding: x [M, K] fp32 -> the dequantized floats dx * qx per block of 32
    (dx = amax / 127, qx = round-half-even(x / dx)), bit-identical to the kernel's qx, dx."""
    m, k = x.shape
    xb = x.float().reshape(m, k // 32, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(xb * inv) * d).reshape(m, k)


def quantize_x2(x: torch.Tensor) -> torch.Tensor:
    """Reference of the "int8x2" rounding: x [M, K] fp32 -> d2 * (254 * q1 + q2) per block of 32, bit-identical to
    the kernel's q1, q2, d2: d1 = amax / 127, q1 = round-half-even(x * fl(1 / d1)), d2 = fl(d1 / 254),
    r = fl(x - d2 * (254 * q1)) (one rounding: the kernel's fma), q2 = clamp(round-half-even(r * fl(1 / d2)), -127,
    127). |x - result| <= d2 / 2 (+ fp32 rounding) = amax / 64516."""
    m, k = x.shape
    xb = x.float().reshape(m, k // 32, 32)
    d1 = xb.abs().amax(-1, keepdim=True) / 127.0
    inv1 = torch.where(d1 > 0, 1.0 / d1, torch.zeros_like(d1))
    q1 = torch.round(xb * inv1)
    d2 = d1 / 254.0
    inv2 = torch.where(d2 > 0, 1.0 / d2, torch.zeros_like(d2))
    hi = q1 * 254.0  # exact integers
    r = (xb.double() - d2.double() * hi.double()).float()  # exact in double, so one rounding like the fma
    q2 = torch.round(r * inv2).clamp_(-127, 127)
    return ((hi + q2) * d2).reshape(m, k)
