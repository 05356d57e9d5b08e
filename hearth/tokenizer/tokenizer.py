"""The tokenizer and chat template.

transformers decides how a checkpoint tokenizes (which pipeline its tokenizer class builds, the special tokens,
the chat template); importing it and resolving the class costs seconds of a start-up. So the tokenizer transformers
builds is saved once (hearth.tokenizer.cache: its `tokenizers` backend as tokenizer.json, plus the few
facts encode/decode/templates need, TokenizerInfo) and later starts load only that with `tokenizers` (fast).
Chat templates are rendered by transformers' Jinja renderer, imported on the first chat request.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from hearth.errors import LoadError
from hearth.tokenizer import cache as tokenizer_cache
from hearth.tokenizer.info import TokenizerInfo

logger = logging.getLogger("hearth")

# A decode that transformers' clean_up_tokenization changes, to learn whether a tokenizer applies it.
_CLEANUP_PROBE = "a . b , c ! d ? e n't f 's"


class Tokenizer:
    def __init__(self, backend: Any, info: TokenizerInfo, chat_template: str | None = None) -> None:
        self.backend = backend  # tokenizers.Tokenizer
        self.info = info
        self.templates = info.chat_template
        if chat_template:  # --chat-template overrides whatever the checkpoint has
            self.templates = chat_template
        self.all_special_ids = set(info.special_ids)

    @classmethod
    def from_hf(cls, hf: Any, chat_template: str | None = None) -> Tokenizer:
        """From a transformers fast tokenizer (what the cache stores is derived here)."""
        from copy import copy

        backend = copy(hf.backend_tokenizer)
        # transformers turns these off per call unless asked; hearth never pads or truncates a prompt
        backend.no_padding()
        backend.no_truncation()
        return cls(backend, info_from_hf(hf), chat_template)

    @classmethod
    def from_folder(cls, folder: str, chat_template: str | None = None) -> Tokenizer:
        key = tokenizer_cache.folder_key(folder)
        hit = tokenizer_cache.load(key) if key else None
        if hit is not None:
            return cls(*hit, chat_template)
        tok = cls.from_hf(_load_hf(folder), chat_template)  # (the override is in tok.templates, not tok.info)
        if key:
            tokenizer_cache.store(key, tok.backend, tok.info)
        return tok

    # ---- what the engine and server use
    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    def __len__(self) -> int:
        return self.info.vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self.info.eos_token_id

    # The special tokens' text, as transformers names them (None when the tokenizer has none).
    bos_token = property(lambda self: self.info.special_tokens.get("bos_token"))
    eos_token = property(lambda self: self.info.special_tokens.get("eos_token"))
    unk_token = property(lambda self: self.info.special_tokens.get("unk_token"))
    pad_token = property(lambda self: self.info.special_tokens.get("pad_token"))

    @property
    def chat_template(self) -> str | None:
        """The template used when a request names none (of named templates: "default")."""
        t = self.templates
        return t.get("default") if isinstance(t, dict) else t

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        text = self.backend.decode(token_ids, skip_special_tokens=skip_special_tokens)
        return clean_up_tokenization(text) if self.info.cleanup else text

    def token_id(self, token: str) -> int | None:
        """The id of a token of the vocabulary (special tokens included), None if it has no such token."""
        return self.backend.token_to_id(token)

    def convert_ids_to_tokens(self, token_ids: list[int]) -> list[str]:
        return [self.backend.id_to_token(int(t)) for t in token_ids]

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, chat_template: str | None = None,
                            continue_final_message: bool = False, **kwargs: Any) -> str:
        """The prompt text, rendered as transformers' apply_chat_template(..., tokenize=False) renders it."""
        from transformers.utils.chat_template_utils import render_jinja_template  # (slow to import: on first use)

        rendered, _ = render_jinja_template(**self.chat_render_kwargs(
            messages, add_generation_prompt, tools, chat_template, continue_final_message, **kwargs))
        return rendered[0]

    def chat_render_kwargs(self, messages: list[dict], add_generation_prompt: bool = True,
                           tools: list[dict] | None = None, chat_template: str | None = None,
                           continue_final_message: bool = False, **kwargs: Any) -> dict[str, Any]:
        """The arguments of transformers' render_jinja_template for apply_chat_template (plain values, so a
        worker process can render them)."""
        template = self._pick_template(chat_template, tools)
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be set")
        # Keys whose value is None are dropped (transformers does the same): templates test for a missing key.
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        return {"conversations": [messages], "tools": tools, "chat_template": template,
                "continue_final_message": continue_final_message, "add_generation_prompt": add_generation_prompt,
                **{**self.info.special_tokens, **kwargs}}

    def is_own_template(self, name_or_text: str | None) -> bool:
        """True for None, a name of this tokenizer's templates, or the text of one (what --chat-template set)."""
        t = self.templates
        if name_or_text is None:
            return True
        if isinstance(t, dict):
            return name_or_text in t or name_or_text in t.values()
        return name_or_text == t

    def warm_up(self) -> None:
        """Import the renderer and compile the default template (what the first chat request would do)."""
        if self.chat_template:
            self.apply_chat_template([{"role": "user", "content": "hi"}])

    def _pick_template(self, name_or_text: str | None, tools: list[dict] | None) -> str:
        t = self.templates
        if isinstance(t, dict):
            if name_or_text in t:
                return t[name_or_text]
            if name_or_text is None:
                name_or_text = t.get("tool_use") if tools else None
                name_or_text = name_or_text or t.get("default")
        template = name_or_text or t
        if not template or isinstance(template, dict):
            raise ValueError("this model has no chat template: pass --chat-template (a file or a Jinja string), "
                             "or use the completions API")
        return template

    def should_add_bos_in_chat(self) -> bool:
        """Chat templates usually write the BOS text themselves; encoding must not add a second one."""
        return False


