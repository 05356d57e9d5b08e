"""Fill-in-the-middle (`suffix` on /v1/completions, Ollama's /api/generate): the prefix-suffix-middle prompt the
model was trained on, from its FIM tokens.

The tokens come from GGUF metadata (tokenizer.ggml.fim_pre/suf/mid_token_id) or, as llama.cpp finds them, by
their text in the vocabulary: Qwen2.5-Coder <|fim_prefix|>, StarCoder <fim_prefix>, CodeLlama <PRE>,
DeepSeek-Coder <｜fim▁begin｜>. The layout is llama.cpp's: [BOS] PRE prefix SUF suffix MID; the model writes the
middle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hearth.entrypoints.openai.errors import APIError
from hearth.tokenizer import Tokenizer

# (prefix, suffix, middle) token texts, by family
FIM_TOKEN_NAMES = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),  # Refact
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),  # CodeLlama (the SentencePiece pieces)
    ("<PRE>", "<SUF>", "<MID>"),  # CodeLlama (tokenizer.json added tokens)
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
)


@dataclass(frozen=True)
class FIMTokens:
    prefix: int
    suffix: int
    middle: int
    bos: int | None = None  # put first when the tokenizer adds BOS to prompts (CodeLlama)


def find_fim_tokens(tokenizer: Tokenizer, hf_config: Any = None) -> FIMTokens | None:
    """The model's FIM tokens, or None when it has none."""
    bos = _bos(tokenizer)
    if hf_config is not None:
        ids = [hf_config.get(k) for k in ("fim_pre_token_id", "fim_suf_token_id", "fim_mid_token_id")]
        if all(isinstance(i, int) and i >= 0 for i in ids):
            return FIMTokens(*ids, bos=bos)
    for names in FIM_TOKEN_NAMES:
        ids = [tokenizer.backend.token_to_id(n) for n in names]
        if all(i is not None for i in ids):
            return FIMTokens(*ids, bos=bos)
    return None


def _bos(tokenizer: Tokenizer) -> int | None:
    """The BOS id when encoding adds one (SentencePiece Llamas do; byte-level BPE models mostly do not)."""
    with_special = tokenizer.encode("a", add_special_tokens=True)
    without = tokenizer.encode("a", add_special_tokens=False)
    if len(with_special) > len(without) and with_special[1:] == without:
        return with_special[0]
    return None


def fim_ids(fim: FIMTokens, tokenizer: Tokenizer, prefix: str, suffix: str) -> list[int]:
    ids = [fim.bos] if fim.bos is not None else []
    ids += [fim.prefix, *tokenizer.encode(prefix, add_special_tokens=False)]
    ids += [fim.suffix, *tokenizer.encode(suffix, add_special_tokens=False), fim.middle]
    return ids


def fim_prompt_ids(fim: FIMTokens | None, tokenizer: Tokenizer, prefix: str, suffix: str,
                   param: str = "suffix") -> list[int]:
    """The FIM prompt; a 400 naming the field for a model without FIM tokens."""
    if fim is None:
        raise APIError(400, f"{param}: this model has no fill-in-the-middle tokens (none of "
                            f"{', '.join(n[0] for n in FIM_TOKEN_NAMES)} in its vocabulary, and no "
                            "tokenizer.ggml.fim_* metadata); use a code model trained for it (e.g. Qwen2.5-Coder, "
                            "StarCoder, CodeLlama) or send the prompt without a suffix", param=param)
    return fim_ids(fim, tokenizer, prefix, suffix)
