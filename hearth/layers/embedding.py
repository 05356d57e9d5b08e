import torch
import torch.nn.functional as F
from torch import nn

from hearth.layers.linear import adoptable, keep_16bit


class Embedding(nn.Module):
    """Token embedding without random init (the checkpoint fills it; init would cost seconds on big vocabularies).

    Like Linear, a float32 model keeps a 16-bit checkpoint's table in 16 bits (exact); lookups return float32.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)
        self.out_dtype = self.weight.dtype

    def load(self, tensor: torch.Tensor) -> None:
        if keep_16bit(self.weight, tensor):
            self.weight = nn.Parameter(torch.empty(self.weight.shape, dtype=tensor.dtype), requires_grad=False)
        if tuple(self.weight.shape) != tuple(tensor.shape):
            raise ValueError(f"shape mismatch for embedding: checkpoint {tuple(tensor.shape)}, "
                             f"model {tuple(self.weight.shape)}")
        if adoptable(self.weight, tensor):
            self.weight = nn.Parameter(tensor, requires_grad=False)
        else:
            self.weight.data.copy_(tensor)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight).to(self.out_dtype)
