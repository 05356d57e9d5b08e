"""vLLM's `vllm.platforms` names, so field-report lines such as `current_platform = CpuPlatform()` and
`register_platform("cpu")` run: hearth has one platform, this CPU, described as `hearth doctor` does
(hearth.platform.cpu_info). Nothing here changes how hearth runs.
"""
from __future__ import annotations

import logging

from hearth.platform import CPUInfo, cpu_info

logger = logging.getLogger("hearth")


class CpuPlatform:
    """The CPU hearth runs on; read on first use (HEARTH_KERNELS_ISA applies, as everywhere)."""

    device_name = "cpu"
    device_type = "cpu"

    @property
    def info(self) -> CPUInfo:
        return cpu_info()

    @property
    def isa(self) -> str:
        return self.info.isa

    def is_cpu(self) -> bool:
        return True

    def is_cuda(self) -> bool:
        return False

    def is_rocm(self) -> bool:
        return False

    def get_device_name(self, device_id: int = 0) -> str:
        return self.info.model_name

    def __repr__(self) -> str:
        return f"CpuPlatform({self.info.summary()})"


current_platform: CpuPlatform = CpuPlatform()


def register_platform(name: str = "cpu") -> CpuPlatform:
    """Accepted for "cpu" (one info line: it is the only platform); any other name is a ValueError."""
    if str(name).lower() != "cpu":
        raise ValueError(f"register_platform({name!r}): hearth runs on the CPU only; use 'cpu'")
    logger.info("register_platform('cpu'): accepted; hearth always runs on the CPU (%s)", current_platform.isa)
    return current_platform
