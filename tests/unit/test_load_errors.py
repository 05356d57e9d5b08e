"""Every load error is one line naming the cause and the fix."""
import json
import os
import shutil

import pytest

from hearth.config import EngineArgs
from hearth.errors import LoadError
from hearth.loader.model_loader import load_model
from tests.tiny_models import build_checkpoint, tiny_config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("ckpt") / "tiny"), tiny_config("llama"))


def copy_of(checkpoint: str, tmp_path) -> str:
    dst = str(tmp_path / "copy")
    shutil.copytree(checkpoint, dst)
    return dst


def load(folder: str):
    return load_model(EngineArgs(model=folder, dtype="float32"))


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def edit_config(folder: str, **changes) -> None:
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    cfg.update(changes)
    json.dump(cfg, open(path, "w"))


def test_loads_fine(checkpoint):
    loaded = load(checkpoint)
    assert loaded.model_config.architecture == "LlamaForCausalLM"
    assert loaded.model_config.eos_token_ids == [1]


def test_unknown_architecture_lists_supported(checkpoint, tmp_path):
    folder = copy_of(checkpoint, tmp_path)
    edit_config(folder, architectures=["FancyNewForCausalLM"])
    with pytest.raises(LoadError) as e:
        load(folder)
    msg = one_line(e)
    assert "FancyNewForCausalLM" in msg and "LlamaForCausalLM" in msg


def test_remote_code_is_refused(checkpoint, tmp_path):
    folder = copy_of(checkpoint, tmp_path)
    edit_config(folder, architectures=["BaichuanLikeForCausalLM"],
                auto_map={"AutoModelForCausalLM": "modeling_x.BaichuanLikeForCausalLM"})
    with pytest.raises(LoadError) as e:
        load(folder)
    assert "trust_remote_code" in one_line(e)


def test_config_with_bom_loads(checkpoint, tmp_path):
    folder = copy_of(checkpoint, tmp_path)
    path = os.path.join(folder, "config.json")
    data = open(path, "rb").read()
    open(path, "wb").write(b"\xef\xbb\xbf" + data)
    assert load(folder).model_config.architecture == "LlamaForCausalLM"


def test_invalid_json_names_file_and_line(checkpoint, tmp_path):
    folder = copy_of(checkpoint, tmp_path)
    path = os.path.join(folder, "config.json")
    open(path, "w").write('{\n  "architectures": ["LlamaForCausalLM"],\n  "hidden_size": 64,,\n}\n')
    with pytest.raises(LoadError) as e:
        load(folder)
    msg = one_line(e)
    assert "config.json" in msg and "line 3" in msg


def test_truncated_safetensors_names_file(checkpoint, tmp_path):
    folder = copy_of(checkpoint, tmp_path)
    path = os.path.join(folder, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(LoadError) as e:
        load(folder)
    msg = one_line(e)
    assert "model.safetensors" in msg and "truncated" in msg


def test_corrupt_safetensors_names_file(checkpoint, tmp_path):
    folder = copy_of(checkpoint, tmp_path)
    path = os.path.join(folder, "model.safetensors")
    open(path, "wb").write(b"\x00" * 64)
    with pytest.raises(LoadError) as e:
        load(folder)
    assert "model.safetensors" in one_line(e)


def test_missing_shard_names_it(checkpoint, tmp_path):
    folder = copy_of(checkpoint, tmp_path)
    os.rename(os.path.join(folder, "model.safetensors"), os.path.join(folder, "model-00001-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                                            "lm_head.weight": "model-00002-of-00002.safetensors"}}
    json.dump(index, open(os.path.join(folder, "model.safetensors.index.json"), "w"))
    with pytest.raises(LoadError) as e:
        load(folder)
    assert "model-00002-of-00002.safetensors" in one_line(e)


def test_sharded_checkpoint_loads(checkpoint, tmp_path):
    """A checkpoint saved in several shards with an index loads the same model."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = str(tmp_path / "sharded")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    model.save_pretrained(folder, max_shard_size="100KB")
    for f in os.listdir(checkpoint):
        if f.startswith("tokenizer") or f.startswith("special"):
            shutil.copy(os.path.join(checkpoint, f), folder)
    assert os.path.exists(os.path.join(folder, "model.safetensors.index.json"))
    a, b = load(checkpoint).model, load(folder).model
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)


def test_missing_weights(checkpoint, tmp_path):
    folder = copy_of(checkpoint, tmp_path)
    os.remove(os.path.join(folder, "model.safetensors"))
    with pytest.raises(LoadError) as e:
        load(folder)
    assert "safetensors" in one_line(e)


def test_hub_id_is_not_downloaded():
    with pytest.raises(LoadError) as e:
        load("meta-llama/Llama-3.2-1B")
    msg = one_line(e)
    assert "never downloads" in msg and "local" in msg


def test_generation_config_eos_list(checkpoint, tmp_path):
    folder = copy_of(checkpoint, tmp_path)
    json.dump({"eos_token_id": [1, 4]}, open(os.path.join(folder, "generation_config.json"), "w"))
    assert load(folder).model_config.eos_token_ids == [1, 4]


def test_missing_eos_warns_and_uses_tokenizer(checkpoint, tmp_path, caplog):
    folder = copy_of(checkpoint, tmp_path)
    edit_config(folder, eos_token_id=None)
    gen = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    with caplog.at_level("WARNING", logger="hearth"):
        loaded = load(folder)
    assert loaded.model_config.eos_token_ids == [loaded.tokenizer.eos_token_id]
    assert any("eos" in r.message for r in caplog.records)


def test_kv_cache_too_small_is_a_clear_error(checkpoint):
    from hearth import LLM

    with pytest.raises(ValueError) as e:
        LLM(checkpoint, dtype="float32", kv_cache_space=0.00001, max_model_len=256)
    msg = one_line(e)
    assert "--kv-cache-space" in msg and "--max-model-len" in msg
