"""The kernel parity test files once more as on an AVX2-only CPU (HEARTH_KERNELS_ISA=avx2, in a child pytest: the
ISA is read once per process), so `make test` on an AVX-512 machine checks the AVX2 bodies and their dispatch too.

Skipped where the run already is the AVX2 one: with the variable set, or on a CPU without AVX-512 (the files above
then ran on the AVX2 path directly)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hearth import envs
from hearth.platform import cpu_info

ROOT = Path(__file__).resolve().parents[2]
# Files whose tests compare hearth's kernels (and the layers on them) with torch's reference.
KERNEL_TESTS = ("test_kernels.py", "test_quant.py", "test_nf4.py", "test_fused.py", "test_attention_kernel.py",
                "test_attention_layer.py", "test_decode_program.py", "test_linear_parts.py",
                "test_hf_quant_formats.py")


@pytest.mark.skipif(envs.kernels_isa() == "avx2" or not cpu_info().has_avx512,
                    reason="this run is already on the AVX2 path")
def test_kernel_parity_files_pass_as_on_an_avx2_only_cpu() -> None:
    env = {**os.environ, "HEARTH_KERNELS_ISA": "avx2"}
    files = [str(Path(__file__).parent / name) for name in KERNEL_TESTS]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"HEARTH_KERNELS_ISA=avx2 pytest {' '.join(KERNEL_TESTS)}:\n{r.stdout[-6000:]}"
    assert " passed" in r.stdout
