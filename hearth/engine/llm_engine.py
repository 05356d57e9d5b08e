"""LLMEngine: add_request / step / abort. One engine behind both the offline API and the server."""
from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass, field

import torch

from hearth import envs, generation_defaults
from hearth.config import CacheConfig, EngineArgs, LoRAConfig, SchedulerConfig
from hearth.errors import ContextLengthError, LoRAError, ParamError
from hearth.engine.block_manager import BlockManager, freeable_window
from hearth.kv_sizing import num_kv_blocks
from hearth.engine.kv_dtype import kv_cache_dtype
from hearth.engine.lora_pool import AdapterWeights, LoRAPool
from hearth.engine.model_runner import ModelRunner
from hearth.engine.outputs import StepOutput
from hearth.engine.pooling import PoolingRunner, resolve_runner
from hearth.engine.request import Request, RequestStatus
from hearth.engine.scheduler import Scheduler, SchedulerOutput
from hearth.distributed import start_tensor_parallel
from hearth.engine.tp_worker import tp_worker_main
from hearth.layers.attention import Attention
from hearth.layers.pooler import PoolerConfig
from hearth.loader.model_loader import DEFAULT_MODEL_FILE, load_model
from hearth.lora.request import LoRARequest
from hearth.multimodal.families import vision_spec
from hearth.multimodal.inputs import ImageInput
from hearth.multimodal.processing import check_image_count, image_limit, no_images, parse_limits
from hearth.platform import cpu_info, keep_freed_memory, setup_threads
from hearth.pooling_params import PoolingParams
from hearth.sampling_params import SamplingParams
from hearth.engine.spec_decode.config import SpeculativeConfig
from hearth.engine.spec_decode.draft_proposer import DraftProposer, load_draft_model
from hearth.engine.spec_decode.speculator import Speculator
from hearth.structured.compiler import CompiledGrammar, MiB
from hearth.structured.manager import StructuredOutputManager
from hearth.structured.reasoning import ReasoningGate

logger = logging.getLogger("hearth")


@dataclass
class _Sequence:
    """Engine-side state of one of a request's n sequences."""

    request: Request  # (its group_id is the user request id its n siblings share)
    index: int
    sent_prompt_logprobs: bool = False
    prompt_logprobs: list = field(default_factory=list)


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    num_used_blocks: int
    num_preemptions: int
    prefix_queries: int
    prefix_hits: int
    # Speculative decoding (cumulative; zero when off): hearth.engine.spec_decode.speculator.SpecStats.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()
    # Images (cumulative; zero for text-only models): hearth.engine.encoder_cache.EncoderCache.
    mm_images_encoded: int = 0
    mm_encoder_seconds: float = 0.0
    mm_encoder_cache_hits: int = 0


