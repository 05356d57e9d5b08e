"""The tokenizer and chat template (tokenizer.py), the facts kept beside it (info.py) and their on-disk cache
(cache.py). A GGUF's tokenizer is built from its metadata by hearth.loader.gguf.tokenizer."""
from hearth.tokenizer.info import TokenizerInfo
from hearth.tokenizer.tokenizer import Tokenizer, clean_up_tokenization, info_from_hf, resolve_chat_template

__all__ = ["Tokenizer", "TokenizerInfo", "clean_up_tokenization", "info_from_hf", "resolve_chat_template"]
