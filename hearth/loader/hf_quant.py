"""Pre-quantized HF checkpoints: read quantization_config, then hand each quantized layer its tensors as one
PackedSource (hearth.weights.formats), which the layer repacks into hearth's int4 / int8 / nf4 layouts."""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from hearth.config import HFConfig
from hearth.errors import LoadError
from hearth.loader.hf_folder import read_json
from hearth.weights.formats import bitsandbytes as bnb
from hearth.weights.formats.source import PackedSource

METHODS = ("gptq", "awq", "compressed-tensors", "bitsandbytes")
SUPPORTED = ("GPTQ 4/8-bit (checkpoint_format gptq or gptq_v2), AWQ 4-bit GEMM, compressed-tensors int-quantized "
             "(W8A8/W8A16) and pack-quantized (W4A16), bitsandbytes NF4/FP4 and LLM.int8")
_CT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")


@dataclass(frozen=True)
class QuantSpec:
    method: str  # one of METHODS
    bits: int
    required: tuple[str, ...]  # checkpoint suffixes a quantized layer must have
    ignored: tuple[str, ...] = ()  # suffixes read and dropped (activation scales hearth does not use)
    options: dict = field(default_factory=dict)


def _unsupported(what: str) -> LoadError:
    return LoadError(f"{what} is not supported; hearth loads {SUPPORTED}")


def read_spec(folder: str, hf_cfg: HFConfig) -> QuantSpec | None:
    """The checkpoint's quantization (config.json's quantization_config, or AutoGPTQ's quantize_config.json)."""
    qc = hf_cfg.get("quantization_config")
    if qc is None and os.path.exists(os.path.join(folder, "quantize_config.json")):
        qc = {"quant_method": "gptq", **read_json(os.path.join(folder, "quantize_config.json"))}
    if qc is None:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method == "gptq":
        return _gptq(qc)
    if method == "awq":
        return _awq(qc)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "bitsandbytes":
        if qc.get("load_in_4bit") or qc.get("_load_in_4bit"):
            if qc.get("bnb_4bit_quant_type", "fp4") not in ("nf4", "fp4"):
                raise _unsupported(f"bitsandbytes 4-bit quant type {qc.get('bnb_4bit_quant_type')!r}")
            return QuantSpec("bitsandbytes", 4, ("weight", "absmax", "quant_map"))
        if qc.get("load_in_8bit") or qc.get("_load_in_8bit"):
            return QuantSpec("bitsandbytes", 8, ("weight", "SCB"), ("weight_format",))
        raise _unsupported("bitsandbytes quantization_config without load_in_4bit / load_in_8bit")
    raise _unsupported(f"quantization_config quant_method {method!r}")


def _gptq(qc: dict) -> QuantSpec:
    bits = qc.get("bits")
    fmt = str(qc.get("checkpoint_format") or qc.get("format") or "gptq").lower()
    if bits not in (4, 8):
        raise _unsupported(f"GPTQ {bits}-bit")
    if fmt not in ("gptq", "gptq_v2"):
        raise _unsupported(f"GPTQ checkpoint_format {fmt!r}")
    if qc.get("dynamic"):
        raise _unsupported("GPTQ with per-module 'dynamic' overrides")
    # v1 ("gptq") stores zero - 1 (AutoGPTQ's historical offset); v2 the zero itself
    return QuantSpec("gptq", bits, ("qweight", "qzeros", "scales", "g_idx"),
                     options={"zero_offset": 1 if fmt == "gptq" else 0})


def _awq(qc: dict) -> QuantSpec:
    bits, version = qc.get("bits", qc.get("w_bit")), str(qc.get("version", "gemm")).lower()
    if bits != 4 or version != "gemm" or not qc.get("zero_point", True):
        raise _unsupported(f"AWQ {bits}-bit version {version!r}" + ("" if qc.get("zero_point", True)
                                                                   else " without zero points"))
    return QuantSpec("awq", 4, ("qweight", "qzeros", "scales"))


def _compressed_tensors(qc: dict) -> QuantSpec:
    groups = list((qc.get("config_groups") or {}).values())
    if not groups:
        raise LoadError("compressed-tensors quantization_config has no config_groups")
    fmts = {str(g.get("format") or qc.get("format")) for g in groups}
    weights = [g.get("weights") or {} for g in groups]
    keys = {(w.get("type"), w.get("num_bits"), bool(w.get("symmetric", True)), w.get("actorder")) for w in weights}
    if len(fmts) != 1 or len(keys) != 1:
        raise _unsupported("compressed-tensors with several differently quantized config groups")
    (fmt,), ((kind, bits, symmetric, actorder),) = fmts, keys
    if fmt not in _CT_FORMATS or kind != "int" or bits not in (4, 8):
        raise _unsupported(f"compressed-tensors format {fmt!r} with {bits}-bit {kind} weights")
    if str(qc.get("quantization_status", "compressed")) != "compressed":
        raise _unsupported(f"compressed-tensors quantization_status {qc.get('quantization_status')!r}")
    if actorder == "group":
        raise _unsupported("compressed-tensors actorder 'group' (weight_g_idx)")
    if fmt == "pack-quantized":
        required = ("weight_packed", "weight_scale", "weight_shape") + (() if symmetric else ("weight_zero_point",))
    else:
        if not symmetric:
            raise _unsupported("compressed-tensors asymmetric int8 weights (hearth's int8 layout is symmetric)")
        required = ("weight", "weight_scale")
    for g in groups:
        act = g.get("input_activations")
        if act and act.get("type") != "int":
            raise _unsupported(f"compressed-tensors {act.get('type')} activations")
    return QuantSpec("compressed-tensors", bits, required,
                     ("input_scale", "input_zero_point", "weight_zero_point", "weight_g_idx"))


