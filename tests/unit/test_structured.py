"""Structured output pieces on the tiny tokenizer: params, compile cache and errors, bitmasks, the sampler hook,
tool-call parsing (whole and streamed)."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from hearth.engine.request import Request
from hearth.layers.sampler import Sampler
from hearth.sampling_params import SamplingParams
from hearth.structured.bitmask import MaskPrefetcher, apply_grammar_masks, unpack_bitmask
from hearth.structured.compiler import GrammarCompiler
from hearth.structured.params import StructuredOutputsParams as S
from hearth.structured.tool_calls import StreamingToolParser, parse_tool_calls, tool_choice_constraint
from hearth.tokenizer import Tokenizer
from tests.tiny_models import tiny_tokenizer

EOS = 1
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["n", "ok"],
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}}}


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def compiler(tok):
    # NOTE: wider than the tokenizer, like padded model vocabularies
    return GrammarCompiler(Tokenizer.from_hf(tok), 520, [EOS])


def test_params_shape_checks():
    with pytest.raises(ValueError, match="exactly one"):
        S()
    with pytest.raises(ValueError, match="exactly one"):
        S(json={}, regex="a")
    with pytest.raises(ValueError, match="not valid JSON"):
        S(json="{x")
    with pytest.raises(ValueError, match="choice"):
        S(choice=["a", ""])
    assert S(json='{"type": "object"}').json == {"type": "object"}
    assert S(json_object=True).kind == "json_object"
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"json": {}})


def test_compile_cache_and_errors(compiler):
    a = compiler.compile(S(json=SCHEMA))
    assert compiler.compile(S(json=json.dumps(SCHEMA))) is a  # same grammar text: one compile
    assert compiler.hits >= 1
    for bad, words in [(S(json={"type": "nope"}), "Invalid type"), (S(regex="(("), "unclosed group"),
                       (S(grammar="root ::= missing"), "missing"), (S(json={"$ref": "#/defs/x"}), "/defs/x")]:
        with pytest.raises(ValueError, match=words):
            compiler.compile(bad)


def _run_grammar(compiler, tok, spec, seed: int, steps: int = 80) -> tuple[str, bool]:
    """Sample from random logits under the grammar with the real Sampler: the text must still be valid."""
    req = Request("r", [0], SamplingParams(temperature=1.0, seed=seed, max_tokens=steps), eos_token_ids=[EOS])
    req.grammar = compiler.compile(spec).new_matcher()
    sampler = Sampler(520)
    gen = torch.Generator().manual_seed(seed)
    prefetch = MaskPrefetcher()
    out: list[int] = []
    done = False
    for _ in range(steps):
        prefetch.submit([req.grammar])
        token = sampler(torch.randn(1, 520, generator=gen) * 3, [req]).token_ids[0]
        assert token < len(tok)
        if token == EOS:
            done = True
            break
        out.append(token)
        req.append_output_token(token)
        assert req.grammar.accept(token)
        if req.grammar.is_terminated:
            done = True
            break
    prefetch.shutdown()
    return tok.decode(out), done


def test_sampler_obeys_json_schema(compiler, tok):
    for seed in range(10):
        text, done = _run_grammar(compiler, tok, S(json=SCHEMA), seed)
        assert done, text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_sampler_obeys_regex_and_choice(compiler, tok):
    import re

    for seed in range(5):
        text, done = _run_grammar(compiler, tok, S(regex=r"[a-c]{2,3}x"), seed)
        assert done and re.fullmatch(r"[a-c]{2,3}x", text), text
        text, done = _run_grammar(compiler, tok, S(choice=["alpha", "beta"]), seed)
        assert done and text in ("alpha", "beta")


def test_bitmask_unpack_and_apply(compiler):
    mask = torch.zeros(2, 2, dtype=torch.int32)
    mask[0, 0] = 0b101  # tokens 0 and 2
    mask[1, 1] = -2 ** 31  # token 63 (the sign bit)
    allowed = unpack_bitmask(mask, 60)
    assert allowed.shape == (2, 60)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2]
    assert not allowed[1].any()  # token 63 is past the 60 kept columns

    m = compiler.compile(S(choice=["The"])).new_matcher()
    logits = torch.zeros(3, 520)
    logits[1, 5] = float("-inf")
    apply_grammar_masks(logits, [None, m, None])
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[2]).all()
    assert 0 < int(torch.isfinite(logits[1]).sum()) < 10  # only tokens that start "The"


def test_dead_row_falls_back_to_grammar_tokens(compiler, tok):
    """min_tokens bans EOS while the grammar allows only EOS: sampling must stay within the grammar."""
    m = compiler.compile(S(choice=["x"])).new_matcher()
    assert m.accept(tok.encode("x")[0]) and m.is_terminated
    logits = torch.zeros(1, 520)
    logits[0, EOS] = float("-inf")
    apply_grammar_masks(logits, [m])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]


def test_parse_tool_calls_formats():
    text = 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n' \
           '<tool_call>{"name": "g", "arguments": "{\\"b\\": 2}"}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1}), ("g", {"b": 2})]
    content, calls = parse_tool_calls('<|python_tag|>{"name": "f", "parameters": {"x": "y"}}; {"name": "h", '
                                      '"parameters": {}}')
    assert content is None and [c.name for c in calls] == ["f", "h"]
    content, calls = parse_tool_calls('[{"name": "f", "parameters": {"q": 1}}]')
    assert [c.name for c in calls] == ["f"]
    assert parse_tool_calls("no tools here") == ("no tools here", [])
    assert parse_tool_calls('{"not": "a call"}') == ('{"not": "a call"}', [])
    assert parse_tool_calls("<tool_call>{broken</tool_call>") == ("<tool_call>{broken</tool_call>", [])
    # An unclosed tag at the end (the model stopped at EOS) still counts.
    assert [c.name for c in parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}')[1]] == ["f"]


@pytest.mark.parametrize("size", [1, 3, 7])
def test_streaming_parser_matches_whole(size):
    text = 'Sure. <tool_call>{"name": "f", "arguments": {"a": [1, 2]}}</tool_call> <tool_c'
    p = StreamingToolParser()
    content, calls = "", []
    for i in range(0, len(text), size):
        c, k = p.feed(text[i:i + size])
        content, calls = content + c, calls + k
        assert "<tool_call>" not in content
    c, k = p.finish()
    content, calls = content + c, calls + k
    assert content == "Sure.  <tool_c" and [x.name for x in calls] == ["f"]
    p = StreamingToolParser()
    held = [p.feed(ch) for ch in ' {"name": "f", "parameters": {}}']
    assert all(c == "" and not k for c, k in held)
    assert [x.name for x in p.finish()[1]] == ["f"]


def test_tool_choice_constraints(compiler, tok):
    tools = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}},
             {"type": "function", "function": {"name": "g"}}]
    assert tool_choice_constraint(tools, "auto") is None
    named = tool_choice_constraint(tools, {"type": "function", "function": {"name": "f"}})
    assert named.json == SCHEMA
    parallel = tool_choice_constraint(tools, "required")  # one or more calls
    assert parallel.json["type"] == "array" and parallel.json["minItems"] == 1 and "maxItems" not in parallel.json
    required = tool_choice_constraint(tools, "required", parallel_tool_calls=False)
    assert required.json["maxItems"] == 1
    for seed in range(5):
        text, done = _run_grammar(compiler, tok, required, seed, steps=150)
        assert done, text
        _, calls = parse_tool_calls(text)
        assert len(calls) == 1 and calls[0].name in ("f", "g")
        if calls[0].name == "f":
            jsonschema.validate(json.loads(calls[0].arguments), SCHEMA)
