"""Load a llama.cpp GGUF checkpoint: HF-style config, HF-named tensors, a fast tokenizer.

    reader.py      the file: header, split parts, tensor bytes
    arch.py        the architecture table (GGUF names and metadata -> HF names and config)
    tokenizer.py   the tokenizer from the file's metadata
    checkpoint.py  GGUFCheckpoint and load_gguf, which put them together
    widened.py     the block types a load dequantizes and their memory cost (load log, `hearth doctor`)
"""
from hearth.loader.gguf.checkpoint import GGUFCheckpoint, load_gguf
from hearth.loader.gguf.reader import GGUFError

__all__ = ["GGUFCheckpoint", "GGUFError", "load_gguf"]
