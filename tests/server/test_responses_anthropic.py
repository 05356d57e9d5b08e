"""/v1/responses (openai client) and /v1/messages (anthropic client) on the tiny random checkpoint: shapes, event
sequences, function tools through the grammar, previous_response_id, Anthropic's error shape."""
from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.server.test_structured import PERSON, TOOLS_TEMPLATE, WEATHER

FN = {"type": "function", "name": WEATHER["function"]["name"], "description": WEATHER["function"]["description"],
      "parameters": WEATHER["function"]["parameters"]}
ANTHROPIC_TOOL = {"name": FN["name"], "description": FN["description"], "input_schema": FN["parameters"]}
EXTRA = {"ignore_eos": True, "chat_template": TOOLS_TEMPLATE}  # random weights: fixed lengths, short tool prompt


def test_responses_text_whole_and_streamed(client: openai.OpenAI):
    kw = dict(model="tiny", input="The quick brown fox", instructions="Be brief.", max_output_tokens=6,
              temperature=0, extra_body=EXTRA)
    r = client.responses.create(**kw)
    assert r.object == "response" and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"] and r.output[0].content[0].type == "output_text"
    assert r.usage.output_tokens == 6 and r.usage.total_tokens == r.usage.input_tokens + 6
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text == events[-1].response.output_text


def test_responses_function_tool_and_follow_up(client: openai.OpenAI):
    ask = dict(model="tiny", input="Weather in Paris?", tools=[FN], max_output_tokens=80, temperature=0,
               tool_choice={"type": "function", "name": "get_weather"}, extra_body={"chat_template": TOOLS_TEMPLATE})
    r = client.responses.create(**ask)
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
    call = r.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])

    events = list(client.responses.create(stream=True, **ask))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == args == call.arguments  # greedy: the same call
    assert events[-1].type == "response.completed" and events[-1].response.output[0].type == "function_call"

    # The call's result goes back through previous_response_id; the stored conversation holds the call.
    follow = client.responses.create(model="tiny", previous_response_id=r.id, max_output_tokens=4, extra_body=EXTRA,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "18 C"}])
    assert follow.previous_response_id == r.id and follow.output[0].type == "message"
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": call.call_id, "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments}}]},
               {"role": "tool", "tool_call_id": call.call_id, "content": "18 C"}]
    same = client.chat.completions.create(model="tiny", messages=history, max_tokens=1, extra_body=EXTRA)
    assert follow.usage.input_tokens == same.usage.prompt_tokens
    assert client.responses.retrieve(follow.id).output_text == follow.output_text
    client.responses.delete(follow.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(follow.id)
    unstored = client.responses.create(model="tiny", input="hi", store=False, max_output_tokens=2, extra_body=EXTRA)
    with pytest.raises(openai.NotFoundError, match="previous_response_id|no stored response"):
        client.responses.create(model="tiny", input="hi", previous_response_id=unstored.id, max_output_tokens=2)


def test_responses_json_schema(client: openai.OpenAI):
    r = client.responses.create(model="tiny", input="A person.", max_output_tokens=120, temperature=0.7,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}},
                                extra_body={"seed": 3})
    jsonschema.validate(json.loads(r.output_text), PERSON)


def anthropic_client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)


def test_messages_text_whole_and_streamed(server):
    ac = anthropic_client(server)
    # NOTE: this anthropic client has no sampling arguments; the server still takes temperature/top_p/top_k
    kw = dict(model="tiny", max_tokens=6, system="Be brief.", extra_body={**EXTRA, "temperature": 0},
              messages=[{"role": "user", "content": "The quick brown fox"}])
    m = ac.messages.create(**kw)
    assert m.type == "message" and m.role == "assistant" and m.stop_reason == "max_tokens"
    assert [b.type for b in m.content] == ["text"] and m.usage.output_tokens == 6
    with ac.messages.stream(**kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "content_block_stop" in events
    assert final.content[0].text == m.content[0].text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 6
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == (
        m.usage.input_tokens + m.usage.cache_read_input_tokens)
    count = ac.messages.count_tokens(model="tiny", system="Be brief.", extra_body={"chat_template": TOOLS_TEMPLATE},
                                     messages=[{"role": "user", "content": "The quick brown fox"}])
    assert count.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_messages_tool_use_round_trip(server):
    ac = anthropic_client(server)
    kw = dict(model="tiny", max_tokens=80, tools=[ANTHROPIC_TOOL], tool_choice={"type": "tool", "name": "get_weather"},
              extra_body={"chat_template": TOOLS_TEMPLATE, "temperature": 0},
              messages=[{"role": "user", "content": "Weather in Paris?"}])
    m = ac.messages.create(**kw)
    assert [b.type for b in m.content] == ["tool_use"]
    use = m.content[0]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER["function"]["parameters"])
    with ac.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "tool_use" and final.content[0].input == use.input
    history = [kw["messages"][0], {"role": "assistant", "content": [use.model_dump()]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}]}]
    m2 = ac.messages.create(**{**kw, "messages": history, "tool_choice": {"type": "none"}, "max_tokens": 3,
                               "extra_body": EXTRA})
    assert m2.content[0].type == "text"
    same = openai.OpenAI(base_url=server.url + "/v1", api_key="none").chat.completions.create(
        model="tiny", max_tokens=1, extra_body=EXTRA, messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": use.id, "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps(use.input)}}]},
            {"role": "tool", "tool_call_id": use.id, "content": "18 C"}])
    assert m2.usage.input_tokens + m2.usage.cache_read_input_tokens == same.usage.prompt_tokens


def test_messages_errors_in_anthropic_shape(server):
    ac = anthropic_client(server)
    with pytest.raises(anthropic.BadRequestError) as e:
        ac.messages.create(model="tiny", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                           extra_body={"temperature": -1})
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        ac.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    r = httpx.post(server.url + "/v1/messages", json={"model": "tiny", "messages": []}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"] or "messages" in r.json()["error"]["message"]


def test_messages_output_config_json_schema(server):
    m = anthropic_client(server).messages.create(
        model="tiny", max_tokens=120, messages=[{"role": "user", "content": "A person."}],
        output_config={"format": {"type": "json_schema", "schema": PERSON}}, extra_body={"seed": 3})
    jsonschema.validate(json.loads(m.content[0].text), PERSON)
