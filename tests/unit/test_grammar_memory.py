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


def test_the_limits_are_engine_flags(tmp_path) -> None:
    """--max-grammar-mib and --grammar-cache-mib reach the engine's compiler (in every deployment mode the engine
    is built from EngineArgs); a grammar over the lowered limit is refused with it."""
    from hearth import LLM
    from hearth.engine_args import EngineArgs
    from tests.tiny_models import build_checkpoint, tiny_config

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="--max-grammar-mib must be a whole number of MiB >= 1"):
            EngineArgs(model="x", max_grammar_mib=bad)
    llm = LLM(build_checkpoint(str(tmp_path / "tiny"), tiny_config("llama")), max_grammar_mib=2,
              grammar_cache_mib=3, kv_cache_space=0.05, threads=1)
    compiler = llm.engine.structured.compiler
    assert (compiler.max_grammar_bytes, compiler.cache_bytes_limit) == (2 * MiB, 3 * MiB)
    with pytest.raises(ValueError, match="more than the limit of 2 MiB"):
        compiler.compile(S(regex="(x{100}){80}"))
