"""The kernel codes Python passes to C are C's: the tables in kernels/weight.py and kernels/decoder.py against the
enums of csrc/hk_api.h (read from the header, no compiler), and the plan kernels against dispatch.Kernel's names."""
from __future__ import annotations

import re
from pathlib import Path

from hearth.kernels import decoder, weight
from hearth.weights.dispatch import Kernel

HEADER = Path(decoder.__file__).parent / "csrc" / "hk_api.h"


def _enum(name: str) -> dict[str, int]:
    """enum `name` of hk_api.h as {C name: value} (every member has an explicit value there)."""
    body = re.search(r"enum\s+" + name + r"\s*\{([^}]*)\}", HEADER.read_text()).group(1)
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"(\w+)\s*=\s*(\d+)", body)}


def _kebab(c_name: str, prefix: str) -> str:
    """kPlanDensePanels -> dense-panels."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", c_name.removeprefix(prefix)).lower()


def test_plan_kernels_are_the_c_enum() -> None:
    c = {_kebab(k, "kPlan"): v for k, v in _enum("PlanKernel").items() if k != "kPlanNone"}
    assert decoder.PLAN_KERNELS == c
    assert set(decoder.PLAN_KERNELS) <= {k.value for k in Kernel}  # the program runs dispatch's kernels by name


def test_quant_kernels_are_the_c_enum() -> None:
    c = {_kebab(k, "kQuant").removeprefix("dot-").replace("gemm-", ""): v for k, v in _enum("QuantKernel").items()}
    assert weight.KERNELS == c


def test_the_header_reader_sees_the_enums() -> None:
    assert _enum("PlanKernel")["kPlanNone"] == 0 and len(_enum("QuantKernel")) == 5
