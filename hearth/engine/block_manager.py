"""Paged KV-cache blocks: ref counts, an LRU free list, and automatic prefix caching. Pure Python, no torch.

Prefix caching (vLLM v1's scheme): a full block's hash chains its parent's hash with its token ids, so equal
hashes mean equal whole prefixes. A hit re-compares the tokens (hash collisions never corrupt output). A freed
block keeps its hash and stays findable until it is reused: the free list is an LRU, and requests free their
blocks tail first, so the ends of prefixes are evicted before their beginnings. Blocks never used yet are handed
out only when no freed block is left: the pool's pages are then faulted in as the working set grows, not as
requests come and go, so the process's RSS follows its peak working set instead of creeping up to the whole pool.

Sliding window (vLLM v1's sliding-window manager): when every layer attends only to the last `sliding_window`
positions, a running request's blocks that lie wholly before its window are released as its computed tokens
advance, and their table entries become the null block (block 0, reserved then, never written, never read by
the kernel; the torch path reads it only at masked positions). Released blocks keep their prefix-cache hashes.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from hearth.engine.request import Request
from hearth.multimodal.inputs import block_extra_keys


class NoFreeBlocksError(RuntimeError):
    pass


@dataclass
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] = field(default=())
    extra_keys: tuple[str, ...] = ()  # the hashes of the images whose tokens the block holds


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...], extra_keys: tuple[str, ...] = ()) -> int:
    return hash((parent_hash, token_ids, extra_keys)) if extra_keys else hash((parent_hash, token_ids))


def chain_root(lora_id: int, scale: float = 1.0) -> int | None:
    """The parent hash of a request's first block: None under the base model, the adapter's own root under a LoRA
    adapter (and scale), so the same tokens under two adapters (or one and none, or one at two scales) never share a
    block: their KV differs."""
    if not lora_id:
        return None
    return hash(("lora", lora_id)) if scale == 1.0 else hash(("lora", lora_id, scale))


def freeable_window(layer_windows: list[int | None]) -> int | None:
    """The window that decides which KV blocks no layer reads any more: the largest layer window, or None when
    any layer attends globally (nothing can be freed then)."""
    if not layer_windows or any(not w for w in layer_windows):
        return None
    return max(layer_windows)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 sliding_window: int | None = None) -> None:
        """sliding_window: see freeable_window; None keeps every block of a request until it ends."""
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # NOTE: with a window (and room for it) block 0 is the null block: held forever (ref_cnt 1), never
        # allocated, hashed or written; it stands in the tables for released blocks.
        self.sliding_window = sliding_window if sliding_window and num_blocks > 1 else None
        self.null_block: int | None = 0 if self.sliding_window else None
        first = 0 if self.null_block is None else 1
        if self.null_block is not None:
            self.blocks[0].ref_cnt = 1
        # NOTE: freed blocks in LRU order (oldest first); cached blocks with ref_cnt 0 live here too. Blocks never
        # used are in `fresh` (lowest id first), taken only when free_blocks is empty.
        self.free_blocks: OrderedDict[int, None] = OrderedDict()
        self.fresh: deque[int] = deque(range(first, num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.req_blocks: dict[str, list[int]] = {}
        # request id -> how many of its leading table entries _cache_full_blocks has already looked at (each step
        # then looks only at newly full blocks, not the whole table of a long sequence).
        self.req_registered: dict[str, int] = {}
        # Counters for metrics.
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ---- queries ----
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks) + len(self.fresh)

    def free_block_ids(self) -> list[int]:
        """Every free block, in the order they would be handed out."""
        return [*self.free_blocks, *self.fresh]

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - (self.null_block is not None)

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_usable_blocks

    def num_held_blocks(self, request_id: str) -> int:
        """Blocks the request holds a reference to (null entries of released blocks not counted)."""
        return sum(1 for b in self.req_blocks.get(request_id, ()) if b != self.null_block)

    def block_table(self, request_id: str) -> list[int]:
        return self.req_blocks.get(request_id, [])

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- hashing ----
    def _full_block_hashes(self, req: Request, num_tokens: int) -> list[int]:
        """Chained hashes of the request's full blocks within its first num_tokens tokens (memoized on req)."""
        hashes = req.block_hashes
        bs = self.block_size
        while (len(hashes) + 1) * bs <= num_tokens:
            i = len(hashes)
            parent = hashes[-1] if hashes else chain_root(req.lora_id, req.lora_scale)
            hashes.append(hash_block(parent, *self._block_content(req, i)))
        return hashes[: num_tokens // bs]

    def _block_content(self, req: Request, i: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Block i's token ids, and the hashes of the images among them: an image's placeholder tokens are the
        same for every image, its pixels are not (vLLM's mm_hash as a block's extra key)."""
        bs = self.block_size
        extra = block_extra_keys(req.mm_inputs, i * bs, (i + 1) * bs) if req.mm_inputs else ()
        return tuple(req.all_token_ids[i * bs:(i + 1) * bs]), extra

    # ---- allocation ----
    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Prefix-cache lookup for a request about to be scheduled from scratch.

        Returns (block ids, number of tokens they cover). The last token is never served from the cache:
        its logits are needed, so at most num_tokens - 1 tokens hit.
        """
        if not self.enable_prefix_caching:
            return [], 0
        hits: list[int] = []
        hashes = self._full_block_hashes(req, req.num_tokens - 1)
        bs = self.block_size
        for i, h in enumerate(hashes):
            block_id = self.cached.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if (block.token_ids, block.extra_keys) != self._block_content(req, i):
                break  # hash collision: treat as a miss
            hits.append(block_id)
        return hits, len(hits) * bs

    def record_prefix_lookup(self, num_queried: int, num_hit: int) -> None:
        """Count one lookup whose request was admitted (a request that waits for blocks looks up again each step;
        only the lookup that admits it counts, as in vLLM's prefix_cache_queries / _hits)."""
        self.prefix_queries += num_queried
        self.prefix_hits += num_hit

    def _take_free_block(self) -> int:
        if not self.free_blocks:
            block_id = self.fresh.popleft()
            self.blocks[block_id].ref_cnt = 1
            return block_id
        block_id, _ = self.free_blocks.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:  # evict from the prefix cache
            if self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
            block.block_hash = None
            block.token_ids, block.extra_keys = (), ()
        block.ref_cnt = 1
        return block_id

    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_cnt == 0:
            del self.free_blocks[block_id]
        block.ref_cnt += 1

    def can_allocate(self, req: Request, num_new_tokens: int, computed_blocks: list[int] = ()) -> bool:
        held = len(self.req_blocks.get(req.request_id, ())) or len(computed_blocks)
        need = self.blocks_needed(req.num_computed_tokens + num_new_tokens) - held
        # Cached hits that sit in the free list are taken out of it, so they don't count as free.
        reusable_free = sum(1 for b in computed_blocks if self.blocks[b].ref_cnt == 0)
        return need <= self.num_free_blocks - reusable_free

    def allocate(self, req: Request, num_new_tokens: int, computed_blocks: list[int] = ()) -> bool:
        """Make room for num_new_tokens more tokens of req (after num_computed_tokens). False if out of blocks.

        computed_blocks: prefix-cache hits from get_computed_blocks, on the request's first allocation.
        """
        table = self.req_blocks.get(req.request_id)
        if table and self.sliding_window is None:  # fast path (most decode steps): room left, no block newly full
            total = req.num_computed_tokens + num_new_tokens
            if total <= len(table) * self.block_size and (
                    not self.enable_prefix_caching
                    or min(total, req.num_tokens) // self.block_size <= self.req_registered.get(req.request_id, 0)):
                return True
        if self.sliding_window is not None:
            table = self.req_blocks.get(req.request_id)
            if table:
                self._release_outside_window(req, table)
            elif computed_blocks:
                # Hits already outside the window are not taken at all (they stay free and cached).
                n_out = self._num_blocks_outside_window(req)
                computed_blocks = [self.null_block] * min(n_out, len(computed_blocks)) + list(computed_blocks[n_out:])
        if not self.can_allocate(req, num_new_tokens, computed_blocks):
            return False
        table = self.req_blocks.setdefault(req.request_id, [])
        if not table:
            for b in computed_blocks:
                if b != self.null_block:
                    self._touch(b)
            table.extend(computed_blocks)
        total = req.num_computed_tokens + num_new_tokens
        while len(table) < self.blocks_needed(total):
            table.append(self._take_free_block())
        if self.enable_prefix_caching:
            self._cache_full_blocks(req, table, min(total, req.num_tokens))
        return True

    def _num_blocks_outside_window(self, req: Request) -> int:
        """Leading blocks of req no query from position num_computed_tokens on can attend to.

        NOTE: a query at position p sees keys in (p - window, p] (the kernel's and the torch path's convention),
        so every future query (chunked-prefill chunks included) needs keys from num_computed - window + 1 on.
        This relies on num_computed_tokens never going back while the request holds blocks (preemption frees
        them all; a speculative step's rejected tokens were never counted as computed).
        """
        first_needed = req.num_computed_tokens - self.sliding_window + 1
        return max(first_needed, 0) // self.block_size

    def _release_outside_window(self, req: Request, table: list[int]) -> None:
        """Release the request's blocks now wholly outside the window; their entries become the null block.
        Walks back from the newest such block and stops at the first null: released blocks form a prefix."""
        i = min(self._num_blocks_outside_window(req), len(table)) - 1
        while i >= 0 and table[i] != self.null_block:
            block = self.blocks[table[i]]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_blocks[block.block_id] = None  # keeps its hash: still a prefix-cache hit until reused
            table[i] = self.null_block
            i -= 1

    def _cache_full_blocks(self, req: Request, table: list[int], num_tokens: int) -> None:
        """Register the request's full blocks (tokens known) in the prefix cache.

        NOTE: a block is registered when it is allocated, before its KV is written. That is safe because every
        layer writes all of a step's KV before any attention reads it, so a request that hits this block in the
        same step still reads finished values.
        """
        hashes = self._full_block_hashes(req, num_tokens)
        start = self.req_registered.get(req.request_id, 0)
        self.req_registered[req.request_id] = len(hashes)
        for i in range(start, len(hashes)):
            h = hashes[i]
            if table[i] == self.null_block:
                continue  # released (sliding window): it was registered before, or never will be
            block = self.blocks[table[i]]
            if block.block_hash is not None:
                continue
            block.block_hash = h
            block.token_ids, block.extra_keys = self._block_content(req, i)
            self.cached.setdefault(h, block.block_id)

    def free(self, request_id: str) -> None:
        """Release a request's blocks, tail first, so prefix tails are evicted before their heads."""
        table = self.req_blocks.pop(request_id, [])
        self.req_registered.pop(request_id, None)
        for block_id in reversed(table):
            if block_id == self.null_block:
                continue  # released already (sliding window)
            block = self.blocks[block_id]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_blocks[block_id] = None  # most recently used: evicted last

    def reset_prefix_cache(self) -> None:
        for block in self.blocks:
            if block.ref_cnt == 0 and block.block_hash is not None:
                block.block_hash = None
                block.token_ids, block.extra_keys = (), ()
        self.cached.clear()
