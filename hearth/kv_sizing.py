"""How many KV blocks to allocate: from --kv-cache-space, or from available memory minus headroom."""
from __future__ import annotations

import logging

import psutil

GiB = 1024 ** 3
HEADROOM_BYTES = 1 * GiB  # left for activations, the tokenizer, the server
AUTO_FRACTION = 0.5  # of what remains after the weights and the headroom

logger = logging.getLogger("hearth")


def num_kv_blocks(bytes_per_block: int, block_size: int, max_model_len: int, max_num_seqs: int,
                  space_gib: float | None) -> int:
    """Blocks for the KV cache. Raises ValueError when not even one max-length sequence fits."""
    per_seq = -(-max_model_len // block_size)
    if space_gib is not None:
        budget = int(space_gib * GiB)
        source = f"--kv-cache-space {space_gib:g} GiB"
    else:
        avail = psutil.virtual_memory().available - HEADROOM_BYTES
        budget = int(max(avail, 0) * AUTO_FRACTION)
        # No point reserving more than every sequence slot at full length.
        budget = min(budget, per_seq * max_num_seqs * bytes_per_block)
        source = f"automatic sizing ({budget / GiB:.2f} GiB of {avail / GiB:.1f} GiB available)"
    blocks = budget // bytes_per_block
    if blocks < per_seq:
        need = per_seq * bytes_per_block / GiB
        raise ValueError(f"the KV cache from {source} holds {blocks * block_size} tokens, but one sequence of "
                         f"--max-model-len {max_model_len} needs {per_seq * block_size} ({need:.2f} GiB): "
                         "raise --kv-cache-space or lower --max-model-len")
    return int(blocks)
