"""GGUF files read: the header parsed with `struct` over an mmap (gguf.GGUFReader builds a Python object per vocab
string: seconds for a big vocabulary), split files joined, tensor bytes dequantized through `gguf.quants`."""
from __future__ import annotations

import math
import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np
import torch

from hearth.errors import LoadError


class GGUFError(LoadError):
    """A GGUF that cannot be loaded; one line naming the file and the fix."""


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
       7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STR, _ARR = 8, 9
# ggml type id -> (name, elements per block, bytes per block); the types we dequantize (through gguf.quants).
# Q4_K_M / Q5_K_M files mix several of these (e.g. Q5_0 and Q8_0 tensors inside a "Q4_K_M" file).
_TYPE_NAMES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
               "Q6_K", "IQ4_NL", "IQ4_XS"]
TYPES = {gguf.GGMLQuantizationType[n].value: (n, *gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[n]])
          for n in _TYPE_NAMES}
TORCH_FLOAT = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


class _Corrupt(Exception):
    """Internal: the header does not parse; translated to GGUFError with the path."""


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order: [out, in] for a weight (ggml stores dims innermost-first)
    ggml_type: int
    start: int  # absolute file offset of the data
    nbytes: int


@dataclass
class Part:
    path: str
    metadata: dict[str, Any]
    tensors: list[TensorInfo]


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


def _read_part(path: str) -> Part:
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
        if ggml_type not in TYPES:
            supported = ", ".join(t[0] for t in TYPES.values())
            raise GGUFError(f"{path}: tensor {name!r} has ggml type {ggml_type}, not supported (supported: "
                            f"{supported}); use a file quantized to one of those")
        _, block, block_bytes = TYPES[ggml_type]
        n = math.prod(shape)  # python ints: a corrupt dim must not wrap around
        if shape and shape[-1] % block:
            raise GGUFError(f"{path}: tensor {name!r} row length {shape[-1]} is not a multiple of {block}; "
                            "the file is corrupt, re-convert it")
        info = TensorInfo(name, shape, ggml_type, data_start + offset, n // block * block_bytes)
        if info.start + info.nbytes > size:
            raise GGUFError(f"{path}: truncated: tensor {name!r} ends at byte {info.start + info.nbytes} but the "
                            f"file has {size}; re-download the file")
        tensors.append(info)
    return Part(path, meta, tensors)


_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def read_parts(path: str) -> list[Part]:
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


def read_tensor(path: str, info: TensorInfo) -> torch.Tensor:
    with open(path, "rb") as f:
        f.seek(info.start)
        return dequantize(f.read(info.nbytes), info)


def dequantize(raw: bytes, info: TensorInfo) -> torch.Tensor:
    if info.ggml_type in TORCH_FLOAT:
        return torch.frombuffer(bytearray(raw), dtype=TORCH_FLOAT[info.ggml_type]).reshape(info.shape)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    _, block, block_bytes = TYPES[info.ggml_type]
    rows = np.frombuffer(raw, np.uint8).reshape(*info.shape[:-1], info.shape[-1] // block * block_bytes)
    out = dequantize(rows, GGMLQuantizationType(info.ggml_type))  # float32, shape == info.shape
    return torch.from_numpy(np.ascontiguousarray(out)).reshape(info.shape)
