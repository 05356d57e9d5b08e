"""The compiled-grammar cache is bounded by bytes: short regexes that expand to huge lexers ("(x{1000}){999}") are
refused, and many distinct large ones keep the heap under the cache's cap (issue 44, item 1)."""
from __future__ import annotations

import gc

import pytest

from hearth.structured.compiler import MAX_GRAMMAR_BYTES, MiB, GrammarCompiler
from hearth.heap import heap_bytes
from hearth.structured.params import StructuredOutputsParams as S
from hearth.tokenizer import Tokenizer
from tests.tiny_models import tiny_tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_hf(tiny_tokenizer())


def test_a_grammar_over_the_memory_limit_is_refused(tok: Tokenizer) -> None:
    compiler = GrammarCompiler(tok, 520, [1])
    with pytest.raises(ValueError, match=f"more than the limit of {MAX_GRAMMAR_BYTES // MiB} MiB") as e:
        compiler.compile(S(regex="(x{1000}){999}"))
    assert "regex" in str(e.value)
    assert len(compiler) == 0 and compiler.cache_bytes == 0


def test_distinct_large_regexes_keep_the_heap_under_the_cap(tok: Tokenizer) -> None:
    cap = 16 * MiB
    compiler = GrammarCompiler(tok, 520, [1], cache_bytes=cap)
    compiler.compile(S(regex="warm"))  # the vocabulary's trie is built once, outside what is measured
    gc.collect()
    before = heap_bytes()
    for k in range(60, 84):  # each some MiB of lexer: 24 of them are well over the cap
        compiler.compile(S(regex=f"(x{{100}}){{{k}}}"))
        assert compiler.cache_bytes <= cap
    gc.collect()
    grown = heap_bytes() - before
    assert len(compiler) < 24
    assert 0 < compiler.cache_bytes <= cap
    assert grown <= cap + 8 * MiB, f"the heap grew {grown / MiB:.0f} MiB for a {cap / MiB:.0f} MiB cache"
    # what the cache holds is still a working grammar
    m = compiler.compile(S(regex="(x{100}){83}")).new_matcher()
    m.fill_bitmask()
    assert not m.matcher.is_error()
