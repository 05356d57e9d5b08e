"""Reasoning output (`--reasoning-parser`, vLLM's names): the text between <think> and </think> is the message's
`reasoning_content`, the rest its `content`; whole texts and streamed deltas.

qwen3: the model opens its thinking itself (or the prompt does); output without </think> is all content.
deepseek_r1: the template opens the thinking in the prompt, so output starts in reasoning until </think>.
Either way a prompt that ends inside an open <think> (a template that writes it) starts the output in reasoning,
and one whose thinking is already closed (Qwen3 with enable_thinking false) starts it in content.
"""
from __future__ import annotations

from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONING_PARSERS = ("qwen3", "deepseek_r1")


@dataclass(frozen=True)
class ReasoningParser:
    name: str  # one of REASONING_PARSERS

    def initial_state(self, prompt_text: str) -> str:
        """Where the output begins, from what the prompt already wrote: "think" (inside the thinking), "before"
        (the model may open it) or "done" (the template closed it: enable_thinking false)."""
        opened, closed = prompt_text.rfind(THINK_OPEN), prompt_text.rfind(THINK_CLOSE)
        if opened > closed:
            return "think"
        if closed >= 0:
            return "done"
        return "think" if self.name == "deepseek_r1" else "before"

    def starts_in_reasoning(self, prompt_text: str) -> bool:
        return self.initial_state(prompt_text) == "think"

    def split(self, text: str, in_reasoning: bool) -> tuple[str | None, str]:
        """A whole output as (reasoning or None, content)."""
        stream = ReasoningStream(in_reasoning)
        reasoning, content = stream.feed(text)
        more_r, more_c = stream.finish()
        reasoning, content = reasoning + more_r, content + more_c
        return (reasoning if stream.opened else None), content


def get_parser(name: str | None) -> ReasoningParser | None:
    if name is None:
        return None
    if name not in REASONING_PARSERS:
        raise ValueError(f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, got {name!r}")
    return ReasoningParser(name)


class ReasoningStream:
    """Splits streamed text into (reasoning, content) deltas, holding back what may be the start of a tag."""

    def __init__(self, in_reasoning: bool) -> None:
        self.mode = "start" if not in_reasoning else "think"  # start | think | after | content
        self.buf = ""
        self.opened = in_reasoning  # a thinking block began (in the prompt or the output)
        self.closed = False

    def feed(self, delta: str) -> tuple[str, str]:
        self.buf += delta
        reasoning, content = [], []
        while self.buf:
            if self.mode == "start":
                s = self.buf.lstrip()
                if s.startswith(THINK_OPEN):
                    self.buf, self.mode, self.opened = s[len(THINK_OPEN):], "think", True
                    continue
                if not s or THINK_OPEN.startswith(s):
                    break  # undecided yet
                self.mode = "content"
            if self.mode == "think":
                if self.buf.startswith(THINK_OPEN):  # a template-opened block the model opens again
                    self.buf = self.buf[len(THINK_OPEN):]
                i = self.buf.find(THINK_CLOSE)
                if i < 0:
                    keep = _partial_suffix(self.buf, THINK_CLOSE)
                    reasoning.append(self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                reasoning.append(self.buf[:i])
                self.buf, self.mode, self.closed = self.buf[i + len(THINK_CLOSE):], "after", True
                continue
            if self.mode == "after":  # NOTE: templates put blank lines after </think>; they belong to neither part
                self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    break
                self.mode = "content"
            content.append(self.buf)
            self.buf = ""
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        buf, self.buf = self.buf, ""
        return (buf, "") if self.mode == "think" else ("", buf)

    @property
    def in_reasoning(self) -> bool:
        return self.mode == "think"


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
