"""The load of `hearth bench lab`: students in a closed loop (ask, read the streamed answer, think, ask again), their
prompts (one shared course preamble, a question of each request's own), and the server's prefix-cache counters."""
from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hearth.benchmarks.common import (
    RequestResult,
    TokenSampler,
    completion_payload,
    random_prompts,
    random_text_prompts,
    stream_completion,
)

if TYPE_CHECKING:
    import httpx


class LabPrompts:
    """Prompts = the course preamble, identical to the byte and token for every student (so a prefix cache can hit
    it), then a random question. Token ids for hearth and vLLM; random words when `sampler` is None (llama-server)."""

    def __init__(self, sampler: TokenSampler | None, preamble_len: int, question_len: int, seed: int) -> None:
        self.sampler = sampler
        self.question_len = question_len
        if sampler is None:
            self.preamble: str | list[int] = random_text_prompts(1, preamble_len, seed)[0]
        else:
            self.preamble = random_prompts(sampler, 1, preamble_len, seed)[0]

    def ask(self, rng: random.Random) -> str | list[int]:
        """A new question after the preamble, drawn from this student's rng."""
        seed = rng.getrandbits(48)
        if self.sampler is None:
            # NOTE: the space goes before the question, so the preamble's words tokenize the same in every prompt.
            return f"{self.preamble} {random_text_prompts(1, self.question_len, seed)[0]}"
        return self.preamble + random_prompts(self.sampler, 1, self.question_len, seed)[0]


@dataclass
class LevelLoad:
    """How one level's students behave."""

    students: int
    duration_s: float  # students keep asking until ramp_up_s + duration_s after the level starts
    ramp_up_s: float  # student i first asks at i * ramp_up_s / students
    think_s: tuple[float, float]  # reading time between an answer and the next question, uniform
    output_len: int
    seed: int  # this level's: questions and think times


@dataclass
class Answer:
    """One request of one student, timed from the level's start."""

    student: int
    sent_s: float
    result: RequestResult


async def run_level(client: httpx.AsyncClient, url: str, model: str, prompts: LabPrompts,
                    load: LevelLoad) -> tuple[list[Answer], float]:
    """Every student's closed loop until the deadline; requests in flight then are waited for, not cut off (cutting
    them would drop the slowest answers). Returns the answers and the level's wall time, start to last answer."""
    answers: list[Answer] = []
    t0 = time.perf_counter()
    stop_at = load.ramp_up_s + load.duration_s

    async def student(i: int) -> None:
        rng = random.Random(f"{load.seed}:{i}")  # a str seed is hashed the same in every process
        await asyncio.sleep(i * load.ramp_up_s / load.students)
        while True:
            payload = completion_payload(model, prompts.ask(rng), load.output_len)
            sent = time.perf_counter() - t0
            result = await stream_completion(client, url, payload)
            answers.append(Answer(i, sent, result))
            think = rng.uniform(*load.think_s)
            if time.perf_counter() - t0 + think >= stop_at:
                return
            await asyncio.sleep(think)

    await asyncio.gather(*(student(i) for i in range(load.students)))
    answers.sort(key=lambda a: a.sent_s)
    return answers, time.perf_counter() - t0


# Counter names as vLLM and hearth expose them (tokens queried / found in the prefix cache).
_QUERIES = "vllm:prefix_cache_queries_total"
_HITS = "vllm:prefix_cache_hits_total"


def parse_prefix_counters(text: str) -> tuple[float, float] | None:
    """(queried tokens, hit tokens) summed over label sets from a Prometheus /metrics page; None without them."""
    sums = {_QUERIES: 0.0, _HITS: 0.0}
    seen = set()
    for m in re.finditer(r"^([\w:]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", text, re.MULTILINE):
        if m.group(1) in sums:
            sums[m.group(1)] += float(m.group(2))
            seen.add(m.group(1))
    return (sums[_QUERIES], sums[_HITS]) if len(seen) == 2 else None


async def prefix_counters(client: httpx.AsyncClient, root: str) -> tuple[float, float] | None:
    """The server's prefix-cache counters now, or None when it has no /metrics or not these (llama-server)."""
    import httpx

    try:
        resp = await client.get(f"{root}/metrics")
    except httpx.HTTPError:
        return None
    return parse_prefix_counters(resp.text) if resp.status_code == 200 else None


def hit_rate(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """Hit tokens / queried tokens between two readings of the counters."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])
