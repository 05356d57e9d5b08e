"""hearth's log level from --debug / --log-level / HEARTH_LOGGING_LEVEL (VLLM_LOGGING_LEVEL), set on the "hearth"
logger so the doors' basicConfig(INFO) stays as it is for other libraries."""
from __future__ import annotations

import logging

from hearth import envs

logger = logging.getLogger("hearth")


def apply(debug: bool, level: str | None) -> str | None:
    """Set hearth's logger to the level asked for (--debug wins, then --log-level, then the environment);
    returns the level set, or None when nothing asked for one."""
    chosen = "debug" if debug else level or envs.logging_level()
    if chosen is None:
        return None
    logger.setLevel(chosen.upper())
    root = logging.getLogger()
    if not root.handlers and not logger.handlers:  # (the Python API configures no logging: give the lines a place)
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    return chosen
