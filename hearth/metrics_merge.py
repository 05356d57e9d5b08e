"""Merge several Prometheus text expositions (one per worker engine) into one.

Each worker renders its own registry, whose series carry model_name and engine labels, so samples never collide;
only the `# HELP` / `# TYPE` header of a family may appear once, so the samples of each family are grouped under
its first header. Series are not redefined here: whatever metrics.py defines passes through.
"""
from __future__ import annotations


def merge_expositions(texts: list[bytes]) -> bytes:
    families: dict[str, tuple[list[str], list[str]]] = {}
    for text in texts:
        current: str | None = None
        for line in text.decode().splitlines():
            if not line:
                continue
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                head, _ = families.setdefault(name, ([], []))
                current = name
                if line not in head:  # a family seen in an earlier text keeps its one header
                    head.append(line)
            elif line.startswith("#"):
                continue
            else:
                if current is None:  # a sample without a header (not what prometheus-client writes)
                    current = line.split("{", 1)[0].split(" ", 1)[0]
                families.setdefault(current, ([], []))[1].append(line)
    out: list[str] = []
    for head, samples in families.values():
        out.extend(head)
        out.extend(samples)
    return ("\n".join(out) + "\n").encode() if out else b""
