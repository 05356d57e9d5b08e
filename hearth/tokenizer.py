"""The tokenizer and chat template, through HF `tokenizers`/`transformers` (offline only)."""
from __future__ import annotations

import logging
import os
from typing import Any

from hearth.loader.errors import LoadError

logger = logging.getLogger("hearth")


class Tokenizer:
    def __init__(self, hf_tokenizer: Any, chat_template: str | None = None) -> None:
        self.hf = hf_tokenizer
        self.chat_template = chat_template or getattr(hf_tokenizer, "chat_template", None)
        self.all_special_ids = set(hf_tokenizer.all_special_ids)

    @classmethod
    def from_folder(cls, folder: str, chat_template: str | None = None) -> Tokenizer:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        try:
            hf = _named_tokenizer(folder) or AutoTokenizer.from_pretrained(folder, local_files_only=True,
                                                                           trust_remote_code=False)
        except Exception as e:  # transformers raises many kinds here
            # AutoTokenizer also reads config.json (e.g. it rejects a UTF-8 BOM that hearth accepts): a plain
            # fast tokenizer needs only tokenizer.json.
            if os.path.exists(os.path.join(folder, "tokenizer.json")):
                return cls(PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True), chat_template)
            raise LoadError(f"cannot load the tokenizer from {folder} ({type(e).__name__}: {str(e).splitlines()[0]}); "
                            "the folder needs tokenizer.json or tokenizer.model with tokenizer_config.json") from None
        return cls(hf, chat_template)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def eos_token_id(self) -> int | None:
        return self.hf.eos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_ids: list[int]) -> list[str]:
        return self.hf.convert_ids_to_tokens(token_ids)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, chat_template: str | None = None,
                            continue_final_message: bool = False, **kwargs: Any) -> str:
        template = chat_template or self.chat_template
        if not template:
            raise ValueError("this model has no chat template: pass --chat-template (a file or a Jinja string), "
                             "or use the completions API")
        return self.hf.apply_chat_template(messages, chat_template=template, tools=tools, tokenize=False,
                                           add_generation_prompt=add_generation_prompt,
                                           continue_final_message=continue_final_message, **kwargs)

    def should_add_bos_in_chat(self) -> bool:
        """Chat templates usually write the BOS text themselves; encoding must not add a second one."""
        return False


def _named_tokenizer(folder: str) -> Any | None:
    """The class tokenizer_config.json names, loaded directly: what AutoTokenizer resolves to, without its
    AutoConfig step (which imports the model family's modules and torch.distributed: ~2.5 s of a 5 s start-up).
    None when the config names no class transformers has built in (AutoTokenizer then decides)."""
    import json

    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path) or not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return None
    try:
        with open(path, encoding="utf-8-sig") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    name = cfg.get("tokenizer_class") if isinstance(cfg, dict) else None
    if not isinstance(name, str) or "auto_map" in cfg:
        return None
    cls = tokenizer_class_from_name(name) or tokenizer_class_from_name(name.removesuffix("Fast"))
    if cls is None:
        return None
    return cls.from_pretrained(folder, local_files_only=True, trust_remote_code=False)


def resolve_chat_template(value: str | None) -> str | None:
    """--chat-template takes a file path or a literal Jinja string."""
    if value is None:
        return None
    if os.path.exists(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value:
        raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template")
    return value
