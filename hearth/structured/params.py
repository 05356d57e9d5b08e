"""StructuredOutputsParams: which constraint a request's output must satisfy (vLLM's field names).

Exactly one of json / regex / choice / grammar / json_object. Validated here (shape only); whether the schema, regex
or grammar is one the grammar library accepts is checked when it is compiled (GrammarCompiler.compile).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema (object or its text)
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None  # Lark, or EBNF/GBNF (llama.cpp style: `root ::= ...`)
    json_object: bool | None = None  # any JSON object
    # NOTE: True by default (unlike vLLM): with arbitrary whitespace a weak model can emit blanks until max_tokens.
    disable_any_whitespace: bool = True

    def __post_init__(self) -> None:
        given = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            what = "none" if not given else ", ".join(given)
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(_KINDS)} (got {what})")
        if self.json is not None:
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as e:
                    raise ValueError(f"json schema is not valid JSON: {e}") from None
            if not isinstance(schema, dict | bool):
                raise ValueError(f"json schema must be a JSON object, got {type(schema).__name__}")
            object.__setattr__(self, "json", schema)
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError("regex must be a non-empty string")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError("grammar must be a non-empty string")
        if self.choice is not None:
            if (not isinstance(self.choice, list | tuple) or not self.choice
                    or any(not isinstance(c, str) or not c for c in self.choice)):
                raise ValueError("choice must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", tuple(self.choice))

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if getattr(self, k) not in (None, False))

    def describe(self) -> str:
        return {"json": "JSON schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
                "json_object": "JSON object"}[self.kind]
