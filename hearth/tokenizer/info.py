"""TokenizerInfo: the facts hearth keeps beside a tokenizer's backend (and caches with it)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TokenizerInfo:
    """What hearth needs besides the backend: the same values transformers' tokenizer reports."""
    vocab_size: int  # len(tokenizer): base vocabulary + added tokens
    eos_token_id: int | None
    special_ids: list[int]
    special_tokens: dict[str, Any] = field(default_factory=dict)  # bos_token, eos_token, ...: chat template variables
    chat_template: str | dict[str, str] | None = None  # a dict holds named templates ("default", "tool_use")
    cleanup: bool = False  # decode applies clean_up_tokenization (transformers' clean_up_tokenization_spaces)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TokenizerInfo:
        return cls(**data)
