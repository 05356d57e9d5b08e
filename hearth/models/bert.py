"""BERT encoders: BertModel (sentence-transformers embedders such as all-MiniLM-L6-v2) and
BertForSequenceClassification (cross-encoders that score a text pair).

Encoders see every token of a sequence at once (bidirectional attention, no KV cache): forward takes the flat
batch [T] of whole sequences with their lengths. The linear layers run on the flat rows; only attention pads.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hearth.config import HFConfig
from hearth.layers.linear import Linear
from hearth.models.common import MERGED_PROJECTIONS, CausalLMBase

_ACTS = {"gelu": F.gelu, "relu": F.relu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
         "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}

# Checkpoint module names -> ours, applied in order (attention.output before output).
_RENAMES = (("encoder.layer.", "layers."), (".attention.self.query.", ".q_proj."),
            (".attention.self.key.", ".k_proj."), (".attention.self.value.", ".v_proj."),
            (".attention.output.dense.", ".o_proj."), (".attention.output.LayerNorm.", ".attn_norm."),
            (".intermediate.dense.", ".up."), (".output.dense.", ".down."), (".output.LayerNorm.", ".out_norm."))


class BertLayer(nn.Module):
    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("layer_norm_eps", 1e-12)
        self.num_heads = cfg["num_attention_heads"]
        self.head_dim = hidden // self.num_heads
        self.qkv_proj = Linear(hidden, 3 * hidden, bias=True, shard_sizes={"q": hidden, "k": hidden, "v": hidden})
        self.o_proj = Linear(hidden, hidden, bias=True)
        self.attn_norm = nn.LayerNorm(hidden, eps)
        self.up = Linear(hidden, cfg["intermediate_size"], bias=True)
        self.down = Linear(cfg["intermediate_size"], hidden, bias=True)
        self.out_norm = nn.LayerNorm(hidden, eps)
        act = cfg.get("hidden_act", "gelu")
        if act not in _ACTS:
            raise ValueError(f"BERT hidden_act {act!r} is not supported ({', '.join(_ACTS)} are)")
        self.act = _ACTS[act]

    def forward(self, x: torch.Tensor, index: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """x: [T, hidden]; index: [B, L] flat row of each padded position; valid: [B, L] (None: no padding)."""
        b, length = index.shape
        qkv = self.qkv_proj(x)[index]  # [B, L, 3 * hidden]
        q, k, v = qkv.view(b, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # [B, nh, L, hd]
        mask = valid[:, None, None, :] if valid is not None else None
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, nh, L, hd]
        attn = attn.transpose(1, 2).reshape(b, length, -1)
        attn = attn[valid] if valid is not None else attn.reshape(b * length, -1)  # back to the flat rows
        h = self.attn_norm(x + self.o_proj(attn))
        return self.out_norm(h + self.down(self.act(self.up(h))))


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], hidden)
        self.token_type_embeddings = nn.Embedding(cfg.get("type_vocab_size", 2), hidden)
        self.LayerNorm = nn.LayerNorm(hidden, cfg.get("layer_norm_eps", 1e-12))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.LayerNorm(x + self.token_type_embeddings(token_type_ids))


class BertModel(CausalLMBase):
    """The encoder. (CausalLMBase for its checkpoint loading only: an encoder has no LM head.)"""

    is_encoder = True
    default_pooling = "CLS"
    merged = MERGED_PROJECTIONS
    skip_prefixes = ("position_ids",)
    keep_pooler = False  # sentence-transformers embedders pool themselves; the checkpoint's pooler goes unused

    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__()
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"BERT position_embedding_type {cfg['position_embedding_type']!r} is not supported")
        if max_len > cfg["max_position_embeddings"]:
            raise ValueError(f"--max-model-len {max_len} is past this BERT's {cfg['max_position_embeddings']} "
                             "position embeddings")
        self.embeddings = BertEmbeddings(cfg)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg["num_hidden_layers"]))

    def _rename(self, name: str) -> str | None:
        name = name.removeprefix("bert.")
        if name.endswith(self.skip_prefixes) or (name.startswith("pooler.") and not self.keep_pooler):
            return None
        for old, new in _RENAMES:
            name = name.replace(old, new)
        return name

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor,
                seq_lens: list[int]) -> torch.Tensor:
        """Whole sequences, flat: input_ids, positions, token_type_ids [T]. Returns hidden states [T, hidden]."""
        lens = torch.tensor(seq_lens)
        length = max(seq_lens)
        starts = torch.cumsum(lens, 0) - lens
        offsets = torch.arange(length)
        valid = offsets[None, :] < lens[:, None]  # [B, L]
        index = torch.where(valid, starts[:, None] + offsets[None, :], 0)  # padded slots read row 0, masked out
        x = self.embeddings(input_ids, positions, token_type_ids)
        mask = None if bool(valid.all()) else valid
        for layer in self.layers:
            x = layer(x, index, mask)
        return x


class BertForSequenceClassification(BertModel):
    """A cross-encoder: [CLS] query [SEP] document [SEP] -> num_labels logits (pooler dense + tanh on CLS)."""

    keep_pooler = True

    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        hidden = cfg["hidden_size"]
        self.num_labels = len(cfg.get("id2label") or {}) or int(cfg.get("num_labels") or 2)
        self.pooler = nn.Module()
        self.pooler.dense = Linear(hidden, hidden, bias=True)
        self.classifier = Linear(hidden, self.num_labels, bias=True)

    def classify(self, hidden: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        """hidden: [T, hidden] -> logits [B, num_labels] float32, from each sequence's first (CLS) token."""
        starts = torch.cumsum(torch.tensor(seq_lens), 0) - torch.tensor(seq_lens)
        return self.classifier(torch.tanh(self.pooler.dense(hidden[starts]))).float()
