"""A tensor-parallel worker rank's process: load this rank's shard of the model, allocate its KV heads, then run
every forward rank 0 mirrors to it (hearth.distributed.tensor_parallel does the communication)."""
from __future__ import annotations

from typing import Any

from hearth import log_level
from hearth.distributed.shm_allreduce import SharedBuffers
from hearth.distributed.tensor_parallel import serve_forwards, worker_sharder


def tp_worker_main(args: Any, bind: str, rank: int, world: int, port: int, buffers: SharedBuffers | None,
                   conn: Any) -> None:
    from hearth.engine.model_runner import ModelRunner
    from hearth.loader.model_loader import load_model

    log_level.apply(args.debug, args.log_level)  # (args arrive pickled: their __post_init__ ran in the parent)
    try:
        loaded = load_model(args, worker_sharder(args, bind, rank, world, port, buffers))
        num_blocks, block_size, kv_dtype = conn.recv()
        ModelRunner(loaded.model, num_blocks, block_size, kv_dtype, loaded.model_config.vocab_size, args.seed)
    except BaseException as e:  # noqa: BLE001 (reported to rank 0, which raises it)
        conn.send(f"{type(e).__name__}: {e}")
        return
    conn.send("ready")
    serve_forwards(loaded.model, conn)
