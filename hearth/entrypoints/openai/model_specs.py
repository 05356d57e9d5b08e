"""Which models a multi-model server offers: every .gguf file and HF folder of --models-dir, and/or the entries of
a --models-config TOML file:

    [[models]]
    name = "qwen"                  # the API's model name (default: the file or folder name without extension)
    path = "/models/qwen2.5-0.5b"  # a .gguf file or an HF folder
    aliases = ["qwen2.5"]
    pinned = true                  # loaded at start, never unloaded for room or idleness
    max-model-len = 4096           # any engine flag, by its --flag name (dashes or underscores)
    kv-cache-space = 0.5
    reasoning-parser = "qwen3"     # and reasoning-budget: the serving flags that are per model
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from hearth.engine_args import engine_arg_names
from hearth.entrypoints.openai.toml_file import check_fields, read_toml, str_list, tables

_SPLIT_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")  # llama.cpp's split GGUF names: model-00001-of-00003.gguf
_SPEC_KEYS = {"name", "path", "aliases", "pinned"}
_ENGINE_KEYS = set(engine_arg_names()) - {"model", "served_model_name"}
SERVING_KEYS = ("reasoning_parser", "reasoning_budget")  # `hearth serve` flags a model's ServingContext takes


@dataclass
class ModelSpec:
    name: str
    path: str
    aliases: list[str] = field(default_factory=list)
    pinned: bool = False
    engine_args: dict = field(default_factory=dict)  # EngineArgs field -> value, over the command line's
    serving: dict = field(default_factory=dict)  # SERVING_KEYS field -> value, over the command line's


def _is_hf_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def specs_from_dir(folder: str) -> list[ModelSpec]:
    if not os.path.isdir(folder):
        raise ValueError(f"--models-dir {folder!r} is not a directory")
    specs = []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if entry.endswith(".gguf") and os.path.isfile(path):
            stem = entry[: -len(".gguf")]
            m = _SPLIT_SHARD.search(stem)
            if m is not None:
                if int(m.group(1)) != 1:
                    continue  # later shards are read through the first
                stem = stem[: m.start()]
            specs.append(ModelSpec(stem, path))
        elif os.path.isdir(path) and _is_hf_folder(path):
            specs.append(ModelSpec(entry, path))
    if not specs:
        raise ValueError(f"--models-dir {folder!r} holds no .gguf file and no HF model folder (one with config.json)")
    return specs


def specs_from_toml(path: str) -> list[ModelSpec]:
    data = read_toml("--models-config", path)
    check_fields(data, {"models"}, f"--models-config {path}", "top-level field(s)")
    entries = tables(data, "models", f"--models-config {path}")
    if not entries:
        raise ValueError(f"--models-config {path!r} has no [[models]] entries")
    base = os.path.dirname(os.path.abspath(path))
    specs = []
    for i, entry in enumerate(entries):
        where = f"--models-config {path!r}, model {i + 1}"
        if "path" not in entry:
            raise ValueError(f"{where}: set path = \"...\" (a .gguf file or an HF folder)")
        model_path = os.path.join(base, os.path.expanduser(entry["path"]))
        if not os.path.exists(model_path):
            raise ValueError(f"{where}: path {model_path!r} does not exist")
        name = entry.get("name") or os.path.splitext(os.path.basename(model_path.rstrip("/")))[0]
        engine_args, serving = {}, {}
        for key, value in entry.items():
            if key in _SPEC_KEYS:
                continue
            arg = key.replace("-", "_")
            if arg in SERVING_KEYS:
                serving[arg] = value
                continue
            if arg not in _ENGINE_KEYS:
                flags = sorted(k.replace("_", "-") for k in (*_ENGINE_KEYS, *SERVING_KEYS))
                raise ValueError(f"{where}: unknown key {key!r}; use name, path, aliases, pinned or an engine "
                                 f"flag ({', '.join(flags)})")
            engine_args[arg] = value
        aliases = str_list(entry, "aliases", where) or []
        specs.append(ModelSpec(str(name), model_path, aliases, bool(entry.get("pinned", False)), engine_args,
                               serving))
    return specs


def check_names(specs: list[ModelSpec]) -> None:
    """Every name and alias must route to one model."""
    seen: dict[str, str] = {}
    for s in specs:
        for n in [s.name, *s.aliases]:
            if n in seen:
                raise ValueError(f"the model name {n!r} is used by both {seen[n]!r} and {s.path!r}: rename one "
                                 "(name = ... in --models-config)")
            seen[n] = s.path