class LLMEngine:
    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        bind = args.omp_threads_bind or envs.omp_threads_bind()
        self.tp = start_tensor_parallel(args, bind, self, tp_worker_main)
        self.threads, self.bound_cores = setup_threads(*((self.tp.threads, self.tp.bind) if self.tp else
                                                         (args.threads, bind)))
        keep_freed_memory()  # process-wide glibc setting, before the model and its activations are allocated
        torch.manual_seed(args.seed)
        spec_config = SpeculativeConfig.parse(args.speculative_config)  # before loading: a bad config fails fast
        lora_config = _lora_config(args)  # (the same)
        self.mm_limits = parse_limits(args.limit_mm_per_prompt)  # (the same)
        loaded = load_model(args, self.tp.shard if self.tp else None)
        self.model_config = loaded.model_config
        self.tokenizer = loaded.tokenizer
        self.model = loaded.model
        mc = self.model_config
        self.vision = vision_spec(mc.hf_config)  # None: the model takes text only
        draft_model = None
        if spec_config is not None and spec_config.method == "draft_model":
            draft_model, draft_mc = load_draft_model(args, spec_config.model, mc)
            draft_kv_dtype = kv_cache_dtype(args.kv_cache_dtype, draft_mc.dtype)
        space = args.kv_cache_space if args.kv_cache_space is not None else envs.kv_cache_space_gib()
        kv_dtype = kv_cache_dtype(args.kv_cache_dtype, mc.dtype)
        # (a float type that fell back is reported as the type held: /metrics' cache_config_info)
        held = args.kv_cache_dtype if args.kv_cache_dtype in ("auto", "int8") else str(kv_dtype).removeprefix("torch.")
        self.cache_config = CacheConfig(args.block_size, space, args.enable_prefix_caching, held)
        self.scheduler_config = SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens or _default_budget(self.model, args.max_num_seqs),
            max_model_len=mc.max_model_len, max_waiting_requests=args.max_waiting_requests,
            max_prefills_per_decode_step=args.max_prefills_per_decode_step,
            max_num_seqs_per_request=args.max_num_seqs_per_request, scheduling_policy=args.scheduling_policy,
            max_loras=lora_config.max_loras if lora_config else 0)
        self.runner_type = resolve_runner(args.runner, self.model)
        if lora_config is not None and self.runner_type == "pooling":
            raise ValueError("--enable-lora is for text generation; this model is served for pooling (--runner "
                             "pooling): drop --enable-lora")
        self.lora = LoRAPool(self.model, lora_config, mc.dtype) if lora_config is not None else None
        per_block = ModelRunner.kv_bytes_per_block(self.model, args.block_size, kv_dtype)
        if draft_model is not None:  # the draft's KV cache has as many blocks as the target's
            per_block += ModelRunner.kv_bytes_per_block(draft_model, args.block_size, draft_kv_dtype)
        # Sliding-window models: blocks outside every layer's window are released as requests advance; block 0
        # is then the null block that stands in for them, one more on top of the sized cache.
        window = freeable_window([m.sliding_window for m in self.model.modules() if isinstance(m, Attention)])
        if per_block == 0:  # an encoder: no paged attention, no KV cache (one block keeps the manager valid)
            self.cache_config.num_blocks = 1
        else:
            self.cache_config.num_blocks = num_kv_blocks(per_block, args.block_size, mc.max_model_len,
                                                         args.max_num_seqs, space) + (window is not None)
        if self.runner_type == "pooling" and per_block:  # KV only for one pooling pass: one step's tokens
            pass_tokens = max(self.scheduler_config.max_num_batched_tokens, mc.max_model_len)
            self.cache_config.num_blocks = min(self.cache_config.num_blocks,
                                               -(-pass_tokens // args.block_size) + args.max_num_seqs + 1)
        self.block_manager = BlockManager(self.cache_config.num_blocks, args.block_size, args.enable_prefix_caching,
                                          window)
        self.scheduler = Scheduler(self.scheduler_config, self.block_manager,
                                   pooling_needs_kv=not getattr(self.model, "is_encoder", False))
        if args.mm_cache_gb < 0:
            raise ValueError(f"--mm-cache-gb must be >= 0, got {args.mm_cache_gb}")
        self.runner = ModelRunner(self.model, self.cache_config.num_blocks, args.block_size, kv_dtype,
                                  mc.vocab_size, args.seed, self.lora, int(args.mm_cache_gb * 2**30))
        if self.tp is not None:
            self.tp.attach(self.model, self.cache_config.num_blocks, args.block_size, kv_dtype)
        self.speculator: Speculator | None = None
        if spec_config is not None:
            draft = None
            if draft_model is not None:
                if self.block_manager.sliding_window is not None:
                    raise ValueError("a draft model cannot be used with a sliding-window target model (its released "
                                     "blocks hold no draft KV): use {\"method\": \"ngram\"} instead")
                draft = DraftProposer(draft_model, self.cache_config.num_blocks, args.block_size, draft_kv_dtype,
                                      mc.vocab_size, self.runner.sampler)
            self.speculator = Speculator(spec_config, mc.max_model_len, draft)
            logger.info("speculative decoding: %s", spec_config)
        # Structured output: grammars compiled against the tokenizer, masks prefetched while the model runs.
        self.structured = StructuredOutputManager(self.tokenizer, mc.vocab_size, mc.eos_token_ids,
                                                  args.max_grammar_mib * MiB, args.grammar_cache_mib * MiB)
        pooler = PoolerConfig.parse(args.pooler_config) or loaded.pooler_config or PoolerConfig(
            getattr(self.model, "default_pooling", "LAST"), True)
        self.pooling = PoolingRunner(self.model, mc, pooler, self.block_manager)
        self.seqs: dict[str, _Sequence] = {}  # engine request id -> sequence
        self.parents: dict[str, list[str]] = {}  # user request id -> engine request ids
        self._ids = itertools.count()
        self.last_step_tokens = 0
        logger.info("%s", self.startup_summary())
        self.generation_defaults = generation_defaults.resolve(
            args.generation_config, mc.model, os.path.basename(mc.model) == DEFAULT_MODEL_FILE,
            args.override_generation_config, args.max_tokens_default)
        logger.info("%s", generation_defaults.describe(self.generation_defaults, args.generation_config))

    def cache_config_info(self) -> dict[str, object]:
        """vllm:cache_config_info's labels: vLLM's CacheConfig fields that mean something here."""
        cc = self.cache_config
        return {"block_size": cc.block_size, "cache_dtype": cc.kv_cache_dtype,
                "enable_prefix_caching": cc.enable_prefix_caching, "num_cpu_blocks": cc.num_blocks,
                "num_gpu_blocks": 0, "cpu_kvcache_space_bytes": int((cc.kv_cache_space_gib or 0) * 2**30)}

    def default_sampling_params(self) -> SamplingParams:
        """What a request that sets nothing gets (vLLM's LLM.get_default_sampling_params)."""
        return SamplingParams(**self.generation_defaults)

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args)

    def startup_summary(self) -> str:
        mc, cc = self.model_config, self.cache_config
        blocks = self.block_manager.num_usable_blocks  # (without the reserved null block of windowed models)
        tokens = blocks * cc.block_size
        cores = ",".join(map(str, self.bound_cores)) or "unbound"
        if self.runner_type == "pooling":
            kv = "no KV cache (encoder)" if not self.runner.attn_layers else f"KV for one pass: {tokens} tokens"
            return (f"hearth ready for pooling (embeddings, scores): {mc.architecture}, dtype "
                    f"{str(mc.dtype).removeprefix('torch.')}, {self.threads} threads (cores {cores}; "
                    f"{cpu_info().isa}), {self.pooling.pooler_summary()}, {kv}, max input {mc.max_model_len} tokens")
        return (f"hearth ready: {mc.architecture}, dtype {str(mc.dtype).removeprefix('torch.')}, "
                f"{self.threads} threads (cores {cores}; {cpu_info().isa}), KV cache {blocks} blocks x "
                f"{cc.block_size} = {tokens} tokens, max concurrency {tokens / mc.max_model_len:.1f}x at "
                f"max-model-len {mc.max_model_len}" + (f"; {self.lora.summary()}" if self.lora else ""))

    # ---- requests ----
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | PoolingParams,
                    arrival_time: float | None = None, grammar: CompiledGrammar | None = None,
                    lora_request: LoRARequest | None = None, mm_inputs: list[ImageInput] | None = None) -> None:
        """Queue a request. Raises ParamError (a user error) for an empty or too-long prompt, bad token ids.
        grammar: params.structured_outputs compiled by the caller (off the engine thread); compiled here if None.
        lora_request: the adapter it runs under (None: the base model); a LoRAError if it cannot be served.
        mm_inputs: the images whose tokens the prompt holds (hearth.multimodal.processing expanded them)."""
        if request_id in self.parents:
            raise ParamError(None, f"request id {request_id!r} is already in use")
        mc = self.model_config
        n_prompt = len(prompt_token_ids)
        if n_prompt == 0:
            raise ParamError("prompt", "the prompt is empty: give at least one token")
        vocab = mc.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise ParamError("prompt", f"prompt token ids must be in [0, {vocab})")
        if mm_inputs:
            self._check_images(prompt_token_ids, mm_inputs, isinstance(params, PoolingParams))
        if self.vision is not None:  # (an image token no image fills would run on the placeholder's embedding)
            placeholders = prompt_token_ids.count(self.vision.image_token_id)
            if placeholders != sum(img.length for img in mm_inputs or ()):
                raise ParamError("prompt", f"the prompt holds {placeholders} image tokens (id "
                                 f"{self.vision.image_token_id}) that its {len(mm_inputs or ())} images do not "
                                 "fill: send an image for each image placeholder")
        if lora_request is not None and self.lora is None:
            raise ParamError("model", f"this server has no LoRA adapters (start it with --enable-lora): "
                             f"{lora_request.lora_name!r} cannot be used")
        if isinstance(params, PoolingParams):
            if lora_request is not None:
                raise ParamError("model", "LoRA adapters apply to text generation, not to embeddings or scores")
            if n_prompt > mc.max_model_len:
                raise ContextLengthError(f"the input has {n_prompt} tokens, but this model's maximum input length "
                                         f"is {mc.max_model_len} tokens: shorten it, or set truncate_prompt_tokens",
                                         n_prompt, None, mc.max_model_len)
            self.pooling.check(params)
            self.pooling.check_tokens(prompt_token_ids, params)
            req = Request(request_id, prompt_token_ids, params, [], arrival_time)
            self.seqs[request_id] = _Sequence(req, 0)
            self.parents[request_id] = [request_id]
            self.scheduler.add_request(req)
            return
        if self.runner_type == "pooling":
            raise ParamError("model", f"model {mc.served_model_name!r} is served for pooling (--runner pooling): it "
                             "answers embeddings and scores, not text generation")
        params.check_vocab(vocab)
        if params.priority != 0 and self.scheduler_config.scheduling_policy != "priority":
            raise ParamError("priority", "priority is only used with --scheduling-policy priority (this server is "
                             "fcfs): leave it at 0")
        max_tokens = params.max_tokens
        if n_prompt >= mc.max_model_len:
            raise ContextLengthError(f"the prompt has {n_prompt} tokens, but this model's context is "
                                     f"{mc.max_model_len} tokens (the prompt must leave room for at least one "
                                     "generated token)", n_prompt, max_tokens, mc.max_model_len)
        if max_tokens is not None and n_prompt + max_tokens > mc.max_model_len:
            raise ContextLengthError(f"this model's maximum context length is {mc.max_model_len} tokens, but the "
                                     f"request asks for {n_prompt + max_tokens} ({n_prompt} in the prompt and "
                                     f"{max_tokens} to generate): shorten the prompt or lower max_tokens",
                                     n_prompt, max_tokens, mc.max_model_len)
        if params.min_tokens > mc.max_model_len - n_prompt:
            raise ParamError("min_tokens", f"min_tokens ({params.min_tokens}) is more than this model's context "
                             f"leaves after the prompt ({mc.max_model_len} - {n_prompt} = "
                             f"{mc.max_model_len - n_prompt} tokens)")
        # NOTE: before anything is queued: an invalid schema is a ParamError (400), never a step error.
        if grammar is None and params.structured_outputs:
            grammar = self.structured.compile(params.structured_outputs)
        children = []
        lora_id, lora_scale = (lora_request.lora_int_id, lora_request.scale) if lora_request is not None else (0, 1.0)
        for i in range(params.n):
            child_params = params
            if params.n > 1:
                child_params = _child_params(params, i)
            rid = f"{request_id}#{i}" if params.n > 1 else request_id
            req = Request(rid, prompt_token_ids, child_params, mc.eos_token_ids, arrival_time, lora_id, lora_scale,
                          mm_inputs)
            req.group_id = request_id  # the scheduler caps the slots of one request's n sequences together
            if grammar is not None:
                req.grammar = grammar.new_matcher()  # each of the n sequences walks the grammar on its own
            if params.reasoning is not None:  # thinking first, then the grammar (if any)
                req.grammar = ReasoningGate(params.reasoning, req.grammar, self.structured.compiler.vocab_size)
            self.seqs[rid] = _Sequence(req, i)
            children.append(rid)
        if lora_request is not None:
            try:
                for rid in children:
                    self.lora.acquire(rid, lora_request)
            except LoRAError:
                for rid in children:
                    self.lora.release(rid)
                    del self.seqs[rid]
                raise
        self.parents[request_id] = children
        for rid in children:
            self.scheduler.add_request(self.seqs[rid].request)

    def _check_images(self, prompt_token_ids: list[int], images: list[ImageInput], pooling: bool) -> None:
        """Images must belong to a model that takes them, stay within the limit, and each cover a run of the
        family's image tokens inside the prompt, in prompt order, without overlapping."""
        if self.vision is None:
            raise no_images(self.model_config.served_model_name, "multi_modal_data")
        if pooling:
            raise ParamError("multi_modal_data", "images are for text generation, not embeddings or scores")
        if self.tp is not None:  # (the ranks' mirrored forward carries token ids only, not image rows)
            raise ParamError("multi_modal_data", "this server runs with --tensor-parallel-size > 1, which cannot "
                             "take images yet: serve the model without it for images")
        check_image_count(len(images), image_limit(self.mm_limits), "multi_modal_data")
        token, prev_end = self.vision.image_token_id, 0
        for img in images:
            if (img.offset < prev_end or img.end > len(prompt_token_ids) or img.length < 1
                    or any(t != token for t in prompt_token_ids[img.offset:img.end])):
                raise ParamError("multi_modal_data", f"an image's {img.length} tokens at prompt position "
                                 f"{img.offset} are not a run of image tokens ({token}) in the prompt")
            prev_end = img.end

    def abort_request(self, request_id: str) -> None:
        """Abort a user request (all its n sequences); frees their KV blocks at once. Unknown ids are ignored."""
        for rid in self.parents.pop(request_id, []):
            seq = self.seqs.pop(rid, None)
            if seq is not None:
                self.scheduler.finish(seq.request, RequestStatus.FINISHED_ABORTED)
            if self.lora is not None:
                self.lora.release(rid)

    def stop_sequence(self, request_id: str, index: int, stop: str) -> StepOutput | None:
        """The front found stop string `stop` in sequence `index`'s text: finish it as stopped (its KV blocks are
        freed) and return its last output, with no new tokens. None if it has finished already."""
        children = self.parents.get(request_id, [])
        seq = self.seqs.get(children[index]) if index < len(children) else None
        if seq is None:
            return None
        req = seq.request
        self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
        self._forget(seq)
        return StepOutput(request_id, index, [], [], finished=True, finish_reason="stop", stop_reason=stop,
                          num_prompt_tokens=req.num_prompt_tokens, num_output_tokens=req.num_output_tokens,
                          num_cached_tokens=req.num_cached_tokens)

    # ---- LoRA adapters ----
    def read_lora(self, lora: LoRARequest) -> AdapterWeights:
        """Read and check an adapter for add_lora without touching the engine's state (safe off the engine
        thread). Raises LoRAError."""
        return self._lora_pool().read(lora)

    def add_lora(self, lora: LoRARequest, weights: AdapterWeights | None = None) -> None:
        """Register and load an adapter (weights: from read_lora). Raises LoRAError."""
        self._lora_pool().add(lora, weights)

    def remove_lora(self, lora_id: int) -> bool:
        """Forget an adapter; requests in flight under it finish under it. False: no such adapter."""
        return self._lora_pool().remove(lora_id)

    def _lora_pool(self) -> LoRAPool:
        if self.lora is None:
            raise LoRAError("LoRA adapters need --enable-lora")
        return self.lora

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self) -> EngineStats:
        bm = self.block_manager
        stats = EngineStats(len(self.scheduler.running), len(self.scheduler.waiting),
                            bm.usage, bm.num_used_blocks,
                            self.scheduler.num_preemptions, bm.prefix_queries, bm.prefix_hits)
        cache = self.runner.encoder_cache
        if cache is not None:
            stats.mm_images_encoded, stats.mm_encoder_seconds = cache.num_encoded, cache.encoder_seconds
            stats.mm_encoder_cache_hits = cache.num_hits
        if self.speculator is not None:
            sp = self.speculator.stats
            stats.spec_num_drafts, stats.spec_num_draft_tokens = sp.num_drafts, sp.num_draft_tokens
            stats.spec_num_accepted_tokens, stats.spec_accepted_per_pos = (sp.num_accepted_tokens,
                                                                           tuple(sp.accepted_per_pos))
        return stats

    # ---- the loop ----
    def step(self) -> list[StepOutput]:
        self.last_step_tokens = 0
        if not self.scheduler.has_unfinished():
            return []
        if self.speculator is not None:
            self.speculator.plan(self.scheduler.running)
        sched = self.scheduler.schedule()
        self.last_step_tokens = sched.num_tokens  # (vllm:iteration_tokens_total)
        pooled = self._pooling_pass(sched.pooling) if sched.pooling else []
        if not sched.scheduled:
            return pooled
        return pooled + self._generation_step(sched)

    def _pooling_pass(self, batch: list[Request]) -> list[StepOutput]:
        try:
            outputs = self.pooling.run(batch)
        except BaseException:
            self.scheduler.requeue_pooling(batch)
            raise
        for req in batch:
            req.status = RequestStatus.FINISHED_STOPPED
            seq = self.seqs.get(req.request_id)
            if seq is not None:
                self._forget(seq)
        return outputs

    def _generation_step(self, sched: SchedulerOutput) -> list[StepOutput]:
        if self.speculator is not None:
            self.speculator.fill(sched, self.block_manager)
        self.structured.prefetch([s.request for s in sched.scheduled if s.sample])  # overlaps the forward pass
        result = self.runner.execute(sched, self.block_manager)
        self.scheduler.commit(sched, result.num_accepted)
        if self.speculator is not None:
            self.speculator.record(sched, result.num_accepted)
        now = time.monotonic()
        outputs: list[StepOutput] = []
        for rid, entries in result.prompt_logprobs.items():
            self.seqs[rid].prompt_logprobs.extend(entries)
        for req, tokens, lps in result.sampled:
            seq = self.seqs.get(req.request_id)
            if seq is None:
                continue
            if len(tokens) == 1:
                outputs.append(self._process_token(seq, tokens[0], lps[0], now))
                continue
            # Several tokens (speculative): stop checks run per token; tokens after a stop are dropped.
            outs = []
            for token, lp in zip(tokens, lps):
                outs.append(self._process_token(seq, token, lp, now))
                if outs[-1].finished:
                    break
            outputs.append(_merge(outs))
        return outputs

    def _process_token(self, seq: _Sequence, token: int, lp, now: float) -> StepOutput:
        """Token-level stops only (EOS, stop token ids, lengths, a complete grammar); stop strings are the front's
        (hearth.engine.output_processor), which calls stop_sequence when one appears."""
        req = seq.request
        req.append_output_token(token)
        if req.first_token_time is None:
            req.first_token_time = now
        req.last_token_time = now
        status, stop_reason = self._check_stop_token(req, token)
        if (req.grammar is not None and self.structured.accept(req.grammar, token, req.request_id)
                and status in (None, RequestStatus.FINISHED_LENGTH)):
            status = RequestStatus.FINISHED_STOPPED  # the grammar is complete: nothing but EOS could follow
        if status is None and req.num_tokens >= self.model_config.max_model_len:
            status = RequestStatus.FINISHED_LENGTH
        prompt_lp = None
        if req.params.prompt_logprobs is not None and not seq.sent_prompt_logprobs:
            prompt_lp = [None] + seq.prompt_logprobs
            seq.sent_prompt_logprobs = True
        out = StepOutput(seq.request.group_id, seq.index, [token], [lp] if lp is not None else [],
                         finished=status is not None, num_prompt_tokens=req.num_prompt_tokens,
                         num_output_tokens=req.num_output_tokens, num_cached_tokens=req.num_cached_tokens,
                         prompt_logprobs=prompt_lp)
        if status is not None:
            self.scheduler.finish(req, status)
            out.finish_reason, out.stop_reason = status.finish_reason, stop_reason
            out.ended_by_stop_token = ((token in req.eos_token_ids and not req.params.ignore_eos)
                                       or stop_reason is not None)
            self._forget(seq)
        return out

    @staticmethod
    def _check_stop_token(req: Request, token: int) -> tuple[RequestStatus | None, int | None]:
        p = req.params
        if req.num_output_tokens >= p.min_tokens:
            if not p.ignore_eos and token in req.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED, None
            if token in p.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED, token
        if p.max_tokens is not None and req.num_output_tokens >= p.max_tokens:
            return RequestStatus.FINISHED_LENGTH, None
        return None, None

    def _forget(self, seq: _Sequence) -> None:
        self.seqs.pop(seq.request.request_id, None)
        if self.lora is not None:
            self.lora.release(seq.request.request_id)
        siblings = self.parents.get(seq.request.group_id)
        if siblings is not None and all(rid not in self.seqs for rid in siblings):
            del self.parents[seq.request.group_id]


