"""Load-time checks that name a problem before anything slow (or before the first request) finds it."""
from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable

logger = logging.getLogger("hearth")

# Above this a context needs rope scaling to be believable: no open model trains longer without one.
MAX_PLAUSIBLE_CONTEXT = 131072


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'X'?)' for a close known name, else ''. A hint in the message only: nothing is guessed."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def plausible_context(hf_cfg: dict, limit: int) -> int:
    """The model's max_position_embeddings, capped with a warning where it cannot be its real context: over
    MAX_PLAUSIBLE_CONTEXT without rope scaling (the KV cache is sized for this length, so a bogus 1M context costs
    gigabytes). A config with rope scaling (llama3, yarn, longrope, ...) is trusted."""
    scaling = hf_cfg.get("rope_scaling") or hf_cfg.get("rope_parameters") or {}
    scaled = isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) not in (None, "default")
    if limit <= MAX_PLAUSIBLE_CONTEXT or scaled:
        return limit
    logger.warning("config.json says max_position_embeddings=%d without rope scaling, more than any such model "
                   "trains on; capping the context at %d tokens: pass --max-model-len N to choose another",
                   limit, MAX_PLAUSIBLE_CONTEXT)
    return MAX_PLAUSIBLE_CONTEXT


def chat_template_present(tokenizer, where: str) -> None:
    if not tokenizer.templates:
        logger.warning("%s has no chat template: chat requests (/v1/chat/completions, LLM.chat, hearth chat) will "
                       "answer 400; pass --chat-template (a file or a Jinja string) to chat with it", where)
