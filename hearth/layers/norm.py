"""Normalization layers. Computed in float32 like HF, returned in the input dtype."""
import torch
from torch import nn

from hearth.kernels import fused
from hearth.kernels.decoder import NormSpec


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset  # Gemma stores weight - 1: its norm multiplies by (1 + weight)
        self.weight = nn.Parameter(torch.ones(hidden_size) if offset == 0 else torch.zeros(hidden_size),
                                   requires_grad=False)
        self._weight32: tuple[tuple[int, int], torch.Tensor] | None = None  # fp32 copy for the C kernel

    def weight32(self) -> torch.Tensor:
        """The weight in fp32, converted once (again only if the weight is replaced or changed in place)."""
        w = self.weight
        key = (w.data_ptr(), w._version)
        if self._weight32 is None or self._weight32[0] != key:
            self._weight32 = (key, w.detach().float().contiguous())
        return self._weight32[1]

    def program_spec(self) -> NormSpec:
        """This norm as the decode program applies it (RMSNorm: fused with the residual add)."""
        return NormSpec(self.weight32(), self.offset, self.eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor | tuple:
        """With residual: returns (norm(x + residual), x + residual), the pre-norm transformer's fused step."""
        out = fused.rms_norm(x, self.weight32(), self.offset, self.eps, residual)
        if out is not None:  # one C call; below, the same math in torch ops
            return out
        if residual is not None:
            x = x + residual
            residual = x
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = h * (self.weight.float() + self.offset)
        h = h.to(dtype)
        return h if residual is None else (h, residual)


class LayerNorm(nn.LayerNorm):
    """affine=False: no weight or bias at all (OLMo's non-parametric norm)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, bias: bool = True, affine: bool = True) -> None:
        super().__init__(hidden_size, eps=eps, elementwise_affine=affine, bias=bias)
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor | tuple:
        if residual is not None:
            x = x + residual
            residual = x
        h = nn.functional.layer_norm(x.float(), self.normalized_shape,
                                     None if self.weight is None else self.weight.float(),
                                     None if self.bias is None else self.bias.float(), self.eps).to(x.dtype)
        return h if residual is None else (h, residual)
