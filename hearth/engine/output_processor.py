"""The front side of a request's outputs: token ids -> text deltas, stop strings, hidden stop tokens (vLLM v1's
output processor). The engine core deals in token ids only; this runs where the outputs are read (the server's
event loop, the offline API's caller), never on the engine thread.

A stop string ends a sequence here: its output is cut at the stop, later tokens are dropped, and `to_stop` lists
the sequences the engine must finish (their KV blocks freed); outputs that still arrive for them are ignored.
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING

from hearth.detokenizer import IncrementalDetokenizer, find_stop, partial_stop_len
from hearth.engine.outputs import StepOutput
from hearth.sampling_params import SamplingParams
from hearth.tokenizer import Tokenizer

if TYPE_CHECKING:
    from hearth.engine.llm_engine import LLMEngine
    from hearth.engine.protocol import EngineRequest


@dataclass
class _SequenceText:
    params: SamplingParams
    prompt_token_ids: list[int]
    detok: IncrementalDetokenizer | None = None  # made at the first output
    emitted_chars: int = 0
    finished: bool = False

    @property
    def wants_text(self) -> bool:
        return isinstance(self.params, SamplingParams) and self.params.detokenize


@dataclass(frozen=True)
class StopRequest:
    """A sequence the engine must finish: the front found `stop` in its text."""

    request_id: str
    index: int
    stop: str


class OutputProcessor:
    """Text for the outputs of the requests added to it. Not thread-safe: one reader."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._seqs: dict[tuple[str, int], _SequenceText] = {}
        self.num_unfinished = 0  # sequences added and not yet finished here
        self.to_stop: list[StopRequest] = []  # filled by process(); the caller drains it

    @classmethod
    def for_requests(cls, tokenizer: Tokenizer, requests: list[EngineRequest]) -> OutputProcessor:
        """A processor for one stream's engine requests."""
        processor = cls(tokenizer)
        for r in requests:
            processor.add_request(r.request_id, r.prompt_token_ids, r.params)
        return processor

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        for i in range(getattr(params, "n", 1)):  # (pooling params: one output, no text)
            self._seqs[(request_id, i)] = _SequenceText(params, prompt_token_ids)
            self.num_unfinished += 1

    def process(self, outputs: list[StepOutput]) -> list[StepOutput]:
        """Fill each output's new_text (in place); drop outputs of sequences that already ended here."""
        kept = []
        for out in outputs:
            seq = self._seqs.get((out.request_id, out.index))
            if seq is None:  # not added here (an output of another reader's request)
                kept.append(out)
                continue
            if seq.finished:
                continue
            if seq.wants_text:
                if seq.detok is None:
                    seq.detok = IncrementalDetokenizer(self.tokenizer, seq.prompt_token_ids,
                                                       seq.params.skip_special_tokens)
                self._detokenize(seq, out)
            if out.finished:
                seq.finished = True
                self.num_unfinished -= 1
            kept.append(out)
        return kept

    def _detokenize(self, seq: _SequenceText, out: StepOutput) -> None:
        p, detok = seq.params, seq.detok
        tokens = out.new_token_ids
        hide_last = out.ended_by_stop_token and (out.stop_reason is None or not p.include_stop_str_in_output)
        first_output_count = out.num_output_tokens - len(tokens)  # output tokens before this delta
        for i, token in enumerate(tokens):
            last = i == len(tokens) - 1
            if not (last and hide_last):
                detok.add_one(token)
            done = last and out.finished
            if done:
                detok.flush()
            text = detok.text
            # NOTE: the length limit too: a stop string in the last allowed token still ends (and cuts) the text.
            can_stop = out.finish_reason in (None, "length") or not done
            if p.stop_strings and first_output_count + i + 1 >= p.min_tokens and can_stop:
                # Only text not yet streamed: a stop string that began in streamed text (possible only while
                # min_tokens held the check off) was let through then and must not cut what the client has.
                hit = find_stop(text, len(text) - seq.emitted_chars, p.stop_strings)
                if hit is not None and hit[0] >= seq.emitted_chars:
                    start, stop = hit
                    detok.text = text[:start + len(stop) if p.include_stop_str_in_output else start]
                    self._end_at_stop(out, i, stop)
                    self.to_stop.append(StopRequest(out.request_id, out.index, stop))
                    break
        text = detok.text
        visible = len(text)
        if not out.finished and p.stop_strings:
            visible -= partial_stop_len(text, p.stop_strings)  # hold back what may become a stop string
        if visible > seq.emitted_chars:
            out.new_text = text[seq.emitted_chars:visible]
            seq.emitted_chars = visible

    @staticmethod
    def _end_at_stop(out: StepOutput, i: int, stop: str) -> None:
        """The sequence ends at its i-th new token: later tokens (a speculative step's) are dropped."""
        dropped = len(out.new_token_ids) - (i + 1)
        del out.new_token_ids[i + 1:]
        del out.new_logprobs[i + 1:]
        out.num_output_tokens -= dropped
        out.finished, out.finish_reason, out.stop_reason = True, "stop", stop
        out.ended_by_stop_token = False


def run_step(engine: LLMEngine, processor: OutputProcessor) -> list[StepOutput]:
    """One engine step on the caller's thread (the offline doors), its outputs with text; the sequences ended at a
    stop string are finished in the engine before it steps again."""
    outputs = processor.process(engine.step())
    for s in processor.to_stop:
        engine.stop_sequence(s.request_id, s.index, s.stop)
    processor.to_stop = []
    return outputs
