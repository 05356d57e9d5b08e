"""The element-wise steps of a decoder layer as single C calls (csrc/fused.cpp): RMSNorm (+ residual add),
rotary embedding in place, gated activations, the paged KV-cache write; and drawing tokens from logits (random
and greedy).

Each function returns None when the kernel cannot take the input (kernels unavailable, unusual strides or
dtypes); the caller then runs its torch code. Results equal the torch code's up to fp32 summation order.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from hearth import kernels
from hearth.kernels import _build

_DTYPE_CODE = kernels._DTYPE_CODE
ACT_CODE = {"silu": 0, "gelu_tanh": 1}


@functools.cache
def _lib() -> ctypes.CDLL | None:
    if not kernels.available():
        return None
    return _build.load()


def available() -> bool:
    return _lib() is not None


def _rows(x: torch.Tensor) -> torch.Tensor | None:
    """x as [rows, last dim] with unit stride along the last dim (a view when possible), or None."""
    if x.dtype not in _DTYPE_CODE or x.numel() == 0:
        return None
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1 or (x2.shape[0] > 1 and x2.stride(0) < x2.shape[1]):
        return None
    return x2


def rms_norm(x: torch.Tensor, weight32: torch.Tensor, offset: float, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
    """norm(x) or, with residual, (norm(x + residual), x + residual); weight32: fp32 [H]."""
    lib = _lib()
    if lib is None:
        return None
    x2 = _rows(x)
    r2 = None if residual is None else _rows(residual)
    if x2 is None or (residual is not None and (r2 is None or residual.dtype != x.dtype
                                                 or residual.shape != x.shape)):
        return None
    t, h = x2.shape
    out = torch.empty(x.shape, dtype=x.dtype)
    total = torch.empty(x.shape, dtype=x.dtype) if residual is not None else None
    rc = lib.hk_rms_norm(x2.data_ptr(), x2.stride(0), r2.data_ptr() if r2 is not None else None,
                         r2.stride(0) if r2 is not None else 0, weight32.data_ptr(), offset, eps, out.data_ptr(),
                         total.data_ptr() if total is not None else None, t, h, _DTYPE_CODE[x.dtype],
                         torch.get_num_threads())
    if rc:
        raise RuntimeError(f"hk_rms_norm failed with code {rc}")
    return out if total is None else (out, total)


def _heads_ok(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """[T, H, D] with unit stride along D and heads adjacent: rows of one token are one strided run."""
    return (x.dim() == 3 and x.dtype == dtype and x.stride(2) == 1 and x.stride(1) == x.shape[2]
            and (x.shape[0] == 1 or x.stride(0) >= x.shape[1] * x.shape[2]))


def rope_neox_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor,
               rotary_dim: int) -> bool:
    """Rotates q [T, Hq, D] and k [T, Hk, D] in place with table rows `rows` [T]; False if it could not."""
    lib = _lib()
    if lib is None or q.dtype not in _DTYPE_CODE or not (_heads_ok(q, q.dtype) and _heads_ok(k, q.dtype)):
        return False
    if rows.dtype != torch.int64 or not rows.is_contiguous() or rows.numel() != q.shape[0]:
        return False
    rc = lib.hk_rope_neox(q.data_ptr(), q.stride(0), q.shape[1], k.data_ptr(), k.stride(0), k.shape[1], q.shape[2],
                          rotary_dim, cos.data_ptr(), sin.data_ptr(), rows.data_ptr(), q.shape[0],
                          _DTYPE_CODE[q.dtype], torch.get_num_threads())
    if rc:
        raise RuntimeError(f"hk_rope_neox failed with code {rc}")
    return True


def act_and_mul(x: torch.Tensor, act: str) -> torch.Tensor | None:
    """act(gate) * up for x = [..., 2d] (gate first) -> [..., d]."""
    lib = _lib()
    x2 = _rows(x) if lib is not None else None
    if x2 is None or x2.shape[1] % 2:
        return None
    t, d = x2.shape[0], x2.shape[1] // 2
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype)
    rc = lib.hk_act_and_mul(x2.data_ptr(), x2.stride(0), out.data_ptr(), t, d, ACT_CODE[act], _DTYPE_CODE[x.dtype],
                            torch.get_num_threads())
    if rc:
        raise RuntimeError(f"hk_act_and_mul failed with code {rc}")
    return out


def kv_write(k: torch.Tensor, v: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor,
             slot_mapping: torch.Tensor) -> bool:
    """k_flat[slot_mapping] = k; v_flat[slot_mapping] = v (k, v: [T, Hkv, D]; caches [slots, Hkv, D], same dtype)
    in one call; False if it could not (the caller then uses index_copy_)."""
    lib = _lib()
    if lib is None or not (_heads_ok(k, k_flat.dtype) and _heads_ok(v, k_flat.dtype)):
        return False
    if not (k_flat.is_contiguous() and v_flat.is_contiguous() and v_flat.dtype == k_flat.dtype
            and k_flat.shape[1:] == k.shape[1:] and v_flat.shape[1:] == v.shape[1:] and k.shape == v.shape):
        return False
    if slot_mapping.dtype != torch.int64 or not slot_mapping.is_contiguous() or slot_mapping.numel() != k.shape[0]:
        return False
    elem = k.element_size()
    rc = lib.hk_kv_write(k.data_ptr(), k.stride(0) * elem, v.data_ptr(), v.stride(0) * elem, k_flat.data_ptr(),
                         v_flat.data_ptr(), slot_mapping.data_ptr(), k.shape[0], k.shape[1] * k.shape[2] * elem,
                         min(k_flat.shape[0], v_flat.shape[0]))
    if rc:
        raise IndexError("KV-cache slot out of range")
    return True


def sample(logits: torch.Tensor, u: torch.Tensor, inv_t: torch.Tensor) -> torch.Tensor | None:
    """One token per row of fp32 logits [n, V], drawn from softmax(logits * inv_t) (inv_t [n] = 1 / temperature)
    by inverting its cumulative distribution at u [n] (uniform in [0, 1)): the first token whose running probability
    exceeds u, never one with no mass. -1 marks a row without a finite maximum or mass (the caller's torch path
    decides those). None: no kernel here, or logits it cannot take."""
    lib = _lib()
    if lib is None or logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        return None
    n, v = logits.shape
    u = u.to(torch.float32).contiguous()
    inv_t = inv_t.to(torch.float32).contiguous()
    out = torch.empty(n, dtype=torch.int64)
    if n:
        lib.hk_sample(logits.data_ptr(), logits.stride(0), n, v, inv_t.data_ptr(), u.data_ptr(), out.data_ptr(),
                      torch.get_num_threads())
    return out


def argmax(logits: torch.Tensor) -> torch.Tensor | None:
    """Each row's greedy token of fp32 logits [n, V], exactly as logits.argmax(dim=-1) (first maximal index; a NaN
    counts as the maximum), over every thread: torch's runs one thread per row, a visible part of a many-sequence
    decode step with a large vocabulary. None: no kernel here, or logits it cannot take."""
    lib = _lib()
    if (lib is None or logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1
            or logits.shape[1] == 0):
        return None
    n, v = logits.shape
    out = torch.empty(n, dtype=torch.int64)
    if n:
        lib.hk_argmax(logits.data_ptr(), logits.stride(0), n, v, out.data_ptr(), torch.get_num_threads())
    return out
