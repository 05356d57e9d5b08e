"""Load-time checks (issue 31): each pitfall is named at start-up, with the message a user sees."""
import json
import os
import shutil
import socket

import pytest
import torch

from hearth.config import EngineArgs, HFConfig
from hearth.entrypoints.openai.cli_serve import bind_socket
from hearth.loader import checks, model_loader
from hearth.errors import LoadError
from hearth.loader.model_loader import load_model
from tests.tiny_models import build_checkpoint, tiny_config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("ckpt") / "tiny"), tiny_config("llama"))


def _copy(checkpoint: str, tmp_path, **config) -> str:
    dst = str(tmp_path / "copy")
    shutil.copytree(checkpoint, dst)
    path = os.path.join(dst, "config.json")
    cfg = json.load(open(path))
    cfg.update(config)
    json.dump(cfg, open(path, "w"))
    return dst


def test_architecture_typo_gets_did_you_mean(checkpoint, tmp_path) -> None:
    folder = _copy(checkpoint, tmp_path, architectures=["LlamaForCausalLm"])
    with pytest.raises(LoadError) as e:
        load_model(EngineArgs(model=folder, dtype="float32"))
    assert f"{folder}: unsupported architecture 'LlamaForCausalLm' (did you mean 'LlamaForCausalLM'?); " \
           "hearth supports " in str(e.value)


def test_implausible_context_is_capped_with_a_warning(checkpoint, tmp_path, caplog) -> None:
    folder = _copy(checkpoint, tmp_path, max_position_embeddings=1_000_000)
    with caplog.at_level("WARNING", logger="hearth"):
        loaded = load_model(EngineArgs(model=folder, dtype="float32"))
    assert loaded.model_config.max_model_len == checks.MAX_PLAUSIBLE_CONTEXT == 131072
    assert ("config.json says max_position_embeddings=1000000 without rope scaling, more than any such model trains "
            "on; capping the context at 131072 tokens: pass --max-model-len N to choose another") in caplog.text
    # Asked for explicitly, or scaled by rope: taken as given.
    assert load_model(EngineArgs(model=folder, dtype="float32", max_model_len=4096)).model_config.max_model_len == 4096
    assert checks.plausible_context({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 262144) == 262144


def test_missing_chat_template_warns_at_start(checkpoint, tmp_path, caplog) -> None:
    folder = _copy(checkpoint, tmp_path)
    cfg_path = os.path.join(folder, "tokenizer_config.json")
    cfg = json.load(open(cfg_path))
    cfg.pop("chat_template", None)
    json.dump(cfg, open(cfg_path, "w"))
    for name in ("chat_template.jinja", "chat_template.json"):
        if os.path.exists(os.path.join(folder, name)):
            os.remove(os.path.join(folder, name))
    with caplog.at_level("WARNING", logger="hearth"):
        load_model(EngineArgs(model=folder, dtype="float32"))
    assert (f"{folder} has no chat template: chat requests (/v1/chat/completions, LLM.chat, hearth chat) will answer "
            "400; pass --chat-template (a file or a Jinja string) to chat with it") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hearth"):
        load_model(EngineArgs(model=checkpoint, dtype="float32"))
    assert "no chat template" not in caplog.text


def test_missing_eos_names_the_id_used(checkpoint, tmp_path, caplog) -> None:
    folder = _copy(checkpoint, tmp_path, eos_token_id=None)
    gen = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    with caplog.at_level("WARNING", logger="hearth"):
        loaded = load_model(EngineArgs(model=folder, dtype="float32"))
    eos = loaded.tokenizer.eos_token_id
    assert f"no eos_token_id in generation_config.json or config.json; using the tokenizer's ({eos})" in caplog.text


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_float32_checkpoint_stays_float32_under_auto(monkeypatch, key: str) -> None:
    """Current transformers writes "dtype", older "torch_dtype": either keeps a float32 checkpoint in float32 where
    auto would otherwise pick bfloat16 (a model big enough for bf16: see SMALL_MODEL_PARAMS)."""
    monkeypatch.setattr(model_loader, "resolve_dtype", lambda name: torch.bfloat16)
    big = {"hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32, "intermediate_size": 5632,
           "vocab_size": 32000}
    assert model_loader.resolve_model_dtype("auto", HFConfig(big)) == torch.bfloat16
    assert model_loader.resolve_model_dtype("auto", HFConfig({**big, key: "float32"})) == torch.float32


def test_auto_dtype_keeps_small_models_in_float32(monkeypatch) -> None:
    """bf16 rounding moves a small model's greedy answers (tests/e2e/test_default_answers.py): auto keeps fp32."""
    monkeypatch.setattr(model_loader, "resolve_dtype", lambda name: torch.bfloat16)
    smollm2 = HFConfig({"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                        "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152})
    assert 130e6 < model_loader.approx_params(smollm2) < 140e6
    assert model_loader.resolve_model_dtype("auto", smollm2) == torch.float32
    assert model_loader.resolve_model_dtype("bfloat16", smollm2) == torch.bfloat16


def test_busy_port_is_found_before_loading() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ValueError) as e:
            bind_socket("127.0.0.1", port)
    assert str(e.value) == (f"cannot listen on 127.0.0.1:{port} (Address already in use): another process holds it; "
                            "stop that process or pass --port N")
