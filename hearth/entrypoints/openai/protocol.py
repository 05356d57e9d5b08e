"""Request bodies of the OpenAI API (plus vLLM's extra sampling fields), as pydantic models.

Unknown fields are accepted and ignored (clients send fields we don't use); known fields are type-checked, and a
wrong type becomes a 400 naming the field. Range checks live in SamplingParams, one place for both doors.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from hearth.sampling_params import SamplingParams


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _SamplingFields(OpenAIModel):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    n: StrictInt = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None
    min_p: float | None = None
    # NOTE: torch generators take 64-bit seeds, and sequence i of n uses seed + i: bound it here.
    seed: StrictInt | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: StrictBool = False
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    skip_special_tokens: StrictBool = True
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def sampling_params(self, max_tokens: int | None, logprobs: int | None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """Raises ValueError (a 400) for out-of-range values."""
        bias = None
        if self.logit_bias:
            try:
                bias = {int(k): v for k, v in self.logit_bias.items()}
            except ValueError:
                raise ValueError("logit_bias keys must be token ids (integers as strings)") from None
        return SamplingParams(
            n=self.n, temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0,
            min_p=self.min_p or 0.0, seed=self.seed, presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=bias, stop=self.stop, stop_token_ids=self.stop_token_ids,
            include_stop_str_in_output=self.include_stop_str_in_output, ignore_eos=self.ignore_eos,
            max_tokens=max_tokens, min_tokens=self.min_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


Prompt = str | list[str] | list[StrictInt] | list[list[StrictInt]]


class CompletionRequest(_SamplingFields):
    prompt: Prompt
    max_tokens: StrictInt | None = 16
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    prompt_logprobs: StrictInt | None = None
    suffix: str | None = None
    best_of: StrictInt | None = None
    add_special_tokens: StrictBool = True


class TextPart(OpenAIModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The message as the chat template sees it: text parts joined, other part types refused."""
        content = self.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise ValueError(f"message content parts of type {part.type!r} are not supported (text only)")
                texts.append(part.text)
            content = "\n".join(texts)
        msg: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name is not None:
            msg["name"] = self.name
        return msg


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = None
    echo: StrictBool = False
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: StrictBool = False


class TokenizeRequest(OpenAIModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[StrictInt]
