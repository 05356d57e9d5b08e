"""Image encoder outputs for the prompt rows being prefilled. The encoder runs when an image's first tokens are
scheduled; its output is kept (keyed by the image's pixel hash) while later chunks of the prompt still need it,
and after that for as long as the byte budget allows, so the same image in another prompt is not encoded again.
A miss, even mid-image after an eviction, only re-encodes: it never changes the tokens."""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import torch

from hearth.multimodal.inputs import ImageInput

# Encoder outputs kept beyond the step that needs them, without --mm-cache-gb (LLaVA-1.5's 576 tokens x 4096 in
# float32 are 9 MiB).
DEFAULT_CACHE_BYTES = 256 * 2**20


class EncoderCache:
    def __init__(self, encode: Callable[[torch.Tensor], torch.Tensor], max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.encode = encode  # processed pixels -> [num_tokens, hidden]
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, torch.Tensor] = OrderedDict()  # mm_hash -> encoder output, LRU first
        self.nbytes = 0
        self.num_encoded = 0  # images run through the encoder
        self.encoder_seconds = 0.0  # spent in the encoder
        self.num_hits = 0  # images whose first prefilled token found their output kept (not encoded again)

    def get(self, image: ImageInput, first: bool) -> torch.Tensor:
        """The image's encoder output [length, hidden]. first: the image's first token is among the rows asking
        (a kept output then counts as a hit; later chunks of an image being prefilled do not)."""
        out = self.entries.get(image.mm_hash)
        if out is not None:
            self.entries.move_to_end(image.mm_hash)
            self.num_hits += first
            return out
        t0 = time.perf_counter()
        out = self.encode(image.pixel_values)
        self.encoder_seconds += time.perf_counter() - t0
        if out.shape[0] != image.length:
            raise ValueError(f"the image encoder gave {out.shape[0]} embeddings for an image of {image.length} "
                             "prompt tokens")
        self.num_encoded += 1
        self.entries[image.mm_hash] = out
        self.nbytes += out.numel() * out.element_size()
        return out

    def trim(self, keep: set[str]) -> None:
        """Evict least recently used outputs past the byte budget, never one in `keep` (still being prefilled)."""
        for h in list(self.entries):
            if self.nbytes <= self.max_bytes:
                break
            if h not in keep:
                out = self.entries.pop(h)
                self.nbytes -= out.numel() * out.element_size()


def image_rows(scheduled: list[tuple[list[ImageInput], int, int]], cache: EncoderCache
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The flat batch's image rows and their embeddings. scheduled: per request in row order, (its images, its
    first scheduled prompt position, its scheduled row count). None when no scheduled row is an image's."""
    rows: list[torch.Tensor] = []
    embeds: list[torch.Tensor] = []
    keep: set[str] = set()
    base = 0
    for images, start, n in scheduled:
        for img in images:
            if not img.overlaps(start, start + n):
                continue
            lo, hi = max(start, img.offset), min(start + n, img.end)
            out = cache.get(img, lo == img.offset)
            rows.append(torch.arange(base + lo - start, base + hi - start))
            embeds.append(out[lo - img.offset: hi - img.offset])
            if hi < img.end:
                keep.add(img.mm_hash)  # (its next chunk comes in a later step)
        base += n
    cache.trim(keep)
    if not rows:
        return None
    return torch.cat(rows), torch.cat(embeds)
