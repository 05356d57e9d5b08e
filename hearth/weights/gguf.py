"""Pack functions from GGUF blocks: raw block rows -> hearth's int8 / int4 layouts (hearth.weights.layouts).

Only integer moves and the per-block scales are touched; the weights never pass through floats:
  Q8_0 (fp16 d, 32 int8)              -> int8, group 32, scale d (fp16, as stored)
  Q4_0 (fp16 d, 16 bytes of nibbles)  -> int4, group 32, scale d (fp16), min -8d  (nibble bytes copied as they are)
  Q4_1 (fp16 d, fp16 m, 16 bytes)     -> int4, group 32, scale d, min m (fp16)    (nibble bytes copied as they are)
  Q4_K (256-weight super-blocks: fp16 d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles)
                                      -> int4, group 32, scale d * sc, min -dmin * m; nibbles regrouped (Q4_K keeps
                                         sub-blocks 2j and 2j+1 in the low / high nibbles of the same 32 bytes)
  Q6_K (256-weight super-blocks: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, fp16 d)
                                      -> int8, group 16, scale d * sc, q = 6-bit value - 32 (the head llama-quantize
                                         writes beside Q4_0 layers, and Q4_K_M's ffn_down / attn_v); an untied LM
                                         head instead keeps its 6-bit values in tiles (repack_q6_tiles)
Each repack dequantizes (hearth.weights.reference.dequantize) to exactly gguf.quants.dequantize's floats.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hearth.kernels import quant as qkernels
from hearth.weights.packed import PANEL_COLS, QWeight

# ggml type id -> (name, weights per block, bytes per block) of the types kept quantized.
KEPT_TYPES = {8: ("Q8_0", 32, 34), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 12: ("Q4_K", 256, 144),
              14: ("Q6_K", 256, 210), 20: ("IQ4_NL", 32, 18), 23: ("IQ4_XS", 256, 136)}
KEPT_NAMES = frozenset(name for name, _, _ in KEPT_TYPES.values())
# llama.cpp's kvalues_iq4nl: the 16 non-linear values IQ4_NL / IQ4_XS indices select (ggml-common.h).
CODEBOOK_TYPES = frozenset({"IQ4_NL", "IQ4_XS"})  # repacked into the codebook layout (iq4_to_codebook)
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def kind(type_name: str) -> tuple[int, int, bool]:
    """(bits, group, codebook) of a kept type once repacked: shards of one layer concatenate only within one kind."""
    return (8 if type_name in ("Q8_0", "Q6_K") else 4, 16 if type_name == "Q6_K" else 32, type_name in CODEBOOK_TYPES)


@dataclass
class GGUFBlocks:
    """A GGUF weight kept in its blocks: data uint8 [N, K / block * block_bytes], rows in HF order."""

    ggml_type: int
    shape: tuple[int, int]  # [N, K]
    data: torch.Tensor

    @property
    def type_name(self) -> str:
        return KEPT_TYPES[self.ggml_type][0]

    @property
    def bits(self) -> int:
        return kind(self.type_name)[0]

    @property
    def group(self) -> int:
        """Weights per scale once repacked."""
        return kind(self.type_name)[1]

    @property
    def kind(self) -> tuple[int, int, bool]:
        return kind(self.type_name)

    def index_rows(self, index: torch.Tensor) -> GGUFBlocks:
        return GGUFBlocks(self.ggml_type, self.shape, self.data[index].contiguous())

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K] by gguf.quants (the reference)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        out = dequantize(self.data.numpy(), GGMLQuantizationType(self.ggml_type))
        return torch.from_numpy(np.ascontiguousarray(out)).reshape(self.shape)

    def repack(self) -> QWeight:
        return repack(self.ggml_type, self.data, self.shape)


def _f16(a: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 -> [...] fp32."""
    return _f16_raw(a).astype(np.float32)


