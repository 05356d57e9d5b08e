"""Token bitmasks: computed for a batch in a background thread while the model runs, applied in the sampler.

The mask for a sequence's next token depends only on the tokens it has already accepted, so it can be computed
during the forward pass that produces the logits it will mask (the engine starts it right after scheduling).
"""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from hearth.structured.compiler import GrammarMatcher

def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, W] int32 (bit j of word i = token 32 i + j allowed) -> [N, vocab_size] bool."""
    # NOTE: numpy's unpackbits does this in one pass, unlike shifting in torch; little-endian words, little bit order.
    raw = bitmask.contiguous().numpy().view(np.uint8)  # [N, 4 W]
    if sys.byteorder != "little":
        raw = bitmask.contiguous().numpy().astype("<i4").view(np.uint8)
    bits = np.unpackbits(raw, axis=1, bitorder="little")[:, :vocab_size]  # [N, V] uint8
    return torch.from_numpy(bits.view(np.bool_))


def apply_grammar_masks(logits: torch.Tensor, matchers: list[GrammarMatcher | None]) -> None:
    """Set disallowed tokens' logits to -inf, in place. logits: [N, V] float CPU; matchers[i] None = a free row.

    NOTE: done in numpy (one thread): torch's small multi-threaded ops cost far more on a busy CPU.
    """
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return
    for i in rows:
        m = matchers[i]
        if m.pending is not None:
            m.wait()
        else:
            m.fill_bitmask()  # nobody prepared it (a direct sampler call): compute it now
    allowed = unpack_bitmask(torch.stack([matchers[i].bitmask for i in rows]), logits.shape[1]).numpy()  # [R, V]
    arr = logits.numpy() if logits.is_contiguous() else logits.contiguous().numpy()
    sub = arr[rows]  # [R, V] (a copy)
    np.putmask(sub, ~allowed, -np.inf)
    # NOTE: another processor (min_tokens banning EOS, a logit bias of -inf) may have removed every token the
    # grammar allows: then pick among the grammar's tokens alone, so the output stays valid.
    dead = np.isneginf(sub).all(axis=1)
    if dead.any():
        sub[dead] = np.where(allowed[dead], 0.0, -np.inf)
    arr[rows] = sub
    if not logits.is_contiguous():
        logits.copy_(torch.from_numpy(arr))


class MaskPrefetcher:
    """One background thread that fills the masks of a step's constrained sequences (llguidance drops the GIL)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, matchers: list[GrammarMatcher]) -> None:
        if not matchers:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="hearth-grammar")
        for m in matchers:
            m.wait()  # NOTE: never two jobs on one matcher (a step that failed may have left one)

        def fill() -> None:
            for m in matchers:
                m.fill_bitmask()

        fut = self._pool.submit(fill)
        for m in matchers:
            m.pending = fut

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
