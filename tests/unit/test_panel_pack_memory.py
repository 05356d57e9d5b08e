"""A first pack of dense bf16 weights into panels holds both copies of at most one step of rows: each step's
checkpoint file pages are handed back once packed (so a 7B bf16 folder's 15 GB never become 30 GB resident)."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from hearth.kernels import panels
from hearth.layers.linear import Linear
from hearth.weights import panel_pack

STEP = 1 << 20


def _resident(path: str) -> int:
    """Bytes of `path`'s pages mapped into this process (every mapping of it, /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
                inside = len(fields) >= 6 and fields[5] == path
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def test_first_pack_releases_checkpoint_pages_step_by_step(tmp_path, monkeypatch) -> None:
    if not panels.supported():
        pytest.skip("no panels on this CPU")
    torch.manual_seed(0)
    weights = {f"w{i}": torch.randn(512, 2048).to(torch.bfloat16) for i in range(4)}  # 2 MiB each
    path = str(tmp_path / "model.safetensors")
    save_file(weights, path)
    model = nn.ModuleList()
    with safe_open(path, framework="pt") as f:
        for name in weights:
            lin = Linear(2048, 512)
            lin.weight = nn.Parameter(f.get_tensor(name), requires_grad=False)  # a view of the file's mapping
            model.append(lin)
    before = _resident(path)  # (the header's pages, and the kernel's fault-around beside them)
    if before > STEP:
        pytest.skip("safetensors copied the tensors instead of mapping the file")
    monkeypatch.setattr(panel_pack, "_PACK_STEP_BYTES", STEP, raising=False)
    seen: list[int] = []
    pack = panels.pack

    def spy(w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        seen.append(_resident(path))
        return pack(w, out)

    monkeypatch.setattr(panels, "pack", spy)
    panel_pack.pack_dense_weights(model, None, torch.bfloat16)
    assert len(seen) == 8  # two 1 MiB steps a weight
    # at most the step being packed is resident (+ fault-around pages); all 8 MiB were, before the fix
    assert max(seen) <= before + STEP + (128 << 10), [s / 2**20 for s in seen]
    assert _resident(path) <= before
    for lin, w in zip(model, weights.values()):  # packed step by step, the panels are exactly the whole pack's
        whole = pack(w, torch.empty(panels.numel(*w.shape), dtype=torch.bfloat16))
        assert torch.equal(lin.panels[0], whole)


def test_quantizing_at_load_releases_the_checkpoint_pages(tmp_path) -> None:
    """--quantization int8 / int4 of a safetensors folder: once a layer is packed its bf16 pages leave the process
    (the file mapping lives on, kept by the embedding's views, and would hold every layer's pages resident)."""
    from hearth.weights import prepare

    torch.manual_seed(0)
    path = str(tmp_path / "model.safetensors")
    save_file({"w": torch.randn(1024, 2048).to(torch.bfloat16)}, path)  # 4 MiB
    with safe_open(path, framework="pt") as f:
        w = f.get_tensor("w")
    assert float(w.float().abs().sum()) > 0  # every page read, as the quantizer reads them
    if _resident(path) < 3 << 20:
        pytest.skip("safetensors copied the tensor instead of mapping the file")
    qw = prepare.pack_parts([w], "int8", 2048, None)
    assert qw is not None and qw.bits == 8
    assert _resident(path) <= 128 << 10
    assert torch.equal(w, load_file(path)["w"])  # a view of the released pages still reads the file's bytes
