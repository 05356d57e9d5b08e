"""Building the engine for the offline benchmarks, and describing it in the results."""
from __future__ import annotations

import argparse
import os
import time


def build_engine(ns: argparse.Namespace):
    """LLMEngine from the engine flags (hearth.entrypoints.cli.add_engine_args); returns (engine, load seconds)."""
    from hearth.engine.llm_engine import LLMEngine
    from hearth.entrypoints.cli import engine_args_from

    t0 = time.perf_counter()
    engine = LLMEngine(engine_args_from(ns))
    return engine, time.perf_counter() - t0


def describe(engine, load_s: float) -> dict:
    mc = engine.model_config
    return {
        "model": os.path.basename(os.path.normpath(mc.model)),
        "model_path": mc.model,
        "architecture": mc.architecture,
        "dtype": str(mc.dtype).removeprefix("torch."),
        "threads": engine.threads,
        "max_num_seqs": engine.scheduler_config.max_num_seqs,
        "speculative_config": engine.args.speculative_config,
        "load_s": load_s,
    }
