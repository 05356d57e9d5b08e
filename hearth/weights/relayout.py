"""Re-layouts of a QWeight at load (exact byte permutations) and back: 4-row tiles and VNNI panels.

4-row tiles (int4, 32-weight groups): rows 4t .. 4t + 3 become one run of records with the scales inline, so a decode
tile of four output rows reads one address range instead of eight streams (csrc/quant.cpp, TileGeo).
VNNI panels (int8 / int4, groups of 32 or more): 64 columns x 4 k per 32-bit lane group, read by one broadcast-form
vpdpbusd GEMM at every row count (csrc/quant_panel.cpp). Which one a weight gets is hearth.weights.prepare's choice.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hearth.kernels import quant as qkernels
from hearth.weights.gguf import untile_q6
from hearth.weights.packed import PANEL_COLS, QWeight, pack_u4, panel_scales, unpack_u4


def plain(qw: QWeight) -> QWeight:
    """The weight in plain rows (copies for tiles and panels; 6-bit tiles become int8 with 16-weight groups)."""
    return untile_rows4(from_panels(qw))


def can_tile(qw: QWeight) -> bool:
    """int4, 32-weight groups, K % 64 == 0 and N % 4 == 0 (the tile layout's domain), not tiled yet."""
    n, k = qw.shape
    return qw.bits == 4 and qw.codebook is None and qw.group == 32 and not qw.tiled and k % 64 == 0 and n % 4 == 0 and n > 0


def tile_rows4(qw: QWeight) -> QWeight:
    """The same weight in 4-row tiles (exact, a byte permutation): rows 4t .. 4t + 3 become one run of records, each
    four pairs of blocks (256 weights; the last one K % 256 / 64 pairs) laid out as
        [scales: 4 rows x 8][mins: 4 rows x 8, if any][quants: 4 rows x 128 bytes]
    so a decode tile of four rows streams from one address range instead of eight (see csrc/quant.cpp, TileGeo)."""
    if not can_tile(qw):
        raise ValueError(f"tile_rows4 takes int4 group-32 weights with K % 64 == 0 and N % 4 == 0, got "
                         f"int{qw.bits} group {qw.group} shape {qw.shape}{' (tiled)' if qw.tiled else ''}")
    n, k = qw.shape
    t, npairs = n // 4, k // 64
    nq = npairs // 4
    parts = [qw.scales] + ([] if qw.mins is None else [qw.mins])
    # per tile, row, pair: the pair's bytes of each part
    views = [p.contiguous().view(torch.uint8).view(t, 4, npairs, -1) for p in parts]
    views.append(qw.data.contiguous().view(t, 4, npairs, 32))
    records = []
    for a, b, m in ((0, 4 * nq, nq), (4 * nq, npairs, 1)):  # the full records, then the last (if any)
        if b > a:
            # [t, 4, pairs, bytes] -> [t, records, 4 rows x pairs-of-record x bytes] per part, parts side by side
            cols = [v[:, :, a:b].reshape(t, 4, m, -1).permute(0, 2, 1, 3).reshape(t, m, -1) for v in views]
            records.append(torch.cat(cols, dim=2).reshape(t, -1))
    data = torch.cat(records, dim=1).reshape(n, -1).contiguous()
    empty = torch.empty(n, 0, dtype=qw.scales.dtype)
    return QWeight(4, 32, data, empty, None if qw.mins is None else torch.empty(n, 0, dtype=qw.scales.dtype),
                   tiled=True)


def untile_rows4(qw: QWeight) -> QWeight:
    """Inverse of tile_rows4: the plain layout (copies). 6-bit tiles become int8 with 16-weight groups."""
    if not qw.tiled:
        return qw
    if qw.bits == 6:
        return untile_q6(qw)
    n, k = qw.shape
    t, npairs = n // 4, k // 64
    nq = npairs // 4
    sdt = qw.scales.dtype
    ssz = qw.scales.element_size()
    sizes = [2 * ssz] * (1 if qw.mins is None else 2) + [32]  # bytes per pair of each part
    flat = qw.data.reshape(t, -1)
    pieces: list[list[torch.Tensor]] = [[] for _ in sizes]
    off = 0
    for a, b, m in ((0, 4 * nq, nq), (4 * nq, npairs, 1)):  # as tile_rows4
        if b > a:
            per = (b - a) // m  # pairs per record
            rec = flat[:, off:off + m * 4 * per * sum(sizes)].reshape(t, m, -1)
            off += m * 4 * per * sum(sizes)
            c = 0
            for i, sz in enumerate(sizes):
                part = rec[:, :, c:c + 4 * per * sz].reshape(t, m, 4, per * sz).permute(0, 2, 1, 3)
                pieces[i].append(part.reshape(t, 4, (b - a) * sz))
                c += 4 * per * sz
    cols = [torch.cat(p, dim=2).reshape(n, -1).contiguous() for p in pieces]
    scales = cols[0].view(sdt)
    mins = cols[1].view(sdt) if qw.mins is not None else None
    return QWeight(4, 32, cols[-1], scales, mins)


def to_panels(qw: QWeight, chunk: int = 64, kernel: bool = True) -> QWeight:
    """The weight in VNNI panels (csrc/quant_panel.cpp's layout; exact: from_panels gives the rows back): by the
    kernel library's packer (hq_pack_panels), or (kernel=False, or no VNNI) in torch, `chunk` panels at a time into
    the result, so a big table (a tied head's) needs little memory beyond it. Same bytes either way."""
    qw = untile_rows4(qw)
    n, k = qw.shape
    p = -(-n // PANEL_COLS)
    per_panel = PANEL_COLS * k // (1 if qw.bits == 8 else 2)
    data = torch.empty(p, per_panel, dtype=torch.uint8)
    src = qw.data if qw.data.stride(1) == 1 else qw.data.contiguous()
    packed = kernel and qkernels.pack_panels(src, qw.bits, n, k, data)
    for p0 in range(0, 0 if packed else p, chunk):  # (the torch form: no VNNI kernels here; the tests' reference)
        p1 = min(p, p0 + chunk)
        rows = qw.data[p0 * PANEL_COLS:min(n, p1 * PANEL_COLS)]
        u = rows.view(torch.uint8) ^ 0x80 if qw.bits == 8 else unpack_u4(rows)  # int8: q + 128 (mod 256)
        u = F.pad(u, (0, 0, 0, (p1 - p0) * PANEL_COLS - u.shape[0]))
        u = u.reshape(p1 - p0, PANEL_COLS, k // 4, 4).permute(0, 2, 1, 3)  # [panels, K/4, 64, 4]
        if qw.bits == 4:  # columns 32v + i (low nibble) and 32v + 16 + i (high) share byte (v, i)
            u = u.reshape(p1 - p0, k // 4, 2, 2, 16, 4)
            u = u[:, :, :, 0] | (u[:, :, :, 1] << 4)
        data[p0:p1] = u.reshape(p1 - p0, -1)
    return QWeight(qw.bits, qw.group, data, panel_scales(qw.scales), panel_scales(qw.mins), panel_rows=n)


def from_panels(qw: QWeight) -> QWeight:
    """Inverse of to_panels: the plain rows."""
    if not qw.panel_rows:
        return qw
    n, k = qw.shape
    p = qw.data.shape[0]
    if qw.bits == 8:
        u = qw.data.reshape(p, k // 4, PANEL_COLS, 4)
    else:
        b = qw.data.reshape(p, k // 4, 2, 1, 16, 4)
        u = torch.cat([b & 0x0F, b >> 4], dim=3).reshape(p, k // 4, PANEL_COLS, 4)
    rows = u.permute(0, 2, 1, 3).reshape(p * PANEL_COLS, k)[:n]
    data = (rows.to(torch.int16) - 128).to(torch.int8) if qw.bits == 8 else pack_u4(rows.contiguous())

    def per_row(s: torch.Tensor | None) -> torch.Tensor | None:
        if s is None:
            return None
        return s.reshape(p, -1, PANEL_COLS).transpose(1, 2).reshape(p * PANEL_COLS, -1)[:n].contiguous()

    return QWeight(qw.bits, qw.group, data.contiguous(), per_row(qw.scales), per_row(qw.mins))


def gather_panels(qw: QWeight, ids: torch.Tensor) -> torch.Tensor:
    """dequantize(qw)[ids] read from the panels (a tied head's table: token lookups), without unpacking the table."""
    n, k = qw.shape
    ids = ids.to(torch.int64).reshape(-1)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise IndexError(f"token id out of range for an embedding table of {n} rows")
    p, c = ids // PANEL_COLS, ids % PANEL_COLS
    panels = qw.data.shape[0]
    if qw.bits == 8:
        q = qw.data.view(panels, k // 4, PANEL_COLS, 4)[p, :, c, :].reshape(-1, k).to(torch.int16) - 128
    else:  # byte (v, i) of a quad: column 32v + i low nibble, 32v + 16 + i high
        b = qw.data.view(panels, k // 4, 2, 16, 4)[p, :, c // 32, c % 16, :].reshape(-1, k)
        q = (b >> (4 * ((c % 32) // 16)).to(torch.uint8)[:, None]) & 0x0F
    g = qw.group
    ng = k // g

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t.view(panels, ng, PANEL_COLS)[p, :, c].float()[..., None]

    s = pick(qw.scales)
    if qw.bits == 8:
        return (q.float().reshape(-1, ng, g) * s).reshape(-1, k)
    mins = pick(qw.mins) if qw.mins is not None else -8.0 * s
    return torch.addcmul(mins, q.float().reshape(-1, ng, g), s).reshape(-1, k)
