"""Reasoning output (chat completions, Responses, Anthropic Messages, Ollama) and fill-in-the-middle on a tiny
random checkpoint whose vocabulary has <think>, </think> (added tokens that decode as text, as Qwen3's) and
Qwen2.5-Coder's FIM tokens, and whose template opens the thinking. `--reasoning-budget 4` forces </think> after 4
thinking tokens, which makes the split deterministic on random weights."""
from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import ollama
import openai
import pytest

from tests.server.conftest import TINY_ARGS, ServerProcess, start_server
from tests.server.test_structured import PERSON, WEATHER

FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
THINK = ("<think>", "</think>")
BUDGET = 4
# ChatML that renders tools by name (the tiny context is 256 tokens) and opens the thinking unless
# enable_thinking is false, as Qwen3's template closes it then.
THINK_TEMPLATE = ("{% if tools %}{{'<|im_start|>system\\ntools: ' + (tools | map(attribute='function') | "
                  "map(attribute='name') | join(', ')) + '<|im_end|>\\n'}}{% endif %}"
                  "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + "
                  "'<|im_end|>\\n'}}{% endfor %}"
                  "{% if add_generation_prompt %}{{'<|im_start|>assistant\\n'}}"
                  "{% if enable_thinking is defined and not enable_thinking %}{{'<think>\\n\\n</think>\\n\\n'}}"
                  "{% else %}{{'<think>\\n'}}{% endif %}{% endif %}")
ASK = [{"role": "user", "content": "The quick brown fox"}]
FREE = {"ignore_eos": True}


@pytest.fixture(scope="module")
def think_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.tiny_models import build_checkpoint, tiny_config, tiny_tokenizer

    folder = build_checkpoint(str(tmp_path_factory.mktemp("think") / "think"), tiny_config("llama"))
    tiny_tokenizer(extra_special=FIM, extra_added=THINK, chat_template=THINK_TEMPLATE).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def think_server(think_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server([think_model, *TINY_ARGS, "--served-model-name", "think", "--reasoning-parser", "qwen3",
                        "--reasoning-budget", str(BUDGET)], str(tmp_path_factory.mktemp("logs") / "think.log"))
    yield srv
    srv.stop()


def test_reasoning_split_whole_and_streamed(think_server):
    client = think_server.client()
    kw = dict(model="think", messages=ASK, max_tokens=12, temperature=0, extra_body=FREE)
    r = client.chat.completions.create(logprobs=True, **kw)
    m = r.choices[0].message
    tokens = [t.token for t in r.choices[0].logprobs.content]
    assert len(tokens) == 12 and tokens[BUDGET] == "</think>" and "</think>" not in tokens[:BUDGET]
    assert m.reasoning_content and m.model_extra["reasoning"] == m.reasoning_content
    assert "</think>" not in m.reasoning_content and "</think>" not in (m.content or "")
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    said = "".join(d.content or "" for d in deltas)
    assert thought == m.reasoning_content and said == m.content
    first_content = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not getattr(d, "reasoning_content", None) for d in deltas[first_content:])


def test_history_thinking_does_not_close_this_turn(think_server):
    """An earlier assistant turn's closed <think> block is in the prompt, and this turn's generation prompt opens
    nothing (qwen3: the model may open it): a <think> the model writes still starts a thinking, with its budget."""
    from tests.tiny_models import CHATML

    think_id = httpx.post(think_server.url + "/tokenize", json={"prompt": "<think>"}).json()["tokens"]
    history = [*ASK, {"role": "assistant", "content": "<think>\nold</think>\n\nold answer"},
               {"role": "user", "content": "Paris is"}]
    r = think_server.client().chat.completions.create(
        model="think", messages=history, max_tokens=8, temperature=0, logprobs=True,
        logit_bias={str(think_id[0]): 100}, extra_body={**FREE, "chat_template": CHATML})  # the model opens it
    tokens = [t.token for t in r.choices[0].logprobs.content]
    assert len(think_id) == 1 and tokens[0] == "<think>" and tokens[1 + BUDGET] == "</think>"


