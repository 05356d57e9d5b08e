"""Tiny random vision-language checkpoints built with transformers (config, model, image processor, tokenizer),
and transformers' greedy reference with images, for the multimodal parity and API tests."""
from __future__ import annotations

import os

import numpy as np
import torch

from tests.tiny_models import VOCAB, tiny_config, tiny_tokenizer

IMAGE_TOKEN = "<image>"
IMAGE_SIZE, PATCH = 32, 8  # 16 patches: an image fills 16 prompt tokens ("default" strategy drops CLS)
# A chat template that takes OpenAI-style content lists: an image part becomes the placeholder (as LLaVA's do)
LLAVA_CHAT = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n'}}{% if m['content'] is string %}"
              "{{ m['content'] }}{% else %}{% for part in m['content'] %}{% if part['type'] == 'image' %}"
              "{{ '<image>' }}{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\n'}}"
              "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}")


def test_image(width: int, height: int, seed: int):
    """A PIL image of random blocks (deterministic), so different seeds give visibly different pixels."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(1, height // 4), max(1, width // 4), 3), dtype=np.uint8)
    return Image.fromarray(small).resize((width, height), Image.NEAREST)


test_image.__test__ = False  # (a helper, not a test)


def build_llava(folder: str, seed: int = 0, std: float = 0.08, **overrides) -> str:
    """A tiny LlavaForConditionalGeneration (3-layer CLIP tower, 2-layer Llama) saved with its image processor
    and a tokenizer that has the <image> token."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    tokenizer = tiny_tokenizer(VOCAB, extra_special=(IMAGE_TOKEN,), chat_template=LLAVA_CHAT)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                              image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=32)
    cfg = LlavaConfig(vision_config=vision, text_config=tiny_config("llama"),
                      image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), **overrides)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 or name.endswith("bias"):
                p.normal_(0.0, std)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                       crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(folder)
    return folder


def hf_processor(folder: str):
    import transformers
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, LlavaProcessor

    strategy = AutoConfig.from_pretrained(folder).vision_feature_select_strategy
    # (the Pillow backend, as hearth's: with torchvision installed transformers 5 would pick that one)
    pil = {"backend": "pil"} if int(transformers.__version__.split(".")[0]) >= 5 else {"use_fast": False}
    return LlavaProcessor(image_processor=AutoImageProcessor.from_pretrained(folder, **pil),
                          tokenizer=AutoTokenizer.from_pretrained(folder), patch_size=PATCH,
                          vision_feature_select_strategy=strategy, num_additional_image_tokens=1,
                          image_token=IMAGE_TOKEN)


def hf_llava_greedy(folder: str, prompts: list[tuple[str, list]], steps: int, top: int = 5):
    """transformers' processor and model, one prompt at a time: (input ids, greedy tokens, top-k per step)."""
    from transformers import LlavaForConditionalGeneration

    processor = hf_processor(folder)
    model = LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    results = []
    for text, images in prompts:
        enc = processor(text=text, images=images or None, return_tensors="pt")
        ids = enc["input_ids"][0].tolist()
        inputs = {"input_ids": enc["input_ids"]}
        if images:
            inputs["pixel_values"] = enc["pixel_values"]
        tokens, tops, past = [], [], None
        with torch.no_grad():
            for _ in range(steps):
                out = model(**inputs, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logprobs = torch.log_softmax(out.logits[0, -1].float(), -1)
                t = logprobs.topk(top)
                tops.append((t.indices.tolist(), t.values.tolist()))
                tokens.append(int(logprobs.argmax()))
                inputs = {"input_ids": torch.tensor([[tokens[-1]]])}
        results.append((ids, tokens, tops))
    return results
