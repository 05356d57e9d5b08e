"""A GGUF's tokenizer: transformers' converter on the file's metadata, cached (hearth.tokenizer.cache)."""
from __future__ import annotations

import os
from typing import Any

from hearth import envs
from hearth.tokenizer import cache as tokenizer_cache
from hearth.loader.gguf.reader import GGUFError
from hearth.tokenizer import Tokenizer


def build_tokenizer(path: str, meta: dict[str, Any]) -> Tokenizer:
    """The fast tokenizer the GGUF's metadata describes, from the tokenizer cache when it was built before."""
    key = tokenizer_cache.cache_key(meta) if envs.tokenizer_cache_dir() else None
    hit = tokenizer_cache.load(key) if key else None
    if hit is not None:
        return Tokenizer(*hit)
    from transformers import PreTrainedTokenizerFast

    try:
        from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    except ImportError:  # transformers < 5: the one public entry point
        from transformers import AutoTokenizer

        return Tokenizer.from_hf(AutoTokenizer.from_pretrained(os.path.dirname(path) or ".",
                                                               gguf_file=os.path.basename(path)))
    try:
        arch, tok_dict, tok_cfg = get_gguf_tokenizer(path)
        backend, extra = convert_gguf_tokenizer(arch, tok_dict)
    except (ValueError, KeyError) as e:
        raise GGUFError(f"{path}: cannot build a tokenizer from the embedded vocab ({e}); "
                        "pass --tokenizer with an HF tokenizer folder") from e
    backend = _drop_tokens_past(backend, len(tok_dict["tokens"]))
    # (tok_cfg carries the GGUF's tokenizer.chat_template: the fast tokenizer, and so tok.info, takes it)
    tok = Tokenizer.from_hf(PreTrainedTokenizerFast(tokenizer_object=backend, **{**tok_cfg, **extra}))
    if key:
        tokenizer_cache.store(key, tok.backend, tok.info)
    return tok


def _drop_tokens_past(backend: Any, n: int) -> Any:
    """transformers' byte-level builder (GPT2Tokenizer) adds its default "<|endoftext|>" when the vocab lacks it
    (e.g. Llama 3): an id past the model's embedding. Keep only the GGUF's own n tokens."""
    if backend.get_vocab_size(with_added_tokens=True) <= n:
        return backend
    import json

    from tokenizers import Tokenizer

    state = json.loads(backend.to_str())
    state["added_tokens"] = [t for t in state["added_tokens"] if t["id"] < n]
    return Tokenizer.from_str(json.dumps(state))
