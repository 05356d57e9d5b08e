"""Tensor parallelism across processes on one host (torch.distributed, gloo)."""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


def start_tensor_parallel(args: Any, bind: str, owner: object, worker_main: Callable[..., None]) -> Any:
    """The TensorParallel of an engine (its workers started, stopped when `owner` goes), or None for one rank.
    worker_main: the worker ranks' process entry point (see TensorParallel)."""
    n = args.tensor_parallel_size
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"--tensor-parallel-size must be >= 1, got {n}")
    if n == 1:
        return None
    from hearth.distributed.tensor_parallel import TensorParallel

    tp = TensorParallel(args, bind, worker_main)
    weakref.finalize(owner, tp.close)  # NOTE: also at interpreter exit; the workers are daemons besides
    return tp
