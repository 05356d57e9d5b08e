"""Structured output and tools through the real server, with the official openai client, on the tiny random model:
the grammar alone must make the output valid (random weights know nothing about JSON)."""
from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}}
RF = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
MSGS = [{"role": "user", "content": "Describe a person."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
# The tiny model's context is 256 tokens: a template that renders tools by name only (the default description
# of full tools would not fit). It mentions `tools`, so the server renders them through it.
TOOLS_TEMPLATE = ("{% if tools %}{{'<|im_start|>system\\ntools: ' + (tools | map(attribute='function') | "
                  "map(attribute='name') | join(', ')) + '<|im_end|>\\n'}}{% endif %}"
                  "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + "
                  "'<|im_end|>\\n'}}{% endfor %}"
                  "{% if add_generation_prompt %}{{'<|im_start|>assistant\\n'}}{% endif %}")
TT = {"chat_template": TOOLS_TEMPLATE}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "additionalProperties": False, "required": ["tz"],
                                       "properties": {"tz": {"enum": ["UTC", "CET"]}}}}}


def test_json_schema_chat_20_seeds(client: openai.OpenAI):
    for seed in range(20):
        r = client.chat.completions.create(model=None, messages=MSGS, response_format=RF, seed=seed,
                                           temperature=1.0, max_tokens=150)
        c = r.choices[0]
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), PERSON)


def test_json_object_and_guided_json_on_completions(client: openai.OpenAI):
    r = client.completions.create(model=None, prompt="The quick", max_tokens=200, seed=1,
                                  extra_body={"response_format": {"type": "json_schema",
                                                                  "json_schema": {"name": "p", "schema": PERSON}}})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    r = client.completions.create(model=None, prompt="The quick", max_tokens=150, seed=2,
                                  extra_body={"guided_json": PERSON})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    # json_object: any object; a tight max_tokens may cut it, and then it says so.
    r = client.chat.completions.create(model=None, messages=MSGS, response_format={"type": "json_object"},
                                       max_tokens=60, seed=3)
    c = r.choices[0]
    assert c.message.content.startswith("{")
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)
    else:
        assert c.finish_reason == "length" and r.usage.completion_tokens == 60


def test_regex_and_choice(client: openai.OpenAI):
    for seed in range(5):
        r = client.completions.create(model=None, prompt="Code:", max_tokens=20, seed=seed,
                                      extra_body={"guided_regex": r"[A-Z]{3}-[0-9]{2,4}"})
        assert re.fullmatch(r"[A-Z]{3}-[0-9]{2,4}", r.choices[0].text), r.choices[0].text
        assert r.choices[0].finish_reason == "stop"
    choices = ["yes", "no", "maybe later"]
    seen = set()
    for seed in range(6):
        r = client.chat.completions.create(model=None, messages=MSGS, seed=seed, max_tokens=10,
                                           extra_body={"guided_choice": choices})
        assert r.choices[0].message.content in choices
        seen.add(r.choices[0].message.content)
    r = client.chat.completions.create(model=None, messages=MSGS, max_tokens=10, temperature=0,
                                       extra_body={"structured_outputs": {"choice": ["left", "right"]}})
    assert r.choices[0].message.content in ("left", "right")
    r = client.completions.create(model=None, prompt="x", max_tokens=10, seed=0,
                                  extra_body={"guided_grammar": 'root ::= "ab" | "cd" [0-9]'})
    assert re.fullmatch(r"ab|cd[0-9]", r.choices[0].text)


def test_grammar_cut_by_max_tokens_is_length(client: openai.OpenAI):
    r = client.chat.completions.create(model=None, messages=MSGS, response_format=RF, max_tokens=5, seed=0)
    c = r.choices[0]
    assert c.finish_reason == "length" and r.usage.completion_tokens == 5
    assert c.message.content.startswith('{"n')  # a prefix of the required layout


def test_n_and_streaming(client: openai.OpenAI):
    r = client.chat.completions.create(model=None, messages=MSGS, response_format=RF, n=3, seed=7, max_tokens=150)
    assert len(r.choices) == 3
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), PERSON)
    stream = client.chat.completions.create(model=None, messages=MSGS, response_format=RF, n=2, seed=7,
                                            max_tokens=150, stream=True)
    texts, reasons = ["", ""], [None, None]
    for chunk in stream:
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
            reasons[ch.index] = ch.finish_reason or reasons[ch.index]
    assert reasons == ["stop", "stop"]
    # Seeded: the streamed texts are the first two of the n=3 texts (sequence i uses seed + i).
    assert texts == [r.choices[0].message.content, r.choices[1].message.content]


