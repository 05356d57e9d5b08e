"""The door's side of images: the family's transformers image processor (Pillow in, pixel values out) and the
prompt's placeholder expansion, giving the engine token ids plus one ImageInput per image."""
from __future__ import annotations

from hearth.config import HFConfig
from hearth.errors import ParamError
from hearth.multimodal.families import VisionSpec, vision_spec
from hearth.multimodal.inputs import ImageInput, image_input

# Images per prompt when --limit-mm-per-prompt does not say (a 50-image message is refused, not encoded).
DEFAULT_IMAGE_LIMIT = 8


def parse_limits(value: dict | str | None) -> dict[str, int]:
    """--limit-mm-per-prompt as vLLM spells it: {"image": N} (JSON or a dict; N or {"count": N}). ValueError
    naming the flag for anything else."""
    import json

    if value is None:
        return {}
    try:
        raw = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as e:
        raise ValueError(f"--limit-mm-per-prompt must be JSON like '{{\"image\": 4}}': {e}") from None
    if not isinstance(raw, dict):
        raise ValueError("--limit-mm-per-prompt must be a JSON object like '{\"image\": 4}'")
    limits = {}
    for modality, n in raw.items():
        if isinstance(n, dict):
            n = n.get("count")
        if modality != "image":
            raise ValueError(f"--limit-mm-per-prompt: hearth takes images only, not {modality!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"--limit-mm-per-prompt: the image limit must be a count >= 0, got {n!r}")
        limits[modality] = n
    return limits


def image_limit(limits: dict[str, int] | None) -> int:
    return int((limits or {}).get("image", DEFAULT_IMAGE_LIMIT))


def check_image_count(n: int, limit: int, param: str = "messages") -> None:
    if n > limit:
        raise ParamError(param, f"{n} images in one prompt, more than the {limit} this server takes "
                                "(--limit-mm-per-prompt '{\"image\": N}')")


def no_images(model: str, param: str = "messages") -> ParamError:
    return ParamError(param, f"model {model!r} takes text only: it cannot read images")


class ImageProcessing:
    """One model's image preprocessing. Built only for a model that takes images (for_model returns None
    otherwise); thread-safe for process() calls from a worker pool (the processor keeps no per-call state)."""

    def __init__(self, model_path: str, spec: VisionSpec, limit: int) -> None:
        # (the module itself, not transformers' lazy top-level name: that lookup can fail while another thread is
        # importing transformers)
        from transformers.models.auto.image_processing_auto import AutoImageProcessor

        self.spec = spec
        self.limit = limit
        import transformers

        # The Pillow path: transformers' reference resize and normalize semantics (transformers 5 names it backend)
        pil = {"backend": "pil"} if int(transformers.__version__.split(".")[0]) >= 5 else {"use_fast": False}
        self.processor = AutoImageProcessor.from_pretrained(model_path, **pil)

    @classmethod
    def for_model(cls, model_path: str, hf_config: HFConfig, limits: dict[str, int] | None
                  ) -> ImageProcessing | None:
        spec = vision_spec(hf_config)
        return None if spec is None else cls(model_path, spec, image_limit(limits))

    def pixels(self, image) -> object:
        """One PIL image -> its processed pixel tensor (the processor's pixel_values for it alone)."""
        out = self.processor(images=[image], return_tensors="pt")
        return out["pixel_values"][0]

    def expand(self, prompt_ids: list[int], images: list, param: str = "prompt") -> tuple[list[int],
                                                                                            list[ImageInput]]:
        """Each image placeholder token in prompt_ids (one per image, in order) becomes the image's tokens.
        images: PIL images. Raises ParamError when placeholders and images do not pair up or are too many."""
        check_image_count(len(images), self.limit, param)
        token = self.spec.image_token_id
        at = [i for i, t in enumerate(prompt_ids) if t == token]
        if len(at) != len(images):
            raise ParamError(param, f"the prompt has {len(at)} image placeholders (token {token}) for "
                                    f"{len(images)} images: put one placeholder where each image goes")
        ids: list[int] = []
        inputs: list[ImageInput] = []
        prev = 0
        for pos, image in zip(at, images):
            pixels = self.pixels(image)
            n = self.spec.num_tokens(pixels)
            ids += prompt_ids[prev:pos]
            inputs.append(image_input(pixels, len(ids), n))
            ids += [token] * n
            prev = pos + 1
        ids += prompt_ids[prev:]
        return ids, inputs
