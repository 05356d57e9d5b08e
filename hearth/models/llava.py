"""LLaVA-1.5 (transformers' LlavaForConditionalGeneration): a CLIP vision tower, a two-layer MLP projector and a
Llama text model. The text model is hearth's Llama stack; an image's projected features replace the embeddings
of its placeholder tokens (the engine says which rows, hearth.engine.encoder_cache)."""
from __future__ import annotations

import torch
from torch import nn

from hearth.config import HFConfig
from hearth.layers.attention import AttentionMetadata
from hearth.models.clip import CLIPVisionTransformer, activation
from hearth.models.llama import LlamaForCausalLM
from hearth.multimodal.families import clip_vision_config


class LlavaMultiModalProjector(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, out_dim, bias=bias)
        self.act = activation(act)
        self.linear_2 = nn.Linear(out_dim, out_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(LlamaForCausalLM):
    """The text model's names are Llama's (model.*, lm_head); the tower and projector keep HF's."""

    takes_images = True
    # The checkpoint layouts: language_model.model.* / language_model.lm_head / vision_tower.vision_model.* (the
    # llava-hf checkpoints; transformers 5 saves this form without vision_model), or model.language_model.* /
    # model.vision_tower.* / lm_head (transformers 4.52-4.x). Applied in order.
    renames = {"model.language_model.": "model.", "language_model.model.": "model.",
               "language_model.lm_head.": "lm_head.", "model.vision_tower.": "vision_tower.",
               "vision_tower.vision_model.": "vision_tower.",
               "model.multi_modal_projector.": "multi_modal_projector."}

    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)  # (cfg: the text config's keys at the top, see hf_folder.read_hf_config)
        vision = clip_vision_config(cfg)
        layer = cfg.get("vision_feature_layer", -2)
        self.feature_layers = [layer] if isinstance(layer, int) else list(layer)
        self.keep_cls = cfg.get("vision_feature_select_strategy", "default") == "full"
        self.vision_tower = CLIPVisionTransformer(vision)
        self.multi_modal_projector = LlavaMultiModalProjector(
            vision["hidden_size"] * len(self.feature_layers), cfg["hidden_size"],
            cfg.get("projector_hidden_act", "gelu"), bool(cfg.get("multimodal_projector_bias", True)))

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """One processed image [3, H, W] -> the embeddings of its prompt tokens [num_tokens, hidden]."""
        states = self.vision_tower.hidden_states(pixels[None], self.feature_layers)
        features = torch.cat(states, dim=-1)[0]  # [1 + patches, vision hidden * len(feature_layers)]
        if not self.keep_cls:
            features = features[1:]
        return self.multi_modal_projector(features)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                image_rows: torch.Tensor | None = None, image_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """image_rows [R]: rows of this step's flat batch that are image tokens; image_embeds [R, hidden]: theirs."""
        if image_rows is None:
            return self.model(input_ids, positions, meta)
        x = self.model.embed(input_ids)
        x[image_rows] = image_embeds.to(x.dtype)
        return self.model(input_ids, positions, meta, inputs_embeds=x)
