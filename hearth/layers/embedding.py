from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hearth.kernels import panels
from hearth.weights import apply, prepare
from hearth.weights.gguf import GGUFBlocks
from hearth.layers.linear import adoptable, keep_16bit


class Embedding(nn.Module):
    """Token embedding without random init (the checkpoint fills it; init would cost seconds on big vocabularies).

    Like Linear, a float32 model keeps a 16-bit checkpoint's table in 16 bits (exact); lookups return float32.
    A GGUF table of a kept block type (weights.gguf.KEPT_NAMES) stays in its repacked blocks (`qweight`) and the
    looked-up rows are dequantized (exact, like a dense table): dequantizing the whole table was a large part of a
    small model's start-up, and a tied head reads the same blocks.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)
        self.out_dtype = self.weight.dtype
        self.qweight = None  # hearth.weights.QWeight, or None: the dense weight
        # The table in bf16 panels (hearth.kernels.panels) when it is also a tied LM head: the head's product reads
        # them, and a lookup gathers a row from its panel (panels.gather_rows).
        self.panels: torch.Tensor | None = None

    def load(self, tensor: torch.Tensor | GGUFBlocks) -> None:
        if isinstance(tensor, GGUFBlocks):
            if tuple(tensor.shape) != tuple(self.weight.shape):
                raise ValueError(f"shape mismatch for embedding: checkpoint {tuple(tensor.shape)}, "
                                 f"model {tuple(self.weight.shape)}")
            qw = prepare.embedding_blocks(tensor)
            if qw is not None:
                self.qweight = qw
                self.weight = nn.Parameter(torch.empty(0, self.weight.shape[1], dtype=self.weight.dtype),
                                           requires_grad=False)
                return
            tensor = tensor.dequantize()
        if keep_16bit(self.weight, tensor):
            self.weight = nn.Parameter(torch.empty(self.weight.shape, dtype=tensor.dtype), requires_grad=False)
        if tuple(self.weight.shape) != tuple(tensor.shape):
            raise ValueError(f"shape mismatch for embedding: checkpoint {tuple(tensor.shape)}, "
                             f"model {tuple(self.weight.shape)}")
        if adoptable(self.weight, tensor):
            self.weight = nn.Parameter(tensor, requires_grad=False)
        else:
            self.weight.data.copy_(tensor)

    def can_use_panels(self) -> bool:
        return (self.panels is None and self.qweight is None and self.weight.dtype == torch.bfloat16
                and self.weight.dim() == 2 and panels.packable(*self.weight.shape) and self.weight.stride(1) == 1)

    def row_blocks(self) -> list[torch.Tensor]:
        return [self.weight]

    def use_panels(self, alloc: Callable[[int], torch.Tensor], pack: bool = True) -> list[torch.Tensor]:
        """As Linear.use_panels (the table is the one row block)."""
        w = self.weight
        self.panels = panels.place(w, alloc(panels.numel(*w.shape)), pack)
        self.weight = nn.Parameter(torch.empty(0, w.shape[1], dtype=w.dtype), requires_grad=False)
        return [w]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.panels is not None:
            ids = input_ids.reshape(-1)
            rows = panels.gather_rows(self.panels, ids)
            return rows.reshape(*input_ids.shape, rows.shape[1]).to(self.out_dtype)
        if self.qweight is not None:
            rows = apply.dequantize_gather(self.qweight, input_ids.reshape(-1))
            return rows.reshape(*input_ids.shape, rows.shape[1]).to(self.out_dtype)
        return F.embedding(input_ids, self.weight).to(self.out_dtype)