def test_prefix_cached_prompt_keeps_constraint(client: openai.OpenAI):
    long = [{"role": "user", "content": "hearth serves language models on CPUs. " * 12}]
    outs = []
    for _ in range(2):
        r = client.chat.completions.create(model=None, messages=long, response_format=RF, seed=11, max_tokens=150)
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
        outs.append(r)
    assert outs[1].usage.prompt_tokens_details.cached_tokens > 0
    assert outs[0].choices[0].message.content == outs[1].choices[0].message.content


def test_mixed_batch(server):
    async def run() -> None:
        ac = server.async_client()
        jobs = []
        for i in range(4):
            jobs.append(ac.chat.completions.create(model=None, messages=MSGS, response_format=RF, seed=i,
                                                   max_tokens=150))
            jobs.append(ac.completions.create(model=None, prompt="The quick", max_tokens=30, seed=i,
                                              extra_body={"ignore_eos": True}))
            jobs.append(ac.completions.create(model=None, prompt="Code:", max_tokens=20, seed=i,
                                              extra_body={"guided_regex": r"[a-z]{2}[0-9]{2}"}))
        results = await asyncio.gather(*jobs)
        for i in range(0, len(results), 3):
            js, free, rx = results[i:i + 3]
            jsonschema.validate(json.loads(js.choices[0].message.content), PERSON)
            assert free.choices[0].finish_reason == "length" and free.usage.completion_tokens == 30
            assert re.fullmatch(r"[a-z]{2}[0-9]{2}", rx.choices[0].text)
        await ac.close()

    asyncio.run(run())


def _validate_call(call, tool) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == tool["function"]["name"]
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def test_forced_tool_calls(client: openai.OpenAI):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    for seed in range(3):
        r = client.chat.completions.create(model=None, messages=ask, tools=[WEATHER, TIME], seed=seed,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           max_tokens=100, extra_body=TT)
        c = r.choices[0]
        assert c.finish_reason == "stop" and c.message.content is None
        assert len(c.message.tool_calls) == 1
        _validate_call(c.message.tool_calls[0], WEATHER)
    for seed in range(3):
        r = client.chat.completions.create(model=None, messages=ask, tools=[WEATHER, TIME], tool_choice="required",
                                           seed=seed, max_tokens=150, parallel_tool_calls=False, extra_body=TT)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c.message
        assert len(c.message.tool_calls) == 1
        call = c.message.tool_calls[0]
        _validate_call(call, WEATHER if call.function.name == "get_weather" else TIME)


def test_tool_calls_stream_and_round_trip(client: openai.OpenAI):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        stream = client.chat.completions.create(model=None, messages=ask, tools=[WEATHER], tool_choice=choice,
                                                seed=5, max_tokens=150, stream=True, parallel_tool_calls=False,
                                                extra_body=TT)
        calls: dict[int, dict] = {}
        finish = None
        for chunk in stream:
            for ch in chunk.choices:
                finish = ch.finish_reason or finish
                for d in ch.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                    entry["id"] = d.id or entry["id"]
                    if d.function is not None:
                        entry["name"] = d.function.name or entry["name"]
                        entry["arguments"] += d.function.arguments or ""
        assert finish == ("tool_calls" if choice == "required" else "stop")
        assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
        jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])
    # The call and its result go back to the model as history.
    history = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0]["id"], "type": "function",
         "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C, sunny"}]
    # (ignore_eos: an unseeded draw from the random model may end at once; the point is that the history is taken)
    r = client.chat.completions.create(model=None, messages=history, tools=[WEATHER], tool_choice="none",
                                       max_tokens=5, extra_body={**TT, "ignore_eos": True})
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("body,param,words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format", "Invalid type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_json": {"type": "string", "pattern": "(("}}, "guided_json", "regex"),
    ({"guided_regex": "[a-"}, "guided_regex", "regex"),
    ({"guided_choice": []}, "guided_choice", "choice"),
    ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar", "grammar"),
    ({"structured_outputs": {"json": PERSON, "regex": "a"}}, "structured_outputs", "exactly one"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "not several"),
    ({"response_format": {"type": "yaml"}}, "response_format", "response_format"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}],
      "tool_choice": "required"}, "tools", "bogus"),
    ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "tool_choice", "combined"),
])
def test_bad_constraints_are_400(server, body, param, words):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 5, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_bad_schema_via_openai_client(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=None, prompt="x", max_tokens=5,
                                  extra_body={"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/x"}}}})
    assert "/x" in str(e.value)
    assert server_alive(client)


def server_alive(client: openai.OpenAI) -> bool:
    r = client.completions.create(model=None, prompt="x", max_tokens=2, extra_body={"ignore_eos": True})
    return r.choices[0].finish_reason == "length"