def clean_up_tokenization(text: str) -> str:
    """transformers' clean_up_tokenization: no space before punctuation and English contractions."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


def info_from_hf(hf: Any) -> TokenizerInfo:
    """The facts of a transformers tokenizer that hearth uses, as plain JSON values."""
    special = {k: v for k, v in getattr(hf, "special_tokens_map", {}).items() if isinstance(v, (str, list))}
    template = getattr(hf, "chat_template", None)
    probe = hf.encode(_CLEANUP_PROBE, add_special_tokens=False)
    cleanup = bool(getattr(hf, "clean_up_tokenization_spaces", False)) and (
        hf.decode(probe) != hf.backend_tokenizer.decode(probe))
    return TokenizerInfo(vocab_size=len(hf), eos_token_id=hf.eos_token_id,
                         special_ids=sorted(int(i) for i in hf.all_special_ids), special_tokens=special,
                         chat_template=template if isinstance(template, (str, dict)) else None, cleanup=cleanup)


def _load_hf(folder: str) -> Any:
    """The tokenizer transformers builds for a folder (what AutoTokenizer would give)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        # NOTE: AutoTokenizer, not the class tokenizer_config.json names: it can pick another (e.g. a byte-level
        # tokenizer.json under a LlamaTokenizer name loads as TokenizersBackend). Only a cache miss pays for it.
        hf = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # transformers raises many kinds here
        # AutoTokenizer also reads config.json (e.g. it rejects a UTF-8 BOM that hearth accepts): a plain
        # fast tokenizer needs only tokenizer.json.
        if os.path.exists(os.path.join(folder, "tokenizer.json")):
            return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
        raise LoadError(f"cannot load the tokenizer from {folder} ({type(e).__name__}: {str(e).splitlines()[0]}); "
                        "the folder needs tokenizer.json or tokenizer.model with tokenizer_config.json") from None
    if getattr(hf, "backend_tokenizer", None) is None:
        raise LoadError(f"the tokenizer in {folder} has no fast (tokenizers) form; hearth needs tokenizer.json "
                        "or a tokenizer transformers can convert")
    return hf


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
