"""Reading the server's TOML files (--models-config, --api-key-file) the same way: every mistake is one error
that names the flag, the file, the entry and the field."""
from __future__ import annotations

import tomllib
from typing import Any


def read_toml(flag: str, path: str) -> dict[str, Any]:
    """The parsed file. Raises FileNotFoundError (no file) or ValueError (not TOML), naming `flag`."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag} {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{flag} {path}: not valid TOML: {e}") from None


def tables(data: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    """The [[key]] array of tables ([] when absent)."""
    entries = data.get(key, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{where}: {key} must be [[{key}]] tables")
    return entries


def check_fields(entry: dict[str, Any], allowed: set[str] | frozenset[str], where: str,
                 kind: str = "field(s)") -> None:
    extra = set(entry) - set(allowed)
    if extra:
        raise ValueError(f"{where}: unknown {kind} {sorted(extra)}; expected {sorted(allowed)}")


def str_list(entry: dict[str, Any], name: str, where: str) -> list[str] | None:
    """A list of strings (None when absent)."""
    value = entry.get(name)
    if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
        raise ValueError(f"{where}: {name} must be a list of strings")
    return value
