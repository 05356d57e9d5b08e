"""A GGUF checkpoint opened: HF-style config, HF-named tensors (dequantized, or kept in their blocks), tokenizer."""
from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from hearth.config import HFConfig
from hearth.loader.gguf import reader
from hearth.loader.gguf.arch import ARCHS, IGNORED, Arch, build_config, hf_name, llama3_rope_scaling
from hearth.loader.gguf.reader import TORCH_FLOAT, TYPES, GGUFError, Part, TensorInfo, read_parts, read_tensor
from hearth.loader.gguf.tokenizer import build_tokenizer
from hearth.tokenizer import Tokenizer
from hearth.weights.gguf import GGUFBlocks
from hearth.platform import MADV_POPULATE_READ


@dataclass
class GGUFCheckpoint:
    path: str
    hf_config: HFConfig
    tokenizer: Tokenizer  # its info.chat_template: the GGUF's tokenizer.chat_template
    eos_token_ids: list[int]
    bos_token_id: int | None
    _parts: list[Part] = field(repr=False, default_factory=list)
    _arch: Arch | None = field(repr=False, default=None)

    def tensors(self, dtype: torch.dtype, keep_quantized: frozenset[str] = frozenset(),
                placeholders: frozenset[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor | GGUFBlocks]]:
        """(HF name, tensor in HF layout, dtype), one at a time; only one tensor's bytes are resident.

        Linear weights and the embedding table of a ggml type named in `keep_quantized` (a subset of
        weights.gguf.KEPT_NAMES: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, IQ4_NL, IQ4_XS) come as GGUFBlocks (raw rows, HF row order) instead.
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
                    hf = hf_name(info.name, self._arch)
                    if hf is None:
                        continue  # IGNORED, checked at load
                    if hf in placeholders:
                        yield hf, _untouched_zeros(tuple(info.shape), dtype)
                        continue
                    if TYPES[info.ggml_type][0] in keep_quantized and (_is_linear_weight(hf, info)
                                                                         or hf == "model.embed_tokens.weight"):
                        blocks = self._blocks(part.path, info, hf)
                        yield hf, blocks
                        continue
                    t = reader.dequantize(buf[info.start:info.start + info.nbytes], info)
                    _release(buf, info)
                    if self._arch.permute_qk and ".self_attn.q_proj." in hf:
                        t = unpermute_rows(t, cfg["num_attention_heads"])
                    elif self._arch.permute_qk and ".self_attn.k_proj." in hf:
                        t = unpermute_rows(t, cfg["num_key_value_heads"])
                    if self._arch.norm_offset and hf.endswith("norm.weight"):
                        t = t.float() - self._arch.norm_offset  # in fp32, before any downcast
                    yield hf, _storage(t, dtype, info, "embed_tokens" not in hf).contiguous()
            finally:
                buf.close()

    @property
    def architecture(self) -> str:
        """The file's general.architecture (a key of arch.ARCHS)."""
        return self._parts[0].metadata["general.architecture"]

    def tensor_infos(self) -> Iterator[tuple[str, TensorInfo]]:
        """(HF name, header) of every tensor the model reads, without reading any bytes."""
        assert self._arch is not None
        for part in self._parts:
            for info in part.tensors:
                hf = hf_name(info.name, self._arch)
                if hf is not None:
                    yield hf, info

    @property
    def has_output_weight(self) -> bool:
        """False when the head is tied to token_embd.weight (no output.weight tensor)."""
        return any(info.name == "output.weight" for part in self._parts for info in part.tensors)

    def _head(self, keep_quantized: frozenset[str]) -> tuple[Part, TensorInfo] | None:
        infos = {info.name: (part, info) for part in self._parts for info in part.tensors}
        found = infos.get("output.weight") or infos.get("token_embd.weight")
        if found is None or TYPES[found[1].ggml_type][0] not in keep_quantized:
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
        # A view of the file, not a copy: the head's packer reads it a step of rows at a time and hands each step's
        # pages back (prepare.head_weight), so its raw bytes never sit beside the packed head whole. (A private
        # mapping: writable for torch, never written; the tensor keeps it alive and it is unmapped with it.)
        with open(part.path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return _as_blocks(info, torch.frombuffer(buf, dtype=torch.uint8, count=info.nbytes, offset=info.start))

    def _blocks(self, path: str, info: TensorInfo, hf: str) -> GGUFBlocks:
        """Raw rows of a block-quantized weight; q/k rows un-permuted (rows of block formats are independent)."""
        rows = info.shape[0]
        blocks = _as_blocks(info, _file_view(path, info))
        heads = None
        if self._arch.permute_qk and ".self_attn.q_proj." in hf:
            heads = self.hf_config["num_attention_heads"]
        elif self._arch.permute_qk and ".self_attn.k_proj." in hf:
            heads = self.hf_config["num_key_value_heads"]
        return blocks if heads is None else blocks.index_rows(unpermute_rows(torch.arange(rows), heads))


def _as_blocks(info: TensorInfo, data: torch.Tensor) -> GGUFBlocks:
    """A block-quantized tensor's bytes (uint8, flat) as its rows of blocks."""
    _, block, block_bytes = TYPES[info.ggml_type]
    rows, cols = info.shape
    return GGUFBlocks(info.ggml_type, (rows, cols), data.reshape(rows, cols // block * block_bytes))


def _untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros in fresh anonymous pages: contiguous, so the layer adopts the tensor instead of copying it (a stride-0
    view was copied, faulting in a whole dense head), and never touched, so it is never resident."""
    count = math.prod(shape)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    buf = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # (the default is shmem)
    return torch.frombuffer(buf, dtype=dtype, count=count).view(shape)


def _file_view(path: str, info: TensorInfo) -> torch.Tensor:
    """A tensor's bytes (uint8, flat) as a view of its own private mapping of the file, its pages mapped in with one
    call: no copy of the bytes (copying a 7B's blocks out of the page cache was a third of its load), and resident
    exactly as long as a copy would be (the mapping goes with the last view of it; a packer may hand pages back
    sooner: panel_pack.release_file_pages). Never written (copy-on-write: a write would not reach the file)."""
    lo = info.start // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), info.start + info.nbytes - lo, access=mmap.ACCESS_COPY, offset=lo)
    try:
        buf.madvise(MADV_POPULATE_READ)
    except (OSError, ValueError):  # (before Linux 5.14: the packer faults the pages in as it reads)
        pass
    return torch.frombuffer(buf, dtype=torch.uint8, count=info.nbytes, offset=info.start - lo)


def _release(buf: mmap.mmap, info: TensorInfo) -> None:
    """Unmap a tensor's file pages from this process once its bytes are copied out (the page cache keeps them):
    else the mapping holds the whole file resident beside the weights made from it until the last tensor (a 7B
    Q4_0's 4.4 GB twice at peak)."""
    lo = info.start // mmap.PAGESIZE * mmap.PAGESIZE
    buf.madvise(mmap.MADV_DONTNEED, lo, info.start + info.nbytes - lo)


def kept_as_blocks(hf: str, info: TensorInfo, keep_quantized: frozenset[str]) -> bool:
    """The tensor stays in its blocks: a linear weight, the embedding table or the LM head (GGUFCheckpoint.head_blocks)
    of a type in keep_quantized. Every other tensor of a block type is dequantized at load (widened)."""
    return TYPES[info.ggml_type][0] in keep_quantized and (
        _is_linear_weight(hf, info) or hf in ("model.embed_tokens.weight", "lm_head.weight"))


def storage_dtype(dtype: torch.dtype, info: TensorInfo, read_per_step: bool) -> torch.dtype:
    """The dtype a model in `dtype` receives a dequantized tensor in: F16/BF16 matrices as stored in a float32 model
    (Linear and Embedding keep 16-bit weights where the kernels read them, else widen exactly). A block type read
    densely by a projection or the head (read_per_step: a type not kept quantized, Q5_0, Q5_K, ..., or any block
    type when keeping is off) comes as float16: half the bytes per decode step of float32, for a rounding of
    <= 2^-11 relative, far below the block format's own step. Embedding tables (row lookups) stay exact."""
    if dtype != torch.float32 or len(info.shape) != 2:
        return dtype
    if info.ggml_type in TORCH_FLOAT:
        return TORCH_FLOAT[info.ggml_type]
    return torch.float16 if read_per_step else dtype


def _storage(t: torch.Tensor, dtype: torch.dtype, info: TensorInfo, read_per_step: bool) -> torch.Tensor:
    return t.to(storage_dtype(dtype, info, read_per_step))


def _is_linear_weight(hf: str, info: TensorInfo) -> bool:
    # (lm_head stays a float Linear, like the embedding)
    return len(info.shape) == 2 and hf.endswith(".weight") and "embed_tokens" not in hf and not hf.startswith("lm_head")


def unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of convert_hf_to_gguf.py's permute: per head, rows (2, d/2) were stored as (d/2, 2)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def load_gguf(path: str) -> GGUFCheckpoint:
    """Parse a GGUF (or all parts of a split one): config, tokenizer; tensors are read lazily later."""
    path = os.fspath(path)
    parts = read_parts(path)
    meta = parts[0].metadata
    arch_name = meta.get("general.architecture")
    if arch_name not in ARCHS:
        raise GGUFError(f"{path}: GGUF architecture {arch_name!r} is not supported (supported: "
                        f"{', '.join(ARCHS)}); use a model of a supported architecture")
    arch = ARCHS[arch_name]
    names = {t.name for p in parts for t in p.tensors}
    unknown = sorted(n for n in names if hf_name(n, arch) is None and n not in IGNORED)
    if unknown:
        raise GGUFError(f"{path}: {len(unknown)} tensors have no HF mapping for {arch_name} (e.g. {unknown[:3]}); "
                        "this GGUF variant is not supported")
    cfg = build_config(path, meta, arch_name, arch, names)
    freqs = next(((p.path, t) for p in parts for t in p.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None and arch_name == "llama" and cfg["rope_scaling"] is None:
        cfg["rope_scaling"] = llama3_rope_scaling(path, cfg, read_tensor(*freqs))
    found = {t.name: (p.path, t) for p in parts for t in p.tensors if t.name.startswith("rope_factors_")}
    if arch_name == "phi3" and len(found) == 2:  # LongRoPE: per-frequency factors live in tensors
        cfg["rope_scaling"] = {"rope_type": "longrope", "type": "longrope",
                               **{f"{k}_factor": read_tensor(*found[f"rope_factors_{k}.weight"]).tolist()
                                  for k in ("long", "short")}}
        cfg["original_max_position_embeddings"] = meta.get("phi3.rope.scaling.original_context_length")
    tokenizer = build_tokenizer(parts[0].path, meta)
    eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                             "tokenizer.ggml.eom_token_id") if k in meta]
    return GGUFCheckpoint(path, cfg, tokenizer, list(dict.fromkeys(eos)),
                          meta.get("tokenizer.ggml.bos_token_id"), parts, arch)
