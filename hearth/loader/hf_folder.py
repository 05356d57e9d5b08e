"""An HF model folder: config.json, safetensors (single or sharded), generation_config.json."""
from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterator

import torch
from safetensors import safe_open

from hearth.config import HFConfig
from hearth.errors import LoadError

logger = logging.getLogger("hearth")

_REMOTE_CODE_HINT = ("hearth never runs model code shipped with a checkpoint; use a model whose architecture "
                     "hearth supports natively")


def read_json(path: str) -> dict:
    """Read a JSON file, tolerating a UTF-8 BOM; invalid JSON names the file and line."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except FileNotFoundError:
        raise LoadError(f"{path} not found") from None
    except UnicodeDecodeError as e:
        raise LoadError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise LoadError(f"{path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    if not isinstance(data, dict):
        raise LoadError(f"{path} must hold a JSON object")
    return data


def read_hf_config(folder: str) -> HFConfig:
    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        raise LoadError(f"{folder} has no config.json: pass an HF model folder (config.json + *.safetensors + "
                        "tokenizer files) or a .gguf file")
    cfg = HFConfig(read_json(path))
    archs = cfg.get("architectures") or []
    if not archs:
        raise LoadError(f"{path} names no 'architectures'; cannot tell which model this is")
    if cfg.get("auto_map") and not _is_known(archs[0]):
        raise LoadError(f"{folder} needs trust_remote_code (its config.json has auto_map for {archs[0]}); "
                        f"{_REMOTE_CODE_HINT}")
    if isinstance(cfg.get("text_config"), dict) and cfg.get("vision_config") is not None and _is_known(archs[0]):
        return _flatten_vision_language(folder, cfg)
    return cfg


def _flatten_vision_language(folder: str, cfg: HFConfig) -> HFConfig:
    """A vision-language config with its text model's keys at the top (the engine, the KV sizing and the text
    stack read them there), and both sub-configs completed with transformers' defaults: save_pretrained writes
    only the keys that differ from them."""
    from transformers import AutoConfig

    full = AutoConfig.from_pretrained(folder).to_dict()
    text = {k: v for k, v in full["text_config"].items()
            if v is not None and k not in ("architectures", "model_type", "_name_or_path")}
    return HFConfig({**full, **text, "architectures": cfg["architectures"], "model_type": cfg.get("model_type")})


def _is_known(arch: str) -> bool:
    from hearth.models.registry import supported_architectures

    return arch in supported_architectures()


def read_generation_config(folder: str) -> dict:
    path = os.path.join(folder, "generation_config.json")
    return read_json(path) if os.path.exists(path) else {}


def safetensors_files(folder: str) -> list[str]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise LoadError(f"{index} has no weight_map")
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.exists(os.path.join(folder, f))]
        if missing:
            raise LoadError(f"{folder} is missing shard {missing[0]} listed in model.safetensors.index.json "
                            f"({len(missing)} of {len(files)} missing): copy the complete checkpoint")
        return [os.path.join(folder, f) for f in files]
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        return [single]
    found = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if found:
        return [os.path.join(folder, f) for f in found]
    if any(f.endswith((".bin", ".pt", ".pth")) for f in os.listdir(folder)):
        raise LoadError(f"{folder} holds only PyTorch pickle weights (*.bin): hearth loads safetensors; convert "
                        "them with transformers' save_pretrained(..., safe_serialization=True)")
    raise LoadError(f"{folder} has no *.safetensors weights")


def check_safetensors(path: str) -> None:
    """Catch truncated or corrupt files with a clear message before safetensors mmaps them."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise LoadError(f"{path} is truncated or not a safetensors file (size {size} bytes): re-copy it")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, 100 * 1024 * 1024):
            raise LoadError(f"{path} is corrupt or not a safetensors file (bad header length): re-copy it")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise LoadError(f"{path} is corrupt (unreadable safetensors header): re-copy it") from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        raise LoadError(f"{path} is truncated ({size} bytes, header promises {8 + header_len + end}): re-copy it")


def iter_safetensors(files: list[str], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from mmapped files. 16-bit and float32 tensors come as stored (the layer that receives
    one decides its format and converts while copying, so no second full copy is made); others go to dtype."""
    for path in files:
        check_safetensors(path)
        logger.debug("Loading weight file %s", path)
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                native = t.dtype in (torch.float32, torch.bfloat16, torch.float16)
                yield name, t if native or not t.is_floating_point() else t.to(dtype)
