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

from hearth.heap import give_back, heap_bytes
from hearth.structured.params import StructuredOutputsParams
from hearth.tokenizer import Tokenizer

logger = logging.getLogger("hearth")

_MAX_ERROR_CHARS = 600
# A constraint's source text (schema JSON, regex, grammar, choices) beyond this is refused before compiling:
# compile time and memory grow with it, and no real output format needs more.
MAX_GRAMMAR_CHARS = 100_000
MiB = 1024 * 1024
# A short text can still expand to a huge lexer ("(x{1000}){999}": about 170 MiB); a grammar whose compile (and
# first mask) takes more heap than this is refused, and the cache keeps at most GRAMMAR_CACHE_BYTES of them.
MAX_GRAMMAR_BYTES = 64 * MiB
GRAMMAR_CACHE_BYTES = 512 * MiB
_GIVE_BACK_BYTES = 16 * MiB  # evictions freeing this much trim the heap (a trim walks every arena)


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
    def __init__(self, template: Any, mask_words: int, nbytes: int = 0) -> None:
        self._template = template
        self.mask_words = mask_words
        self.nbytes = nbytes  # heap the compile took: what the cache charges for keeping it

    def new_matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._template.deep_copy(), self.mask_words)


class GrammarCompiler:
    """Thread-safe: the server compiles (to reject bad schemas early) while the engine thread runs. The cache is
    bounded by entries and by bytes (each grammar charged the heap its compile took)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int], cache_size: int = 512,
                 cache_bytes: int = GRAMMAR_CACHE_BYTES, max_grammar_bytes: int = MAX_GRAMMAR_BYTES) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = max(vocab_size, len(tokenizer))  # NOTE: the model's logits may be wider (padded)
        self.eos_token_ids = list(eos_token_ids) or [tokenizer.eos_token_id]
        self.cache_size = cache_size
        self.cache_bytes_limit = cache_bytes
        self.max_grammar_bytes = max_grammar_bytes
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self.cache_bytes = 0  # the sum of the cached grammars' nbytes
        self._lock = threading.Lock()
        # NOTE: one build at a time, so the heap growth measured around a build is that grammar's own
        self._build_lock = threading.Lock()
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
        """Raises ValueError with a user-facing message for an invalid or unsupported constraint, or one that needs
        more than max_grammar_bytes of memory."""
        text = grammar_text(spec)
        lltok = self.ll_tokenizer
        mask_words = self.mask_words
        hit = self._lookup(text)
        if hit is not None:
            return hit
        with self._build_lock:
            hit = self._lookup(text)  # built by another request while this one waited
            if hit is not None:
                return hit
            compiled = self._build(spec, text, lltok, mask_words)
        dropped = 0
        with self._lock:
            self.misses += 1
            self._cache[text] = compiled
            self.cache_bytes += compiled.nbytes
            while len(self._cache) > self.cache_size or (self.cache_bytes > self.cache_bytes_limit
                                                         and len(self._cache) > 1):
                _, old = self._cache.popitem(last=False)
                self.cache_bytes -= old.nbytes
                dropped += old.nbytes
        if dropped >= _GIVE_BACK_BYTES:
            give_back()
        return compiled

    def __len__(self) -> int:
        return len(self._cache)

    def _lookup(self, text: str) -> CompiledGrammar | None:
        with self._lock:
            hit = self._cache.get(text)
            if hit is not None:
                self._cache.move_to_end(text)
                self.hits += 1
            return hit

    def _build(self, spec: StructuredOutputsParams, text: str, lltok: Any, mask_words: int) -> CompiledGrammar:
        import llguidance as llg

        before = heap_bytes()
        template = llg.LLMatcher(lltok, text, log_level=0)
        if template.is_error():
            message = clean_error(template.get_error())
            raise ValueError(f"invalid {spec.describe()}: {message}")
        # llguidance builds the lexer lazily, at the first mask, into state every copy of the template shares:
        # computing one here charges that memory to this grammar (and refuses it) before any request runs it.
        warm = GrammarMatcher(template.deep_copy(), mask_words)
        warm.fill_bitmask()
        error = warm.error if warm.matcher.is_error() else None
        del warm
        nbytes = max(heap_bytes() - before, len(text))
        if error:
            raise ValueError(f"invalid {spec.describe()}: {clean_error(error)}")
        if nbytes > self.max_grammar_bytes:
            del template
            give_back()
            raise ValueError(f"the {spec.describe()} needs {nbytes / MiB:.0f} MiB of memory to compile, more than "
                             f"the limit of {self.max_grammar_bytes / MiB:.0f} MiB: simplify it (nested repeat "
                             "counts multiply)")
        return CompiledGrammar(template, mask_words, nbytes)


def _ll_tokenizer(backend: Any, n_vocab: int, eos_token_ids: list[int]) -> Any:
    """backend: a tokenizers.Tokenizer."""
    import llguidance as llg
    from copy import copy

    backend = copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return llg.LLTokenizer(backend.to_str(), n_vocab=n_vocab, eos_token=eos_token_ids)
