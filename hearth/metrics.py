"""Prometheus metrics with vLLM's names and meanings, so vLLM dashboards and autoscalers work unchanged.

Every server gets its own CollectorRegistry (tests start several in one process). Counters are exposed with
prometheus-client's `_total` suffix, exactly as vLLM's are. The engine thread writes; the HTTP thread reads
(prometheus-client metrics are thread-safe).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:  # (the engine reports to the metrics; they never import it)
    from hearth.engine.llm_engine import EngineStats
    from hearth.structured.compiler import GrammarCompiler

CONTENT_TYPE = CONTENT_TYPE_LATEST
disable_created_metrics()  # no *_created series (as vLLM's exposition); process-wide, harmless
FINISH_REASONS = ("stop", "length", "abort")

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0]
_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0]
_ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
_N_BUCKETS = [1, 2, 5, 10, 20]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max_value (the model's context)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


class ServerMetrics:
    """All of one server's metrics. `labels` are vLLM's: model_name and engine (the data-parallel rank)."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None, max_model_len: int = 2048,
                 engine: str = "0") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.labels = {"model_name": model_name, "engine": engine}
        names = ["model_name", "engine"]
        values = {"model_name": model_name, "engine": engine}
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=r).labels(**values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=r).labels(**values)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(**values)

        self.num_running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.num_waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.used_blocks = gauge("hearth:kv_cache_used_blocks", "KV-cache blocks held by requests right now.")
        self.total_blocks = gauge("hearth:kv_cache_total_blocks", "KV-cache blocks in the pool.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          names + ["finished_reason"], registry=r)
        self.request_success = {reason: success.labels(**values, finished_reason=reason) for reason in FINISH_REASONS}
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              _TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             _ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             _LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", _LATENCY_BUCKETS)
        self._add_vllm_request_series(histogram, gauge, max_model_len)
        # Images (zero for text-only models)
        self.mm_encoded = counter("hearth:mm_images_encoded", "Images run through the image encoder.")
        self.mm_encoder_seconds = counter("hearth:mm_encoder_seconds", "Seconds spent in the image encoder.")
        self.mm_cache_hits = counter("hearth:mm_encoder_cache_hits",
                                     "Images whose encoder output was kept from an earlier prompt (not encoded again).")
        # Speculative decoding (zero unless --speculative-config is set).
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.spec_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                          names + ["position"], registry=r)
        self._spec_per_pos = lambda pos: per_pos.labels(**values, position=str(pos))
        self.cpu = Info("hearth:cpu", "The CPU hearth runs on: detected ISA, compute threads, bound cores.",
                        registry=r)
        self.threads = gauge("hearth:threads", "Compute threads the engine uses.")
        self.bound_cores = gauge("hearth:bound_cores", "CPU cores the compute threads are pinned to (0 = unbound).")
        self.grammar_cache_bytes = gauge("hearth:grammar_cache_bytes",
                                         "Memory held by the compiled-grammar cache (structured output), in bytes.")
        self.grammar_cache_entries = gauge("hearth:grammar_cache_entries",
                                           "Compiled grammars in the structured-output cache.")
        self._last: EngineStats | None = None

    def _add_vllm_request_series(self, histogram, gauge, max_model_len: int) -> None:
        """The rest of vLLM v1's PrometheusStatLogger (vllm/v1/metrics/loggers.py): same names, docs, buckets."""
        tokens = build_1_2_5_buckets(max_model_len)
        self.inference_time = histogram("vllm:request_inference_time_seconds",
                                        "Histogram of time spent in RUNNING phase for request.", _LATENCY_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.", _LATENCY_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.", _LATENCY_BUCKETS)
        self.request_tpot = histogram("vllm:request_time_per_output_token_seconds",
                                      "Histogram of time_per_output_token_seconds per request.", _ITL_BUCKETS)
        # Deprecated in vLLM (0.10) for inter_token_latency_seconds, still what its Grafana dashboard plots.
        self.tpot = histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds."
                              "DEPRECATED: Use vllm:inter_token_latency_seconds instead.", _ITL_BUCKETS)
        self.prefill_per_token = histogram("vllm:time_per_prefill_token_request_seconds",
                                           "Time spent per token during prefill  phase in seconds",
                                           [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0])
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               tokens)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.", tokens)
        self.request_max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
            tokens)
        self.request_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.", _N_BUCKETS)
        self.request_max_tokens = histogram("vllm:request_params_max_tokens",
                                            "Histogram of the max_tokens request parameter.", tokens)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.", _ITERATION_BUCKETS)
        # Deprecated in vLLM 0.9 (renamed kv_cache_usage_perc), still on its dashboard's Cache Utilization panel.
        self.gpu_cache_usage = gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."
                                     "DEPRECATED: Use vllm:kv_cache_usage_perc instead.")

    def set_cache_config(self, info: dict[str, object]) -> None:
        """vllm:cache_config_info: a gauge at 1 whose labels are the cache configuration (vLLM's metrics_info)."""
        labels = {k: str(v) for k, v in info.items()} | {"engine": self.labels["engine"]}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(labels),
              registry=self.registry).labels(**labels).set(1)

    def observe_request(self, *, prompt_tokens: int, generation_tokens: int, n: int, max_tokens: int | None,
                        arrival: float, scheduled: float | None, first_token: float | None,
                        finished: float) -> None:
        """One finished request's histograms, as vLLM's FinishedRequestStats feed them (times in seconds, one
        clock): queue = arrival -> first scheduled, prefill = scheduled -> first token, decode = first token ->
        finished, inference = prefill + decode."""
        start = scheduled if scheduled is not None else arrival
        first = first_token if first_token is not None else finished
        prefill, decode = max(0.0, first - start), max(0.0, finished - first)
        self.inference_time.observe(prefill + decode)
        self.prefill_time.observe(prefill)
        self.decode_time.observe(decode)
        if prompt_tokens > 0:
            self.prefill_per_token.observe(prefill / prompt_tokens)
        if generation_tokens > 1:
            self.request_tpot.observe(decode / (generation_tokens - 1))
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(generation_tokens)
        self.request_max_generation_tokens.observe(max_tokens if max_tokens is not None else generation_tokens)
        self.request_n.observe(n)
        if max_tokens:
            self.request_max_tokens.observe(max_tokens)

    def observe_iteration(self, num_tokens: int) -> None:
        self.iteration_tokens.observe(num_tokens)

    def set_cpu(self, isa: str, threads: int, bound_cores: list[int], num_blocks: int) -> None:
        self.cpu.info({"isa": isa, "threads": str(threads), "bound_cores": ",".join(map(str, bound_cores)) or "none"})
        self.threads.set(threads)
        self.bound_cores.set(len(bound_cores))
        self.total_blocks.set(num_blocks)

    def watch_grammar_cache(self, compiler: GrammarCompiler) -> None:
        """The grammar cache's gauges read it at each scrape (a compile happens off the engine thread)."""
        self.grammar_cache_bytes.set_function(lambda: compiler.cache_bytes)
        self.grammar_cache_entries.set_function(lambda: len(compiler))

    def observe_stats(self, stats: EngineStats) -> None:
        """Gauges take the snapshot; counters advance by what the engine's cumulative counts grew since the last."""
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_usage)
        self.gpu_cache_usage.set(stats.kv_usage)
        self.used_blocks.set(stats.num_used_blocks)
        last = self._last
        self.preemptions.inc(max(0, stats.num_preemptions - (last.num_preemptions if last else 0)))
        self.prefix_queries.inc(max(0, stats.prefix_queries - (last.prefix_queries if last else 0)))
        self.prefix_hits.inc(max(0, stats.prefix_hits - (last.prefix_hits if last else 0)))
        self.spec_drafts.inc(max(0, stats.spec_num_drafts - (last.spec_num_drafts if last else 0)))
        self.mm_encoded.inc(max(0, stats.mm_images_encoded - (last.mm_images_encoded if last else 0)))
        self.mm_encoder_seconds.inc(max(0.0, stats.mm_encoder_seconds - (last.mm_encoder_seconds if last else 0.0)))
        self.mm_cache_hits.inc(max(0, stats.mm_encoder_cache_hits - (last.mm_encoder_cache_hits if last else 0)))
        self.spec_draft_tokens.inc(max(0, stats.spec_num_draft_tokens - (last.spec_num_draft_tokens if last else 0)))
        self.spec_accepted_tokens.inc(max(0, stats.spec_num_accepted_tokens
                                          - (last.spec_num_accepted_tokens if last else 0)))
        before = last.spec_accepted_per_pos if last else ()
        for pos, n in enumerate(stats.spec_accepted_per_pos):
            grown = n - (before[pos] if pos < len(before) else 0)
            if grown > 0:
                self._spec_per_pos(pos).inc(grown)
        self._last = stats

    def render(self) -> bytes:
        return generate_latest(self.registry)
