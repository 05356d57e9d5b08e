"""hearth: a CPU-first LLM inference and serving engine."""
__version__ = "0.1.0"

from hearth.platform import limit_torch_isa  # noqa: E402

limit_torch_isa()  # HEARTH_KERNELS_ISA=avx2 reaches torch's kernels only if set before their first use

from hearth.pooling_params import PoolingParams  # noqa: E402
from hearth.sampling_params import SamplingParams  # noqa: E402


def __getattr__(name: str):
    # LLM pulls in torch and the model code; import it only when asked for.
    if name == "LLM":
        from hearth.entrypoints.llm import LLM

        return LLM
    if name == "EngineArgs":  # vLLM's `from vllm import LLM, EngineArgs, SamplingParams`
        from hearth.config import EngineArgs

        return EngineArgs
    raise AttributeError(name)


__all__ = ["LLM", "EngineArgs", "PoolingParams", "SamplingParams", "__version__"]
