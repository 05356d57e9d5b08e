"""Tokenizing pooling inputs (texts, token ids, text pairs), with vLLM's truncate_prompt_tokens.

truncate_prompt_tokens: None keeps the input whole (too long is a user error); -1 means the model's maximum;
k > 0 keeps k tokens. Text keeps its head and its special tokens ([CLS] ... [SEP], as transformers' truncation
and sentence-transformers do); token ids keep their last k (vLLM's rule for token inputs).
"""
from __future__ import annotations

from hearth.tokenizer import Tokenizer


def truncation_limit(truncate_prompt_tokens: int | None, max_model_len: int) -> int | None:
    if truncate_prompt_tokens is None:
        return None
    if truncate_prompt_tokens == -1:
        return max_model_len
    if truncate_prompt_tokens < 1:
        raise ValueError(f"truncate_prompt_tokens must be -1 or >= 1, got {truncate_prompt_tokens}")
    if truncate_prompt_tokens > max_model_len:
        raise ValueError(f"truncate_prompt_tokens {truncate_prompt_tokens} is more than this model's maximum "
                         f"input length ({max_model_len})")
    return truncate_prompt_tokens


def encode_text(tok: Tokenizer, text: str, limit: int | None, add_special_tokens: bool = True) -> list[int]:
    if limit is None:
        return tok.encode(text, add_special_tokens=add_special_tokens)
    backend = tok.backend
    enc = backend.encode(text, add_special_tokens=False)
    special = backend.num_special_tokens_to_add(False) if add_special_tokens else 0
    if len(enc.ids) + special > limit:
        enc.truncate(max(limit - special, 0))
    return backend.post_process(enc, None, add_special_tokens).ids


def encode_ids(ids: list[int], limit: int | None) -> list[int]:
    return list(ids[-limit:]) if limit is not None and len(ids) > limit else list(ids)


def encode_pair(tok: Tokenizer, first: str, second: str, limit: int | None) -> tuple[list[int], list[int]]:
    """A cross-encoder's input: ([CLS] first [SEP] second [SEP] ids, segment ids). Too long with a limit: the
    longer side loses tokens first (transformers' longest_first)."""
    backend = tok.backend
    a = backend.encode(first, add_special_tokens=False)
    b = backend.encode(second, add_special_tokens=False)
    if limit is not None:
        room = max(limit - backend.num_special_tokens_to_add(True), 0)
        na, nb = len(a.ids), len(b.ids)
        while na + nb > room:
            if na >= nb:  # (a tie costs the first text: the second keeps the odd token, as tokenizers does)
                na -= 1
            else:
                nb -= 1
        a.truncate(na)
        b.truncate(nb)
    enc = backend.post_process(a, b, True)
    return enc.ids, enc.type_ids
