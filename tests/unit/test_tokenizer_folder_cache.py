"""A folder's tokenizer, built once by transformers and then loaded from the cache with `tokenizers` alone,
behaves exactly like transformers' AutoTokenizer: ids, text, special tokens, chat templates. Covered: a plain
tokenizer.json, classes that transformers 5 rebuilds from vocab/merges with their own pipeline, and a WordPiece
tokenizer whose decode cleans up spaces."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hearth.tokenizer import tokenizer as tokenizer_mod
from hearth.tokenizer import Tokenizer
from tests.tiny_models import tiny_tokenizer

TEXTS = ["The quick brown fox.", "  two  spaces\n\nand\ttabs ", "héllo wörld — 日本語 🤖", "a , b . c ! don't",
         "<s>the</s> fox<unk>", "1234567 3.14", ""]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, fox?"},
            {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And the dog?", "name": None}]


def _bpe_folder(root: Path, tokenizer_class: str | None) -> Path:
    folder = root / (tokenizer_class or "plain")
    tiny_tokenizer().save_pretrained(folder)
    if tokenizer_class:
        cfg_path = folder / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["tokenizer_class"] = tokenizer_class
        cfg_path.write_text(json.dumps(cfg))
    return folder


def _wordpiece_folder(root: Path) -> Path:
    folder = root / "bert"
    folder.mkdir()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", ",", ".", "!", "the", "fox", "don",
             "'", "t", "##s", "quick"]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "clean_up_tokenization_spaces": True, "do_lower_case": True}))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tok_folders")
    out = {name: _bpe_folder(root, cls) for name, cls in
           [("plain", None), ("gpt2", "GPT2Tokenizer"), ("qwen2", "Qwen2Tokenizer"), ("llama", "LlamaTokenizer")]}
    out["bert"] = _wordpiece_folder(root)
    return out


def _same_as_transformers(tok: Tokenizer, ref) -> None:
    for text in TEXTS:
        for special in (True, False):
            ids = tok.encode(text, add_special_tokens=special)
            assert ids == ref.encode(text, add_special_tokens=special), (text, special)
            for skip in (True, False):
                assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text
            assert tok.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)
    assert len(tok) == tok.vocab_size == len(ref)
    assert tok.eos_token_id == ref.eos_token_id
    assert tok.all_special_ids == set(ref.all_special_ids)
    assert (tok.bos_token, tok.eos_token, tok.unk_token, tok.pad_token) == (
        ref.bos_token, ref.eos_token, ref.unk_token, ref.pad_token)
    if ref.chat_template:
        assert tok.chat_template == ref.chat_template
        for gen in (True, False):
            assert tok.apply_chat_template(MESSAGES, add_generation_prompt=gen) == ref.apply_chat_template(
                MESSAGES, tokenize=False, add_generation_prompt=gen)
        assert tok.apply_chat_template(MESSAGES[:3], add_generation_prompt=False, continue_final_message=True) \
            == ref.apply_chat_template(MESSAGES[:3], tokenize=False, continue_final_message=True)


@pytest.mark.parametrize("name", ["plain", "gpt2", "qwen2", "llama", "bert"])
def test_cached_folder_tokenizer_equals_transformers(name: str, folders: dict[str, Path], tokenizer_cache_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    folder = folders[name]
    ref = AutoTokenizer.from_pretrained(str(folder))
    cold = Tokenizer.from_folder(str(folder))  # a miss: transformers builds it, the cache stores it
    _same_as_transformers(cold, ref)
    assert len([p for p in tokenizer_cache_dir.iterdir() if not p.name.startswith(".")]) == 1

    def no_transformers(folder: str):
        raise AssertionError("a cache hit must not build the tokenizer with transformers")

    monkeypatch.setattr(tokenizer_mod, "_load_hf", no_transformers)
    _same_as_transformers(Tokenizer.from_folder(str(folder)), ref)


def test_edited_tokenizer_files_miss_the_cache(folders: dict[str, Path], tokenizer_cache_dir: Path,
                                               tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "edit"
    shutil.copytree(folders["plain"], folder)
    first = Tokenizer.from_folder(str(folder))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["eos_token"] = "<s>"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    second = Tokenizer.from_folder(str(folder))
    assert first.eos_token == "</s>" and second.eos_token == "<s>" and second.eos_token_id != first.eos_token_id
    assert len([p for p in tokenizer_cache_dir.iterdir() if not p.name.startswith(".")]) == 2


def test_chat_template_override_and_named_templates(folders: dict[str, Path], tokenizer_cache_dir: Path) -> None:
    folder = str(folders["plain"])
    tok = Tokenizer.from_folder(folder, chat_template="{{ messages[0]['content'] }}!")
    assert tok.apply_chat_template(MESSAGES[1:2]) == "Hi, fox?!"
    assert Tokenizer.from_folder(folder).chat_template != tok.chat_template  # the override is not cached
    tok.templates = {"default": "D{{ messages|length }}", "tool_use": "T{{ tools|length if tools else 0 }}"}
    assert tok.apply_chat_template(MESSAGES) == "D4"
    assert tok.apply_chat_template(MESSAGES, tools=[{"type": "function", "function": {"name": "f"}}]) == "T1"
    assert tok.apply_chat_template(MESSAGES, chat_template="tool_use") == "T0"
    tok.templates = None
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template(MESSAGES)


def test_warm_start_does_not_import_transformers(folders: dict[str, Path], tokenizer_cache_dir: Path) -> None:
    """The point of the cache: importing transformers costs ~2 s of a start-up."""
    folder = str(folders["qwen2"])
    Tokenizer.from_folder(folder)  # fill the cache
    code = ("import sys; from hearth.tokenizer import Tokenizer; t = Tokenizer.from_folder(sys.argv[1]); "
            "assert t.encode('the fox'); assert 'transformers' not in sys.modules, 'transformers was imported'")
    env = {**__import__("os").environ, "HEARTH_TOKENIZER_CACHE": str(tokenizer_cache_dir)}
    subprocess.run([sys.executable, "-c", code, folder], check=True, env=env, timeout=120)
