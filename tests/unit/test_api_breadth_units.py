"""Pieces of the API-breadth work that need no server: the reasoning splitter on awkward delta boundaries, the
reasoning gate's masks, FIM token discovery and layouts, the API key in Anthropic's header."""
from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from hearth.entrypoints.openai.fim import find_fim_tokens, fim_ids
from hearth.entrypoints.openai.reasoning_parser import ReasoningParser, ReasoningStream
from hearth.structured.bitmask import unpack_bitmask
from hearth.structured.reasoning import ReasoningGate, ReasoningParams
from hearth.tokenizer import Tokenizer

TEXT = "<think>\nweigh it</think>\n\nThe answer."


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 7])
def test_reasoning_stream_any_delta_boundaries(cut: int) -> None:
    stream = ReasoningStream(in_reasoning=False)
    thought, said = "", ""
    for i in range(0, len(TEXT), cut):
        r, c = stream.feed(TEXT[i:i + cut])
        thought, said = thought + r, said + c
    r, c = stream.finish()
    assert (thought + r, said + c) == ("\nweigh it", "The answer.")


def test_reasoning_parsers_and_prompt_state() -> None:
    qwen3, r1 = ReasoningParser("qwen3"), ReasoningParser("deepseek_r1")
    assert qwen3.split("no thinking here", False) == (None, "no thinking here")
    assert r1.split("unclosed thought", r1.starts_in_reasoning("<|Assistant|>")) == ("unclosed thought", "")
    assert qwen3.initial_state("<|im_start|>assistant\n<think>\n") == "think"
    assert qwen3.initial_state("assistant\n<think>\n\n</think>\n\n") == "done"  # enable_thinking false
    assert qwen3.initial_state("assistant\n") == "before" and r1.initial_state("assistant\n") == "think"
    assert qwen3.split("a</think>b", True) == ("a", "b")


def _allowed(gate: ReasoningGate) -> list[int]:
    gate.fill_bitmask()
    return unpack_bitmask(gate.bitmask[None], gate.vocab_size)[0].nonzero().flatten().tolist()


