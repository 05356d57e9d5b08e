"""Per family: which token stands for an image in the prompt and how many tokens one processed image fills. The
door expands each placeholder into that many tokens; the model's encoder fills them with its embeddings."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hearth.config import HFConfig

# transformers' CLIPVisionConfig defaults: a config.json's vision_config may leave any of them out.
CLIP_VISION_DEFAULTS: dict = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                  num_attention_heads=12, num_channels=3, image_size=224, patch_size=32,
                                  hidden_act="quick_gelu", layer_norm_eps=1e-5)


@dataclass(frozen=True)
class VisionSpec:
    image_token_id: int  # the placeholder token, one per image in the prompt before expansion
    num_tokens: Callable[[torch.Tensor], int]  # processed pixels -> how many prompt tokens the image fills
    max_images: int | None = None  # the family's own ceiling per prompt, if it has one


def clip_vision_config(cfg: HFConfig) -> HFConfig:
    return HFConfig({**CLIP_VISION_DEFAULTS, **(cfg.get("vision_config") or {})})


def _llava(cfg: HFConfig) -> VisionSpec:
    vision = clip_vision_config(cfg)
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    # "default" drops the CLS position, "full" keeps it (transformers' vision_feature_select_strategy)
    n = patches + (cfg.get("vision_feature_select_strategy", "default") == "full")
    token = cfg.get("image_token_index", cfg.get("image_token_id", 32000))
    return VisionSpec(int(token), lambda pixels: n)


_FAMILIES: dict[str, Callable[[HFConfig], VisionSpec]] = {
    "LlavaForConditionalGeneration": _llava,
}


def vision_spec(cfg: HFConfig) -> VisionSpec | None:
    """The family's image spec; None for a model that takes no images."""
    arch = (cfg.get("architectures") or [""])[0]
    build = _FAMILIES.get(arch)
    return build(cfg) if build is not None else None
