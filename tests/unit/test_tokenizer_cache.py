"""The GGUF tokenizer cache: a second load hits it with identical encodings, damaged entries are rebuilt, the
key follows the tokenizer metadata, and HEARTH_TOKENIZER_CACHE=0 turns it off."""
from __future__ import annotations

from pathlib import Path

import pytest

from hearth.tokenizer import cache as tokenizer_cache
from hearth.loader.gguf import reader
from hearth.loader.gguf import load_gguf
from tests.gguf_writer import write_gguf
from tests.tiny_models import build_checkpoint, tiny_config

TEXTS = ["The quick brown fox jumps over the lazy dog.", "héllo wörld <|im_start|> 123 ✓", ""]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tokcache_ckpt")
    build_checkpoint(str(folder), tiny_config("llama"))
    path = folder / "m.gguf"
    write_gguf(folder, path)
    return path


def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of transformers' GGUF converter (a cache hit makes none)."""
    import transformers.integrations.gguf as tg

    calls: list[int] = []
    real = tg.convert_gguf_tokenizer

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(tg, "convert_gguf_tokenizer", counting)
    return calls


def encodings(tok) -> list:
    return [tok.encode(t) for t in TEXTS] + [tok.decode(tok.encode(TEXTS[1]))] + [
        (tok.bos_token, tok.eos_token, len(tok), tok.all_special_ids)]


def entries(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if not p.name.startswith(".")] if root.exists() else []


def test_second_load_hits_the_cache(gguf_file: Path, tokenizer_cache_dir: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    builds = count_builds(monkeypatch)
    first = load_gguf(str(gguf_file))
    assert len(builds) == 1
    (entry,) = entries(tokenizer_cache_dir)
    assert {p.name for p in entry.iterdir()} == {"tokenizer.json", "hearth.json"}
    second = load_gguf(str(gguf_file))
    assert len(builds) == 1  # no rebuild
    assert encodings(second.tokenizer) == encodings(first.tokenizer)
    assert second.tokenizer.chat_template == first.tokenizer.chat_template
    # And both equal a build without any cache.
    monkeypatch.setenv("HEARTH_TOKENIZER_CACHE", "0")
    uncached = load_gguf(str(gguf_file))
    assert len(builds) == 2 and encodings(uncached.tokenizer) == encodings(first.tokenizer)
    assert entries(tokenizer_cache_dir) == [entry]


@pytest.mark.parametrize("damage", ["truncate", "flip", "bad_info", "no_tokenizer"])
def test_damaged_entry_is_rebuilt(gguf_file: Path, tokenizer_cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                  damage: str) -> None:
    ref = encodings(load_gguf(str(gguf_file)).tokenizer)
    (entry,) = entries(tokenizer_cache_dir)
    tok_json = entry / "tokenizer.json"
    data = tok_json.read_bytes()
    if damage == "truncate":
        tok_json.write_bytes(data[: len(data) // 2])
    elif damage == "flip":  # still valid JSON, another token: only the checksum catches it
        tok_json.write_bytes(data.replace(b'"he"', b'"hf"', 1))
        assert tok_json.read_bytes() != data
    elif damage == "bad_info":
        (entry / "hearth.json").write_text("{not json")
    else:
        tok_json.unlink()
    builds = count_builds(monkeypatch)
    again = load_gguf(str(gguf_file))
    assert len(builds) == 1 and encodings(again.tokenizer) == ref
    assert (entry / "hearth.json").exists()  # rewritten
    assert encodings(load_gguf(str(gguf_file)).tokenizer) == ref and len(builds) == 1  # and hit from now on


def test_key_follows_tokenizer_metadata_only(gguf_file: Path) -> None:
    meta = reader.read_parts(str(gguf_file))[0].metadata
    key = tokenizer_cache.cache_key(meta)
    assert key == tokenizer_cache.cache_key(dict(meta))
    other_weights = {**meta, "llama.block_count": 99, "general.name": "x"}
    assert tokenizer_cache.cache_key(other_weights) == key  # a requantized file shares the entry
    tokens = list(meta["tokenizer.ggml.tokens"])
    tokens[10] += "x"
    assert tokenizer_cache.cache_key({**meta, "tokenizer.ggml.tokens": tokens}) != key
    assert tokenizer_cache.cache_key({**meta, "tokenizer.ggml.bos_token_id": 3}) != key
    assert tokenizer_cache.cache_key({**meta, "general.architecture": "qwen2"}) != key


def test_unwritable_cache_still_loads(gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("HEARTH_TOKENIZER_CACHE", str(blocker / "sub"))  # a directory under a file: mkdir fails
    ck = load_gguf(str(gguf_file))
    assert ck.tokenizer.encode(TEXTS[0])


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from hearth import envs

    monkeypatch.delenv("HEARTH_TOKENIZER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert envs.tokenizer_cache_dir() == str(tmp_path / "hearth" / "tokenizers")
    monkeypatch.setenv("HEARTH_TOKENIZER_CACHE", "off")
    assert envs.tokenizer_cache_dir() is None