class _OnlyToken:
    """A grammar that allows one token, then is complete."""

    def __init__(self, token: int, vocab: int) -> None:
        self.token, self.vocab, self.done = token, vocab, False
        self.bitmask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)

    def fill_bitmask(self) -> None:
        self.bitmask.zero_()
        self.bitmask[self.token // 32] = 1 << (self.token % 32)

    def accept(self, token_id: int) -> bool:
        self.done = token_id == self.token
        return self.done

    @property
    def is_terminated(self) -> bool:
        return self.done

    error = ""


def test_reasoning_gate_budget_then_grammar() -> None:
    vocab, end, start = 70, 65, 64
    gate = ReasoningGate(ReasoningParams(end, None, in_reasoning=True, budget=2), _OnlyToken(33, vocab), vocab)
    assert len(_allowed(gate)) == vocab  # thinking: anything
    gate.accept(3), gate.accept(4)
    assert _allowed(gate) == [end]  # the budget is spent: only </think>
    gate.accept(end)
    assert _allowed(gate) == [33] and not gate.is_terminated  # then the grammar alone
    gate.accept(33)
    assert gate.is_terminated
    before = ReasoningGate(ReasoningParams(end, start), _OnlyToken(33, vocab), vocab)
    assert _allowed(before) == [33, start]  # the model may open its thinking, or answer at once


def _tokenizer(specials: tuple[str, ...], bos: bool = False) -> Tokenizer:
    from tokenizers import processors

    from tests.tiny_models import tiny_tokenizer

    hf = tiny_tokenizer(extra_special=specials)
    tok = Tokenizer.from_hf(hf)
    if bos:  # a SentencePiece-style tokenizer that starts every prompt with <s>, as CodeLlama's
        tok.backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tok


@pytest.mark.parametrize("names,bos", [
    (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), False),  # Qwen2.5-Coder
    (("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), False),  # StarCoder
    (("<PRE>", "<SUF>", "<MID>"), True),  # CodeLlama: BOS first
])
def test_fim_layouts(names: tuple[str, str, str], bos: bool) -> None:
    tok = _tokenizer(names, bos)
    fim = find_fim_tokens(tok)
    pre, suf, mid = (tok.backend.token_to_id(n) for n in names)
    ids = fim_ids(fim, tok, "def f(", "):\n")
    body = [pre, *tok.encode("def f(", add_special_tokens=False), suf, *tok.encode("):\n", add_special_tokens=False),
            mid]
    assert ids == ([0] if bos else []) + body


def test_fim_from_gguf_metadata_and_none() -> None:
    tok = _tokenizer(())
    assert find_fim_tokens(tok) is None
    fim = find_fim_tokens(tok, {"fim_pre_token_id": 7, "fim_suf_token_id": 8, "fim_mid_token_id": 9})
    assert (fim.prefix, fim.suffix, fim.middle) == (7, 8, 9)


def test_api_key_in_anthropic_header() -> None:
    from fastapi import FastAPI

    from hearth.entrypoints.openai.guard import Guard
    from hearth.entrypoints.openai.serving_keys import key_ring

    app = FastAPI()
    app.get("/v1/messages")(lambda: {"ok": True})
    app.get("/api/tags")(lambda: {"models": []})
    guarded = Guard(app, key_ring("k1", None, None), 1000)

    async def get(headers: dict[str, str]) -> int:
        transport = httpx.ASGITransport(app=guarded)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return (await c.get("/v1/messages", headers=headers)).status_code

    assert asyncio.run(get({"x-api-key": "k1"})) == 200
    assert asyncio.run(get({"authorization": "Bearer k1"})) == 200
    assert asyncio.run(get({"x-api-key": "k2"})) == 401
    assert asyncio.run(get({})) == 401

    async def ollama(headers: dict[str, str]) -> int:  # Ollama's routes need the key too
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guarded), base_url="http://t") as c:
            return (await c.get("/api/tags", headers=headers)).status_code

    assert asyncio.run(ollama({})) == 401 and asyncio.run(ollama({"authorization": "Bearer k1"})) == 200


def test_ollama_history_as_chat_messages() -> None:
    """Ollama's history shape (arguments as an object, tool results named by tool_name) as the chat template sees
    it; and the tool calls of an answer in Ollama's shape."""
    from hearth.entrypoints.ollama.protocol import OllamaMessage
    from hearth.entrypoints.ollama.serving import _chat_messages, _tool_calls
    from hearth.entrypoints.openai.protocol import ChatMessage

    args = {"city": "Paris"}
    history = [OllamaMessage(role="assistant", tool_calls=[{"function": {"name": "get_weather", "arguments": args}}]),
               OllamaMessage(role="tool", content="18 C", tool_name="get_weather")]
    msgs = [ChatMessage.model_validate(m).as_dict() for m in _chat_messages(history)]
    assert msgs[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": args}
    assert msgs[1] == {"role": "tool", "content": "18 C", "name": "get_weather"}
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert _tool_calls([call]) == [{"function": {"name": "get_weather", "arguments": args}}]


def test_fim_tokens_from_gguf_file(tmp_path, monkeypatch) -> None:
    """tokenizer.ggml.fim_* metadata reaches the config the server reads FIM tokens from."""
    import gguf

    from hearth.loader.gguf import load_gguf
    from tests.unit.test_gguf_loader import write_llama

    write_template = gguf.GGUFWriter.add_chat_template

    def with_fim(self, template):  # write_llama's metadata, plus llama.cpp's FIM keys
        write_template(self, template)
        for key, token in (("pre", 3), ("suf", 4), ("mid", 5)):
            self.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", token)

    monkeypatch.setattr(gguf.GGUFWriter, "add_chat_template", with_fim)
    write_llama(tmp_path / "fim.gguf")
    ck = load_gguf(str(tmp_path / "fim.gguf"))
    fim = find_fim_tokens(ck.tokenizer, ck.hf_config)
    assert (fim.prefix, fim.suffix, fim.middle) == (3, 4, 5)
