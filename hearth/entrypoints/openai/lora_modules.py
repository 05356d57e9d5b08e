"""--lora-modules: the LoRA adapters `hearth serve` starts with, in vLLM's two forms. No torch or server imports
here: the serve plan parses the flag before anything loads."""
from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRAModule:
    """One --lora-modules entry."""
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_modules(values: list[str] | None) -> list[LoRAModule]:
    """--lora-modules entries: name=path, or vLLM's JSON {"name": ..., "path": ..., "base_model_name": ...}.
    Raises ValueError (one line naming the flag)."""
    modules: list[LoRAModule] = []
    for value in values or []:
        if value.lstrip().startswith("{"):
            try:
                obj = json.loads(value)
                module = LoRAModule(obj["name"], obj["path"], obj.get("base_model_name"))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"--lora-modules: {value!r} is not JSON with a name and a path ({e})") from None
        else:
            name, sep, path = value.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules: {value!r} is not name=path or JSON")
            module = LoRAModule(name, path)
        if not isinstance(module.name, str) or not isinstance(module.path, str) or not module.name:
            raise ValueError(f"--lora-modules: {value!r}: name and path must be strings")
        if any(m.name == module.name for m in modules):
            raise ValueError(f"--lora-modules: the name {module.name!r} is given twice")
        modules.append(module)
    return modules
