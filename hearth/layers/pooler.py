"""Pooling: a flat batch of hidden states -> one vector per sequence (CLS, mean or last token), optionally
L2-normalized. The config comes from vLLM's --pooler-config, else a sentence-transformers folder's modules.json
and 1_Pooling/config.json, else the family's default (encoders: CLS; decoders: last token, as Qwen3-Embedding)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

POOLING_TYPES = ("CLS", "MEAN", "LAST")


@dataclass
class PoolerConfig:
    pooling_type: str = "LAST"
    normalize: bool = True

    def __post_init__(self) -> None:
        self.pooling_type = self.pooling_type.upper()
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}; got {self.pooling_type!r}")

    @classmethod
    def parse(cls, value: dict | str | None) -> PoolerConfig | None:
        """vLLM's --pooler-config JSON: {"pooling_type": "MEAN", "normalize": true}."""
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"--pooler-config is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError("--pooler-config must be a JSON object like {\"pooling_type\": \"MEAN\"}")
        unknown = set(value) - {"pooling_type", "normalize"}
        if unknown:
            raise ValueError(f"--pooler-config: unknown keys {sorted(unknown)} (known: pooling_type, normalize)")
        return cls(**value)


def read_sentence_transformers_config(folder: str) -> PoolerConfig | None:
    """The pooling a sentence-transformers checkpoint declares (modules.json), or None if it is not one."""
    path = os.path.join(folder, "modules.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        modules = json.load(f)
    pooling, normalize = None, False
    for m in modules:
        kind = m.get("type", "")
        if kind.endswith(".Pooling"):
            with open(os.path.join(folder, m.get("path", ""), "config.json")) as f:
                cfg = json.load(f)
            if cfg.get("pooling_mode_cls_token"):
                pooling = "CLS"
            elif cfg.get("pooling_mode_mean_tokens"):
                pooling = "MEAN"
            elif cfg.get("pooling_mode_lasttoken"):
                pooling = "LAST"
            else:
                modes = sorted(k for k, v in cfg.items() if k.startswith("pooling_mode") and v)
                raise ValueError(f"{folder}: pooling modes {modes} are not supported (CLS, mean, last token are)")
        elif kind.endswith(".Normalize"):
            normalize = True
    return PoolerConfig(pooling, normalize) if pooling else None


def sentence_transformers_max_len(folder: str) -> int | None:
    """sentence_bert_config.json's max_seq_length: what sentence-transformers truncates inputs to."""
    path = os.path.join(folder, "sentence_bert_config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        value = json.load(f).get("max_seq_length")
    return int(value) if value else None


def pool(hidden: torch.Tensor, seq_lens: list[int], pooling_type: str) -> torch.Tensor:
    """hidden: [T, H] flat over the sequences in order; returns [B, H] in float32."""
    starts = torch.tensor([0] + seq_lens[:-1], dtype=torch.long).cumsum(0)
    lens = torch.tensor(seq_lens, dtype=torch.long)
    if pooling_type == "CLS":
        return hidden[starts].float()
    if pooling_type == "LAST":
        return hidden[starts + lens - 1].float()
    # MEAN: a segment sum over the flat rows (index_add, no padding)
    seq_of_row = torch.repeat_interleave(torch.arange(len(seq_lens)), lens)
    sums = torch.zeros(len(seq_lens), hidden.shape[-1], dtype=torch.float32)
    sums.index_add_(0, seq_of_row, hidden.float())
    return sums / lens.unsqueeze(1).float()


def finish_embedding(vec: torch.Tensor, normalize: bool, dimensions: int | None) -> torch.Tensor:
    """vec: [H] float32. Matryoshka truncation comes before normalization (the prefix is the smaller embedding)."""
    if dimensions is not None:
        vec = vec[:dimensions]
    return F.normalize(vec, p=2, dim=-1) if normalize else vec
