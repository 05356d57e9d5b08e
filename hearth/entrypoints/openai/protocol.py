"""Request bodies of the OpenAI API (plus vLLM's extra sampling fields), as pydantic models.

Unknown fields are accepted and ignored (clients send fields we don't use); known fields are type-checked, and a
wrong type becomes a 400 naming the field. Range checks live in SamplingParams, one place for both doors.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from hearth.entrypoints.openai.body import JSONTextError, parse_json
from hearth.errors import ParamError
from hearth.sampling_params import SamplingParams
from hearth.structured.params import StructuredOutputsParams


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class JSONSchemaFormat(OpenAIModel):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputsField(OpenAIModel):
    """vLLM's `structured_outputs` object."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: StrictBool | None = None
    disable_any_whitespace: StrictBool | None = None
    structural_tag: Any = None


class LoRAScale(OpenAIModel):
    """One entry of llama-server's per-request `lora` list: an adapter by its index in --lora-modules, and what its
    delta is multiplied by (0: off)."""
    id: StrictInt
    scale: float


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
    priority: StrictInt = Field(default=0, ge=-(2**31), le=2**31 - 1)  # vLLM's: with --scheduling-policy priority
    lora: list[LoRAScale] | None = None  # llama-server's per-request adapters (lora_select.py)
    # Structured output: OpenAI's response_format, vLLM's guided_* fields and structured_outputs object.
    response_format: ResponseFormat | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None  # accepted and ignored: hearth has one backend
    structured_outputs: StructuredOutputsField | None = None

    def structured_params(self) -> tuple[StructuredOutputsParams | None, str | None]:
        """The requested constraint and the field that asked for it. Raises ParamError naming the problem."""
        asked: list[tuple[str, dict[str, Any]]] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            asked.append(("response_format", {"json_object": True}))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise ParamError("response_format", "response_format of type json_schema needs json_schema.schema")
            asked.append(("response_format", {"json": rf.json_schema.schema_}))
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                          ("guided_grammar", "grammar")):
            if getattr(self, name) is not None:
                asked.append((name, {key: getattr(self, name)}))
        so = self.structured_outputs
        if so is not None:
            if so.structural_tag is not None:
                raise ParamError("structured_outputs",
                                 "structured_outputs.structural_tag is not supported by this server")
            fields = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar,
                      "json_object": so.json_object}
            asked.append(("structured_outputs", {k: v for k, v in fields.items() if v is not None}))
            if so.disable_any_whitespace is not None:
                asked[-1][1]["disable_any_whitespace"] = so.disable_any_whitespace
        if not asked:
            return None, None
        if len(asked) > 1:
            raise ParamError(asked[1][0], f"give one structured output constraint, not several "
                                         f"({', '.join(n for n, _ in asked)})")
        name, kwargs = asked[0]
        try:
            return StructuredOutputsParams(**kwargs), name
        except ValueError as e:
            raise ParamError(name, f"{name}: {e}") from None

    def sampling_params(self, max_tokens: int | None, logprobs: int | None,
                        prompt_logprobs: int | None = None,
                        structured_outputs: StructuredOutputsParams | None = None,
                        defaults: dict[str, Any] | None = None, room: int | None = None) -> SamplingParams:
        """Raises ValueError (a 400) for out-of-range values. defaults: the engine's generation_defaults, for the
        fields the request leaves unset; a default max_tokens is cut to `room` (the context the prompt leaves)."""
        d = dict(defaults or {})
        if room is not None and d.get("max_tokens") is not None:
            d["max_tokens"] = max(1, min(d["max_tokens"], room))

        def pick(value: Any, name: str, fallback: Any) -> Any:
            return value if value is not None else d.get(name, fallback)
        bias = None
        if self.logit_bias:
            try:
                bias = {int(k): v for k, v in self.logit_bias.items()}
            except ValueError:
                raise ParamError("logit_bias", "logit_bias keys must be token ids (integers as strings)") from None
        return SamplingParams(
            n=self.n, temperature=pick(self.temperature, "temperature", 1.0),
            top_p=pick(self.top_p, "top_p", 1.0), top_k=pick(self.top_k, "top_k", 0) or 0,
            min_p=pick(self.min_p, "min_p", 0.0), seed=self.seed, presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=pick(self.repetition_penalty, "repetition_penalty", 1.0),
            logit_bias=bias, stop=self.stop, stop_token_ids=self.stop_token_ids,
            include_stop_str_in_output=self.include_stop_str_in_output, ignore_eos=self.ignore_eos,
            max_tokens=pick(max_tokens, "max_tokens", None), min_tokens=self.min_tokens, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens, structured_outputs=structured_outputs,
            priority=self.priority)

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


class ImageURL(OpenAIModel):
    url: str
    detail: str | None = None


class TextPart(OpenAIModel):
    """A content part: {"type": "text", "text"} or {"type": "image_url", "image_url": {"url"}}."""
    type: str
    text: str | None = None
    image_url: ImageURL | str | None = None

    @property
    def image_url_str(self) -> str | None:
        return self.image_url.url if isinstance(self.image_url, ImageURL) else self.image_url


class FunctionCall(OpenAIModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallMessage(OpenAIModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallMessage] | None = None
    tool_call_id: str | None = None

    def image_parts(self) -> list[TextPart]:
        return [p for p in self.content if p.type == "image_url"] if isinstance(self.content, list) else []

    def as_dict(self, image_text: str | None = None) -> dict[str, Any]:
        """The message as the chat template sees it: text parts joined, each image part as image_text (the model's
        image placeholder, where the image goes; None: images refused), other part types refused."""
        content = self.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type == "image_url" and image_text is not None:
                    texts.append(image_text)
                    continue
                if part.type != "text" or part.text is None:
                    raise ValueError(f"message content parts of type {part.type!r} are not supported (text only)")
                texts.append(part.text)
            content = "\n".join(texts)
        msg: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name is not None:
            msg["name"] = self.name
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                                 for c in self.tool_calls]
        return msg


def _arguments(args: str | dict[str, Any]) -> dict[str, Any]:
    """Templates render arguments as an object (`| tojson`): parse the JSON text a client sends back."""
    if isinstance(args, dict):
        return args
    try:
        value = parse_json(args or "{}")
    except JSONTextError as e:
        raise ValueError(f"tool call arguments must be a JSON object ({e}), got {args[:100]!r}") from None
    if not isinstance(value, dict):  # NOTE: ValueError, not TypeError: render_chat makes it a 400
        raise ValueError(f"tool call arguments must be a JSON object, got {args[:100]!r}")  # noqa: TRY004
    return value


class FunctionDefinition(OpenAIModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(OpenAIModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"] = "function"
    function: NamedFunction


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
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = True


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
