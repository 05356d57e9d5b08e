"""`hearth serve | generate | chat | bench | doctor`. Flag names follow vLLM's where they mean the same thing.

CLI errors are one line naming the fix (no traceback): ValueError/LoadError from config and loading are caught here.
"""
from __future__ import annotations

import argparse
import logging
import sys

from hearth import __version__


def add_engine_args(p: argparse.ArgumentParser, model_optional: bool = False, max_prefills_per_step: int = 0) -> None:
    """The engine's flags. max_prefills_per_step: the --max-prefills-per-decode-step default (the server
    staggers prompts; offline runs take a batch in as few steps as the budget allows)."""
    if model_optional:
        p.add_argument("model", nargs="?", default=None,
                       help="HF model folder or .gguf file; None: the bundled SmolLM2-135M-Instruct")
    else:
        p.add_argument("model", help="HF model folder or .gguf file")
    from hearth import vllm_compat

    g = p.add_argument_group("engine")
    g.add_argument("--model", dest="model_flag", default=None, metavar="MODEL",
                   help="the model, as vLLM's --model (instead of the positional MODEL)")
    g.add_argument("--tokenizer", default=None, help="tokenizer folder, if not the model's own")
    g.add_argument("--dtype", default="auto", choices=vllm_compat.DTYPE_CHOICES,
                   help="compute dtype; auto = bfloat16 where the CPU has AVX512-BF16/AMX (float32 for models too "
                        "small to gain from it), else float32; float16/half computes in bfloat16")
    g.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    g.add_argument("--max-num-seqs", type=int, default=64, help="sequences in flight at once")
    g.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget of one engine step")
    g.add_argument("--max-prefills-per-decode-step", type=int, default=max_prefills_per_step,
                   help="start at most N new prompts per engine step (0: as many as the token budget allows; "
                        f"default {max_prefills_per_step}); 1 staggers bursts of requests, so each waits about one "
                        "step for its first token instead of a whole wave's prefill")
    g.add_argument("--max-num-seqs-per-request", type=int, default=None,
                   help="sequence slots one request's n sequences may hold at once (default: a quarter of "
                        "--max-num-seqs), so a large n cannot starve other requests")
    g.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                   help="fcfs: arrival order; priority: requests' `priority` field first (lower runs earlier), "
                        "then arrival")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    g.add_argument("--kv-cache-space", type=float, default=None,
                   help="KV-cache size in GiB (env HEARTH_KVCACHE_SPACE / VLLM_CPU_KVCACHE_SPACE; default: "
                        "from available memory)")
    g.add_argument("--kv-cache-dtype", default="auto", choices=vllm_compat.KV_CACHE_DTYPE_CHOICES,
                   help="KV-cache storage: auto (the model dtype) or int8 with per-token scales (fp8*: int8)")
    g.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="turn automatic prefix caching off")
    g.add_argument("--threads", type=int, default=None, help="compute threads (default: physical cores)")
    g.add_argument("--omp-threads-bind", default=None,
                   help="auto | nobind | core list like 0-3 (env HEARTH_CPU_OMP_THREADS_BIND)")
    g.add_argument("--seed", type=int, default=0, help="seed for requests without their own")
    g.add_argument("--chat-template", default=None, help="chat template: a file or a Jinja string")
    g.add_argument("--served-model-name", default=None, nargs="+",
                   help="model name the API reports and accepts (vLLM's; the first of several)")
    g.add_argument("--quantization", default=None,
                   choices=["auto", "none", "int8", "int4", "int4-g32", "int4-g64", "int4-g128", "gguf", "gptq",
                            "awq", "compressed-tensors", "bitsandbytes"],
                   help="weight-only quantization: int8 (per channel) / int4[-gN] (group-wise, default group 128) "
                        "computed at load; auto (default) keeps GGUF Q8_0/Q4_0/Q4_1/Q4_K weights and a checkpoint's "
                        "own GPTQ / AWQ / compressed-tensors / bitsandbytes quantization; bitsandbytes on a float "
                        "checkpoint: NF4 at load (blocks of 64, as bitsandbytes); none dequantizes GGUF weights")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="split every layer over N processes on this host, one per NUMA node by default "
                        "(dense and quantized weights; shared-memory all-reduce); default 1")
    g.add_argument("--speculative-config", default=None,
                   help='speculative decoding, as JSON: {"method": "ngram", "num_speculative_tokens": 4, '
                        '"prompt_lookup_max": 4, "prompt_lookup_min": 2} (prompt lookup) or {"model": "DRAFT", '
                        '"num_speculative_tokens": 4} (a small draft model of the same vocabulary)')
    add_pooling_args(g)
    g = p.add_argument_group("sampling defaults", "for requests that leave a field unset")
    g.add_argument("--generation-config", default="auto",
                   help="auto: the checkpoint's generation_config.json (the bundled model: greedy, 1024 tokens); "
                        "vllm: none (temperature 1.0); or a folder holding generation_config.json")
    g.add_argument("--override-generation-config", default=None,
                   help='JSON on top of --generation-config, e.g. \'{"temperature": 0.5, "max_new_tokens": 256}\'')
    g.add_argument("--max-tokens-default", type=int, default=None,
                   help="max_tokens of requests that name none (default: the generation config's max_new_tokens, "
                        "else the context that is left)")
    vllm_compat.add_vllm_args(p)


