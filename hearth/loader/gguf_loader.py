"""Load a llama.cpp GGUF checkpoint: HF-style config, HF-named dequantized tensors, a fast tokenizer.

The header is parsed here with `struct` over an mmap (gguf.GGUFReader builds a Python object per vocab
string: seconds for a big vocabulary), and the tensor bytes go through `gguf.quants.dequantize`. Mapping
to HF is table driven: `_ARCHS` holds one row per GGUF architecture.
"""
from __future__ import annotations

import math
import mmap
import os
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gguf
import numpy as np
import torch

from hearth import envs
from hearth.config import HFConfig
from hearth.weights.gguf import GGUFBlocks
from hearth.loader import tokenizer_cache
from hearth.loader.errors import LoadError
from hearth.tokenizer import Tokenizer



class GGUFError(LoadError):
    """A GGUF that cannot be loaded; one line naming the file and the fix."""


# ---------------------------------------------------------------- header parsing

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
       7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STR, _ARR = 8, 9
# ggml type id -> (name, elements per block, bytes per block); the types we dequantize (through gguf.quants).
# Q4_K_M / Q5_K_M files mix several of these (e.g. Q5_0 and Q8_0 tensors inside a "Q4_K_M" file).
_TYPE_NAMES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
               "Q6_K", "IQ4_NL", "IQ4_XS"]
_TYPES = {gguf.GGMLQuantizationType[n].value: (n, *gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[n]])
          for n in _TYPE_NAMES}
_TORCH_FLOAT = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


class _Corrupt(Exception):
    """Internal: the header does not parse; translated to GGUFError with the path."""


@dataclass
class _TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order: [out, in] for a weight (ggml stores dims innermost-first)
    ggml_type: int
    start: int  # absolute file offset of the data
    nbytes: int


@dataclass
class _Part:
    path: str
    metadata: dict[str, Any]
    tensors: list[_TensorInfo]


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def unpack(self, fmt: str) -> Any:
        vals = struct.unpack_from(fmt, self.buf, self.pos)  # struct.error past the end
        self.pos += struct.calcsize(fmt)
        return vals[0] if len(vals) == 1 else vals

    def count(self, n: int, min_bytes: int) -> int:
        # A corrupt count must fail now, not loop ~forever: each item needs >= min_bytes.
        if n * min_bytes > self.size - self.pos:
            raise _Corrupt(f"count {n} exceeds the file size")
        return n

    def string(self) -> str:
        n = self.count(self.unpack("<Q"), 1)
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def strings(self, n: int) -> list[str]:
        """n strings: the vocabulary and merges arrays (~100k items: one tight loop instead of a string() call each)."""
        buf, pos, size, out = self.buf, self.pos, self.size, []
        length = struct.Struct("<Q").unpack_from
        for _ in range(n):
            k = length(buf, pos)[0]
            pos += 8
            if k > size - pos:
                raise _Corrupt("string length exceeds the file size")
            out.append(buf[pos:pos + k].decode("utf-8", errors="replace"))
            pos += k
        self.pos = pos
        return out

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STR:
            return self.string()
        if vtype == _ARR:
            etype, n = self.unpack("<IQ")
            if etype in _NP:
                dt = np.dtype(_NP[etype])
                n = self.count(n, dt.itemsize)
                arr = np.frombuffer(self.buf, dt, n, self.pos).tolist()  # tolist: no view kept on the mmap
                self.pos += n * dt.itemsize
                return arr
            if etype == _STR:
                return self.strings(self.count(n, 8))
            return [self.value(etype) for _ in range(self.count(n, 12))]
        raise _Corrupt(f"unknown metadata value type {vtype}")


