"""GGUFs written from the tiny checkpoints (tests/gguf_writer.py, llama.cpp's conventions) vs transformers on the
original HF folder: hearth loading the .gguf gives the same greedy tokens (and close top-5 logprobs), and the
tokenizer rebuilt from the GGUF metadata encodes like the folder's tokenizer."""
from pathlib import Path

import gguf
import pytest
import torch
from safetensors.torch import load_file

from tests.gguf_writer import write_gguf
from tests.models.parity import PARITY_PROMPTS, assert_greedy_parity
from tests.tiny_models import build_checkpoint, hf_greedy, hf_greedy_loop, tiny_config

Q = gguf.GGMLQuantizationType
STEPS = 32
# Gemma 2/3: GGUF has no query_pre_attn_scalar key (llama.cpp uses head_dim), so the tiny configs use head_dim.
CASES = {
    "llama": dict(family="llama"),
    "llama-tied-bias": dict(family="llama", tie_word_embeddings=True, attention_bias=True),  # q/k biases permuted
    "llama-linear-rope": dict(family="llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "qwen2": dict(family="qwen2", use_sliding_window=False),
    "qwen3": dict(family="qwen3"),
    "phi3": dict(family="phi3"),
    "phi3-partial-rotary": dict(family="phi3", tie_word_embeddings=True, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    "gemma": dict(family="gemma", tie_word_embeddings=True),
    "gemma2": dict(family="gemma2", tie_word_embeddings=True, query_pre_attn_scalar=16),
    "gemma3": dict(family="gemma3", query_pre_attn_scalar=16),
    # quantized files: the reference runs the weights as the file decodes them (same gguf.quants round trip)
    "llama-q8_0": dict(family="llama", qtype=Q.Q8_0),
    "gemma-f16": dict(family="gemma", tie_word_embeddings=True, qtype=Q.F16),
    "phi3-q4_0": dict(family="phi3", qtype=Q.Q4_0),
    "llama-tied-q8_0": dict(family="llama", tie_word_embeddings=True, qtype=Q.Q8_0),  # embedding kept in blocks
    # IQ4 in the codebook layout (embedding and tied head too); IQ4_XS rows need K % 256 (else IQ4_NL, as
    # llama-quantize falls back): a wider model so most of its matrices are IQ4_XS
    "llama-tied-iq4_nl": dict(family="llama", tie_word_embeddings=True, qtype=Q.IQ4_NL),
    "qwen3-iq4_xs": dict(family="qwen3", hidden_size=256, intermediate_size=512, qtype=Q.IQ4_XS),
}
TEXTS = ["The quick brown fox jumps over the lazy dog.", "  Paris is\tthe capital of France\n\nhéllo wörld 🤖 123",
         "<|im_start|>user\nWhat is hearth?<|im_end|>\n<|im_start|>assistant\n", "<s>attention</s><unk>", ""]


def _build(case: str, tmp_path: Path) -> tuple[str, Path, Q, dict[str, torch.Tensor]]:
    kwargs = dict(CASES[case])
    family, qtype = kwargs.pop("family"), kwargs.pop("qtype", Q.F32)
    folder = build_checkpoint(str(tmp_path / case), tiny_config(family, **kwargs))
    path = tmp_path / f"{case}.gguf"
    decoded = write_gguf(folder, path, qtype)
    return folder, path, qtype, decoded


def _reference(folder: str, decoded: dict[str, torch.Tensor] | None):
    if decoded is None:
        return hf_greedy(folder, PARITY_PROMPTS, STEPS)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict(decoded, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return [hf_greedy_loop(model, ids, STEPS) for ids in PARITY_PROMPTS]


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_greedy_parity(case: str, tmp_path: Path, monkeypatch) -> None:
    from hearth.weights import activations

    # Q8_0 / Q4_0 stay quantized: decode with float activations (pinned), so hearth computes exactly the reference's
    # dequantized model (int8 activation rounding, HEARTH_QUANT_ACT=int8, is checked in tests/unit/test_quant.py and
    # on the real SmolLM2 in tests/e2e/test_quant_smollm2.py).
    monkeypatch.setattr(activations, "ACTIVATIONS", "float")
    folder, path, qtype, decoded = _build(case, tmp_path)
    if qtype != Q.F32:
        # the round trip must actually change the weights, or this case tests nothing beyond F32
        orig = load_file(f"{folder}/model.safetensors")
        assert any(not torch.equal(orig[k], v) for k, v in decoded.items())
    assert_greedy_parity(str(path), steps=STEPS, expected=_reference(folder, None if qtype == Q.F32 else decoded))


@pytest.mark.parametrize("case", ["llama", "phi3", "gemma3"])
def test_gguf_tokenizer_matches_folder(case: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from hearth.loader.gguf import load_gguf

    folder, path, _, _ = _build(case, tmp_path)
    ck = load_gguf(str(path))
    ref = AutoTokenizer.from_pretrained(folder)
    assert len(ck.tokenizer) == ck.hf_config["vocab_size"] == 512  # the GGUF pads the 371 trained tokens
    for text in TEXTS:
        ids = ck.tokenizer.encode(text)
        assert ids == ref.encode(text), text
        assert ck.tokenizer.decode(ids, skip_special_tokens=False) == text
    assert ck.tokenizer.encode("<|im_start|>", add_special_tokens=False) == [3]  # special kept whole
    assert (ck.bos_token_id, ck.eos_token_ids) == (0, [1])
    assert ck.tokenizer.chat_template == ref.chat_template
    msgs = [{"role": "user", "content": "Hi"}]
    assert (ck.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
            == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))


def test_quantized_embedding_rows_equal_the_dequantized_table(tmp_path: Path) -> None:
    """A kept block type's embedding stays in its blocks; lookups equal the file's dequantized table, and the tied
    head reads the same blocks."""
    from hearth import LLM

    _, path, _, decoded = _build("llama-tied-q8_0", tmp_path)
    model = LLM(str(path), kv_cache_space=0.05).engine.model
    embed = model.model.embed_tokens
    assert embed.qweight is not None and model.lm_head_qweight is embed.qweight
    ids = torch.tensor([[0, 5, 511, 5], [7, 3, 2, 1]])
    table = decoded["model.embed_tokens.weight"]
    rows = embed(ids)  # in the model dtype: bfloat16 where the CPU has native bf16 GEMMs (dtype auto), else fp32
    torch.testing.assert_close(rows, table[ids].to(rows.dtype), rtol=0, atol=0)
