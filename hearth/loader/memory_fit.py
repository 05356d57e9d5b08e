"""What a checkpoint costs in memory before it is loaded: weights per precision option, KV bytes per token, and
what fits this machine's available memory (`hearth doctor MODEL`, and the load-time refusal)."""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import psutil

from hearth.config import HFConfig
from hearth.kv_sizing import GiB, HEADROOM_BYTES
from hearth.errors import LoadError

_ELEM = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
         "F8_E4M3": 1, "F8_E5M2": 1}
# Tensors kept in the model dtype whatever the scheme (quant_linear.SKIP_MODULES, embeddings, norms).
_DENSE_NAMES = ("embed", "lm_head", "norm", "wte", "wpe")


@dataclass
class Footprint:
    linear: int  # weights of the 2-D projections a --quantization scheme packs
    linear_rows: int  # their output rows (per-channel int8 scales)
    other: int  # every other weight (embeddings, head, norms, biases)
    stored_bytes: int  # the checkpoint's tensor bytes as stored
    prequantized: bool  # a GGUF or a GPTQ / AWQ / compressed-tensors folder: kept as stored
    kv_per_token: int  # bytes of KV cache per token in the model dtype (int8 KV: kv_per_token_int8)
    kv_per_token_int8: int
    max_len: int
    head: int = 0  # weights of the LM head's matrix (a tied head: the embedding table's), counted in `other`
    head_rows: int = 0
    head_tied: bool = False  # no lm_head tensor: the head reads the embedding table

    def weight_bytes(self, option: str, elem: int = 2, int8_head: bool = False) -> int:
        """Resident weight bytes under `option`: "stored", "dense" (elem bytes a weight), "int8", "int4",
        "nf4". int8_head: the LM head quantized at load to int8 per row (hearth.loader.lm_head), replacing the dense
        head, or beside the embedding table it is tied to."""
        if option == "stored" or self.prequantized:
            return self.stored_bytes
        head = 0
        if int8_head and option in ("int8", "int4", "nf4"):  # the head's int8 bytes and scales for its dense ones
            head = self.head + 4 * self.head_rows - (0 if self.head_tied else elem * self.head)
        if option == "int8":  # a byte a weight + an fp32 scale a row
            return self.linear + 4 * self.linear_rows + elem * self.other + head
        if option == "int4":  # half a byte a weight + fp32 scale and min per 128
            return self.linear // 2 + self.linear // 16 + elem * self.other + head
        if option == "nf4":  # (--quantization bitsandbytes) half a byte a weight + an fp32 absmax per 64
            return self.linear // 2 + self.linear // 16 + elem * self.other + head
        return elem * (self.linear + self.other)


def _kv(cfg: HFConfig) -> tuple[int, int]:
    cfg = cfg.get_text_config()
    layers = cfg["num_hidden_layers"]
    kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    per = 2 * layers * kv_heads
    return per * cfg.head_dim_, per * (cfg.head_dim_ + 4)  # (x element size of the model dtype for the first)


def _safetensors_headers(files: list[str]) -> dict[str, dict]:
    from hearth.loader.hf_folder import check_safetensors

    out = {}
    for path in files:
        check_safetensors(path)  # (a truncated or corrupt file is named before its header is read)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            out.update({k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"})
    return out


def footprint(path: str, cfg: HFConfig, elem: int = 2) -> Footprint:
    """From tensor headers only (no weight is read). `elem`: the model dtype's bytes (for the KV cache)."""
    kv, kv8 = _kv(cfg)
    max_len = int(cfg.get("max_position_embeddings") or 2048)
    if os.path.isfile(path):  # GGUF: its blocks stay as stored
        from hearth.loader.gguf.reader import read_parts

        size = sum(os.path.getsize(p.path) for p in read_parts(path))
        return Footprint(0, 0, 0, size, True, kv * elem, kv8, max_len)
    from hearth.loader.hf_folder import safetensors_files

    qc = cfg.get("quantization_config") or {}
    # bitsandbytes 4-bit layers stay packed (the "nf4" layout), a double-quantized absmax decoded to fp32
    bnb4 = qc.get("quant_method") == "bitsandbytes" and bool(qc.get("load_in_4bit") or qc.get("_load_in_4bit"))
    linear = rows = other = stored = 0
    head: tuple[int, int] | None = None  # (weights, rows) of the lm_head matrix
    embed = (0, 0)
    for name, info in _safetensors_headers(safetensors_files(path)).items():
        shape = info["shape"]
        numel = 1
        for d in shape:
            numel *= d
        decoded = bnb4 and info["dtype"] == "U8" and name.endswith(".absmax")
        stored += numel * (4 if decoded else _ELEM.get(info["dtype"], 2))
        if len(shape) == 2 and not any(s in name for s in _DENSE_NAMES):
            linear, rows = linear + numel, rows + shape[0]
        else:
            other += numel
            if len(shape) == 2 and "lm_head" in name:
                head = (numel, shape[0])
            elif len(shape) == 2 and "embed" in name and numel > embed[0]:
                embed = (numel, shape[0])
    pre = cfg.get("quantization_config") is not None or os.path.exists(os.path.join(path, "quantize_config.json"))
    (hw, hr), tied = (head, False) if head is not None else (embed, True)
    return Footprint(linear, rows, other, stored, pre, kv * elem, kv8, max_len, hw, hr, tied)


def size(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f} GiB" if nbytes >= GiB else f"{nbytes / 2**20:.1f} MiB"


def available_bytes() -> int:
    return psutil.virtual_memory().available


def option_of(scheme: str | None) -> str:
    """The Footprint option a quant_linear scheme loads as."""
    if scheme in ("prequant", "gguf"):
        return "stored"
    if scheme == "nf4":
        return "nf4"
    return "int8" if scheme == "int8" else "int4" if scheme and scheme.startswith("int4") else "dense"


def check_fits(path: str, fp: Footprint, option: str, elem: int, int8_head: bool = False) -> None:
    """Refuse, in one line with the numbers, a model whose weights and the runtime headroom exceed available memory
    (rather than being OOM-killed half way through the load). int8_head: as Footprint.weight_bytes."""
    need = fp.weight_bytes(option, elem, int8_head)
    avail = available_bytes()
    if need + HEADROOM_BYTES > avail:
        hint = " or --quantization int4 / int8" if option not in ("int4", "stored") and not fp.prequantized else ""
        raise LoadError(f"{path} does not fit in memory: its weights need {size(need)} ({option}) + "
                        f"{size(HEADROOM_BYTES)} headroom, and {size(avail)} is available; free memory"
                        f"{hint}, or use a smaller model (hearth doctor {path} lists the options)")
