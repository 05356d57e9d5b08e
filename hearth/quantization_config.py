"""`quantization_config=` as transformers takes it (a BitsAndBytesConfig or its dict form) -> hearth's own
--quantization and --dtype, so a from_pretrained-style snippet loads through hearth's bitsandbytes path.

4-bit NF4 is quantized at load as bitsandbytes does (blocks of 64); 8-bit LLM.int8 is int8 per output row, which
is LLM.int8's weight format. A field hearth cannot honour is a ValueError naming it. Torch-free (the compute dtype
may be a torch.dtype: it is read by name).
"""
from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("hearth")

# Fields whose values change nothing here: storage of the absmax, and the GPU-only outlier split of LLM.int8.
_INERT = {"bnb_4bit_use_double_quant": "double quant only shrinks the absmax; hearth keeps it in fp32",
          "llm_int8_threshold": "no outlier split: int8 weights per row, activations as --quantization int8 takes "
                                "them",
          "llm_int8_has_fp16_weight": None, "bnb_4bit_quant_storage": None, "quant_method": None,
          "load_in_4bit": None, "load_in_8bit": None, "bnb_4bit_quant_type": None, "bnb_4bit_compute_dtype": None,
          "_load_in_4bit": None, "_load_in_8bit": None}
_DTYPES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
           "half": "float16"}


def as_dict(config: Any) -> dict[str, Any]:
    """A BitsAndBytesConfig (anything with to_dict) or a dict -> a plain dict."""
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    raise ValueError(f"quantization_config must be a transformers BitsAndBytesConfig or a dict, got "
                     f"{type(config).__name__}")


def _dtype_name(value: Any) -> str | None:
    if value is None:
        return None
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"quantization_config.bnb_4bit_compute_dtype={name}: hearth computes in float32 or "
                         "bfloat16 (float16 computes in bfloat16)")
    return _DTYPES[name]


def apply(args: Any) -> None:
    """Map args.quantization_config onto args.quantization / args.dtype in place and clear it (so EngineArgs
    stays picklable for tensor-parallel workers)."""
    qc = as_dict(args.quantization_config)
    args.quantization_config = None
    method = getattr(qc.get("quant_method"), "value", qc.get("quant_method")) or "bitsandbytes"  # (an Enum)
    if method != "bitsandbytes":
        raise ValueError(f"quantization_config.quant_method={method}: only bitsandbytes configs map onto "
                         "hearth's loader; use quantization=... for the others")
    four, eight = bool(qc.get("load_in_4bit") or qc.get("_load_in_4bit")), bool(qc.get("load_in_8bit")
                                                                               or qc.get("_load_in_8bit"))
    if four == eight:
        raise ValueError("quantization_config: set exactly one of load_in_4bit / load_in_8bit")
    if args.quantization not in (None, "auto", "bitsandbytes", "int8" if eight else "bitsandbytes"):
        raise ValueError(f"quantization_config and quantization={args.quantization!r} disagree: drop one")
    for key in ("llm_int8_skip_modules", "llm_int8_enable_fp32_cpu_offload"):
        if qc.get(key):
            raise ValueError(f"quantization_config.{key}: hearth quantizes every linear layer on the CPU; drop it")
    if qc.get("bnb_4bit_quant_storage") not in (None, "uint8", "torch.uint8"):
        raise ValueError(f"quantization_config.bnb_4bit_quant_storage={qc['bnb_4bit_quant_storage']}: hearth packs "
                         "4-bit codes into uint8 only; drop it")
    unknown = sorted(k for k in qc if k not in _INERT and k not in ("llm_int8_skip_modules",
                                                                      "llm_int8_enable_fp32_cpu_offload"))
    if unknown:
        raise ValueError(f"quantization_config.{unknown[0]}: not a BitsAndBytesConfig field hearth knows")
    if four:
        kind = qc.get("bnb_4bit_quant_type", "fp4")
        if kind != "nf4":
            raise ValueError(f"quantization_config.bnb_4bit_quant_type={kind!r}: hearth quantizes a float "
                             "checkpoint to nf4 only at load (FP4 checkpoints saved by bitsandbytes load as they "
                             "are); use bnb_4bit_quant_type='nf4'")
        args.quantization = "bitsandbytes"
        dtype = _dtype_name(qc.get("bnb_4bit_compute_dtype"))
        if dtype is not None and args.dtype == "auto":
            args.dtype = dtype
        if qc.get("bnb_4bit_use_double_quant"):
            logger.info("quantization_config.bnb_4bit_use_double_quant: %s", _INERT["bnb_4bit_use_double_quant"])
        logger.info("quantization_config: 4-bit NF4 at load (--quantization bitsandbytes), compute dtype %s",
                    args.dtype)
    else:
        args.quantization = "int8"
        logger.info("quantization_config: 8-bit LLM.int8 -> --quantization int8 (%s)", _INERT["llm_int8_threshold"])
