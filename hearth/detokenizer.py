"""Incremental detokenization that never splits a multi-byte character, and stop-string matching."""
from __future__ import annotations

from tokenizers.decoders import DecodeStream

from hearth.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decodes a short window of tokens (from prefix_offset) and emits the part past what was already emitted;
    while the newest tokens end in an incomplete UTF-8 sequence (decoded as U+FFFD) nothing is emitted.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        # Start the window on a few prompt tokens so leading-space handling (sentencepiece) is right.
        self.context = list(prompt_token_ids[-4:])
        self.prefix_offset = 0
        self.read_offset = len(self.context)
        self.text = ""
        # tokenizers' DecodeStream runs the same window algorithm in one call per token (two decodes here). Not when
        # the tokenizer's text needs transformers' cleanup (it applies to whole strings), nor when the prompt ends
        # inside a character (DecodeStream then re-emits the prompt's tail with the first token).
        self._stream = None
        if not tokenizer.info.cleanup and not self._decode(self.context).endswith("\ufffd"):
            self._stream = DecodeStream(ids=list(self.context), skip_special_tokens=skip_special_tokens)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_token_ids: list[int]) -> str:
        """Append tokens; return the newly completed text (possibly empty)."""
        return "".join([self.add_one(tok) for tok in new_token_ids])

    def add_one(self, tok: int) -> str:
        """Append one token; return the newly completed text (possibly empty)."""
        self.token_ids.append(tok)
        self.context.append(tok)
        piece = self._window_piece() if self._stream is None else self._stream_piece(tok)
        if piece:  # (nothing while the newest tokens end inside a character)
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.context)
            self.text += piece
        return piece

    def _window_piece(self) -> str:
        prefix_text = self._decode(self.context[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.context[self.prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            return new_text[len(prefix_text):]
        return ""

    def _stream_piece(self, tok: int) -> str:
        try:
            return self._stream.step(self.tokenizer.backend, tok) or ""
        except Exception:  # e.g. its prefix check failing on an odd decoder: the window algorithm from here on
            self._stream = None
            return self._window_piece()

    def flush(self) -> str:
        """At the end: emit whatever is held back (an incomplete character decodes as U+FFFD)."""
        if self.read_offset < len(self.context):
            prefix_text = self._decode(self.context[self.prefix_offset:self.read_offset])
            rest = self._decode(self.context[self.prefix_offset:])[len(prefix_text):]
            self.read_offset = len(self.context)
            self.text += rest
            return rest
        return ""


def find_stop(text: str, new_len: int, stops: list[str]) -> tuple[int, str] | None:
    """Earliest stop string that ends within the last new_len characters: (its start index, the string)."""
    best: tuple[int, str] | None = None
    for s in stops:
        start_from = max(0, len(text) - new_len - len(s) + 1)
        i = text.find(s, start_from)
        if i != -1 and (best is None or i < best[0]):
            best = (i, s)
    return best


def partial_stop_len(text: str, stops: list[str]) -> int:
    """Length of the longest tail of text that could be the start of a stop string: hold it back when streaming."""
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                held = max(held, k)
                break
    return held