def _f16_raw(a: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 -> [...] fp16 (kept as stored: the kernels widen fp16 scales exactly)."""
    return np.ascontiguousarray(np.ascontiguousarray(a).view(np.float16)[..., 0])


def _q4k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 scale bytes [..., 12] -> 6-bit scales and mins [..., 8] (llama.cpp's get_scale_min_k4)."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def repack(ggml_type: int, data: torch.Tensor, shape: tuple[int, int]) -> QWeight:
    """Raw GGUF rows (uint8 [N, row bytes]) -> QWeight; see the module docstring."""
    name, block, nbytes = KEPT_TYPES[ggml_type]
    n, k = shape
    nb = k // block
    b = data.numpy().reshape(n, nb, nbytes)
    if name == "Q8_0":
        q = np.ascontiguousarray(b[:, :, 2:]).view(np.int8).reshape(n, k)
        return QWeight(8, 32, torch.from_numpy(q), torch.from_numpy(_f16_raw(b[:, :, 0:2])), None)
    if name in ("Q4_0", "Q4_1"):
        d = _f16_raw(b[:, :, 0:2])
        # Q4_0 is symmetric (min = -8 d): no mins array. Scales (and mins) stay fp16 as stored: Q4_0 reads
        # 18 bytes per 32 weights like the file (20 with fp32 scales), Q4_1 20 (24).
        m = None if name == "Q4_0" else torch.from_numpy(_f16_raw(b[:, :, 2:4]))
        qs = np.ascontiguousarray(b[:, :, nbytes - 16:]).reshape(n, k // 2)  # already hearth's nibble order
        return QWeight(4, 32, torch.from_numpy(qs), torch.from_numpy(d), m)
    if name == "Q6_K":
        return q6k_to_int8(b, n, k)
    if name in ("IQ4_NL", "IQ4_XS"):
        return iq4_to_codebook(name, b, n, k)
    # Q4_K
    d, dmin = _f16(b[:, :, 0:2]), _f16(b[:, :, 2:4])  # [N, nb]
    sc, mn = _q4k_scale_min(b[:, :, 4:16])  # [N, nb, 8]
    scales = (d[..., None] * sc.astype(np.float32)).reshape(n, nb * 8)  # exact: 11-bit d times 6-bit sc
    mins = -(dmin[..., None] * mn.astype(np.float32)).reshape(n, nb * 8)
    qs = b[:, :, 16:].reshape(n, nb, 4, 32)
    sub = np.stack([qs & 0x0F, qs >> 4], axis=3)  # [N, nb, 4, 2, 32]: sub-block 2j, 2j+1 values
    packed = sub[..., :16] | (sub[..., 16:] << 4)  # hearth: byte i = v[i] | v[i + 16] << 4
    return QWeight(4, 32, torch.from_numpy(np.ascontiguousarray(packed).reshape(n, k // 2)),
                   torch.from_numpy(np.ascontiguousarray(scales)), torch.from_numpy(np.ascontiguousarray(mins)))


# The panel packer's view of a GGUF block: (bits, bytes before the weights).
_PANEL_BLOCKS = {"Q8_0": (8, 2), "Q4_0": (4, 2), "Q4_1": (4, 4)}


def panels_from_blocks(parts: list[GGUFBlocks]) -> QWeight | None:
    """cat(parts) (one layer's shards, rows in order) in VNNI panels, packed straight from the GGUF rows: the same
    QWeight as to_panels(cat(repack(part))) without the plain-row copy of each part or their concatenation. None where
    that does not apply: a type other than Q8_0 / Q4_0 / Q4_1 (or mixed), a part before the last that does not fill
    whole 64-row panels, or no packer here. The caller asks dispatch.panels_take whether panels run at all."""
    name = panel_block_type(parts)
    if name is None:
        return None
    bits, header = _PANEL_BLOCKS[name]
    n_all, k = sum(p.shape[0] for p in parts), parts[0].shape[1]
    nbytes = KEPT_TYPES[parts[0].ggml_type][2]
    panels = -(-n_all // PANEL_COLS)
    data = torch.empty(panels, PANEL_COLS * k * bits // 8, dtype=torch.uint8)
    scales, mins, p0 = [], [], 0
    for part in parts:
        n = part.shape[0]
        raw = part.data if part.data.is_contiguous() else part.data.contiguous()
        if not qkernels.pack_panels_blocks(raw, bits, n, k, nbytes, header, data[p0]):
            return None
        for out, at in ((scales, 0), (mins, 2)) if name == "Q4_1" else ((scales, 0),):
            got = qkernels.pack_panel_scales_blocks(raw, n, k, nbytes, at)
            if got is None:
                return None
            out.append(got)
        p0 += -(-n // PANEL_COLS)
    return QWeight(bits, 32, data, torch.cat(scales), torch.cat(mins) if mins else None, panel_rows=n_all)


def panel_block_type(parts: list[GGUFBlocks]) -> str | None:
    """The one GGUF type of parts if panels_from_blocks takes it (Q8_0 / Q4_0 / Q4_1, whole panels but the last)."""
    names = {p.type_name for p in parts}
    name = names.pop() if len(names) == 1 else None
    if name not in _PANEL_BLOCKS or any(p.shape[0] % PANEL_COLS for p in parts[:-1]):
        return None
    return name


def panel_block_bits(parts: list[GGUFBlocks]) -> int:
    """Bits of the panels panels_from_blocks would write for parts (0: it does not take them)."""
    name = panel_block_type(parts)
    return 0 if name is None else _PANEL_BLOCKS[name][0]


def iq4_to_codebook(name: str, b: np.ndarray, n: int, k: int) -> QWeight:
    """IQ4_NL blocks [N, nb, 18] / IQ4_XS super-blocks [N, nb, 136] -> the codebook layout, block 32: w =
    kvalues[q] * absmax, the fp32 product gguf.quants computes (d * (ls - 32) and its product with a 7-bit kvalue
    are exact in fp32, so no rounding order matters). Nibbles are already hearth's int4 order in both."""
    if name == "IQ4_NL":
        absmax = _f16(b[:, :, 0:2])  # [N, nb]
        qs = b[:, :, 2:]
    else:
        d = _f16(b[:, :, 0:2])
        high = b[:, :, 2:4].copy().view(np.uint16)  # [N, nb, 1]: 2 bits per sub-block, sub-block j at bit 2j
        high = (high >> (2 * np.arange(8, dtype=np.uint16))) & 3  # [N, nb, 8]
        low = b[:, :, 4:8, None] >> np.array([0, 4], np.uint8)  # [N, nb, 4, 2]: sub-block 2i + h
        ls = (low.reshape(n, -1, 8) & 0x0F) | (high.astype(np.uint8) << 4)
        absmax = d[..., None] * (ls.astype(np.float32) - 32.0)  # [N, nb, 8]
        qs = b[:, :, 8:]
    return QWeight(4, 32, torch.from_numpy(np.ascontiguousarray(qs).reshape(n, k // 2)),
                   torch.from_numpy(np.ascontiguousarray(absmax, dtype=np.float32).reshape(n, k // 32)), None,
                   codebook=torch.tensor(IQ4_VALUES, dtype=torch.float32))


def repack_q6_tiles(blocks: GGUFBlocks) -> QWeight:
    """Q6_K blocks -> hearth's 6-bit tiles (QWeight bits 6, the decode kernels' format for a Q6_K LM head; see
    csrc/quant.cpp kQ6Rec): each row's super-blocks stay the file's own 210-byte blocks ([ql 128][qh 64][16 scales][d]),
    rows 4t .. 4t + 3 interleaved super-block by super-block so a tile streams from one place. Exact (bytes moved)."""
    n, k = blocks.shape
    if blocks.type_name != "Q6_K" or n % 4 or k % 256:
        raise ValueError(f"repack_q6_tiles takes Q6_K weights with N % 4 == 0, got {blocks.type_name} {blocks.shape}")
    nsb = k // 256
    tiles = blocks.data.numpy().reshape(n // 4, 4, nsb, 210).transpose(0, 2, 1, 3)
    data = torch.from_numpy(np.ascontiguousarray(tiles).reshape(n, nsb * 210))
    return QWeight(6, 16, data, torch.empty(n, 0, dtype=torch.float32), None, tiled=True)


def q6k_to_int8(b: np.ndarray, n: int, k: int) -> QWeight:
    """Q6_K blocks [N, nb, 210] -> int8 group 16. Per 128 weights (half h of a super-block), 64 bytes of ql and 32 of
    qh: rows of 32 weights j = 0..3 take ql byte (j % 2) * 32 + l, low nibble for j < 2 else high, and the 2 bits of
    qh byte l at 2 * j (llama.cpp's dequantize_row_q6_K)."""
    nb = k // 256
    ql = b[:, :, :128].reshape(n, nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    qh = b[:, :, 128:192].reshape(n, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    low = (ql & 0x0F).reshape(n, nb, 8, 32)
    q = (low | ((qh & 0x03).reshape(n, nb, 8, 32) << 4)).view(np.int8) - np.int8(32)
    sc = b[:, :, 192:208].view(np.int8).astype(np.float32)  # [N, nb, 16]
    scales = (_f16(b[:, :, 208:210])[..., None] * sc).reshape(n, nb * 16)  # exact: 11-bit d times 8-bit sc
    return QWeight(8, 16, torch.from_numpy(np.ascontiguousarray(q).reshape(n, k)),
                   torch.from_numpy(np.ascontiguousarray(scales)), None)


def untile_q6(qw: QWeight) -> QWeight:
    """6-bit tiles (repack_q6_tiles) -> int8 q = value - 32, fp32 scales d * sc per 16 weights (exact): the rows put
    back in order, then the file's own Q6_K decode."""
    n, k = qw.shape
    nsb = k // 256
    rec = qw.data.reshape(n // 4, nsb, 4, 210).permute(0, 2, 1, 3).reshape(n, nsb, 210)
    return q6k_to_int8(rec.numpy(), n, k)
