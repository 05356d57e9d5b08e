"""Embedding throughput of a sentence-transformers folder: hearth's LLM.embed against sentence-transformers on the
same texts (each exactly --tokens tokens with [CLS]/[SEP]), one batch of --batch texts per run, medians of --runs.

python -m hearth.benchmarks.embed_throughput FOLDER [--dtype auto] [--threads 2] [--sentence-transformers]
"""
from __future__ import annotations

import argparse
import statistics
import time

from hearth.benchmarks.common import WORDS


def make_texts(folder: str, n: int, tokens: int) -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    texts = []
    for i in range(n):
        ids = tok(" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(2 * tokens)),
                  add_special_tokens=False)["input_ids"][:tokens - 2]
        texts.append(tok.decode(ids))
    return texts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hearth.benchmarks.embed_throughput")
    p.add_argument("folder")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--sentence-transformers", action="store_true", help="time sentence-transformers instead")
    ns = p.parse_args(argv)
    texts = make_texts(ns.folder, ns.batch, ns.tokens)
    if ns.sentence_transformers:
        import torch
        from sentence_transformers import SentenceTransformer

        if ns.threads:
            torch.set_num_threads(ns.threads)
        model = SentenceTransformer(ns.folder, device="cpu")
        name = "sentence-transformers (float32)"

        def run() -> None:
            model.encode(texts, batch_size=ns.batch)
    else:
        from hearth import LLM

        llm = LLM(ns.folder, dtype=ns.dtype, threads=ns.threads)
        name = f"hearth LLM.embed ({str(llm.engine.model_config.dtype).removeprefix('torch.')})"

        def run() -> None:
            llm.embed(texts)
    run()  # warm-up
    rates = []
    for _ in range(ns.runs):
        t0 = time.perf_counter()
        run()
        rates.append(ns.batch / (time.perf_counter() - t0))
    print(f"{name}: {statistics.median(rates):.1f} texts/s median of {ns.runs} "
          f"({', '.join(f'{r:.1f}' for r in rates)}); {ns.batch} texts x {ns.tokens} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
