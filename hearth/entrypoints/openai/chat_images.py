"""A chat request's images: the image_url parts of its messages as checked PIL images (base64 data URLs, or
http(s) from the hosts --allowed-media-domains names), then the prompt's placeholders expanded with the model's
image processor. Decoding and processing run in a small bounded pool, never on the event loop; every problem
with an image is a 400 naming it."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from hearth.config import HFConfig
from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.protocol import ChatMessage
from hearth.errors import ParamError
from hearth.multimodal.families import vision_spec
from hearth.multimodal.image_io import check_remote_url, decode_data_url, load_image
from hearth.multimodal.inputs import ImageInput
from hearth.multimodal.processing import ImageProcessing, check_image_count, image_limit, no_images

MAX_FETCH_BYTES = 20 * 2**20  # an image fetched from an allowed host
FETCH_TIMEOUT_S = 10.0
POOL_THREADS = 2  # images decoded and processed at once, per served model

T = TypeVar("T")


class ChatImages:
    """One served model's image handling (the processor is loaded at the first image)."""

    def __init__(self, model_name: str, model_path: str, hf_config: HFConfig, limits: dict[str, int],
                 domains: list[str]) -> None:
        self.model_name, self.model_path, self.hf_config = model_name, model_path, hf_config
        self.spec = vision_spec(hf_config)
        self.limits, self.limit, self.domains = limits, image_limit(limits), domains
        self.pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="hearth-images")
        self.processing: ImageProcessing | None = None
        self.lock = threading.Lock()  # (the pool's threads build the processor once)

    @property
    def placeholder_id(self) -> int | None:
        return None if self.spec is None else self.spec.image_token_id

    async def load(self, messages: list[ChatMessage]) -> list:
        """The messages' images, in order, as RGB PIL images ([] when there are none)."""
        parts = [p for m in messages for p in m.image_parts()]
        if not parts:
            return []
        try:
            if self.spec is None:
                raise no_images(self.model_name)
            check_image_count(len(parts), self.limit)
            images = []
            for part in parts:
                url = part.image_url_str
                if not url:
                    raise ParamError("messages", "an image_url part has no url")
                data = decode_data_url(url, "messages") if url.startswith("data:") else await self._fetch(url)
                images.append(await self._run(load_image, data, "messages"))
            return images
        except ParamError as e:
            raise APIError(400, str(e), param=e.param, code="invalid_image") from None

    async def expand(self, ids: list[int], images: list) -> tuple[list[int], list[ImageInput]]:
        """The token ids with each image placeholder expanded, and the images' inputs for the engine."""
        try:
            return await self._run(self._expand, ids, images)
        except ParamError as e:
            raise APIError(400, str(e), param="messages", code="invalid_image") from None

    def _expand(self, ids: list[int], images: list) -> tuple[list[int], list[ImageInput]]:
        with self.lock:
            if self.processing is None:
                self.processing = ImageProcessing(self.model_path, self.spec, self.limit)
        return self.processing.expand(ids, images, "messages")

    async def _run(self, fn: Callable[..., T], *args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def _fetch(self, url: str) -> bytes:
        import httpx

        check_remote_url(url, self.domains, "messages")
        data = bytearray()
        try:
            async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, follow_redirects=False) as client:
                async with client.stream("GET", url) as r:
                    if r.status_code != 200:
                        raise ParamError("messages", f"fetching the image URL gave HTTP {r.status_code}")
                    async for chunk in r.aiter_bytes():
                        data += chunk
                        if len(data) > MAX_FETCH_BYTES:
                            raise ParamError("messages", f"the image at the URL is larger than {MAX_FETCH_BYTES} "
                                                         "bytes")
        except httpx.HTTPError as e:
            raise ParamError("messages", f"the image URL could not be fetched: {type(e).__name__}") from None
        return bytes(data)