def check_requested(spec: QuantSpec | None, requested: str | None, folder: str) -> None:
    """--quantization against the checkpoint: auto / the checkpoint's own method, or an error naming the fix
    (bitsandbytes on a float checkpoint quantizes at load: model_loader)."""
    if spec is None:
        if requested in METHODS and requested != "bitsandbytes":
            raise LoadError(f"--quantization {requested} needs a {requested} checkpoint, and {folder}'s config.json "
                            "has no quantization_config: drop the flag, or use int8 / int4 to quantize at load")
        return
    if requested == "int8" and spec.method == "bitsandbytes" and spec.bits == 8:
        return  # (quantization_config=BitsAndBytesConfig(load_in_8bit=True) asks for int8: an LLM.int8 checkpoint is)
    if requested not in (None, "auto", spec.method):
        raise LoadError(f"{folder} is already quantized ({spec.method}): drop --quantization {requested} "
                        f"(or pass --quantization {spec.method})")


def _source(spec: QuantSpec, prefix: str, t: dict[str, torch.Tensor]) -> PackedSource:
    if spec.method == "gptq":
        n, k = t["scales"].shape[1], t["g_idx"].numel()
        groups = t["scales"].shape[0]
        if t["qweight"].shape[0] * 32 // spec.bits != k:
            raise LoadError(f"{prefix}: qweight {tuple(t['qweight'].shape)} is not {spec.bits}-bit for "
                            f"{k} inputs (g_idx)")
    elif spec.method == "bitsandbytes":  # LLM.int8: one scale a row
        n, k = t["weight"].shape
        groups = 1
    elif spec.method == "awq":
        k, n, groups = t["qweight"].shape[0], t["scales"].shape[1], t["scales"].shape[0]
    else:
        n, k = (int(v) for v in t["weight_shape"].tolist()) if "weight_shape" in t else t["weight"].shape
        s = t["weight_scale"]
        groups = 1 if s.numel() == 1 else s.shape[-1]
    if k % groups:
        raise LoadError(f"{prefix}: {groups} scale groups do not divide its {k} inputs")
    return PackedSource(spec.method, spec.bits, k // groups, (n, k), t, spec.options)


def _assemble_bnb4(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, object]]:
    """bitsandbytes 4-bit: each layer's `W.weight` (uint8) and `W.weight.*` statistics -> (`W.weight`, PackedSource),
    which the layer keeps in the "nf4" layout (bitsandbytes' floats, dense, where its blocks straddle rows)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        base, dot, rest = name.partition(".weight.")
        if dot:
            key, suffix = base + ".weight", rest
        elif name.endswith(".weight") and tensor.dtype == torch.uint8:
            key, suffix = name, "weight"
        else:
            yield name, tensor
            continue
        parts = pending.setdefault(key, {})
        parts[suffix] = tensor
        if _bnb4_complete(parts):
            t = pending.pop(key)
            state = bnb.quant_state(t)
            n, k = (int(d) for d in state["shape"])
            yield key, PackedSource("bitsandbytes", 4, int(state["blocksize"]), (n, k), t)
    if pending:
        key, parts = next(iter(pending.items()))
        raise LoadError(f"bitsandbytes checkpoint: {key} lacks some of its statistics (has {', '.join(sorted(parts))})"
                        ": re-copy the checkpoint")


def _bnb4_complete(parts: dict[str, torch.Tensor]) -> bool:
    if not all(s in parts for s in ("weight", "absmax", "quant_map")) or not any(
            s.startswith("quant_state.") for s in parts):
        return False
    return "nested_blocksize" not in bnb.quant_state(parts) or {"nested_absmax", "nested_quant_map"} <= parts.keys()


def assemble(weights: Iterator[tuple[str, torch.Tensor]], spec: QuantSpec) -> Iterator[tuple[str, object]]:
    """Checkpoint tensors -> the same stream with each quantized layer's tensors replaced by one
    (`prefix.weight`, PackedSource); a layer's tensors may come in any order and from different shards."""
    if spec.method == "bitsandbytes" and spec.bits == 4:
        yield from _assemble_bnb4(weights)
        return
    pending: dict[str, dict[str, torch.Tensor]] = {}
    wanted = set(spec.required) | set(spec.ignored)
    for name, tensor in weights:
        prefix, _, suffix = name.rpartition(".")
        # (compressed-tensors names its int8 weight `weight`, like a float layer's: the dtype tells them apart)
        if suffix not in wanted or (suffix == "weight" and tensor.dtype != torch.int8):
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[suffix] = tensor
        if all(s in parts for s in spec.required):
            yield f"{prefix}.weight", _source(spec, prefix, pending.pop(prefix))
    left = {p: [s for s in spec.required if s not in t] for p, t in pending.items()}
    left = {p: m for p, m in left.items() if len(m) < len(spec.required)}
    if left:
        prefix, missing = next(iter(left.items()))
        raise LoadError(f"{spec.method} checkpoint: {prefix} lacks {', '.join(missing)} ({len(left)} layers "
                        "incomplete): re-copy the checkpoint")
