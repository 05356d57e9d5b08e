"""`hearth serve`'s own flags (beside the engine's, hearth/engine_args.py), each declared once as a ServerArgs field:
add_serve_args, --help, docs/configuration.md and the vLLM flag mapping are generated from them (hearth/arg_fields.py).

No torch, Ray or server imports here: `hearth serve --help` builds its parser from this module.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from hearth.arg_fields import SAME, add_args, arg, vllm_flags
from hearth.entrypoints.openai.cli_ray import DEFAULT_TARGET_ONGOING_REQUESTS
from hearth.entrypoints.openai.reasoning_parser import REASONING_PARSERS

# Long enough for a local client's next request to arrive, so it joins the next step (a shorter TTFT under
# closed-loop load); it costs at most this after a step that finished requests, a fraction of one decode step.
DEFAULT_REFILL_WAIT_MS = 30.0
# server.DEFAULT_MAX_BODY_BYTES, not imported from there: the server module pulls in torch, and `--help` must not.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024

MODELS, SERVER, GATEWAY = "several models / data parallel (engines in worker processes)", "server", "gateway"
RAY = "ray serve (pip install 'hearth[ray]')"


def csv_list(value: str) -> list[str]:
    """A comma list flag: the non-empty items, stripped."""
    return [v.strip() for v in value.split(",") if v.strip()]


@dataclass
class ServerArgs:
    """Every `hearth serve` flag that is not an engine flag; the parsed namespace carries them by these names."""

    # Several models and data parallelism: engines in worker processes (cli_models.build_router).
    models_dir: str | None = arg(None, "serve every .gguf file and HF folder in DIR, named by file or folder name (no "
                                 "extension)", group=MODELS)
    models_config: str | None = arg(None, "TOML file of [[models]] entries: name, path, aliases, pinned, engine "
                                    "flags", group=MODELS)
    max_loaded_models: int | None = arg(None, "at most N models resident; the least recently used idle unpinned one "
                                        "is unloaded first. The cores are split into N slots, one per resident model "
                                        "(default: one per model)", group=MODELS)
    models_memory: float | None = arg(None, "GiB budget for resident models (weights + KV cache)", group=MODELS)
    idle_unload_seconds: float | None = arg(None, "unload an unpinned model idle this long (its worker process "
                                            "exits)", group=MODELS)
    model_load_timeout: float = arg(300.0, "how long a request waits for its model to load before a 503 (default "
                                    "%(default)s s)", group=MODELS)
    data_parallel_size: int = arg(1, "N engine processes per model, each on its own cores (default: one per NUMA node "
                                  "when there are several, else the physical cores split evenly); requests go to the "
                                  "least busy", group=MODELS, flags=("--data-parallel-size", "-dp"), vllm=SAME)

    host: str = arg("127.0.0.1", "address to bind (default 127.0.0.1)", group=SERVER, vllm=SAME)
    port: int = arg(8000, "port to bind (default 8000)", group=SERVER, vllm=SAME)
    api_key: str | None = arg(None, "require 'Authorization: Bearer <key>' on /v1 (env HEARTH_API_KEY / "
                              "VLLM_API_KEY)", group=SERVER, vllm=SAME)
    api_key_file: str | None = arg(None, "per-user keys with limits, a TOML file (see docs/web-and-keys.md); re-read "
                                   "on SIGHUP", group=SERVER)
    max_waiting_requests: int | None = arg(None, "refuse requests with 503 + Retry-After when this many are already "
                                           "waiting", group=SERVER)
    refill_wait_ms: float = arg(DEFAULT_REFILL_WAIT_MS, "after a step that finished requests, wait up to this long "
                                "for clients' next requests before the next step, while a slot is free and none "
                                "waits (default %(default)s; 0: off)", group=SERVER)
    max_request_body_bytes: int = arg(DEFAULT_MAX_BODY_BYTES, "larger request bodies get 413", group=SERVER)
    drain_timeout: float = arg(30.0, "on SIGTERM, seconds to let in-flight requests finish", group=SERVER)
    allowed_hosts: list[str] | None = arg(None, "comma list of Host header names to answer ('*': any; default: the "
                                          "bind address, plus localhost and 127.0.0.1 on loopback; any for 0.0.0.0); "
                                          "others get 400 (DNS rebinding)", group=SERVER, type=csv_list)
    allowed_origins: list[str] = arg(help="comma list of origins allowed cross-origin requests (CORS), '*' for any; "
                                     "default none: requests with another site's Origin get 403", group=SERVER,
                                     default_factory=list, type=csv_list)
    header_timeout: float = arg(10.0, "close connections whose request headers are not complete after this many "
                                "seconds", group=SERVER)
    body_timeout: float = arg(30.0, "answer 408 when a request body stalls for this many seconds", group=SERVER)
    lora_modules: list[str] | None = arg(None, "LoRA adapters to serve (with --enable-lora), each name=path (a PEFT "
                                         "folder or a llama.cpp GGUF adapter file) or JSON "
                                         '{"name": ..., "path": ..., "base_model_name": ...}; a request names one '
                                         "as its model (or by position in llama-server's lora field)", group=SERVER,
                                         nargs="+", vllm=SAME)
    reasoning_parser: str | None = arg(None, "split <think>...</think> into the message's reasoning_content (qwen3: "
                                       "the model opens it; deepseek_r1: the prompt does)", group=SERVER,
                                       choices=tuple(REASONING_PARSERS), vllm=SAME)
    reasoning_budget: int | None = arg(None, "with --reasoning-parser: end the thinking (force </think>) after this "
                                       "many tokens", group=SERVER)
    uvicorn_log_level: str = arg("info", "uvicorn's own log level", group=SERVER,
                                 choices=("critical", "error", "warning", "info", "debug", "trace"), vllm=SAME)

    # Gateway mode (gateway.gateway_config_from).
    upstream: str | None = arg(None, "an OpenAI-compatible server (e.g. vLLM on GPUs, http://gpu:8000/v1) that gets "
                               "requests for models this server does not serve, and long prompts "
                               "(--upstream-min-prompt-tokens)", group=GATEWAY, metavar="URL")
    upstream_api_key: str | None = arg(None, "sent to the upstream as 'Authorization: Bearer <key>' (env "
                                       "HEARTH_UPSTREAM_API_KEY)", group=GATEWAY)
    upstream_model: str | None = arg(None, "model name to ask the upstream for when a request for the local model "
                                     "goes there for its length (default: the same name)", group=GATEWAY)
    upstream_min_prompt_tokens: int | None = arg(None, "forward requests for the local model whose prompt has at "
                                                 "least this many tokens (default: serve them all locally)",
                                                 group=GATEWAY)
    upstream_timeout: float = arg(600.0, "seconds to wait for the upstream's next bytes (default %(default)s)",
                                  group=GATEWAY)
    blocklist: str | None = arg(None, "file of regular expressions, one a line (case-insensitive; # comments): "
                                "prompts that match one are refused with a 400", group=GATEWAY, metavar="FILE")
    answer_cache_size: int = arg(0, "keep the answers of this many repeatable requests (temperature 0 or a seed), "
                                 "LRU (default 0: off)", group=GATEWAY)
    answer_cache_ttl: float = arg(600.0, "seconds an answer stays in the answer cache (default %(default)s)",
                                  group=GATEWAY)

    # Ray Serve replicas (cli_ray.run_ray_serve); Ray is imported only when --ray is given.
    ray: bool = arg(False, "serve through Ray Serve: an ingress on --host/--port in front of --num-replicas model "
                    "replicas placed anywhere in the Ray cluster", group=RAY, action="store_true")
    ray_address: str | None = arg(None, "Ray cluster to join ('auto' for the one this machine belongs to, or "
                                  "host:6379); default: the RAY_ADDRESS environment variable, else start a local Ray",
                                  group=RAY)
    num_replicas: int | None = arg(None, "model replicas (default 1)", group=RAY)
    min_replicas: int | None = arg(None, "autoscale on ongoing requests per replica, down to this many", group=RAY)
    max_replicas: int | None = arg(None, "autoscale up to this many replicas", group=RAY)
    target_ongoing_requests: float = arg(DEFAULT_TARGET_ONGOING_REQUESTS, "autoscaling target: requests in flight "
                                         "per replica (default %(default)s)", group=RAY)
    num_cpus_per_replica: float | None = arg(None, "CPUs each replica reserves in Ray (default: --threads, else this "
                                             "machine's physical cores)", group=RAY)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """`hearth serve`'s parser: the engine's flags (the model optional, prompts staggered), then ServerArgs'."""
    from hearth.entrypoints.cli import add_engine_args

    add_engine_args(p, model_optional=True, max_prefills_per_step=1)
    add_args(p, [ServerArgs])


def vllm_flag_mapping() -> dict[str, tuple[str, str]]:
    """vLLM's flag -> (how hearth takes it: "same" | "mapped" | "no-op", the field it sets), for every vLLM flag
    `hearth serve` accepts, from the engine's and the server's declarations."""
    from hearth.engine_args import EngineArgs

    return vllm_flags([EngineArgs, ServerArgs])
