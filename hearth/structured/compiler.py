"""Grammar compilation against the model's vocabulary (llguidance), cached by grammar text.

llguidance builds its lexer and token trie lazily, so compiling is cheap for typical schemas; the token-level
work happens per step, when a matcher computes its mask (see bitmask.py). A compiled grammar is kept as a fresh
"template" matcher; each request gets a deep copy of it (microseconds).
"""
from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any

import torch

from hearth.structured.params import StructuredOutputsParams
from hearth.tokenizer import Tokenizer

logger = logging.getLogger("hearth")

_MAX_ERROR_CHARS = 600
# A constraint's source text (schema JSON, regex, grammar, choices) beyond this is refused before compiling:
# compile time and memory grow with it, and no real output format needs more.
MAX_GRAMMAR_CHARS = 100_000


def clean_error(message: str) -> str:
    """llguidance's message without Rust internals (a panic's location and backtrace), cut to a readable size."""
    message = str(message).strip()
    for marker in ("\nstack backtrace", "\nnote: run with", "panicked at"):
        if marker in message:
            message = message.split(marker, 1)[0].strip() or "the grammar could not be compiled"
    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    message = message or "the grammar could not be compiled"
    return message if len(message) <= _MAX_ERROR_CHARS else message[:_MAX_ERROR_CHARS] + " ..."


def source_size(spec: StructuredOutputsParams) -> int:
    kind = spec.kind
    if kind == "json":
        return len(spec.json if isinstance(spec.json, str) else json.dumps(spec.json))
    if kind == "regex":
        return len(spec.regex)
    if kind == "choice":
        return sum(len(c) + 3 for c in spec.choice)
    if kind == "grammar":
        return len(spec.grammar)
    return 0


def grammar_text(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar for a constraint. Raises ValueError for a grammar that cannot be converted."""
    import llguidance as llg

    size = source_size(spec)
    if size > MAX_GRAMMAR_CHARS:
        raise ValueError(f"the {spec.describe()} is {size} characters, more than the limit of {MAX_GRAMMAR_CHARS}")
    kind = spec.kind
    if kind in ("json", "json_object"):
        schema: Any = spec.json if kind == "json" else {"type": "object"}
        options: dict[str, Any] = {"whitespace_flexible": not spec.disable_any_whitespace}
        if spec.disable_any_whitespace:
            options.update(item_separator=", ", key_separator=": ")  # json.dumps' layout: what models write
        try:
            return llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=options)
        except ValueError as e:
            raise ValueError(f"invalid JSON schema: {clean_error(str(e))}") from None
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(spec.regex)
    if kind == "choice":
        return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice))
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(spec.grammar)
    except Exception as e:  # noqa: BLE001 (the converter raises its own error types)
        raise ValueError(f"invalid grammar: {clean_error(str(e))}") from None
    return llg.LLMatcher.grammar_from_lark(lark)


class GrammarMatcher:
    """One sequence's position in its grammar, plus its next-token bitmask (one bit per vocabulary entry)."""

    def __init__(self, matcher: Any, mask_words: int) -> None:
        self.matcher = matcher
        self.bitmask = torch.full((mask_words,), -1, dtype=torch.int32)  # [W]
        self.pending: Any = None  # a concurrent.futures.Future filling bitmask, set by StructuredOutputManager

    def fill_bitmask(self) -> None:
        """Compute the mask of tokens allowed next (drops the GIL while it works)."""
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.data_ptr(), self.bitmask.numel() * 4)

    def wait(self) -> None:
        """Wait for a mask being computed in the background (re-raises its error)."""
        fut, self.pending = self.pending, None
        if fut is not None:
            fut.result()

    def accept(self, token_id: int) -> bool:
        """Advance past a sampled token. False if the grammar does not allow it (the matcher is then in error)."""
        self.wait()
        return self.matcher.consume_token(token_id)

    @property
    def is_terminated(self) -> bool:
        """No token but EOS can follow: the output is complete."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        return self.matcher.get_error()


class CompiledGrammar:
    def __init__(self, template: Any, mask_words: int) -> None:
        self._template = template
        self.mask_words = mask_words

    def new_matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._template.deep_copy(), self.mask_words)


class GrammarCompiler:
    """Thread-safe: the server compiles (to reject bad schemas early) while the engine thread runs."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int], cache_size: int = 512) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = max(vocab_size, len(tokenizer))  # NOTE: the model's logits may be wider (padded)
        self.eos_token_ids = list(eos_token_ids) or [tokenizer.eos_token_id]
        self.cache_size = cache_size
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self._lltok: Any = None
        self.hits = self.misses = 0

    @property
    def ll_tokenizer(self) -> Any:
        """The vocabulary as llguidance sees it. Built once (about a second for a 50k vocabulary)."""
        if self._lltok is None:
            with self._lock:
                if self._lltok is None:
                    self._lltok = _ll_tokenizer(self.tokenizer.backend, self.vocab_size, self.eos_token_ids)
        return self._lltok

    @property
    def mask_words(self) -> int:
        return (self.ll_tokenizer.vocab_size + 31) // 32

    def compile(self, spec: StructuredOutputsParams) -> CompiledGrammar:
        """Raises ValueError with a user-facing message for an invalid or unsupported constraint."""
        import llguidance as llg

        text = grammar_text(spec)
        lltok = self.ll_tokenizer
        with self._lock:
            hit = self._cache.get(text)
            if hit is not None:
                self._cache.move_to_end(text)
                self.hits += 1
                return hit
        template = llg.LLMatcher(lltok, text, log_level=0)
        if template.is_error():
            message = clean_error(template.get_error())
            raise ValueError(f"invalid {spec.describe()}: {message}")
        compiled = CompiledGrammar(template, self.mask_words)
        with self._lock:
            self.misses += 1
            self._cache[text] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled


def _ll_tokenizer(backend: Any, n_vocab: int, eos_token_ids: list[int]) -> Any:
    """backend: a tokenizers.Tokenizer."""
    import llguidance as llg
    from copy import copy

    backend = copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return llg.LLTokenizer(backend.to_str(), n_vocab=n_vocab, eos_token=eos_token_ids)
