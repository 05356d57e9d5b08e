"""On-disk cache of tokenizers built from GGUF metadata: transformers' converter takes 20-40 s for Gemma 3 (it
regenerates 262k merges from the scores); loading the saved tokenizer.json takes a few.

An entry is <tokenizer cache dir>/<key>/{tokenizer.json, hearth.json}. The key hashes everything the build reads:
the GGUF's tokenizer.* metadata and general.architecture, plus the transformers and tokenizers versions (their
converter is the builder) and this module's FORMAT. So the same vocabulary in another quantization shares an
entry, and an upgrade rebuilds. hearth.json holds the tokenizer's kwargs, the chat template and tokenizer.json's
sha256: a damaged entry is detected, dropped and rebuilt. Entries are written to a temporary directory and renamed
into place, so a reader never sees half of one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from hearth import envs

logger = logging.getLogger("hearth")

FORMAT = 1
_TOKENIZER, _INFO = "tokenizer.json", "hearth.json"


def cache_key(meta: dict[str, Any]) -> str:
    """Hash of the metadata a GGUF tokenizer is built from (cheap: ~0.1 s for Gemma 3's 262k tokens)."""
    import tokenizers
    import transformers

    h = hashlib.sha256(f"hearth-tokenizer {FORMAT} transformers {transformers.__version__} "
                       f"tokenizers {tokenizers.__version__}".encode())
    for key in sorted(k for k in meta if k.startswith("tokenizer.") or k == "general.architecture"):
        value = meta[key]
        h.update(b"\0" + key.encode() + b"\0")
        if isinstance(value, list) and value and isinstance(value[0], (int, float)) and not isinstance(value[0], bool):
            arr = np.asarray(value)
            h.update(str(arr.dtype).encode() + arr.tobytes())  # scores, token types: no slow repr of floats
        else:
            h.update(json.dumps(value).encode())
    return h.hexdigest()[:32]


def entry_dir(key: str) -> Path | None:
    root = envs.tokenizer_cache_dir()
    return Path(root) / key if root else None


def load(key: str):
    """(PreTrainedTokenizerFast, chat template) from the cache, or None (a miss, or a damaged entry: removed)."""
    entry = entry_dir(key)
    if entry is None or not (entry / _INFO).exists():
        return None
    from transformers import PreTrainedTokenizerFast

    try:
        info = json.loads((entry / _INFO).read_text())
        data = (entry / _TOKENIZER).read_bytes()
        if info.get("format") != FORMAT or hashlib.sha256(data).hexdigest() != info.get("sha256"):
            raise ValueError("checksum or format mismatch")
        # NOTE: tokenizer_file, not tokenizer_object: the latter deep-copies the backend (~2x the load time).
        tok = PreTrainedTokenizerFast(tokenizer_file=str(entry / _TOKENIZER), **info["kwargs"])
    except Exception as e:  # any damage: rebuild rather than fail a start
        logger.warning("tokenizer cache entry %s is unusable (%s: %s); rebuilding it", entry, type(e).__name__,
                       str(e)[:200])
        shutil.rmtree(entry, ignore_errors=True)
        return None
    logger.debug("tokenizer loaded from cache %s", entry)
    return tok, info.get("chat_template")


def store(key: str, backend: Any, kwargs: dict[str, Any], chat_template: str | None) -> Path | None:
    """Save a built backend tokenizer (tokenizers.Tokenizer) with its kwargs; returns the entry's tokenizer.json,
    or None when caching is off or impossible (unwritable directory, kwargs that are not JSON)."""
    entry = entry_dir(key)
    if entry is None:
        return None
    try:
        info = {"format": FORMAT, "kwargs": kwargs, "chat_template": chat_template}
        json.dumps(info)  # before writing anything
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=entry.parent))
        try:
            tmp.chmod(0o755)  # mkdtemp's 0700 would stay on the renamed entry
            backend.save(str(tmp / _TOKENIZER), pretty=False)
            info["sha256"] = hashlib.sha256((tmp / _TOKENIZER).read_bytes()).hexdigest()
            (tmp / _INFO).write_text(json.dumps(info))
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
