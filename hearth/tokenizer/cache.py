"""On-disk cache of the tokenizers transformers builds, so later starts load them with `tokenizers` alone.

Building costs a start-up seconds: importing transformers and resolving a folder's tokenizer class, and for a
GGUF the converter (it regenerates every merge from the scores: long for a big vocabulary such as Gemma 3's).
Loading the saved tokenizer.json is a small fraction of that.

An entry is <tokenizer cache dir>/<key>/{tokenizer.json, hearth.json}: the backend exactly as transformers built
it, and hearth.tokenizer.TokenizerInfo (special tokens, chat template, ...) with tokenizer.json's sha256, so a
damaged entry is detected, dropped and rebuilt. The key hashes everything the build reads, plus the transformers
and tokenizers versions (they are the builder) and this module's FORMAT, so an edit or an upgrade rebuilds:
- a GGUF: its tokenizer.* metadata and general.architecture (the same vocabulary in another quantization shares
  an entry);
- a folder: the bytes of the tokenizer files AutoTokenizer reads (and config.json, which can pick the class).
Entries are written to a temporary directory and renamed into place, so a reader never sees half of one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from hearth import envs
from hearth.tokenizer.info import TokenizerInfo

logger = logging.getLogger("hearth")

FORMAT = 2
_TOKENIZER, _INFO = "tokenizer.json", "hearth.json"
# What transformers' tokenizer loading reads from a folder (a missing file is hashed as missing).
_FOLDER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                 "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja",
                 "chat_template.json", "config.json")


def _versions() -> bytes:
    """Without importing transformers (that import is what the cache saves)."""
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "none"
    return f"hearth-tokenizer {FORMAT} transformers {version('transformers')} " \
           f"tokenizers {version('tokenizers')}".encode()


def cache_key(meta: dict[str, Any]) -> str:
    """Key of a GGUF's tokenizer: its tokenizer metadata (cheap, even for a big vocabulary)."""
    h = hashlib.sha256(b"gguf " + _versions())
    for key in sorted(k for k in meta if k.startswith("tokenizer.") or k == "general.architecture"):
        value = meta[key]
        h.update(b"\0" + key.encode() + b"\0")
        if isinstance(value, list) and value and isinstance(value[0], (int, float)) and not isinstance(value[0], bool):
            arr = np.asarray(value)
            h.update(str(arr.dtype).encode() + arr.tobytes())  # scores, token types: no slow repr of floats
        else:
            h.update(json.dumps(value).encode())
    return h.hexdigest()[:32]


def folder_key(folder: str) -> str | None:
    """Key of a folder's tokenizer (its files' bytes), or None when caching is off or a file is unreadable."""
    if envs.tokenizer_cache_dir() is None:
        return None
    h = hashlib.sha256(b"folder " + _versions())
    try:
        for name in _FOLDER_FILES:
            path = os.path.join(folder, name)
            h.update(b"\0" + name.encode() + b"\0")
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
            else:
                h.update(b"-")
        extra = os.path.join(folder, "additional_chat_templates")
        if os.path.isdir(extra):
            for name in sorted(os.listdir(extra)):
                with open(os.path.join(extra, name), "rb") as f:
                    h.update(name.encode() + hashlib.sha256(f.read()).digest())
    except OSError:
        return None
    return h.hexdigest()[:32]


def entry_dir(key: str) -> Path | None:
    root = envs.tokenizer_cache_dir()
    return Path(root) / key if root else None


def load(key: str) -> tuple[Any, TokenizerInfo] | None:
    """(tokenizers.Tokenizer, TokenizerInfo) from the cache, or None (a miss, or a damaged entry: removed)."""
    entry = entry_dir(key)
    if entry is None or not (entry / _INFO).exists():
        return None
    from tokenizers import Tokenizer as Backend

    try:
        info = json.loads((entry / _INFO).read_text())
        data = (entry / _TOKENIZER).read_bytes()
        if info.get("format") != FORMAT or hashlib.sha256(data).hexdigest() != info.get("sha256"):
            raise ValueError("checksum or format mismatch")
        backend = Backend.from_str(data.decode())
        tok_info = TokenizerInfo.from_json(info["info"])
    except Exception as e:  # any damage: rebuild rather than fail a start
        logger.warning("tokenizer cache entry %s is unusable (%s: %s); rebuilding it", entry, type(e).__name__,
                       str(e)[:200])
        shutil.rmtree(entry, ignore_errors=True)
        return None
    logger.debug("tokenizer loaded from cache %s", entry)
    return backend, tok_info


def store(key: str, backend: Any, info: TokenizerInfo) -> Path | None:
    """Save a built backend tokenizer (tokenizers.Tokenizer) with its info; returns the entry's tokenizer.json,
    or None when caching is off or impossible (unwritable directory)."""
    entry = entry_dir(key)
    if entry is None:
        return None
    try:
        data = {"format": FORMAT, "info": info.to_json()}
        json.dumps(data)  # before writing anything
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=entry.parent))
        try:
            tmp.chmod(0o755)  # mkdtemp's 0700 would stay on the renamed entry
            backend.save(str(tmp / _TOKENIZER), pretty=False)
            data["sha256"] = hashlib.sha256((tmp / _TOKENIZER).read_bytes()).hexdigest()
            (tmp / _INFO).write_text(json.dumps(data))
            os.replace(tmp, entry)  # NOTE: fails if another process got there first; its entry is as good
        except OSError:
            if not (entry / _INFO).exists():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except (OSError, TypeError, ValueError) as e:
        logger.warning("cannot cache the tokenizer in %s (%s: %s)", entry, type(e).__name__, str(e)[:200])
        return None
    return entry / _TOKENIZER
