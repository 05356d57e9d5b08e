"""CLIP's vision transformer (the LLaVA family's image tower), in plain torch ops for now: patch embedding, class
token and learned positions, pre-norm encoder layers with bidirectional attention. Names match transformers'
CLIPVisionTransformer (`embeddings.*`, `encoder.layers.*`) so a checkpoint loads by name."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hearth.config import HFConfig

# transformers' ACT2FN names for the activations these towers and projectors use
ACTIVATIONS = {"quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "gelu": F.gelu,
               "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu, "silu": F.silu}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r} in a vision tower; hearth has {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        dim, patch = cfg["hidden_size"], cfg["patch_size"]
        self.class_embedding = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.patch_embedding = nn.Conv2d(cfg["num_channels"], dim, patch, stride=patch, bias=False)
        self.position_embedding = nn.Embedding((cfg["image_size"] // patch) ** 2 + 1, dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))  # [B, D, h, w]
        patches = patches.flatten(2).transpose(1, 2)  # [B, h*w, D]
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight[None]


class CLIPAttention(nn.Module):
    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        dim = cfg["hidden_size"]
        self.num_heads = cfg["num_attention_heads"]
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.num_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj,
                                                                                    self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v)  # [B, heads, N, head_dim], no mask: every patch sees all
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class CLIPMLP(nn.Module):
    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        self.act = activation(cfg["hidden_act"])
        self.fc1 = nn.Linear(cfg["hidden_size"], cfg["intermediate_size"])
        self.fc2 = nn.Linear(cfg["intermediate_size"], cfg["hidden_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        eps = cfg["layer_norm_eps"]
        self.layer_norm1 = nn.LayerNorm(cfg["hidden_size"], eps=eps)
        self.self_attn = CLIPAttention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg["hidden_size"], eps=eps)
        self.mlp = CLIPMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))


class CLIPVisionTransformer(nn.Module):
    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(cfg)
        self.pre_layrnorm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"])  # (HF's spelling)
        self.encoder = CLIPEncoder(cfg)
        # (in the checkpoint; LLaVA reads an inner layer's states, never this norm's output)
        self.post_layernorm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"])

    def hidden_states(self, pixels: torch.Tensor, wanted: list[int]) -> list[torch.Tensor]:
        """transformers' hidden_states[i] for each i in wanted (0: the embeddings, i: after layer i; negative
        from the end), running only the layers the deepest one needs. pixels: [B, C, H, W]."""
        n = len(self.encoder.layers)
        wanted = [i if i >= 0 else n + 1 + i for i in wanted]
        states = {0: self.pre_layrnorm(self.embeddings(pixels))}
        x = states[0]
        for i, layer in enumerate(self.encoder.layers[: max(wanted)], start=1):
            x = layer(x)
            states[i] = x
        return [states[i] for i in wanted]