def _lora_config(args: EngineArgs) -> LoRAConfig | None:
    if not args.enable_lora:
        return None
    if args.tensor_parallel_size > 1:
        raise ValueError("--enable-lora cannot be used with --tensor-parallel-size > 1 yet")
    return LoRAConfig(args.max_loras, args.max_lora_rank, args.max_cpu_loras)


def _default_budget(model: torch.nn.Module, max_num_seqs: int) -> int:
    """The step's default token budget. An encoder keeps no KV, so a larger pass costs only activations and
    runs a batch of 64 pooling inputs of 128 tokens in one pass instead of four."""
    return max(8192 if getattr(model, "is_encoder", False) else 2048, max_num_seqs)


def _merge(outs: list[StepOutput]) -> StepOutput:
    """One sequence's per-token outputs of one step as a single delta (the last one's status and counts)."""
    merged = outs[-1]
    merged.new_token_ids = [t for o in outs for t in o.new_token_ids]
    merged.new_logprobs = [lp for o in outs for lp in o.new_logprobs]
    merged.prompt_logprobs = next((o.prompt_logprobs for o in outs if o.prompt_logprobs is not None), None)
    return merged


def _child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The i-th of n sequences: its own seed (seed + i), so seeded n > 1 gives n different, reproducible texts."""
    import dataclasses

    child = dataclasses.replace(params, n=1, stop=params.stop_strings or None)
    if params.seed is not None:
        child.seed = params.seed + index
    return child
