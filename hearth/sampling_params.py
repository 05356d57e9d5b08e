"""SamplingParams: what one request asks of the sampler and the stop logic. Validated once, here."""
import difflib
import functools
import logging
import math
from dataclasses import dataclass, field, fields
from enum import IntEnum

from hearth.errors import ParamError
from hearth.structured.params import StructuredOutputsParams
from hearth.structured.reasoning import ReasoningParams

logger = logging.getLogger("hearth")

_GREEDY_EPS = 1e-5
MAX_N = 128


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    detokenize: bool = True
    # A grammar the output must follow (JSON schema, regex, choice, grammar): see hearth/structured/.
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's request priority (an add_request argument there): lower runs first under --scheduling-policy priority.
    priority: int = 0
    # A reasoning model's thinking: the grammar waits for its end, a budget forces it (hearth/structured/reasoning.py).
    reasoning: ReasoningParams | None = None
    # Filled by the engine, not the user: stop strings as a list, resolved max_tokens.
    _stop_list: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self._stop_list = [self.stop]
        elif self.stop is None:
            self._stop_list = []
        else:
            self._stop_list = list(self.stop)
        if self.top_k is None or self.top_k == -1:
            self.top_k = 0
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        bad = ParamError

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", f"n must be an integer >= 1, got {self.n!r}")
        if self.n > MAX_N:
            raise bad("n", f"n must be <= {MAX_N} (OpenAI's limit), got {self.n}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise bad("temperature", f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", f"top_k must be -1 (disabled), 0 (disabled) or a positive integer, got {self.top_k!r}")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise bad("repetition_penalty", f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise bad("logprobs", f"logprobs must be in [0, 20], got {self.logprobs}")
        if self.prompt_logprobs is not None and (not isinstance(self.prompt_logprobs, int)
                                                 or not 0 <= self.prompt_logprobs <= 20):
            raise bad("prompt_logprobs", f"prompt_logprobs must be in [0, 20], got {self.prompt_logprobs}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", f"seed must be an integer, got {self.seed!r}")
        # Sequence i of n samples with seed + i; torch generators take 64-bit seeds.
        if self.seed is not None and not -(2**63) <= self.seed <= 2**63 - self.n:
            raise bad("seed", f"seed must fit in a signed 64-bit integer, got {self.seed}")
        if any(not isinstance(s, str) or not s for s in self._stop_list):
            raise bad("stop", "stop must be a non-empty string or a list of non-empty strings")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise bad("structured_outputs", "structured_outputs must be a StructuredOutputsParams")
        if self.logit_bias:
            for tok, bias in self.logit_bias.items():
                try:
                    int(tok), float(bias)
                except (TypeError, ValueError):
                    raise bad("logit_bias",
                              f"logit_bias must map token ids to numbers, got {tok!r}: {bias!r}") from None
                if not -100.0 <= float(bias) <= 100.0:
                    raise bad("logit_bias", f"logit_bias values must be in [-100, 100], got {bias} for token {tok}")
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _GREEDY_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM_SEED if self.seed is not None else SamplingType.RANDOM

    @property
    def stop_strings(self) -> list[str]:
        return self._stop_list

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids the user named must exist in the model's vocabulary."""
        for name, ids in (("logit_bias", list(self.logit_bias or {})), ("stop_token_ids", self.stop_token_ids or [])):
            for tok in ids:
                if not 0 <= tok < vocab_size:
                    raise ParamError(name, f"{name}: token id {tok} is out of range for this model's vocabulary "
                                     f"(size {vocab_size})")


# Keywords field reports pass that no sampler takes: accepted with a note (continuous batching forms the batches).
_NOTED_KEYWORDS = {"batch_size": "continuous batching decides batches; --max-num-seqs caps the sequences in flight"}


def _checked_init(init):
    """The dataclass __init__, taking the noted keywords above with one info line and naming the nearest field of
    any other unknown keyword in its TypeError."""
    names = [f.name for f in fields(SamplingParams) if not f.name.startswith("_")]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs) -> None:
        for key in [k for k in kwargs if k in _NOTED_KEYWORDS]:
            logger.info("SamplingParams(%s=%r) accepted and ignored: %s", key, kwargs.pop(key), _NOTED_KEYWORDS[key])
        unknown = [k for k in kwargs if k not in names and k != "_stop_list"]
        if unknown:
            close = difflib.get_close_matches(unknown[0], names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"SamplingParams got an unexpected keyword argument {unknown[0]!r}{hint}")
        init(self, *args, **kwargs)

    return __init__


SamplingParams.__init__ = _checked_init(SamplingParams.__init__)
