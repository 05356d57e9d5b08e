"""`hearth doctor`: what hearth detected about this machine and what it would set."""
from __future__ import annotations

import argparse
import os


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="print detected CPU facts and the settings hearth would use")
    p.add_argument("model", nargs="?", default=None,
                   help="an HF folder or .gguf: also print its memory cost per precision and what fits")
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    import psutil
    import torch

    from hearth import envs
    from hearth.config import resolve_dtype
    from hearth.platform import cpu_info

    info = cpu_info()
    mem = psutil.virtual_memory()
    rows = [
        ("cpu", info.model_name),
        ("isa", info.isa + (f" (HEARTH_KERNELS_ISA=avx2: the CPU's {len(info.hidden)} wider flags hidden, torch's "
                            "kernels limited too)" if info.hidden else "")),
        ("avx2 / avx512 / avx512_bf16 / amx / vnni",
         " / ".join("yes" if x else "no" for x in (info.has_avx2, info.has_avx512, info.has_avx512_bf16,
                                                    info.has_amx, info.has_vnni))),
        ("physical cores (usable)", str(info.physical_cores)),
        ("numa nodes", str(info.numa_nodes)),
        ("memory available", f"{mem.available / 2**30:.1f} GiB of {mem.total / 2**30:.1f} GiB"),
        ("torch", f"{torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"),
        ("default --threads", str(info.physical_cores)),
        ("default --dtype auto ->", str(resolve_dtype("auto")).removeprefix("torch.")),
        ("core binding", envs.omp_threads_bind()),
        ("HEARTH_KVCACHE_SPACE", str(envs.kv_cache_space_gib() or "auto")),
        ("keep freed memory (glibc heap)", "yes" if envs.keep_freed_memory() else "no (HEARTH_KEEP_FREED_MEMORY=0)"),
        ("bf16 weights in panels", _panels_row()),
        ("quantized activations", _activations_row()),
        ("allowed cores", ",".join(map(str, sorted(os.sched_getaffinity(0))))),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    _print_layouts()
    if ns.model:
        from hearth.entrypoints.doctor_model import model_rows

        print()
        print("\n".join(model_rows(ns.model)))
    if not info.has_avx2:
        print("warning: this CPU lacks AVX2/FMA; hearth runs on PyTorch's generic kernels only (slow)")
    return 0


ROW_COUNTS = (1, 8, 32, 128, 512)


def _print_layouts() -> None:
    """The layout table with the kernel dispatch.plan picks here per row count: the same call every layer makes."""
    from hearth.weights import dispatch

    table = dispatch.table(rows=ROW_COUNTS)
    width = max(len(name) for name, _, _ in table)
    print()
    col = max(len(k) for _, _, kernels in table for k in kernels)
    print(f"{'weight layout':<{width}}  " + "  ".join(f"{f'{m} rows':>{col}}" for m in ROW_COUNTS))
    for name, _, kernels in table:
        print(f"{name:<{width}}  " + "  ".join(f"{k:>{col}}" for k in kernels))


def _activations_row() -> str:
    from hearth.weights import activations

    act = activations.rounding()
    if activations.auto():
        act += " (auto: prompt tokens int8 on VNNI panels; mostly-4-bit models int8 but the LM head)"
    return act


def _panels_row() -> str:
    from hearth import envs
    from hearth.kernels import panels

    if not envs.panels_enabled():
        return "no (HEARTH_PANELS=0)"
    if not panels.supported():
        return ("no (needs AVX-512 and the kernels; with native bf16 GEMMs, AVX512-BF16 and HEARTH_BF16_DOT on, "
                "and a bf16 model)")
    root = envs.panel_cache_dir()
    if panels.layout() == "dot":
        where = "in memory" if root is None else f"cached in {root}"
        return f"yes for bf16 models, in vdpbf16ps pair panels, {where}"
    if root is None:
        return "yes, packed in memory at every start (HEARTH_PANEL_CACHE=0)"
    return f"yes, cached in {root} (at most {envs.panel_cache_max_bytes() / (1 << 30):g} GiB)"
