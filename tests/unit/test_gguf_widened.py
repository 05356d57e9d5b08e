"""GGUF block types with no kernel that keeps them quantized: named with their tensor count and memory cost in the
load's log line and in `hearth doctor MODEL`, from the tensor headers."""
import logging
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from hearth.entrypoints.doctor_model import gguf_type_rows, model_rows
from hearth.loader.gguf import load_gguf
from hearth.loader.gguf.widened import widened_types
from hearth.weights.gguf import KEPT_NAMES
from tests.gguf_writer import write_gguf
from tests.tiny_models import build_checkpoint, tiny_config


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("widened")
    folder = build_checkpoint(str(root / "m"), tiny_config("llama"))
    out = {}
    for qtype in (Q.Q5_0, Q.Q4_0):
        out[qtype.name] = root / f"m-{qtype.name}.gguf"
        write_gguf(folder, out[qtype.name], qtype)
    return out


def test_widened_types_count_tensors_and_bytes(files: dict[str, Path]) -> None:
    ck = load_gguf(str(files["Q5_0"]))
    mats = [(hf, info) for hf, info in ck.tensor_infos() if len(info.shape) == 2]
    # a float32 model: projections and the head widen to float16 (2 bytes a weight), the embedding to float32
    want_mem = sum(info.shape[0] * info.shape[1] * (4 if "embed_tokens" in hf else 2) for hf, info in mats)
    (row,) = widened_types(ck, KEPT_NAMES, torch.float32)
    assert (row.name, row.tensors, row.dtype) == ("Q5_0", len(mats), torch.float16)
    assert row.file_bytes == sum(info.nbytes for _, info in mats)
    assert row.memory_bytes == want_mem and row.extra_bytes == want_mem - row.file_bytes > 0
    (bf,) = widened_types(ck, KEPT_NAMES, torch.bfloat16)
    assert bf.memory_bytes == sum(info.shape[0] * info.shape[1] * 2 for _, info in mats)
    # a kept type widens nothing; --quantization none (no kept types) widens every block type
    q4 = load_gguf(str(files["Q4_0"]))
    assert widened_types(q4, KEPT_NAMES, torch.float32) == []
    assert [r.name for r in widened_types(q4, frozenset(), torch.float32)] == ["Q4_0"]


def test_a_kept_type_merged_with_another_counts_as_widened(tmp_path: Path) -> None:
    """q/k in Q4_0 and v in Q8_0 (a llama-quantize mix) cannot join in one qkv layer, which then loads dense in
    float32: all three are widened, and the count is the bytes the loaded model's dense layers hold."""
    from hearth import LLM
    from hearth.layers.quant_linear import QuantLinear

    folder = build_checkpoint(str(tmp_path / "m"), tiny_config("llama"))
    write_gguf(folder, tmp_path / "mix.gguf", Q.Q4_0, {"v_proj": Q.Q8_0})
    rows = {r.name: r for r in widened_types(load_gguf(str(tmp_path / "mix.gguf")), KEPT_NAMES, torch.float32)}
    layers = tiny_config("llama").num_hidden_layers
    assert (rows["Q4_0"].tensors, rows["Q8_0"].tensors) == (2 * layers, layers)
    assert rows["Q4_0"].dtype == rows["Q8_0"].dtype == torch.float32
    model = LLM(str(tmp_path / "mix.gguf"), dtype="float32", kv_cache_space=0.05).engine.model
    dense = [m for m in model.modules() if isinstance(m, QuantLinear) and m.qweight is None]
    assert len(dense) == layers  # the qkv layers; o_proj and the MLP stay Q4_0
    assert sum(m.weight.numel() * m.weight.element_size() for m in dense) == sum(r.memory_bytes for r in rows.values())
    (q4,) = [line for line in gguf_type_rows(load_gguf(str(tmp_path / "mix.gguf"))) if line.startswith("Q4_0")]
    assert "kept quantized: int4 layout" in q4 and f"{2 * layers} WIDENED to float32" in q4


def test_load_logs_the_widened_types(files: dict[str, Path], caplog) -> None:
    from hearth import LLM

    with caplog.at_level(logging.INFO, logger="hearth"):
        LLM(str(files["Q5_0"]), kv_cache_space=0.05)
    lines = [r for r in caplog.records if "widened at load" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    row = widened_types(load_gguf(str(files["Q5_0"])), KEPT_NAMES, torch.float32)[0]
    msg = lines[0].getMessage()
    assert f"Q5_0 ({row.tensors} tensors" in msg and f"+{row.extra_bytes / 2**20:.1f} MiB" in msg
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hearth"):
        LLM(str(files["Q4_0"]), kv_cache_space=0.05)
    assert not [r for r in caplog.records if "widened at load" in r.getMessage()]


def test_widened_bytes_count_in_the_fit_check(files: dict[str, Path], monkeypatch) -> None:
    """Memory for the file's bytes but not for the widened weights: refused at load, in one line."""
    from hearth import EngineArgs
    from hearth.errors import LoadError
    from hearth.kv_sizing import HEADROOM_BYTES
    from hearth.loader import memory_fit
    from hearth.loader.model_loader import load_model

    path = str(files["Q5_0"])
    (row,) = widened_types(load_gguf(path), KEPT_NAMES, torch.float32)
    stored = memory_fit.footprint(path, load_gguf(path).hf_config).stored_bytes
    monkeypatch.setattr(memory_fit, "available_bytes", lambda: HEADROOM_BYTES + stored + row.extra_bytes // 2)
    with pytest.raises(LoadError, match="does not fit in memory"):
        load_model(EngineArgs(model=path, dtype="float32"))


def test_doctor_names_each_type_kept_or_widened(files: dict[str, Path]) -> None:
    text = "\n".join(model_rows(str(files["Q5_0"])))
    assert "as loaded" in text and "as loaded" not in "\n".join(model_rows(str(files["Q4_0"])))
    (q5,) = [line for line in text.splitlines() if line.startswith("Q5_0")]
    assert "WIDENED to float16" in q5 and "no kernel keeps it quantized" in q5 and "(+" in q5
    assert any(line.startswith("F32") and "float, as stored" in line for line in text.splitlines())
    (q4,) = [line for line in gguf_type_rows(load_gguf(str(files["Q4_0"]))) if line.startswith("Q4_0")]
    assert "kept quantized: int4 layout" in q4 and "WIDENED" not in q4
