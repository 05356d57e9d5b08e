"""Typed user errors raised below the doors: the serving layer maps them to 4xx without reading their text, and
the CLI prints them as one line."""
from __future__ import annotations


class LoadError(ValueError):
    """A model that cannot be loaded. The message is one line naming the cause and the fix."""


class ParamError(ValueError):
    """One request parameter is wrong: `param` names its API field (None: no single field), the message says what
    to change. A ValueError, so callers that only tell user errors from bugs keep working."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(ParamError):
    """The prompt and the tokens asked for do not fit in the model's context. `param` is "prompt" when the prompt
    alone is too long, else "max_tokens"."""

    def __init__(self, message: str, prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
        too_long_prompt = max_tokens is None or prompt_tokens >= max_model_len
        super().__init__("prompt" if too_long_prompt else "max_tokens", message)
        self.prompt_tokens, self.max_tokens, self.max_model_len = prompt_tokens, max_tokens, max_model_len


class LoRAError(ValueError):
    """A LoRA adapter that cannot be served (missing, corrupt, over the rank limit, for another base model, or using
    a PEFT feature hearth lacks). The message is one line naming the adapter and the cause."""
