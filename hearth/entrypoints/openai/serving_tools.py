"""Tools on /v1/chat/completions: validating tools + tool_choice, the forcing grammar, and turning model text
into `tool_calls` (whole messages and streamed deltas). Parsing itself lives in hearth/structured/tool_calls.py."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.protocol import ChatCompletionRequest
from hearth.structured.params import StructuredOutputsParams
from hearth.structured.tool_calls import (
    StreamingToolParser,
    ToolCall,
    parse_tool_calls,
    template_renders_tools,
    tool_choice_constraint,
    tools_system_prompt,
)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_json(call: ToolCall, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


@dataclass
class ToolPlan:
    """What the request's tools mean for this response."""

    tools: list[dict]  # as the chat template sees them (empty: no tools, or tool_choice "none")
    mode: str | None  # None (plain chat) | "auto" | "required" | "named"
    name: str | None = None  # the forced function, for "named"
    constraint: StructuredOutputsParams | None = None

    def add_to_messages(self, messages: list[dict], template: str | None) -> list[dict]:
        """Templates that do not render tools get them described in a system message."""
        if not self.tools or template_renders_tools(template):
            return messages
        prompt = tools_system_prompt(self.tools)
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}"}, *messages[1:]]
        return [{"role": "system", "content": prompt}, *messages]


def plan_tools(req: ChatCompletionRequest) -> ToolPlan:
    """Raises APIError (400) for a tool_choice that the tools cannot satisfy."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tools must have distinct function names", param="tools")
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return ToolPlan([], None)
    if not tools:
        raise APIError(400, f"tool_choice {choice if isinstance(choice, str) else 'of a named function'} needs "
                            "tools", param="tool_choice")
    if isinstance(choice, str):
        mode, name = choice, None
    else:
        mode, name = "named", choice.function.name
        if name not in names:
            raise APIError(400, f"tool_choice names the function {name!r}, which is not in tools "
                                f"({', '.join(names)})", param="tool_choice")
    try:
        choice_obj = {"type": "function", "function": {"name": name}} if name is not None else mode
        constraint = tool_choice_constraint(tools, choice_obj, req.parallel_tool_calls is not False)
    except ValueError as e:
        raise APIError(400, f"tools: {e}", param="tools") from None
    return ToolPlan(tools, mode, name, constraint)


def finish_message(plan: ToolPlan, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """The assistant message of a whole response, and its finish_reason."""
    if plan.mode is None:
        return {"role": "assistant", "content": text}, finish_reason
    if plan.mode == "named":
        if finish_reason != "stop":  # cut short: the arguments are not complete JSON
            return {"role": "assistant", "content": text}, finish_reason
        call = ToolCall(plan.name or "", text)
        return {"role": "assistant", "content": None, "tool_calls": [call_json(call, new_call_id())]}, "stop"
    content, calls = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    return ({"role": "assistant", "content": content, "tool_calls": [call_json(c, new_call_id()) for c in calls]},
            "tool_calls" if finish_reason == "stop" else finish_reason)


@dataclass
class ToolStream:
    """Per-choice state of a streamed response with tools: turns text deltas into chat deltas."""

    plan: ToolPlan
    parser: StreamingToolParser | None = None
    num_calls: int = 0
    call_id: str = field(default_factory=new_call_id)

    def __post_init__(self) -> None:
        if self.plan.mode in ("auto", "required"):
            self.parser = StreamingToolParser(json_only=self.plan.mode == "required")

    def delta(self, new_text: str, finished: bool) -> dict:
        """The chat delta for new text ({} when there is nothing to send yet)."""
        if self.plan.mode is None:
            return {"content": new_text} if new_text else {}
        if self.plan.mode == "named":
            entry: dict = {"index": 0, "function": {"arguments": new_text}}
            if self.num_calls == 0:
                entry.update(id=self.call_id, type="function", function={"name": self.plan.name,
                                                                           "arguments": new_text})
                self.num_calls = 1
            elif not new_text:
                return {}
            return {"tool_calls": [entry]}
        assert self.parser is not None
        content, calls = self.parser.feed(new_text)
        if finished:
            more, late = self.parser.finish()
            content, calls = content + more, calls + late
        out: dict = {}
        if content:
            out["content"] = content
        if calls:
            out["tool_calls"] = [{"index": self.num_calls + k, **call_json(c, new_call_id())}
                                 for k, c in enumerate(calls)]
            self.num_calls += len(calls)
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        if self.plan.mode in ("auto", "required") and self.num_calls and reason == "stop":
            return "tool_calls"
        return reason