def add_pooling_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--runner", default="auto", choices=["auto", "generate", "pooling"],
                   help="pooling: serve embeddings / scores only (auto: pooling for encoders such as BERT)")
    g.add_argument("--task", default=None, choices=["auto", "generate", "embed", "embedding", "score", "classify"],
                   help="vLLM's older name for --runner: embed, score and classify mean --runner pooling")
    g.add_argument("--pooler-config", default=None,
                   help='pooling of embeddings, as JSON: {"pooling_type": "MEAN"|"CLS"|"LAST", "normalize": true} '
                        "(default: the checkpoint's sentence-transformers config, else CLS for encoders and LAST "
                        "for decoders, normalized)")


ENGINE_ARG_NAMES = ["model", "tokenizer", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                    "max_prefills_per_decode_step", "max_num_seqs_per_request", "scheduling_policy",
                    "block_size", "kv_cache_space", "kv_cache_dtype", "enable_prefix_caching", "threads",
                    "omp_threads_bind", "seed", "chat_template", "served_model_name", "quantization",
                    "speculative_config", "generation_config", "override_generation_config", "max_tokens_default",
                    "tensor_parallel_size", "pipeline_parallel_size", "enforce_eager", "gpu_memory_utilization",
                    "swap_space", "disable_log_stats", "device", "trust_remote_code", "runner", "pooler_config"]


def engine_args_from(ns: argparse.Namespace):
    from hearth.config import EngineArgs

    kwargs = {k: getattr(ns, k) for k in ENGINE_ARG_NAMES if hasattr(ns, k)}
    flag = getattr(ns, "model_flag", None)
    if flag is not None:
        if kwargs.get("model") not in (None, flag):
            raise ValueError(f"two models given: {kwargs['model']!r} and --model {flag!r}; give one")
        kwargs["model"] = flag
    if isinstance(kwargs.get("served_model_name"), list):
        kwargs["served_model_name"] = kwargs["served_model_name"][0]
    task = getattr(ns, "task", None)
    if task not in (None, "auto"):
        kwargs["runner"] = "generate" if task == "generate" else "pooling"
    if hasattr(ns, "max_waiting_requests"):
        kwargs["max_waiting_requests"] = ns.max_waiting_requests
    return EngineArgs(**kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hearth", description="CPU-first LLM inference and serving")
    parser.add_argument("--version", action="version", version=f"hearth {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    from hearth.entrypoints.openai import cli_serve

    cli_serve.register(sub)
    from hearth.entrypoints import cli_generate

    cli_generate.register(sub)
    try:
        from hearth.benchmarks import cli_bench

        cli_bench.register(sub)
    except ImportError:
        pass
    from hearth.entrypoints import cli_doctor

    cli_doctor.register(sub)
    from hearth.entrypoints import cli_ps

    cli_ps.register(sub)
    from hearth.entrypoints import cli_keys

    cli_keys.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s", datefmt="%H:%M:%S")
    from hearth.errors import LoadError

    command = "hearth"
    try:
        parser = build_parser()  # (imports kernel modules, which read their environment variables)
        ns = parser.parse_args(argv)
        command = f"hearth {ns.command}"
        return int(ns.func(ns) or 0)
    except (ValueError, LoadError, FileNotFoundError) as e:
        print(f"{command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
