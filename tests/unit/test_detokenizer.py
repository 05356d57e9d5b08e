"""Incremental detokenizer (never a partial character) and stop strings, alone and through the engine."""
import pytest

from hearth import LLM, SamplingParams
from hearth.detokenizer import IncrementalDetokenizer, find_stop, partial_stop_len
from hearth.engine.output_processor import OutputProcessor, run_step
from hearth.tokenizer import Tokenizer
from tests.tiny_models import build_checkpoint, tiny_config, tiny_tokenizer

TEXT = "Paris 😀 is 世界, naïve café 🇫🇷 done ✓"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_hf(tiny_tokenizer())


def test_tokenizer_splits_characters_into_bytes(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    # The premise of the tests below: some tokens hold only part of a character.
    assert any("\ufffd" in tok.decode([t]) for t in ids)
    assert tok.decode(ids) == TEXT


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_incremental_decode_never_yields_a_partial_character(tok: Tokenizer, chunk: int) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, tok.encode("The quick", add_special_tokens=False))
    deltas = [detok.add(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT == detok.text
    assert detok.token_ids == ids
    assert sum(1 for d in deltas if d) > 5  # really incremental


@pytest.mark.parametrize("prompt", ["The quick", "ok 😀😀a", ""])
def test_decode_stream_and_window_give_the_same_deltas(tok: Tokenizer, prompt: str) -> None:
    """tokenizers' DecodeStream (the fast path) and the two-decode window: the same delta for every token."""
    p = tok.encode(prompt, add_special_tokens=False)
    ids = tok.encode(TEXT + " fin", add_special_tokens=False) + [1, 370, 10_000]  # a special and an unknown id
    fast, slow = IncrementalDetokenizer(tok, p), IncrementalDetokenizer(tok, p)
    slow._stream = None
    assert fast._stream is not None
    assert [fast.add([t]) for t in ids] == [slow.add([t]) for t in ids]
    assert fast.flush() == slow.flush() and fast.text == slow.text


def test_prompt_window_starting_inside_a_character(tok: Tokenizer) -> None:
    prompt = tok.encode("ok 😀😀a", add_special_tokens=False)  # its last 4 tokens start inside an emoji
    assert "\ufffd" in tok.decode(prompt[-4:])
    ids = tok.encode(" 世界 fox", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt)
    deltas = [detok.add([t]) for t in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == " 世界 fox"


def test_incomplete_character_is_held_until_flush(tok: Tokenizer) -> None:
    ids = tok.encode("a😀", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    deltas = [detok.add([t]) for t in ids[:-1]]  # stop one byte short of the emoji
    assert "".join(deltas) == "a"
    tail = detok.flush()
    assert tail and set(tail) == {"\ufffd"}
    assert detok.flush() == ""


def test_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("fox", add_special_tokens=False) + [1] + tok.encode(" dog", add_special_tokens=False)
    skip = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    assert "".join(skip.add([t]) for t in ids) + skip.flush() == "fox dog"
    keep = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    assert "".join(keep.add([t]) for t in ids) + keep.flush() == "fox</s> dog"


def test_sentencepiece_style_leading_space_comes_from_prompt_context() -> None:
    """Metaspace decoders drop the first token's leading space: the prompt tail gives the first delta its space."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, "\u2581Hello": 2, "\u2581world": 3, "\u2581again": 4, "!": 5}
    raw = RawTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Metaspace()
    tok = Tokenizer.from_hf(PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="</s>"))
    assert tok.decode([3]) == "world"  # alone, the space is gone
    detok = IncrementalDetokenizer(tok, [2])
    assert [detok.add([t]) for t in (3, 4, 5)] == [" world", " again", "!"]
    assert detok.text == " world again!"


def test_find_stop() -> None:
    # The earliest stop string that ends within the last new_len characters.
    assert find_stop("hello world", 5, ["wor", "o"]) == (6, "wor")
    assert find_stop("hello world", 5, ["o", "ld"]) == (7, "o")
    assert find_stop("hello world", 3, ["o"]) is None  # its last 'o' ends 4 characters from the end
    assert find_stop("hello world", 4, ["o"]) == (7, "o")
    assert find_stop("stop here", 4, ["stop"]) is None  # entirely in old text: already checked
    assert find_stop("a stop", 1, ["stop"]) == (2, "stop")  # completed by the newest character
    assert find_stop("a stop", 100, ["stop", "a"]) == (0, "a")
    assert find_stop("", 0, ["x"]) is None
    assert find_stop("abc", 3, []) is None


def test_partial_stop_len() -> None:
    assert partial_stop_len("hello wo", ["world"]) == 2
    assert partial_stop_len("hello w", ["world", "xyz"]) == 1
    assert partial_stop_len("hello", ["world"]) == 0
    assert partial_stop_len("hello wor", ["world", "r"]) == 3
    assert partial_stop_len("hello r", ["world", "r"]) == 0  # a complete stop string is not held back
    assert partial_stop_len("ab", ["abc"]) == 2
    assert partial_stop_len("aab", ["aabx", "bx"]) == 3
    assert partial_stop_len("", ["abc"]) == 0


# ---- through the engine ----

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    # NOTE: one checkpoint per session, shared by the unit-test modules that need one (tokenizer.json is written last).
    folder = tmp_path_factory.getbasetemp() / "unit_tiny_llama"
    if not (folder / "tokenizer.json").exists():
        build_checkpoint(str(folder), tiny_config("llama"))
    return str(folder)


@pytest.fixture(scope="module")
def llm(tiny_llama: str) -> LLM:
    return LLM(tiny_llama, dtype="float32", max_model_len=64)


PROMPTS = [[5, 17, 42, 99, 7], [300, 12], list(range(60, 75))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def refs(llm: LLM):
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)]


def stop_candidates(text: str) -> list[str]:
    """Substrings of text, first seen past its start, made of whole printable characters."""
    found = []
    for length in (3, 2):
        for i in range(2, len(text) - length):
            s = text[i:i + length]
            if "\ufffd" not in s and s.isprintable() and text.find(s) == i:
                found.append(s)
                break
    return found


def test_stop_strings_through_the_engine(llm: LLM, refs) -> None:
    cases = [(prompt, ref, stop, include) for prompt, ref in zip(PROMPTS, refs)
             for stop in stop_candidates(ref.text) for include in (False, True)]
    assert len(cases) >= 8
    outs = llm.generate([{"prompt_token_ids": prompt} for prompt, _, _, _ in cases],
                        [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=[stop, "\x00"],
                                        include_stop_str_in_output=include) for _, _, stop, include in cases])
    for (_prompt, ref, stop, include), o in zip(cases, outs):
        out = o.outputs[0]
        at = ref.text.find(stop)
        assert (out.finish_reason, out.stop_reason) == ("stop", stop)
        assert out.token_ids == ref.token_ids[: len(out.token_ids)]
        if include:
            assert out.text == ref.text[: at + len(stop)]
        else:
            assert out.text == ref.text[:at]
            assert stop not in out.text
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_stop_string_never_streams_partially(llm: LLM, refs) -> None:
    """Step by step: no delta shows a stop string (or a piece of it that later completes)."""
    prompt, ref = PROMPTS[0], refs[0]
    stop = stop_candidates(ref.text)[0]
    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=stop)
    eng.add_request("s", prompt, params)
    processor = OutputProcessor(eng.tokenizer)
    processor.add_request("s", prompt, params)
    streamed = ""
    while eng.has_unfinished_requests():
        for step in run_step(eng, processor):
            streamed += step.new_text
            assert stop not in streamed
            assert streamed == ref.text[: len(streamed)]
    assert streamed == ref.text[: ref.text.find(stop)]


def test_stop_string_in_the_last_allowed_token(llm: LLM, refs) -> None:
    """max_tokens reached on the very token that completes a stop string: the stop wins (the text is cut)."""
    prompt, ref = PROMPTS[0], refs[0]
    stop = stop_candidates(ref.text)[0]
    at = ref.text.find(stop)
    # the first token count whose text holds the whole stop string
    n = next(k for k in range(1, 17) if stop in llm.engine.tokenizer.decode(ref.token_ids[:k]))
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=n,
                                                                      ignore_eos=True, stop=stop))[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == ref.text[:at]
