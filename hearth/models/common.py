"""Shared pieces of decoder-only models: embedding, lm head, and checkpoint-name -> parameter loading."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from hearth.layers.embedding import Embedding
from hearth.layers.linear import Linear
from hearth.weights import apply

# Checkpoint projection name -> (merged layer name, shard). Models add their own rows.
MERGED_PROJECTIONS: dict[str, tuple[str, str]] = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}


class CausalLMBase(nn.Module):
    """A decoder-only LM: self.model(input_ids, positions, meta) -> hidden, self.lm_head -> logits."""

    # Checkpoint names skipped on load (buffers HF saved, heads we tie).
    skip_prefixes: tuple[str, ...] = ("rotary_emb.inv_freq",)
    merged: dict[str, tuple[str, str]] = MERGED_PROJECTIONS
    # Checkpoint name prefix -> our prefix, for families whose HF module names differ.
    renames: dict[str, str] = {}
    tie_word_embeddings: bool = False
    final_logit_softcap: float | None = None

    # The head's weight kept quantized (GGUF head tensors of a kept type, or an HF head quantized at load to int8:
    # hearth.loader.lm_head); None: the dense weight below.
    lm_head_qweight = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head_qweight is not None:
            logits = apply.linear(hidden, self.lm_head_qweight).float()
        else:
            if not self.tie_word_embeddings:
                logits = self.lm_head(hidden).float()
            elif self.model.embed_tokens.panels is not None:
                embed = self.model.embed_tokens
                logits = apply.dense_panels_linear(hidden, [embed.panels], [embed.num_embeddings]).float()
            else:
                logits = apply.dense_linear(hidden, self.model.embed_tokens.weight).float()
        if self.final_logit_softcap:
            logits = torch.tanh(logits / self.final_logit_softcap) * self.final_logit_softcap
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors into parameters; fail naming any parameter left unfilled."""
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        filled: set[str] = set()
        for name, tensor in weights:
            name = self._rename(name)
            if name is None:
                continue
            parts = name.split(".")
            proj = parts[-2] if len(parts) >= 2 else ""
            if proj in self.merged:
                merged_name, shard = self.merged[proj]
                module_name = ".".join(parts[:-2] + [merged_name])
                module = modules.get(module_name)
                if isinstance(module, Linear):
                    module.load_shard(parts[-1], shard, tensor)
                    filled.add(f"{module_name}.{parts[-1]}")
                    continue
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in {type(self).__name__}")
            owner = modules.get(".".join(parts[:-1]))
            if isinstance(owner, Linear):  # the layer owns its weight format
                owner.load_shard(parts[-1], None, tensor)
                filled.add(name)
                continue
            if isinstance(owner, Embedding) and parts[-1] == "weight":
                owner.load(tensor)
                filled.add(name)
                continue
            param = params[name]
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(f"shape mismatch for {name}: checkpoint {tuple(tensor.shape)}, "
                                 f"model {tuple(param.shape)}")
            param.data.copy_(tensor)
            filled.add(name)
        missing = [n for n in params if n not in filled and not self._derived(n)]
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
        self.after_load()

    def lora_target(self, module: str) -> tuple[str, str | None] | None:
        """Where an adapter's update of a checkpoint module lands, by the same tables load_weights reads: (our
        module, its shard: q / k / v / gate / up of a merged layer, None for a whole layer); None if the checkpoint
        name has no place here."""
        name = self._rename(f"{module}.weight")
        if name is None:
            return None
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in self.merged:
            merged_name, shard = self.merged[parts[-2]]
            return ".".join(parts[:-2] + [merged_name]), shard
        return ".".join(parts[:-1]), None

    def _rename(self, name: str) -> str | None:
        if any(name.endswith(s) for s in self.skip_prefixes):
            return None
        for old, new in self.renames.items():
            if name.startswith(old):
                name = new + name[len(old):]
        if self.tie_word_embeddings and name == "lm_head.weight":
            return None
        return name

    def _derived(self, name: str) -> bool:
        """Parameters that may legitimately be absent from a checkpoint."""
        return self.tie_word_embeddings and name == "lm_head.weight"

    def after_load(self) -> None:
        """Hook for post-load transforms (e.g. folding a norm into weights)."""