def test_enable_thinking_false_is_all_content(think_server):
    r = think_server.client().chat.completions.create(
        model="think", messages=ASK, max_tokens=8, temperature=0,
        extra_body={**FREE, "chat_template_kwargs": {"enable_thinking": False}})
    m = r.choices[0].message
    assert getattr(m, "reasoning_content", None) is None and r.usage.completion_tokens == 8 and m.content


def test_grammar_applies_after_thinking(think_server):
    client = think_server.client()
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for seed in range(3):
        r = client.chat.completions.create(model="think", messages=ASK, max_tokens=150, temperature=0.8, seed=seed,
                                           response_format=rf)
        m = r.choices[0].message
        assert m.reasoning_content is not None  # the budget's 4 free tokens came first
        jsonschema.validate(json.loads(m.content), PERSON)
    r = client.chat.completions.create(model="think", messages=ASK, max_tokens=100, temperature=0, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    m = r.choices[0].message
    assert m.reasoning_content is not None and len(m.tool_calls) == 1
    jsonschema.validate(json.loads(m.tool_calls[0].function.arguments), WEATHER["function"]["parameters"])


def test_reasoning_on_responses_and_messages(think_server):
    r = think_server.client().responses.create(model="think", input="The quick brown fox", max_output_tokens=10,
                                               temperature=0, extra_body=FREE)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text and r.output[1].content[0].text
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    ac = anthropic.Anthropic(base_url=think_server.url, api_key="none", max_retries=0)
    kw = dict(model="think", max_tokens=10, messages=ASK, extra_body={**FREE, "temperature": 0})
    msg = ac.messages.create(**kw)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == r.output[0].content[0].text  # the same greedy thought
    with ac.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == msg.content[0].thinking and final.content[1].text == msg.content[1].text
    short = ac.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 2})  # the request's own budget
    t2, t4 = short.content[0].thinking, msg.content[0].thinking
    assert len(t2) < len(t4) and t4.startswith(t2.rstrip("\ufffd"))  # greedy: the same first thinking tokens
    oc = ollama.Client(host=think_server.url, timeout=60)
    chat = oc.chat(model="think", messages=ASK, think=True, options={"temperature": 0, "num_predict": 10})
    assert chat.message.thinking == msg.content[0].thinking and chat.message.content == msg.content[1].text


def test_fim_prompt_layout_token_by_token(think_server, think_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(think_model)
    prefix, suffix = "The quick brown", " over the lazy dog."
    expected = ([tok.convert_tokens_to_ids(FIM[0])] + tok.encode(prefix, add_special_tokens=False)
                + [tok.convert_tokens_to_ids(FIM[1])] + tok.encode(suffix, add_special_tokens=False)
                + [tok.convert_tokens_to_ids(FIM[2])])
    client = think_server.client()
    r = client.completions.create(model="think", prompt=prefix, suffix=suffix, max_tokens=3, temperature=0,
                                  echo=True, logprobs=0, extra_body=FREE)
    assert r.usage.prompt_tokens == len(expected)
    assert r.choices[0].logprobs.tokens[: len(expected)] == [tok.decode([t]) for t in expected]
    plain = client.completions.create(model="think", prompt=expected, max_tokens=3, temperature=0, extra_body=FREE)
    assert r.choices[0].text == prefix + plain.choices[0].text  # echo gives the prefix back, then the middle


def test_fim_refused_without_fim_tokens(client):
    with pytest.raises(openai.BadRequestError, match="fill-in-the-middle") as e:
        client.completions.create(model="tiny", prompt="def f(", suffix="):", max_tokens=2)
    assert e.value.body["param"] == "suffix"


def test_continuous_usage_stats(think_server):
    client = think_server.client()
    opts = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.completions.create(model="think", prompt="The quick", max_tokens=5, stream=True,
                                            stream_options=opts, extra_body=FREE))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == 5 and all(c.usage.prompt_tokens for c in chunks)
    chunks = list(client.chat.completions.create(model="think", messages=ASK, max_tokens=5, stream=True,
                                                 stream_options=opts, extra_body=FREE))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == 5
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 5
