"""HEARTH_KERNELS_ISA=avx2 makes the process behave as an AVX2-only CPU everywhere: cpu_info() (which every other
reader asks), the kernels' ISA and the C library's own feature checks, dispatch's caps, --dtype auto, bf16 panels and
torch's kernels. Run in a fresh interpreter: each of these is read once per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hearth.platform import cpu_info

_PROBE = r"""
import json, os
import hearth  # (first: its import limits torch before any torch operator runs)
import torch
from hearth import kernels
from hearth.config import resolve_dtype
from hearth.kernels import _build, nf4, panels
from hearth.platform import cpu_info
from hearth.weights import dispatch

info = cpu_info()
lib = _build.load()
c = dispatch.caps()
w = torch.randn(4, 64)
print(json.dumps({
    "avx512": info.has_avx512, "vnni": info.has_vnni, "native_bf16": info.has_native_bf16, "amx": info.has_amx,
    "flags_past_avx2": sorted(f for f in info.flags if f.startswith(("avx512", "amx", "avx10", "avx_"))),
    "hidden": len(info.hidden), "isa": kernels.isa(),
    "caps": [c.avx512, c.vnni, c.amx, c.gemm],
    "dtype_auto": str(resolve_dtype("auto")),
    "panels": panels.layout(),
    # the C side: vdpbf16ps in hk_linear, and the NF4 quantizer (AVX-512 only: None means the C checks said no)
    "c_bf16_dot": lib.hk_linear_set_bf16_dot(1) if lib else None,
    "c_nf4_quantize_avx512": nf4.quantize(w, 64, torch.linspace(-1, 1, 15)) is not None if lib else None,
    "torch_capability": torch.backends.cpu.get_cpu_capability(),
    "onednn_bf16": torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    "env": [os.environ.get("ATEN_CPU_CAPABILITY"), os.environ.get("ONEDNN_MAX_CPU_ISA")],
}))
"""


def _probe(isa: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HEARTH_KERNELS_ISA", "ATEN_CPU_CAPABILITY",
                                                            "ONEDNN_MAX_CPU_ISA")}
    if isa is not None:
        env["HEARTH_KERNELS_ISA"] = isa
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_forced_avx2_reports_no_avx512_anywhere() -> None:
    got = _probe("avx2")
    assert not got["avx512"] and not got["vnni"] and not got["native_bf16"] and not got["amx"]
    assert got["flags_past_avx2"] == []
    assert got["caps"] == [False, False, False, False]
    assert got["dtype_auto"] == "torch.float32"  # bf16 only where the CPU computes it natively
    assert got["panels"] is None  # bf16 panels are AVX-512 layouts
    assert got["env"] == ["avx2", "AVX2"]
    assert got["torch_capability"] in ("AVX2", "DEFAULT") and not got["onednn_bf16"]
    if got["isa"] is not None:  # (a CPU without AVX2 has no kernels at all)
        assert got["isa"] == 1 and got["c_bf16_dot"] == 0 and got["c_nf4_quantize_avx512"] is False


@pytest.mark.skipif(not cpu_info().has_avx512, reason="nothing to hide on a CPU without AVX-512")
def test_unforced_avx512_cpu_keeps_its_features() -> None:
    """The check above can fail: on this CPU the same probe without the variable sees AVX-512 everywhere."""
    got = _probe(None)
    assert got["avx512"] and got["caps"][0] and got["isa"] == 2 and got["hidden"] == 0
    assert got["flags_past_avx2"] and got["torch_capability"] == "AVX512"
    assert got["env"] == [None, None]
    assert got["dtype_auto"] == ("torch.bfloat16" if got["native_bf16"] else "torch.float32")


def test_cpu_info_hides_only_what_came_after_avx2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEARTH_KERNELS_ISA", "avx2")
    forced = cpu_info.__wrapped__()  # (uncached: the process's own cpu_info() stays as it was read)
    monkeypatch.delenv("HEARTH_KERNELS_ISA")
    real = cpu_info.__wrapped__()
    assert forced.flags | forced.hidden == real.flags and not forced.flags & forced.hidden
    assert {"avx2", "fma", "f16c"} & real.flags <= forced.flags
    assert all(f.startswith(("avx512", "avx10", "amx", "avx_")) for f in forced.hidden)
    assert real.hidden == frozenset()
