"""--models-dir / --models-config parsing, the metrics merge of several workers, data-parallel core sets."""
from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from hearth.distributed.dp_cores import _split, dp_core_sets
from hearth.entrypoints.openai.model_specs import check_names, specs_from_dir, specs_from_toml
from hearth.metrics_merge import merge_expositions


def test_models_dir_names_files_and_folders(tmp_path: Path) -> None:
    (tmp_path / "qwen.gguf").write_bytes(b"")
    (tmp_path / "big-00001-of-00002.gguf").write_bytes(b"")
    (tmp_path / "big-00002-of-00002.gguf").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "phi3").mkdir()
    (tmp_path / "phi3" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    specs = {s.name: s.path for s in specs_from_dir(str(tmp_path))}
    assert specs == {"qwen": str(tmp_path / "qwen.gguf"), "big": str(tmp_path / "big-00001-of-00002.gguf"),
                     "phi3": str(tmp_path / "phi3")}


def test_models_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no .gguf file"):
        specs_from_dir(str(tmp_path))
    with pytest.raises(ValueError, match="not a directory"):
        specs_from_dir(str(tmp_path / "missing"))


def test_models_config(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"")
    cfg = tmp_path / "m.toml"
    cfg.write_text('[[models]]\npath = "a.gguf"\naliases = ["alpha"]\npinned = true\nmax-model-len = 1024\n'
                   'kv_cache_space = 0.5\nquantization = "int8"\n')
    (spec,) = specs_from_toml(str(cfg))
    assert (spec.name, spec.aliases, spec.pinned) == ("a", ["alpha"], True)
    assert spec.path == str(tmp_path / "a.gguf")
    assert spec.engine_args == {"max_model_len": 1024, "kv_cache_space": 0.5, "quantization": "int8"}

    cfg.write_text('[[models]]\npath = "a.gguf"\nmax-tokens = 3\n')
    with pytest.raises(ValueError, match="unknown key 'max-tokens'"):
        specs_from_toml(str(cfg))
    cfg.write_text('[[models]]\npath = "b.gguf"\n')
    with pytest.raises(ValueError, match="does not exist"):
        specs_from_toml(str(cfg))
    cfg.write_text("models = [")
    with pytest.raises(ValueError, match="not valid TOML"):
        specs_from_toml(str(cfg))
    with pytest.raises(FileNotFoundError, match="no such file"):
        specs_from_toml(str(tmp_path / "none.toml"))
    cfg.write_text('model = "a.gguf"\n')
    with pytest.raises(ValueError, match=r"unknown top-level field\(s\) \['model'\]"):
        specs_from_toml(str(cfg))
    cfg.write_text('[[models]]\npath = "a.gguf"\n[[models]]\nname = "x"\npath = "a.gguf"\naliases = ["a"]\n')
    with pytest.raises(ValueError, match="'a' is used by both"):
        check_names(specs_from_toml(str(cfg)))


def test_models_config_serving_flags(tmp_path: Path) -> None:
    """reasoning-parser / reasoning-budget are per model (over the command line's), checked before any load."""
    import argparse

    from hearth.entrypoints.openai.cli_models import check_serving

    (tmp_path / "a.gguf").write_bytes(b"")
    cfg = tmp_path / "m.toml"
    cfg.write_text('[[models]]\nname = "r1"\npath = "a.gguf"\nreasoning-parser = "deepseek_r1"\n'
                   'reasoning_budget = 8\n[[models]]\nname = "plain"\npath = "a.gguf"\n')
    r1, plain = specs_from_toml(str(cfg))
    assert r1.serving == {"reasoning_parser": "deepseek_r1", "reasoning_budget": 8} and not r1.engine_args
    assert plain.serving == {}
    flags = argparse.Namespace(reasoning_parser=None, reasoning_budget=None)
    check_serving([r1, plain], flags)
    with pytest.raises(ValueError, match="model 'plain': reasoning-budget needs reasoning-parser"):
        check_serving([r1, plain], argparse.Namespace(reasoning_parser=None, reasoning_budget=4))
    cfg.write_text('[[models]]\nname = "x"\npath = "a.gguf"\nreasoning-parser = "nope"\n')
    with pytest.raises(ValueError, match="model 'x': --reasoning-parser must be one of"):
        check_serving(specs_from_toml(str(cfg)), flags)


def _render(model: str, engine: str, n: int) -> bytes:
    r = CollectorRegistry()
    c = Counter("vllm:generation_tokens", "Number of generation tokens processed.", ["model_name", "engine"],
                registry=r)
    c.labels(model_name=model, engine=engine).inc(n)
    return generate_latest(r)


def test_merge_keeps_one_header_per_family() -> None:
    text = merge_expositions([_render("a", "0", 3), _render("a", "1", 4), _render("b", "0", 5)]).decode()
    lines = text.splitlines()
    assert lines.count("# TYPE vllm:generation_tokens_total counter") == 1
    samples = [line for line in lines if line.startswith("vllm:generation_tokens_total")]
    assert samples == ['vllm:generation_tokens_total{engine="0",model_name="a"} 3.0',
                       'vllm:generation_tokens_total{engine="1",model_name="a"} 4.0',
                       'vllm:generation_tokens_total{engine="0",model_name="b"} 5.0']
    assert merge_expositions([]) == b""


def test_dp_core_sets() -> None:
    assert _split([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert dp_core_sets(2, "0-1|2-3", None) == ["0-1", "2-3"]
    assert dp_core_sets(3, "nobind", None) == ["nobind"] * 3
    with pytest.raises(ValueError, match="one per engine"):
        dp_core_sets(2, "0-3", None)
    with pytest.raises(ValueError, match="at least 4096 cores"):
        dp_core_sets(4096, "auto", None)
    sets = dp_core_sets(1, "auto", 1)
    assert len(sets) == 1 and len(sets[0].split(",")) == 1


def test_core_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resident models get their own cores by default: one slot per model that may be resident."""
    import hearth.engine.core_slots as cs
    import hearth.distributed.dp_cores as dc
    from hearth.platform import CPUInfo

    info = CPUInfo("test", frozenset(), physical_cores=4, numa_nodes=1)
    monkeypatch.setattr(cs, "cpu_info", lambda: info)
    monkeypatch.setattr(dc, "cpu_info", lambda: info)
    monkeypatch.setattr(dc, "process_affinity", lambda: frozenset({0, 1, 2, 3}))
    monkeypatch.setattr(dc, "numa_core_lists", lambda: [])
    assert cs.slot_count(3, None, 1) == 3 and cs.slot_count(3, 2, 1) == 2 and cs.slot_count(9, None, 1) == 4
    assert cs.slot_count(5, None, 2) == 2 and cs.slot_count(1, None, 1) == 1
    assert cs.core_slots(2, 1, None, None) == [["0,1"], ["2,3"]]
    assert cs.core_slots(1, 1, "auto", None) == [["0,1,2,3"]]  # one resident model: every core
    assert cs.core_slots(2, 1, "auto", 1) == [["0"], ["2"]]  # --threads caps each slot
    assert cs.core_slots(2, 2, None, None) == [["0", "1"], ["2", "3"]]  # data parallel inside each slot
    assert cs.core_slots(2, 1, "0|1-3", None) == [["0"], ["1-3"]]  # the lists make the slots
    assert cs.core_slots(2, 1, "0-1", None) == [["0-1"]]  # one list: every model on it
    assert cs.core_slots(2, 1, "nobind", None) == [["nobind"]]
    with pytest.raises(ValueError, match="one per engine"):
        cs.core_slots(2, 2, "0|1|2", None)

    slots = cs.CoreSlots([["0,1"], ["2,3"]])
    assert slots.take("a") == ["0,1"] and slots.take("b") == ["2,3"]
    assert slots.take("c") == ["0,1"]  # every slot taken: shares the least shared (the lowest on a tie)
    slots.release("b")
    assert slots.take("d") == ["2,3"]  # b's slot went back
    assert slots.take("a") == ["0,1"] and slots.slot_of("a") == 0 and slots.slot_of("b") is None
