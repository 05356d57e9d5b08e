"""Prompt lookup (n-gram) proposals: find the latest earlier occurrence of the sequence's last n tokens and
propose the tokens that followed it. No model, a few numpy ops per request."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def ngram_propose(token_ids: list[int] | np.ndarray, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier match of the last n tokens, n from n_max down to
    n_min; [] when nothing matches. The match must end before the last token (the suffix itself never counts)."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    length = tokens.shape[0]
    if k <= 0:
        return []
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        windows = sliding_window_view(tokens[:-1], n)  # [length - n, n]: window i is tokens[i:i+n]
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []
