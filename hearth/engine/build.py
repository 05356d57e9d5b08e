"""Building an LLMEngine on a thread that then exits (the server, its worker processes and Ray replicas all do)."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hearth.config import EngineArgs
    from hearth.engine.llm_engine import LLMEngine


def build_engine(args: EngineArgs) -> LLMEngine:
    """The engine, built on a short-lived thread that takes the load's OpenMP worker pool with it when it exits:
    libgomp counts every pool's threads, and with more of them than CPUs it stops spinning at barriers, so the
    engine thread's pool would sleep and wake on a futex at each parallel region of a step. Errors re-raise here."""
    from hearth.engine.llm_engine import LLMEngine

    result: list = []

    def build() -> None:
        try:
            result.append(LLMEngine(args))
        except BaseException as e:  # re-raised on the caller's thread
            result.append(e)

    loader = threading.Thread(target=build, name="hearth-load")
    loader.start()
    loader.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]
