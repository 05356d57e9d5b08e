"""Offline chat messages with images (vLLM's LLM.chat forms): {"type": "image_url", "image_url": {"url": "data:..."}}
or {"type": "image_pil", "image_pil": PIL image} content parts become the model's placeholder text in the message,
and the images are returned in prompt order."""
from __future__ import annotations

from hearth.errors import ParamError
from hearth.multimodal.image_io import decode_data_url, load_image

IMAGE_PART_TYPES = ("image_url", "image_pil", "image")


def split_images(messages: list[dict], placeholder: str | None) -> tuple[list[dict], list]:
    """(messages with each image part replaced by placeholder, the images). Messages without image parts are
    returned unchanged. placeholder None: the model takes no images (a ParamError if any is given)."""
    out, images = [], []
    for msg in messages:
        content = msg.get("content")
        if not isinstance(content, list) or not any(p.get("type") in IMAGE_PART_TYPES for p in content):
            out.append(msg)
            continue
        if placeholder is None:
            raise ParamError("messages", "this model takes text only: it cannot read images")
        texts = []
        for part in content:
            kind = part.get("type")
            if kind == "text":
                texts.append(part.get("text") or "")
                continue
            if kind not in IMAGE_PART_TYPES:
                raise ParamError("messages", f"message content parts of type {kind!r} are not supported")
            texts.append(placeholder)
            images.append(_image_of(part))
        out.append({**msg, "content": "\n".join(texts)})
    return out, images


def _image_of(part: dict):
    value = part.get(part["type"])
    if part["type"] == "image_url":
        url = value.get("url") if isinstance(value, dict) else value
        if not isinstance(url, str) or not url.startswith("data:"):
            raise ParamError("messages", "offline chat takes images as base64 data URLs or PIL images (image_pil)")
        return load_image(decode_data_url(url, "messages"), "messages")
    if value is None or not hasattr(value, "convert"):
        raise ParamError("messages", f"a {part['type']} part must hold a PIL image")
    return value.convert("RGB")
