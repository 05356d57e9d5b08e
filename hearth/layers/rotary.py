"""Rotary position embeddings (neox / HF "rotate_half" layout) with the rope_scaling kinds HF configs use."""
from __future__ import annotations

import math

import torch
from torch import nn

from hearth.kernels import fused
from hearth.kernels.decoder import RopeSpec


def _inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin for every position up to max_len; applied to q and k in place of HF's rotate_half."""

    def __init__(self, head_dim: int, rotary_dim: int, max_len: int, base: float,
                 rope_scaling: dict | None = None, max_position_embeddings: int | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.max_len = max_len
        # longrope only: sequences longer than this use the long factors (rows max_len.. of the table)
        self.long_after: int | None = None
        s = dict(rope_scaling or {})
        kind = s.get("rope_type") or s.get("type") or "default"
        inv_freq = _inv_freq(rotary_dim, base)
        attn_factor = 1.0
        positions = torch.arange(max_len, dtype=torch.float64)
        if kind == "linear":
            positions = positions / s["factor"]
        elif kind == "dynamic":
            # HF rescales the base once a sequence outgrows max_position_embeddings. We fix it for max_len, so
            # sequences within the trained length see exactly HF's values.
            orig = max_position_embeddings or max_len
            if max_len > orig:
                factor = s["factor"]
                base = base * ((factor * max_len / orig) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
                inv_freq = _inv_freq(rotary_dim, base)
        elif kind == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, s)
        elif kind == "yarn":
            inv_freq, attn_factor = _yarn(inv_freq, rotary_dim, base, s, max_position_embeddings)
        elif kind in ("longrope", "su"):
            inv_freq, attn_factor, self.long_after = _longrope(inv_freq, s, max_position_embeddings or max_len)
        elif kind != "default":
            raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: default, linear, "
                             "dynamic, llama3, yarn, longrope)")
        # inv_freq: [rotary_dim / 2], or [2, rotary_dim / 2] for longrope: short rows first, then long rows
        freqs = torch.cat([torch.outer(positions, f) for f in inv_freq.view(-1, inv_freq.shape[-1])])
        self.register_buffer("cos", (freqs.cos() * attn_factor).float(), persistent=False)
        self.register_buffer("sin", (freqs.sin() * attn_factor).float(), persistent=False)

    def program_spec(self) -> RopeSpec | None:
        """NeoX rotary from this table, as the decode program applies it (fp32 contiguous tables only)."""
        if self.cos.dtype != torch.float32 or not (self.cos.is_contiguous() and self.sin.is_contiguous()):
            return None
        return RopeSpec(self.rotary_dim, self.cos, self.sin)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] (rows of the cos/sin table); q: [T, Hq, D]; k: [T, Hk, D]. May rotate q and k in place."""
        if fused.rope_neox_(q, k, self.cos, self.sin, positions, self.rotary_dim):
            return q, k
        cos = self.cos[positions].unsqueeze(1)  # [T, 1, rot/2]
        sin = self.sin[positions].unsqueeze(1)
        return self._apply(q, cos, sin), self._apply(k, cos, sin)

    def table_index(self, positions: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Rows of the cos/sin table for tokens at positions whose sequences hold seq_lens tokens so far.

        Only longrope depends on the length: like HF, a sequence longer than the original context uses the long
        factors at every position (HF decides per forward call, so a prompt prefilled in one call matches exactly).
        """
        if self.long_after is None:
            return positions
        return positions + (seq_lens > self.long_after).long() * self.max_len

    def _apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot = self.rotary_dim
        xr = x[..., :rot].float()
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
        if rot == x.shape[-1]:
            return out
        return torch.cat((out, x[..., rot:]), dim=-1)


def _yarn(inv_freq: torch.Tensor, dim: int, base: float, s: dict, max_pos: int | None) -> tuple[torch.Tensor, float]:
    factor = s["factor"]
    orig = s.get("original_max_position_embeddings") or max_pos
    beta_fast, beta_slow = s.get("beta_fast", 32), s.get("beta_slow", 1)
    mscale = s.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    return inv, mscale


def _longrope(inv_freq: torch.Tensor, s: dict, max_pos: int) -> tuple[torch.Tensor, float, int]:
    """Phi-3's LongRoPE ("su"): per-dimension divisors for short and long contexts, one attention factor for both."""
    orig = s.get("original_max_position_embeddings") or max_pos
    factor = s.get("factor") or max_pos / orig
    attn_factor = s.get("attention_factor")
    if attn_factor is None:
        attn_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    short = torch.tensor(s["short_factor"], dtype=torch.float64)
    long = torch.tensor(s["long_factor"], dtype=torch.float64)
    if short.numel() != inv_freq.numel() or long.numel() != inv_freq.numel():
        raise ValueError(f"longrope short_factor/long_factor must have {inv_freq.numel()} entries (rotary_dim / 2), "
                         f"got {short.numel()} and {long.numel()}")
    return torch.stack((inv_freq / short, inv_freq / long)), attn_factor, int(orig)


def get_rope(cfg, head_dim: int, max_len: int, rotary_dim: int | None = None) -> RotaryEmbedding:
    """Build the rotary embedding a HF-style config describes."""
    base = cfg.get("rope_theta") or 10000.0
    scaling = cfg.get("rope_scaling")
    if scaling is None and isinstance(cfg.get("rope_parameters"), dict):  # transformers >= 5 layout
        rp = cfg["rope_parameters"]
        base = rp.get("rope_theta", base)
        scaling = rp if rp.get("rope_type", "default") != "default" else None
    if scaling is not None and cfg.get("original_max_position_embeddings") and \
            (scaling.get("rope_type") or scaling.get("type")) in ("longrope", "su"):
        # NOTE: Phi-3 keeps the pretraining length at the top level; like HF, it wins over the dict's.
        scaling = {**scaling, "original_max_position_embeddings": cfg["original_max_position_embeddings"]}
    return RotaryEmbedding(head_dim, rotary_dim or head_dim, max_len, float(base), scaling,
                           cfg.get("max_position_embeddings"))
