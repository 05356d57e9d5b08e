"""Built-in chat templates for GGUFs that carry none, by architecture: the formats of llama.cpp's built-in templates
(src/llama-chat.cpp, llm_chat_apply_template) written as Jinja, so they render like any model's own template.

llama-server itself falls back to ChatML for every architecture; a Gemma or Llama 3 vocabulary has its own turn
tokens, so each family here gets the format its tokens were trained on. Gemma and Llama 3 write the BOS text
themselves (hearth's chat encoding adds none: Tokenizer.should_add_bos_in_chat).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BuiltinTemplate:
    name: str  # llama.cpp's name for the format (its --chat-template NAME)
    text: str  # Jinja
    end_of_turn: str  # the token that closes an assistant turn: generation stops on it


# Gemma has no system role: llama.cpp puts the system text, trimmed, at the head of the next user turn.
GEMMA = BuiltinTemplate("gemma", (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = ns.system + m['content'] | trim %}"
    "{% else %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n"
    "{% if ns.system and role != 'model' %}{{ ns.system }}\n\n{% set ns.system = '' %}{% endif %}"
    "{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"), "<end_of_turn>")
CHATML = BuiltinTemplate("chatml", (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"), "<|im_end|>")
LLAMA3 = BuiltinTemplate("llama3", (
    "{{ bos_token }}{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"), "<|eot_id|>")
PHI3 = BuiltinTemplate("phi3", (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"), "<|end|>")

# GGUF general.architecture -> its template; "llama" depends on the vocabulary (pick).
BY_ARCH = {"gemma": GEMMA, "gemma2": GEMMA, "gemma3": GEMMA, "qwen2": CHATML, "qwen3": CHATML, "qwen3moe": CHATML,
           "phi3": PHI3}


def pick(architecture: str | None, has_token: Callable[[str], bool]) -> BuiltinTemplate | None:
    """The built-in template for a GGUF of `architecture` whose vocabulary holds the tokens has_token accepts; None
    where no family matches (a chat request then answers 400, as before). A template is picked only if its
    end-of-turn token is in the vocabulary, so the format is one the model's tokens can express."""
    found = BY_ARCH.get(architecture or "")
    if architecture == "llama":  # Llama 3 by its header tokens; SmolLM and others on llama's graph by ChatML's
        found = LLAMA3 if has_token(LLAMA3.end_of_turn) else CHATML
    return found if found is not None and has_token(found.end_of_turn) else None
