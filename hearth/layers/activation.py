import torch
import torch.nn.functional as F

from hearth.kernels import fused


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2 * d] (gate, up) -> silu(gate) * up: [..., d]."""
    out = fused.act_and_mul(x, "silu")
    if out is not None:
        return out
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    out = fused.act_and_mul(x, "gelu_tanh")
    if out is not None:
        return out
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


ACT_AND_MUL = {"silu": silu_and_mul, "swish": silu_and_mul, "gelu_pytorch_tanh": gelu_tanh_and_mul,
               "gelu_tanh": gelu_tanh_and_mul, "gelu": gelu_tanh_and_mul}
