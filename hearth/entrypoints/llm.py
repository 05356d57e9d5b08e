"""The offline API: hearth.LLM(model=...).generate(prompts, SamplingParams(...)), and .chat(messages)."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from tqdm import tqdm

from hearth.config import EngineArgs
from hearth.engine.llm_engine import LLMEngine
from hearth.engine.output_processor import OutputProcessor, run_step
from hearth.engine.outputs import CompletionOutput, RequestOutput
from hearth.entrypoints import llm_pooling
from hearth.entrypoints.llm_pooling import PoolingRequestOutput
from hearth.lora.request import LoRARequest
from hearth.multimodal.chat_parts import split_images
from hearth.multimodal.inputs import ImageInput
from hearth.multimodal.processing import ImageProcessing, no_images
from hearth.pooling_params import PoolingParams
from hearth.sampling_params import SamplingParams

Prompt = str | list[int] | dict


class LLM:
    def __init__(self, model: str | None = None, **engine_args) -> None:
        self._start(EngineArgs(model=model, **engine_args))

    def _start(self, args: EngineArgs) -> None:
        self.engine = LLMEngine(args)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()
        self._image_processing: ImageProcessing | None = None  # built at the first image

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLM:
        """vLLM's LLM.from_engine_args(EngineArgs(model=..., ...))."""
        llm = cls.__new__(cls)
        llm._start(engine_args)
        return llm

    def get_default_sampling_params(self) -> SamplingParams:
        """The checkpoint's generation_config defaults (--generation-config), as vLLM's LLM gives them."""
        return self.engine.default_sampling_params()

    def generate(self, prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams | list | None = None,
                 use_tqdm: bool = False,
                 lora_request: LoRARequest | list[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """prompts: a string, a list of token ids, {"prompt_token_ids": [...]}, or a list of those; a dict may carry
        images as vLLM's {"prompt": ..., "multi_modal_data": {"image": PIL image or list}}, one image placeholder
        in the prompt per image. lora_request:
        the adapter every prompt runs under, or one per prompt (None: the base model; needs enable_lora=True)."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError("give one LoRARequest, or one per prompt")
        results: dict[str, RequestOutput] = {}
        order: list[str] = []
        processor = OutputProcessor(self.tokenizer)
        for prompt, params, lora in zip(prompts, params_list, loras):
            text, ids = self._tokenize(prompt)
            ids, images = self._images(prompt, ids)
            if params is None:  # the checkpoint's defaults; their max_tokens no longer than the context leaves
                params = self.engine.default_sampling_params()
                room = self.engine.model_config.max_model_len - len(ids)
                if params.max_tokens is not None and 0 < room < params.max_tokens:
                    params = dataclasses.replace(params, max_tokens=room)
            rid = str(next(self._ids))
            try:
                self.engine.add_request(rid, ids, params, lora_request=lora, mm_inputs=images)
            except BaseException:  # (all or nothing: the prompts already queued are dropped)
                for queued in order:
                    self.engine.abort_request(queued)
                raise
            processor.add_request(rid, ids, params)
            results[rid] = RequestOutput(rid, text, ids, [CompletionOutput(i) for i in range(params.n)])
            order.append(rid)
        return self._run(results, order, processor, use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             add_generation_prompt: bool = True, chat_template: str | None = None,
             use_tqdm: bool = False, lora_request: LoRARequest | None = None) -> list[RequestOutput]:
        """messages: one conversation or a list of them; content parts may carry images (image_url with a base64
        data URL, or image_pil with a PIL image), each put where its part is."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        vision = self.engine.vision
        placeholder = self.tokenizer.decode([vision.image_token_id], skip_special_tokens=False) if vision else None
        prompts = []
        for conv in conversations:
            conv, images = split_images(conv, placeholder)
            text = self.tokenizer.apply_chat_template(conv, add_generation_prompt=add_generation_prompt,
                                                      chat_template=chat_template)
            prompt = {"prompt": text, "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=False)}
            if images:
                prompt["multi_modal_data"] = {"image": images}
            prompts.append(prompt)
        return self.generate(prompts, sampling_params, use_tqdm, lora_request)

    def embed(self, prompts: str | list[int] | Sequence[str | list[int]], pooling_params: PoolingParams | None = None,
              truncate_prompt_tokens: int | None = None) -> list[PoolingRequestOutput]:
        """One embedding per prompt (texts or token ids), batched through the engine: .outputs.embedding."""
        return llm_pooling.embed(self.engine, self._ids, prompts, pooling_params, truncate_prompt_tokens)

    def score(self, text_1: str | Sequence[str], text_2: str | Sequence[str],
              truncate_prompt_tokens: int | None = None) -> list[PoolingRequestOutput]:
        """A cross-encoder's score of each (text_1, text_2) pair (1:1, 1:N or N:N): .outputs.score."""
        return llm_pooling.score(self.engine, self._ids, text_1, text_2, truncate_prompt_tokens)

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            return prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
        return None, list(prompt)

    def _images(self, prompt: Prompt, ids: list[int]) -> tuple[list[int], list[ImageInput] | None]:
        """A prompt's images processed and its placeholders expanded (vLLM's multi_modal_data form)."""
        data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        images = (data or {}).get("image")
        if not images:
            return ids, None
        if self._image_processing is None:
            mc = self.engine.model_config
            self._image_processing = ImageProcessing.for_model(mc.model, mc.hf_config, self.engine.mm_limits)
            if self._image_processing is None:
                raise no_images(mc.served_model_name, "multi_modal_data")
        return self._image_processing.expand(ids, images if isinstance(images, list) else [images])

    def _run(self, results: dict[str, RequestOutput], order: list[str], processor: OutputProcessor,
             use_tqdm: bool) -> list[RequestOutput]:
        bar = tqdm(total=len(order), desc="generate", disable=not use_tqdm)
        try:
            while self.engine.has_unfinished_requests():
                for step in run_step(self.engine, processor):
                    res = results.get(step.request_id)
                    if res is None:
                        continue
                    res.add(step)
                    if res.finished:
                        bar.update(1)
        except BaseException:
            for rid in order:
                self.engine.abort_request(rid)
            raise
        finally:
            bar.close()
        return [results[rid] for rid in order]
