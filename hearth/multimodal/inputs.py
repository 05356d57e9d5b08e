"""What the engine receives for one image: its pixels, where its tokens sit in the prompt, and a hash of the
pixels that keys the prefix cache and the encoder-output cache (vLLM's mm_hash)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass
class ImageInput:
    pixel_values: torch.Tensor  # what the family's image processor made of one image, e.g. [3, H, W]
    offset: int  # prompt position of the image's first token
    length: int  # how many prompt tokens the image's embeddings fill
    mm_hash: str  # hash_pixels(pixel_values): equal only for the same processed pixels

    @property
    def end(self) -> int:
        return self.offset + self.length

    def overlaps(self, start: int, stop: int) -> bool:
        """Whether any of the prompt positions [start, stop) is one of this image's."""
        return self.offset < stop and start < self.end


def hash_pixels(pixels: torch.Tensor) -> str:
    """A content hash of processed pixels, their shape and dtype included (two sizes never share a hash)."""
    t = pixels.detach().contiguous().cpu()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{tuple(t.shape)}:{t.dtype}".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def image_input(pixels: torch.Tensor, offset: int, length: int) -> ImageInput:
    return ImageInput(pixels, offset, length, hash_pixels(pixels))


def block_extra_keys(images: list[ImageInput], start: int, stop: int) -> tuple[str, ...]:
    """The hashes of the images with tokens in prompt positions [start, stop): a KV block's extra prefix-cache key,
    so the same text with another image never shares the block."""
    return tuple(img.mm_hash for img in images if img.overlaps(start, stop))
