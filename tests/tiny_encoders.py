"""Tiny random BERT checkpoints (sentence-transformers embedders and cross-encoders) with a WordPiece tokenizer."""
from __future__ import annotations

import json
import os

import torch

WORDS = ("the quick brown fox jumps over lazy dog paris is capital of france hearth serves language models on "
         "cpus with paged attention and continuous batching what where who how many a an to in for").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_wordpiece_tokenizer():
    """A BERT tokenizer ([CLS] a [SEP] b [SEP], segment ids) over a small fixed vocabulary plus single letters."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS + letters + ["##" + c for c in letters] + list(".,?!"))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                             cls_token="[CLS]", mask_token="[MASK]")


def tiny_bert_config(**overrides):
    from transformers import BertConfig

    base = dict(vocab_size=len(tiny_wordpiece_tokenizer()), hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128, type_vocab_size=2)
    base.update(overrides)
    return BertConfig(**base)


def build_bert(folder: str, cross_encoder: bool = False, pooling: str = "mean", normalize: bool = True,
               max_seq_length: int | None = None, seed: int = 0, **config) -> str:
    """A random BertModel saved as a sentence-transformers folder, or (cross_encoder) a one-label
    BertForSequenceClassification."""
    from transformers import BertForSequenceClassification, BertModel

    torch.manual_seed(seed)
    cfg = tiny_bert_config(**({"num_labels": 1} if cross_encoder else {}), **config)
    model = (BertForSequenceClassification if cross_encoder else BertModel)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" not in name:
                p.normal_(0.0, 0.08)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tiny_wordpiece_tokenizer().save_pretrained(folder)
    if not cross_encoder:
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
        _write(folder, "modules.json", modules)
        _write(folder, "1_Pooling/config.json", {"word_embedding_dimension": cfg.hidden_size,
                                                 "pooling_mode_cls_token": pooling == "cls",
                                                 "pooling_mode_mean_tokens": pooling == "mean"})
        if max_seq_length is not None:
            _write(folder, "sentence_bert_config.json", {"max_seq_length": max_seq_length})
    return folder


def _write(folder: str, name: str, obj) -> None:
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f)


def hf_embed(folder: str, texts: list[str], pooling: str = "mean", normalize: bool = True) -> torch.Tensor:
    """transformers' BertModel over a padded batch, pooled as sentence-transformers pools (mask-aware mean / CLS)."""
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder, dtype=torch.float32).eval()
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    if pooling == "cls":
        vec = hidden[:, 0]
    else:
        mask = enc["attention_mask"].unsqueeze(-1).float()
        vec = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(vec, dim=-1) if normalize else vec


def hf_scores(folder: str, pairs: list[tuple[str, str]]) -> torch.Tensor:
    from transformers import AutoTokenizer, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(folder)
    model = BertForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        return torch.sigmoid(model(**enc).logits[:, 0])