def _read_part(path: str) -> _Part:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise GGUFError(f"{path}: not a GGUF file ({size} bytes); pass a llama.cpp .gguf model file")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read ({e.strerror}); check the path and permissions") from e
    try:
        if buf[:4] != b"GGUF":
            raise GGUFError(f"{path}: not a GGUF file (bad magic {bytes(buf[:4])!r}); pass a llama.cpp .gguf file")
        cur = _Cursor(buf)
        cur.pos = 4
        version, n_tensors, n_kv = cur.unpack("<IQQ")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported (only v2/v3); re-convert it "
                            "with a recent llama.cpp convert_hf_to_gguf.py")
        meta: dict[str, Any] = {}
        for _ in range(cur.count(n_kv, 12)):
            key = cur.string()
            meta[key] = cur.value(cur.unpack("<I"))
        raw: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(cur.count(n_tensors, 24)):
            name = cur.string()
            ndim = cur.unpack("<I")
            if ndim > 8:
                raise _Corrupt(f"tensor {name!r} has {ndim} dims")
            dims = struct.unpack_from(f"<{ndim}Q", buf, cur.pos)
            cur.pos += 8 * ndim
            ggml_type, offset = cur.unpack("<IQ")
            raw.append((name, tuple(reversed(dims)), ggml_type, offset))
        align = int(meta.get("general.alignment", 32))
        data_start = (cur.pos + align - 1) // align * align
    except (struct.error, _Corrupt, ValueError, OverflowError, IndexError, MemoryError) as e:
        if isinstance(e, GGUFError):
            raise
        raise GGUFError(f"{path}: truncated or corrupt GGUF header ({e}); re-download or re-convert the file") from e
    finally:
        buf.close()
    tensors = []
    for name, shape, ggml_type, offset in raw:
        if ggml_type not in _TYPES:
            supported = ", ".join(t[0] for t in _TYPES.values())
            raise GGUFError(f"{path}: tensor {name!r} has ggml type {ggml_type}, not supported (supported: "
                            f"{supported}); use a file quantized to one of those")
        _, block, block_bytes = _TYPES[ggml_type]
        n = math.prod(shape)  # python ints: a corrupt dim must not wrap around
        if shape and shape[-1] % block:
            raise GGUFError(f"{path}: tensor {name!r} row length {shape[-1]} is not a multiple of {block}; "
                            "the file is corrupt, re-convert it")
        info = _TensorInfo(name, shape, ggml_type, data_start + offset, n // block * block_bytes)
        if info.start + info.nbytes > size:
            raise GGUFError(f"{path}: truncated: tensor {name!r} ends at byte {info.start + info.nbytes} but the "
                            f"file has {size}; re-download the file")
        tensors.append(info)
    return _Part(path, meta, tensors)


_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _read_parts(path: str) -> list[_Part]:
    """All parts of a (possibly split) GGUF, the one holding the metadata first."""
    if not os.path.exists(path):
        raise GGUFError(f"{path}: no such file; pass the path of an existing .gguf file")
    m = _SPLIT_RE.match(path)
    if m is None:
        part = _read_part(path)
        count = int(part.metadata.get("split.count", 1))
        if count > 1:
            raise GGUFError(f"{path}: is part of a {count}-part split GGUF but is not named '-0000N-of-0000M.gguf'; "
                            "restore the original names or merge it with llama-gguf-split --merge")
        return [part]
    count = int(m["count"])
    paths = [f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    for p in paths:
        if not os.path.exists(p):
            raise GGUFError(f"{p}: missing part of split GGUF {path}; download all {count} parts into one folder")
    return [_read_part(p) for p in paths]


# ---------------------------------------------------------------- architecture table

# GGUF tensor stem (after "blk.N.") -> HF stem (after "model.layers.N."), shared by the dense decoders.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GEMMA2_NAMES = {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                 "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_PHI3_NAMES = {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Tensors llama.cpp adds that HF computes from the config instead.
_IGNORED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}

# "{arch}.<suffix>" metadata -> HF config key.
_CONFIG_KEYS = {
    "context_length": "max_position_embeddings", "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size", "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "rope.freq_base": "rope_theta",
    "attention.key_length": "head_dim", "attention.sliding_window": "sliding_window",
    "vocab_size": "vocab_size", "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
}


@dataclass(frozen=True)
class _Arch:
    hf_arch: str
    model_type: str
    layer_names: dict[str, str]
    defaults: dict[str, Any] = field(default_factory=dict)  # HF config values GGUF does not state
    permute_qk: bool = False  # llama.cpp's convert permutes q/k rows for rotary interleaving (llama arch)
    norm_offset: float = 0.0  # llama.cpp stores Gemma norms as (1 + w); HF stores w
    fixup: Callable[[dict[str, Any], dict[str, Any]], None] | None = None  # (cfg, metadata) -> None


def _gemma2_fixup(cfg: dict[str, Any], meta: dict[str, Any]) -> None:
    # llama.cpp: the 27B scales queries by 1/sqrt(hidden/heads), the others by 1/sqrt(head_dim).
    big = cfg["num_hidden_layers"] in (46, 62)
    cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"] if big else cfg["head_dim"]


def _gemma3_fixup(cfg: dict[str, Any], meta: dict[str, Any]) -> None:
    _gemma2_fixup(cfg, meta)
    cfg["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                          for i in range(cfg["num_hidden_layers"])]


def _phi3_fixup(cfg: dict[str, Any], meta: dict[str, Any]) -> None:
    rot = meta.get("phi3.rope.dimension_count")
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    if rot and rot != head_dim:
        cfg["partial_rotary_factor"] = rot / head_dim
    cfg.pop("head_dim", None)  # Phi3Config derives it


_GELU_TANH = {"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh"}
_ARCHS: dict[str, _Arch] = {
    "llama": _Arch("LlamaForCausalLM", "llama", _LAYER_NAMES, {"hidden_act": "silu", "mlp_bias": False},
                   permute_qk=True),
    "qwen2": _Arch("Qwen2ForCausalLM", "qwen2", _LAYER_NAMES, {"hidden_act": "silu", "use_sliding_window": False}),
    "qwen3": _Arch("Qwen3ForCausalLM", "qwen3", _LAYER_NAMES, {"hidden_act": "silu", "use_sliding_window": False}),
    "phi3": _Arch("Phi3ForCausalLM", "phi3", _PHI3_NAMES, {"hidden_act": "silu"}, fixup=_phi3_fixup),
    "gemma": _Arch("GemmaForCausalLM", "gemma", _LAYER_NAMES, _GELU_TANH, norm_offset=1.0),
    "gemma2": _Arch("Gemma2ForCausalLM", "gemma2", _GEMMA2_NAMES, _GELU_TANH, norm_offset=1.0, fixup=_gemma2_fixup),
    "gemma3": _Arch("Gemma3ForCausalLM", "gemma3_text", _GEMMA2_NAMES,
                    {**_GELU_TANH, "rope_local_base_freq": 10000.0}, norm_offset=1.0, fixup=_gemma3_fixup),
}


def _hf_name(gguf_name: str, arch: _Arch) -> str | None:
    stem, _, leaf = gguf_name.rpartition(".")  # leaf: weight | bias
    if stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{leaf}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", stem)
    if m and m[2] in arch.layer_names:
        return f"model.layers.{m[1]}.{arch.layer_names[m[2]]}.{leaf}"
    return None


def _build_config(path: str, meta: dict[str, Any], arch_name: str, arch: _Arch, names: set[str]) -> HFConfig:
    cfg: dict[str, Any] = {"architectures": [arch.hf_arch], "model_type": arch.model_type, **arch.defaults}
    prefix = arch_name + "."
    for suffix, key in _CONFIG_KEYS.items():
        if prefix + suffix in meta:
            cfg[key] = meta[prefix + suffix]
    for req in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        if req not in cfg:
            raise GGUFError(f"{path}: metadata lacks {arch_name}.* for {req}; re-convert with a recent llama.cpp")
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    cfg["num_key_value_heads"] = max(kv) if isinstance(kv, list) else kv  # some files list one per layer
    if isinstance(cfg.get("intermediate_size"), list):
        cfg["intermediate_size"] = max(cfg["intermediate_size"])
    cfg.setdefault("head_dim", meta.get(prefix + "rope.dimension_count") if arch.permute_qk else None)
    if not cfg["head_dim"]:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg.setdefault("rope_theta", 10000.0)
    cfg.setdefault("vocab_size", len(meta.get("tokenizer.ggml.tokens", [])) or None)
    cfg.setdefault("sliding_window", None)
    cfg["rope_scaling"] = _rope_scaling(meta, prefix)
    cfg["tie_word_embeddings"] = "output.weight" not in names
    # HF attention_bias covers o_proj too (Llama, Qwen3); Qwen2 has q/k/v biases by architecture and none on o_proj.
    cfg["attention_bias"] = "blk.0.attn_output.bias" in names
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        gkey = {"pad_token_id": "padding_token_id"}.get(key, key)
        cfg[key] = meta.get(f"tokenizer.ggml.{gkey}")
    if arch.fixup is not None:
        arch.fixup(cfg, meta)
    return HFConfig(cfg)


def _rope_scaling(meta: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    kind = meta.get(prefix + "rope.scaling.type")
    if kind in (None, "none"):
        return None
    rs: dict[str, Any] = {"rope_type": kind, "type": kind}
    if (factor := meta.get(prefix + "rope.scaling.factor")) is not None:
        rs["factor"] = float(factor)
    if (orig := meta.get(prefix + "rope.scaling.original_context_length")) is not None:
        rs["original_max_position_embeddings"] = int(orig)
    return rs


def _llama3_rope_scaling(path: str, cfg: dict[str, Any], freqs: torch.Tensor) -> dict[str, Any]:
    """llama.cpp stores Llama-3.1-style rope scaling only as per-frequency divisors (rope_freqs.weight).
    Recover HF's rope_scaling: every Llama 3.x release uses low/high 1/4 and original context 8192, so
    take factor = max divisor and check that these parameters reproduce the stored divisors."""
    factor, low, high, orig = float(freqs.max()), 1.0, 4.0, 8192
    dim = freqs.numel() * 2
    inv_freq = 1.0 / (cfg["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    wavelen = 2 * math.pi / inv_freq
    smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
    expect = 1.0 / ((1 - smooth) / factor + smooth)  # 1 for high freqs, factor for low ones
    if not np.allclose(freqs.double().numpy(), expect, rtol=1e-3):
        raise GGUFError(f"{path}: rope_freqs.weight does not match Llama-3 rope scaling (factor {factor}); "
                        "this rope variant is not supported")
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": orig}


def _read_tensor(path: str, info: _TensorInfo) -> torch.Tensor:
    with open(path, "rb") as f:
        f.seek(info.start)
        return _dequantize(f.read(info.nbytes), info)


# ---------------------------------------------------------------- tokenizer

def _build_tokenizer(path: str, meta: dict[str, Any]) -> Tokenizer:
    """The fast tokenizer the GGUF's metadata describes, from the tokenizer cache when it was built before."""
    key = tokenizer_cache.cache_key(meta) if envs.tokenizer_cache_dir() else None
    hit = tokenizer_cache.load(key) if key else None
    if hit is not None:
        return Tokenizer(*hit)
    from transformers import PreTrainedTokenizerFast

    try:
        from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    except ImportError:  # transformers < 5: the one public entry point
        from transformers import AutoTokenizer

        return Tokenizer.from_hf(AutoTokenizer.from_pretrained(os.path.dirname(path) or ".",
                                                               gguf_file=os.path.basename(path)))
    try:
        arch, tok_dict, tok_cfg = get_gguf_tokenizer(path)
        backend, extra = convert_gguf_tokenizer(arch, tok_dict)
    except (ValueError, KeyError) as e:
        raise GGUFError(f"{path}: cannot build a tokenizer from the embedded vocab ({e}); "
                        "pass --tokenizer with an HF tokenizer folder") from e
    backend = _drop_tokens_past(backend, len(tok_dict["tokens"]))
    # (tok_cfg carries the GGUF's tokenizer.chat_template: the fast tokenizer, and so tok.info, takes it)
    tok = Tokenizer.from_hf(PreTrainedTokenizerFast(tokenizer_object=backend, **{**tok_cfg, **extra}))
    if key:
        tokenizer_cache.store(key, tok.backend, tok.info)
    return tok


def _drop_tokens_past(backend: Any, n: int) -> Any:
    """transformers' byte-level builder (GPT2Tokenizer) adds its default "<|endoftext|>" when the vocab lacks it
    (e.g. Llama 3): an id past the model's embedding. Keep only the GGUF's own n tokens."""
    if backend.get_vocab_size(with_added_tokens=True) <= n:
        return backend
    import json

    from tokenizers import Tokenizer

    state = json.loads(backend.to_str())
    state["added_tokens"] = [t for t in state["added_tokens"] if t["id"] < n]
    return Tokenizer.from_str(json.dumps(state))


# ---------------------------------------------------------------- public API

@dataclass
class GGUFCheckpoint:
    path: str
    hf_config: HFConfig
    tokenizer: Tokenizer  # its info.chat_template: the GGUF's tokenizer.chat_template
    eos_token_ids: list[int]
    bos_token_id: int | None
    _parts: list[_Part] = field(repr=False, default_factory=list)
    _arch: _Arch | None = field(repr=False, default=None)

    def tensors(self, dtype: torch.dtype, keep_quantized: frozenset[str] = frozenset(),
                placeholders: frozenset[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor | GGUFBlocks]]:
        """(HF name, tensor in HF layout, dtype), one at a time; only one tensor's bytes are resident.

        Linear weights and the embedding table of a ggml type named in `keep_quantized` (a subset of
        weights.gguf.KEPT_NAMES: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) come as GGUFBlocks (raw rows, HF row order) instead.
        HF names in `placeholders` (values the caller replaces, e.g. a head kept in its blocks) come as zeros of
        their shape without reading or dequantizing the file's bytes (a stride-0 view: no memory of its own).
        """
        assert self._arch is not None
        cfg = self.hf_config
        for part in self._parts:
            with open(part.path, "rb") as f:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                for info in part.tensors:
                    hf = _hf_name(info.name, self._arch)
                    if hf is None:
                        continue  # _IGNORED, checked at load
                    if hf in placeholders:
                        yield hf, torch.zeros((), dtype=dtype).expand(*info.shape)
                        continue
                    if _TYPES[info.ggml_type][0] in keep_quantized and (_is_linear_weight(hf, info)
                                                                         or hf == "model.embed_tokens.weight"):
                        yield hf, self._blocks(buf, info, hf)
                        continue
                    t = _dequantize(buf[info.start:info.start + info.nbytes], info)
                    if self._arch.permute_qk and ".self_attn.q_proj." in hf:
                        t = _unpermute(t, cfg["num_attention_heads"])
                    elif self._arch.permute_qk and ".self_attn.k_proj." in hf:
                        t = _unpermute(t, cfg["num_key_value_heads"])
                    if self._arch.norm_offset and hf.endswith("norm.weight"):
                        t = t.float() - self._arch.norm_offset  # in fp32, before any downcast
                    yield hf, _storage(t, dtype, info, "embed_tokens" not in hf).contiguous()
            finally:
                buf.close()

    @property
    def has_output_weight(self) -> bool:
        """False when the head is tied to token_embd.weight (no output.weight tensor)."""
        return any(info.name == "output.weight" for part in self._parts for info in part.tensors)

    def _head(self, keep_quantized: frozenset[str]) -> tuple[_Part, _TensorInfo] | None:
        infos = {info.name: (part, info) for part in self._parts for info in part.tensors}
        found = infos.get("output.weight") or infos.get("token_embd.weight")
        if found is None or _TYPES[found[1].ggml_type][0] not in keep_quantized:
            return None
        return found

    def head_shape(self, keep_quantized: frozenset[str]) -> tuple[int, ...] | None:
        """head_blocks' (rows, cols), without reading them; None where head_blocks gives None."""
        found = self._head(keep_quantized)
        return None if found is None else tuple(found[1].shape)

    def head_blocks(self, keep_quantized: frozenset[str]) -> GGUFBlocks | None:
        """The LM head's blocks (output.weight, else the tied token_embd.weight) if its type is in keep_quantized."""
        found = self._head(keep_quantized)
        if found is None:
            return None
        part, info = found
        with open(part.path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return self._blocks(buf, info, "lm_head.weight")
        finally:
            buf.close()

    def _blocks(self, buf: mmap.mmap, info: _TensorInfo, hf: str) -> GGUFBlocks:
        """Raw rows of a block-quantized weight; q/k rows un-permuted (rows of block formats are independent)."""
        _, block, block_bytes = _TYPES[info.ggml_type]
        rows, cols = info.shape
        with memoryview(buf) as mv:  # one copy of the bytes (slicing the mmap itself made a bytes copy first)
            data = torch.frombuffer(bytearray(mv[info.start:info.start + info.nbytes]), dtype=torch.uint8)
        blocks = GGUFBlocks(info.ggml_type, (rows, cols), data.reshape(rows, cols // block * block_bytes))
        heads = None
        if self._arch.permute_qk and ".self_attn.q_proj." in hf:
            heads = self.hf_config["num_attention_heads"]
        elif self._arch.permute_qk and ".self_attn.k_proj." in hf:
            heads = self.hf_config["num_key_value_heads"]
        return blocks if heads is None else blocks.index_rows(_unpermute(torch.arange(rows), heads))


def _storage(t: torch.Tensor, dtype: torch.dtype, info: _TensorInfo, read_per_step: bool) -> torch.Tensor:
    """The tensor a float32 model receives for a matrix: F16/BF16 as stored (Linear and Embedding keep 16-bit
    weights where the kernels read them, else widen exactly). A block type read densely by a projection or the
    head (read_per_step: a type not kept quantized, Q5_0, Q5_K, ..., or any block type when keeping is off)
    comes as float16: half the bytes per decode step of float32, for a rounding of <= 2^-11 relative, far below
    the block format's own step. Embedding tables (row lookups) stay exact."""
    if dtype != torch.float32 or t.dim() != 2:
        return t.to(dtype)
    if t.dtype in (torch.float16, torch.bfloat16):
        return t
    if read_per_step and info.ggml_type not in _TORCH_FLOAT:
        return t.to(torch.float16)
    return t.to(dtype)


def _is_linear_weight(hf: str, info: _TensorInfo) -> bool:
    # (lm_head stays a float Linear, like the embedding)
    return len(info.shape) == 2 and hf.endswith(".weight") and "embed_tokens" not in hf and not hf.startswith("lm_head")


def _dequantize(raw: bytes, info: _TensorInfo) -> torch.Tensor:
    if info.ggml_type in _TORCH_FLOAT:
        return torch.frombuffer(bytearray(raw), dtype=_TORCH_FLOAT[info.ggml_type]).reshape(info.shape)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    _, block, block_bytes = _TYPES[info.ggml_type]
    rows = np.frombuffer(raw, np.uint8).reshape(*info.shape[:-1], info.shape[-1] // block * block_bytes)
    out = dequantize(rows, GGMLQuantizationType(info.ggml_type))  # float32, shape == info.shape
    return torch.from_numpy(np.ascontiguousarray(out)).reshape(info.shape)


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of convert_hf_to_gguf.py's permute: per head, rows (2, d/2) were stored as (d/2, 2)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def load_gguf(path: str) -> GGUFCheckpoint:
    """Parse a GGUF (or all parts of a split one): config, tokenizer; tensors are read lazily later."""
    path = os.fspath(path)
    parts = _read_parts(path)
    meta = parts[0].metadata
    arch_name = meta.get("general.architecture")
    if arch_name not in _ARCHS:
        raise GGUFError(f"{path}: GGUF architecture {arch_name!r} is not supported (supported: "
                        f"{', '.join(_ARCHS)}); use a model of a supported architecture")
    arch = _ARCHS[arch_name]
    names = {t.name for p in parts for t in p.tensors}
    unknown = sorted(n for n in names if _hf_name(n, arch) is None and n not in _IGNORED)
    if unknown:
        raise GGUFError(f"{path}: {len(unknown)} tensors have no HF mapping for {arch_name} (e.g. {unknown[:3]}); "
                        "this GGUF variant is not supported")
    cfg = _build_config(path, meta, arch_name, arch, names)
    freqs = next(((p.path, t) for p in parts for t in p.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None and arch_name == "llama" and cfg["rope_scaling"] is None:
        cfg["rope_scaling"] = _llama3_rope_scaling(path, cfg, _read_tensor(*freqs))
    found = {t.name: (p.path, t) for p in parts for t in p.tensors if t.name.startswith("rope_factors_")}
    if arch_name == "phi3" and len(found) == 2:  # LongRoPE: per-frequency factors live in tensors
        cfg["rope_scaling"] = {"rope_type": "longrope", "type": "longrope",
                               **{f"{k}_factor": _read_tensor(*found[f"rope_factors_{k}.weight"]).tolist()
                                  for k in ("long", "short")}}
        cfg["original_max_position_embeddings"] = meta.get("phi3.rope.scaling.original_context_length")
    tokenizer = _build_tokenizer(parts[0].path, meta)
    eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                             "tokenizer.ggml.eom_token_id") if k in meta]
    return GGUFCheckpoint(path, cfg, tokenizer, list(dict.fromkeys(eos)),
                          meta.get("tokenizer.ggml.bos_token_id"), parts, arch)
