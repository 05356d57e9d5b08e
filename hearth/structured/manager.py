"""The engine's side of structured output: compile at add_request, prefetch masks per step, advance on tokens."""
from __future__ import annotations

import logging
from typing import Any

from hearth.structured.bitmask import MaskPrefetcher
from hearth.structured.compiler import (
    GRAMMAR_CACHE_BYTES,
    MAX_GRAMMAR_BYTES,
    CompiledGrammar,
    GrammarCompiler,
    GrammarMatcher,
)
from hearth.structured.params import StructuredOutputsParams
from hearth.tokenizer import Tokenizer

logger = logging.getLogger("hearth")


class StructuredOutputManager:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int],
                 max_grammar_bytes: int = MAX_GRAMMAR_BYTES, cache_bytes: int = GRAMMAR_CACHE_BYTES) -> None:
        self.compiler = GrammarCompiler(tokenizer, vocab_size, eos_token_ids, cache_bytes=cache_bytes,
                                        max_grammar_bytes=max_grammar_bytes)
        self.prefetcher = MaskPrefetcher()

    def compile(self, spec: StructuredOutputsParams) -> CompiledGrammar:
        """Raises ValueError (a 400) for an invalid or unsupported constraint. Thread-safe, cached."""
        return self.compiler.compile(spec)

    def prefetch(self, requests: list[Any]) -> None:
        """Start computing the next-token masks of these requests (those that will sample this step)."""
        self.prefetcher.submit([r.grammar for r in requests if getattr(r, "grammar", None) is not None])

    @staticmethod
    def accept(matcher: GrammarMatcher, token_id: int, request_id: str) -> bool:
        """Advance past a sampled token; True when the grammar is complete (the sequence should finish)."""
        if not matcher.accept(token_id):
            # NOTE: cannot happen for a masked sample; finishing beats generating unconstrained text.
            logger.warning("request %s: token %d rejected by its grammar (%s); finishing it", request_id,
                           token_id, matcher.error)
            return True
        return matcher.is_terminated

    def shutdown(self) -> None:
        self.prefetcher.shutdown()
