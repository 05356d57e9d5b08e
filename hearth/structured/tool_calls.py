"""Tools: the constraint that enforces tool_choice, and parsing tool calls out of model text (full or streamed).

Formats understood, whatever the chat template:
  Hermes / Qwen:  <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (any number, text around them)
  Llama-3 JSON:   {"name": ..., "parameters": {...}}  (the whole output; optionally <|python_tag|>, several joined
                  by ';', or a JSON array of them, which is also what tool_choice="required" forces)
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from hearth.structured.params import StructuredOutputsParams

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object


def function_schema(tool: dict) -> dict:
    """A tool's parameter schema; a function that declares none takes no arguments: {}."""
    params = tool["function"].get("parameters")
    return params if params else {"type": "object", "properties": {}, "additionalProperties": False}


def tool_choice_constraint(tools: list[dict], tool_choice: str | dict,
                           parallel_tool_calls: bool = True) -> StructuredOutputsParams | None:
    """The grammar enforcing tool_choice: "required" is a JSON array of {"name", "parameters"} calls to the given
    tools; a named function is that function's arguments object. None for "auto" and "none"."""
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        tool = next(t for t in tools if t["function"]["name"] == name)
        return StructuredOutputsParams(json=function_schema(tool))
    if tool_choice != "required":
        return None
    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                               "parameters": function_schema(t)},
              "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else
                              {"anyOf": calls}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    return StructuredOutputsParams(json=schema)


def tools_system_prompt(tools: list[dict]) -> str:
    """For chat templates that do not render tools themselves: describe them Hermes-style in a system message."""
    lines = ["You may call one or more functions to assist with the user query. The available functions are:",
             "<tools>"]
    lines += [json.dumps(t, ensure_ascii=False) for t in tools]
    lines += ["</tools>", ("For each function call, return a JSON object with the function name and arguments "
                           "within <tool_call></tool_call> tags:"),
              '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>']
    return "\n".join(lines)


def _call_from_obj(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_json_calls(text: str) -> list[ToolCall] | None:
    """Llama-3 style: the whole text is one or more calls (objects, ';'-separated, or an array). None if not."""
    s = text.strip()
    if s.startswith(PYTHON_TAG):
        s = s[len(PYTHON_TAG):].strip()
    if not s.startswith(("{", "[")):
        return None
    decoder, objs, pos = json.JSONDecoder(), [], 0
    while pos < len(s):
        try:
            obj, end = decoder.raw_decode(s, pos)
        except json.JSONDecodeError:
            return None
        objs.extend(obj if isinstance(obj, list) else [obj])
        pos = end
        while pos < len(s) and s[pos] in " \t\r\n;,":
            pos += 1
    calls = [_call_from_obj(o) for o in objs]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, tool calls) of a finished output. Text that is no valid call stays content."""
    json_calls = parse_json_calls(text)
    if json_calls is not None:
        return None, json_calls
    if TOOL_OPEN not in text:
        return text, []
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    while True:
        start = text.find(TOOL_OPEN, pos)
        if start < 0:
            content.append(text[pos:])
            break
        content.append(text[pos:start])
        end = text.find(TOOL_CLOSE, start)
        body = text[start + len(TOOL_OPEN): end if end >= 0 else len(text)]
        call = _parse_tag_body(body)
        if call is None:  # not a call after all: keep it as text
            content.append(text[start: end + len(TOOL_CLOSE) if end >= 0 else len(text)])
        else:
            calls.extend(call)
        if end < 0:
            break
        pos = end + len(TOOL_CLOSE)
    rest = "".join(content).strip()
    return (rest or None) if calls else text, calls


def _parse_tag_body(body: str) -> list[ToolCall] | None:
    return parse_json_calls(body)


class StreamingToolParser:
    """Splits streamed text into content deltas and completed tool calls.

    Content streams as it comes, except what may be the start of a <tool_call> tag, and except an output that
    starts like a JSON call (Llama-3 style), which is held to the end and then parsed.
    """

    def __init__(self, json_only: bool = False) -> None:
        self.buf = ""
        self.mode = "json" if json_only else "start"  # start | text | tag | json
        self.num_calls = 0

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        self.buf += delta
        out, calls = [], []
        while True:
            if self.mode == "start":
                s = self.buf.lstrip()
                if not s or PYTHON_TAG.startswith(s):
                    break  # undecided yet
                self.mode = "json" if s.startswith(("{", "[", PYTHON_TAG)) else "text"
            if self.mode == "json":
                break
            if self.mode == "text":
                i = self.buf.find(TOOL_OPEN)
                if i < 0:
                    keep = _partial_suffix(self.buf, TOOL_OPEN)
                    out.append(self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                out.append(self.buf[:i])
                self.buf = self.buf[i + len(TOOL_OPEN):]
                self.mode = "tag"
            if self.mode == "tag":
                j = self.buf.find(TOOL_CLOSE)
                if j < 0:
                    break
                body, self.buf = self.buf[:j], self.buf[j + len(TOOL_CLOSE):]
                parsed = _parse_tag_body(body)
                if parsed is None:
                    out.append(TOOL_OPEN + body + TOOL_CLOSE)
                else:
                    calls.extend(parsed)
                self.mode = "text"
        self.num_calls += len(calls)
        return "".join(out), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end of the output: what is still held, as content or calls."""
        buf, mode = self.buf, self.mode
        self.buf = ""
        if mode == "tag":  # an unclosed tag (some models stop at EOS without it)
            parsed = _parse_tag_body(buf)
            if parsed is not None:
                self.num_calls += len(parsed)
                return "", parsed
            return TOOL_OPEN + buf, []
        if mode == "json":
            parsed = parse_json_calls(buf)
            if parsed is not None:
                self.num_calls += len(parsed)
                return "", parsed
        return buf, []


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


_TOOLS_RE = re.compile(r"\btools\b")


def template_renders_tools(template: str | None) -> bool:
    return bool(template) and _TOOLS_RE.search(template) is not None
