"""The Responses, Anthropic Messages and Ollama APIs end to end on the bundled SmolLM2-135M-Instruct, with each
API's own client, where the answers matter."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import ollama
import pytest

from tests.server.conftest import start_server
from tests.server.test_real_model import CAPITAL

pytestmark = pytest.mark.slow

WEATHER_PARAMS = {"type": "object", "additionalProperties": False, "required": ["city"],
                  "properties": {"city": {"type": "string", "maxLength": 20}}}


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    srv = start_server(["--max-model-len", "1024", "--kv-cache-space", "0.25", "--threads", "1"],
                       str(tmp_path_factory.mktemp("logs") / "smol_apis.log"))
    yield srv
    srv.stop()


def test_responses_answers_and_calls(smol):
    client = smol.client()
    name = client.models.list().data[0].id
    r = client.responses.create(model=name, instructions=CAPITAL[0]["content"], input=CAPITAL[1]["content"],
                                temperature=0, max_output_tokens=30)
    assert r.status == "completed" and "Paris" in r.output_text
    events = list(client.responses.create(model=name, instructions=CAPITAL[0]["content"],
                                          input=CAPITAL[1]["content"], temperature=0, max_output_tokens=30,
                                          stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.output_text == r.output_text
    tool = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
            "parameters": WEATHER_PARAMS}
    call = client.responses.create(model=name, input="What is the weather in Paris?", tools=[tool], temperature=0,
                                   tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40)
    fc = call.output[0]
    assert fc.type == "function_call" and fc.name == "get_weather"
    assert "paris" in json.loads(fc.arguments)["city"].lower()


def test_anthropic_messages_answers(smol):
    ac = anthropic.Anthropic(base_url=smol.url, api_key="none", max_retries=0, timeout=120)
    name = smol.client().models.list().data[0].id
    kw = dict(model=name, max_tokens=30, system=CAPITAL[0]["content"], extra_body={"temperature": 0},
              messages=[{"role": "user", "content": CAPITAL[1]["content"]}])
    m = ac.messages.create(**kw)
    assert m.stop_reason == "end_turn" and "Paris" in m.content[0].text
    with ac.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
    assert text == m.content[0].text
    cut = ac.messages.create(**{**kw, "stop_sequences": ["Paris"]})
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", "Paris") and "Paris" not in cut.content[0].text
    tool = {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_PARAMS}
    with ac.messages.stream(model=name, max_tokens=40, tools=[tool], extra_body={"temperature": 0},
                            tool_choice={"type": "tool", "name": "get_weather"},
                            messages=[{"role": "user", "content": "What is the weather in Paris?"}]) as stream:
        final = stream.get_final_message()
    use = final.content[0]
    assert use.type == "tool_use" and use.name == "get_weather" and "paris" in use.input["city"].lower()
    jsonschema.validate(use.input, WEATHER_PARAMS)


def test_ollama_client_answers(smol):
    c = ollama.Client(host=smol.url, timeout=120)
    listed = c.list().models
    assert len(listed) == 1 and listed[0].details.format == "gguf"
    name = listed[0].model
    r = c.chat(model=name, messages=CAPITAL, options={"temperature": 0, "num_predict": 30})
    assert "Paris" in r.message.content and r.done_reason == "stop"
    parts = list(c.chat(model=name, messages=CAPITAL, options={"temperature": 0, "num_predict": 30}, stream=True))
    assert "".join(p.message.content for p in parts) == r.message.content
    g = c.generate(model=name, prompt=CAPITAL[1]["content"], system=CAPITAL[0]["content"],
                   options={"temperature": 0, "num_predict": 30})
    assert "Paris" in g.response and g.context
