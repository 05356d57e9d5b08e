"""EngineArgs: everything a user can set on the engine, by vLLM's names, each field declared once with its flag.

`hearth.LLM(model, **engine_args)` takes these fields; the engine subcommands' flags (entrypoints/cli.py
add_engine_args), their --help, docs/configuration.md and vllm_compat's flag mapping are generated from the same
fields (hearth/arg_fields.py). No torch here: `hearth --help` builds its parsers from this module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hearth.arg_fields import MAPPED, NOOP, SAME, arg, arg_fields
from hearth.vllm_compat import DTYPE_CHOICES, KV_CACHE_DTYPE_CHOICES

ENGINE, SAMPLING, LORA, VLLM = "engine", "sampling defaults", "LoRA adapters", "vLLM compatibility"
GROUP_DESCRIPTIONS = {SAMPLING: "for requests that leave a field unset",
                      LORA: "PEFT adapters over the base model, requests for different adapters batched together",
                      VLLM: "accepted so vLLM command lines run unchanged; on a CPU most mean nothing (one info line "
                            "says so)"}
QUANTIZATION_CHOICES = ("auto", "none", "int8", "int4", "int4-g32", "int4-g64", "int4-g128", "gguf", "gptq", "awq",
                        "compressed-tensors", "bitsandbytes")


@dataclass
class EngineArgs:
    """Everything a user can set, by vLLM's names. `hearth.LLM(model, **engine_args)` takes these."""

    model: str | None = arg(None, "HF model folder or .gguf file", group=ENGINE, positional=True, flags=("--model",),
                            vllm=SAME)
    tokenizer: str | None = arg(None, "tokenizer folder, if not the model's own", group=ENGINE, vllm=SAME)
    dtype: str = arg("auto", "compute dtype; auto = bfloat16 where the CPU has AVX512-BF16/AMX (float32 for models "
                     "too small to gain from it), else float32; float16/half computes in bfloat16", group=ENGINE,
                     choices=tuple(DTYPE_CHOICES), vllm=MAPPED)
    max_model_len: int | None = arg(None, "context length (default: the model's)", group=ENGINE, vllm=SAME)
    max_num_seqs: int = arg(64, "sequences in flight at once", group=ENGINE, vllm=SAME)
    max_num_batched_tokens: int | None = arg(None, "token budget of one engine step", group=ENGINE, vllm=SAME)
    # The server staggers prompts (its parser's default is 1); offline runs take a batch in as few steps as the
    # budget allows.
    max_prefills_per_decode_step: int = arg(
        0, "start at most N new prompts per engine step (0: as many as the token budget allows; default "
        "%(default)s); 1 staggers bursts of requests, so each waits about one step for its first token instead of a "
        "whole wave's prefill", group=ENGINE)
    max_num_seqs_per_request: int | None = arg(
        None, "sequence slots one request's n sequences may hold at once (default: a quarter of --max-num-seqs), so "
        "a large n cannot starve other requests", group=ENGINE)
    scheduling_policy: str = arg("fcfs", "fcfs: arrival order; priority: requests' `priority` field first (lower "
                                 "runs earlier), then arrival", group=ENGINE, choices=("fcfs", "priority"), vllm=SAME)
    block_size: int = arg(16, "tokens per KV-cache block", group=ENGINE, vllm=SAME)
    kv_cache_space: float | None = arg(None, "KV-cache size in GiB (env HEARTH_KVCACHE_SPACE / VLLM_CPU_KVCACHE_SPACE; "
                                       "default: from available memory)", group=ENGINE)
    kv_cache_dtype: str = arg("auto", "KV-cache storage: auto (the model dtype), int8 with per-token scales "
                              "(fp8*: int8), or float16 / bfloat16 / float32 unquantized (the model dtype, with a "
                              "log line, where the CPU or model cannot hold that type)", group=ENGINE,
                              choices=tuple(KV_CACHE_DTYPE_CHOICES), vllm=MAPPED)
    enable_prefix_caching: bool = arg(True, "turn automatic prefix caching off", group=ENGINE,
                                      flags=("--no-enable-prefix-caching",), action="store_false", vllm=SAME)
    threads: int | None = arg(None, "compute threads (default: physical cores)", group=ENGINE)
    omp_threads_bind: str | None = arg(None, "auto | nobind | core list like 0-3 (env HEARTH_CPU_OMP_THREADS_BIND)",
                                       group=ENGINE)
    seed: int = arg(0, "seed for requests without their own", group=ENGINE, vllm=SAME)
    chat_template: str | None = arg(None, "chat template: a file or a Jinja string", group=ENGINE, vllm=SAME)
    # vLLM's takes several names; the API reports and accepts the first (vllm_compat.normalize).
    served_model_name: str | list[str] | None = arg(
        None, "model name the API reports and accepts (vLLM's; the first of several)", group=ENGINE, nargs="+",
        vllm=SAME)
    # auto (None) | none | int8 | int4[-g32|-g64|-g128] | gguf (layers/quant_linear.py) | gptq | awq |
    # compressed-tensors | bitsandbytes (loader/hf_quant.py)
    quantization: str | None = arg(
        None, "weight-only quantization: int8 (per channel) / int4[-gN] (group-wise, default group 128) computed at "
        "load; auto (default) keeps GGUF Q8_0/Q4_0/Q4_1/Q4_K/Q6_K/IQ4_NL/IQ4_XS weights and a checkpoint's own GPTQ / AWQ / "
        "compressed-tensors / bitsandbytes quantization; bitsandbytes on a float checkpoint: NF4 at load (blocks of "
        "64, as bitsandbytes); none dequantizes GGUF weights", group=ENGINE, choices=QUANTIZATION_CHOICES, vllm=SAME)
    # Ranks of tensor parallelism (processes on this host, gloo all-reduce): hearth/distributed/. 1: off.
    tensor_parallel_size: int = arg(1, "split every layer over N processes on this host, one per NUMA node by "
                                    "default (dense and quantized weights; shared-memory all-reduce); default 1",
                                    group=ENGINE, flags=("--tensor-parallel-size", "-tp"), vllm=SAME)
    # Speculative decoding, vLLM's JSON (a dict or a JSON string): hearth/engine/spec_decode/config.py. None: off.
    speculative_config: dict | str | None = arg(
        None, 'speculative decoding, as JSON: {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": '
        '4, "prompt_lookup_min": 2} (prompt lookup) or {"model": "DRAFT", "num_speculative_tokens": 4} (a small '
        'draft model of the same vocabulary)', group=ENGINE, vllm=SAME)
    # vLLM's --runner: auto | generate | pooling (embeddings and scores; encoders always pool). hearth/engine/pooling.py
    runner: str = arg("auto", "pooling: serve embeddings / scores only (auto: pooling for encoders such as BERT)",
                      group=ENGINE, choices=("auto", "generate", "pooling"), vllm=SAME)
    # vLLM's older --task; vllm_compat.normalize turns it into `runner` and clears it.
    task: str | None = arg(None, "vLLM's older name for --runner: embed, score and classify mean --runner pooling",
                           group=ENGINE, choices=("auto", "generate", "embed", "embedding", "score", "classify"),
                           vllm=MAPPED)
    # Structured output (hearth/structured/compiler.py): the heap a grammar's compile may take, and the cache's.
    max_grammar_mib: int = arg(64, "MiB of memory one structured-output grammar may take to compile; a larger one "
                               "is refused (a 400) (default: %(default)s)", group=ENGINE)
    grammar_cache_mib: int = arg(512, "MiB the compiled-grammar cache keeps, least recently used evicted first "
                                 "(default: %(default)s)", group=ENGINE)
    # vLLM's --pooler-config JSON, {"pooling_type": "MEAN"|"CLS"|"LAST", "normalize": bool}; None: the checkpoint's
    pooler_config: dict | str | None = arg(
        None, 'pooling of embeddings, as JSON: {"pooling_type": "MEAN"|"CLS"|"LAST", "normalize": true} (default: '
        "the checkpoint's sentence-transformers config, else CLS for encoders and LAST for decoders, normalized)",
        group=ENGINE, vllm=SAME)
    # Images per prompt (hearth/multimodal/processing.py parse_limits): vLLM's JSON, {"image": N}
    limit_mm_per_prompt: dict | str | None = arg(
        None, 'most images one prompt may carry, as JSON: {"image": 4} (default: 8; models that take images only)',
        group=ENGINE, vllm=SAME)
    # The encoder-output cache's budget (hearth/engine/encoder_cache.py): images kept for a later prompt
    mm_cache_gb: float = arg(0.25, "GiB of image-encoder outputs kept, least recently used evicted first, so the same "
                             "image in a new prompt is not encoded again; 0 keeps an image's output only while its "
                             "prompt is prefilled (default: %(default)s)", group=ENGINE)
    # http(s) image URLs are fetched only from these hosts (hearth/entrypoints/openai/chat_images.py); vLLM's flag
    allowed_media_domains: list[str] | None = arg(
        None, "hosts whose http(s) image URLs the server fetches (default: none: images come as base64 data URLs)",
        group=ENGINE, nargs="+", vllm=SAME)
    # Sampling defaults for requests that leave fields unset: hearth/generation_defaults.py.
    generation_config: str = arg("auto", "auto: the checkpoint's generation_config.json (the bundled model: greedy, "
                                 "1024 tokens); vllm: none (temperature 1.0); or a folder holding "
                                 "generation_config.json", group=SAMPLING, vllm=SAME)
    override_generation_config: dict | str | None = arg(
        None, 'JSON on top of --generation-config, e.g. \'{"temperature": 0.5, "max_new_tokens": 256}\'',
        group=SAMPLING, vllm=SAME)
    max_tokens_default: int | None = arg(None, "max_tokens of requests that name none (default: the generation "
                                         "config's max_new_tokens, else the context that is left)", group=SAMPLING)
    # LoRA adapters (hearth/lora/, hearth/engine/lora_pool.py); the server's --lora-modules names them.
    enable_lora: bool = arg(False, "serve LoRA adapters: a request names one (its `model`, or lora_request offline) "
                            "and requests for different adapters share a batch", group=LORA, action="store_true",
                            vllm=SAME)
    max_loras: int = arg(1, "distinct adapters in one engine step (default %(default)s); requests for another one "
                         "wait for a slot", group=LORA, vllm=SAME)
    max_lora_rank: int = arg(16, "largest adapter rank accepted (default %(default)s)", group=LORA, vllm=SAME)
    max_cpu_loras: int | None = arg(None, "adapters kept loaded, least recently used dropped first (default: "
                                    "--max-loras); an adapter a request in flight uses is kept", group=LORA,
                                    vllm=SAME)
    # vLLM's arguments with no (or a mapped) meaning on a CPU: hearth/vllm_compat.py accepts, maps or refuses them.
    pipeline_parallel_size: int = arg(1, "must be 1 (default: %(default)s)", group=VLLM,
                                      flags=("--pipeline-parallel-size", "-pp"), vllm=MAPPED)
    enforce_eager: bool = arg(False, "no-op: no CUDA graphs (default: off)", group=VLLM, action="store_true",
                              vllm=NOOP)
    gpu_memory_utilization: float | None = arg(None, "no-op: no GPU; size the KV cache with --kv-cache-space "
                                               "(default: %(default)s)", group=VLLM, vllm=NOOP)
    swap_space: float | None = arg(None, "no-op: preemption recomputes; GiB in vLLM (default: %(default)s)",
                                   group=VLLM, vllm=NOOP)
    disable_log_stats: bool = arg(False, "no-op (default: off)", group=VLLM, action="store_true", vllm=NOOP)
    disable_log_requests: bool = arg(False, "no-op: requests are not logged (default: off)", group=VLLM,
                                     action="store_true", vllm=NOOP)
    device: str = arg("auto", "always the CPU (default: %(default)s)", group=VLLM, choices=("auto", "cpu"),
                      vllm=MAPPED)
    trust_remote_code: bool = arg(False, "accepted; hearth never runs a checkpoint's Python code (default: off)",
                                  group=VLLM, action="store_true", vllm=NOOP)
    load_format: str = arg("auto", "accepted; the format is read from the files (default: %(default)s)", group=VLLM,
                           vllm=NOOP)
    enable_chunked_prefill: bool | None = arg(None, "no-op: prefill is always chunked by the token budget",
                                              group=VLLM, action="store_true", vllm=NOOP)
    distributed_executor_backend: str | None = arg(None, "no-op: one process", group=VLLM, vllm=NOOP)
    num_gpu_blocks: int | None = arg(None, "no-op: no GPU; the KV cache is --kv-cache-space (default: "
                                     "%(default)s)", group=VLLM)
    cpu_kv_cache: bool = arg(False, "no-op: the KV cache is always in CPU memory (default: off)", group=VLLM,
                             action="store_true")
    debug: bool = arg(False, "debug logging, as --log-level debug (default: off)", group=VLLM, action="store_true")
    log_level: str | None = arg(None, "hearth's log level (env HEARTH_LOGGING_LEVEL / VLLM_LOGGING_LEVEL; "
                                "default: info)", group=VLLM, choices=("debug", "info", "warning", "error",
                                                                       "critical"))
    # transformers' BitsAndBytesConfig (or its dict): hearth/quantization_config.py maps it onto quantization and
    # dtype, then clears it. Python only (no flag).
    quantization_config: Any = None
    # A server flag (`hearth serve --max-waiting-requests`, serve_args.py), carried to the engine; not an engine flag.
    max_waiting_requests: int | None = None

    def __post_init__(self) -> None:
        from hearth import vllm_compat

        vllm_compat.normalize(self)
        for name in ("max_grammar_mib", "grammar_cache_mib"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a whole number of MiB >= 1, got {value!r}")


def engine_arg_names() -> list[str]:
    """The EngineArgs fields the engine subcommands take as flags (every field but max_waiting_requests)."""
    return [f.name for f, _ in arg_fields(EngineArgs)]
