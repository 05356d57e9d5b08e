"""Structured output and a forced tool call on the bundled SmolLM2-135M-Instruct, through the real server."""
from __future__ import annotations

import json

import jsonschema
import pytest

from tests.server.conftest import start_server

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 30},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"type": "string", "maxLength": 30}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 30},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    log = str(tmp_path_factory.mktemp("logs") / "smol-structured.log")
    srv = start_server(["--max-model-len", "1024", "--kv-cache-space", "0.25", "--threads", "1"], log)
    yield srv
    srv.stop()


def test_json_schema_20_seeds(smol):
    client = smol.client()
    msgs = [{"role": "user", "content": "Give me a JSON object describing a person: name, age and city."}]
    r = client.chat.completions.create(model=None, messages=msgs, n=20, seed=0, temperature=0.8, max_tokens=80,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "person", "schema": PERSON}})
    assert len(r.choices) == 20
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), PERSON)


def test_forced_tool_call(smol):
    """One forced call (parallel_tool_calls=False). With parallel calls allowed, greedy decoding on this 135M model
    sits on a near tie after the first call (',' vs ']', both ~-4 logprob) that fp32 summation order decides, and
    on ',' it repeats the call until max_tokens (the array form's schema: tests/unit/test_structured.py)."""
    client = smol.client()
    msgs = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    r = client.chat.completions.create(model=None, messages=msgs, tools=[WEATHER], tool_choice="required",
                                       parallel_tool_calls=False, temperature=0, max_tokens=80)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    call = c.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
