"""BERT encoders vs transformers on tiny random checkpoints: embeddings (mean / CLS pooling, normalize as the
sentence-transformers config says), cross-encoder scores, and truncation as transformers truncates."""
import pytest
import torch

from hearth import LLM, PoolingParams
from tests.tiny_encoders import build_bert, hf_embed, hf_scores

TEXTS = ["the quick brown fox", "paris is the capital of france " * 6, "a", "what is hearth?",
         "hearth serves language models on cpus with paged attention and continuous batching"]
ARGS = dict(dtype="float32", threads=1)


@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("cls", False)])
def test_embedding_parity(tmp_path, pooling: str, normalize: bool) -> None:
    folder = build_bert(str(tmp_path / "bert"), pooling=pooling, normalize=normalize)
    llm = LLM(folder, **ARGS)
    ours = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS)])
    ref = hf_embed(folder, TEXTS, pooling, normalize)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
    if normalize:
        torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(TEXTS)))
    # Per request: normalize overrides the checkpoint's config; the batch (one forward) equals one-at-a-time.
    alone = llm.embed(TEXTS[1], PoolingParams(normalize=not normalize))[0].outputs.embedding
    expect = hf_embed(folder, TEXTS[1:2], pooling, not normalize)[0]
    torch.testing.assert_close(torch.tensor(alone), expect, atol=2e-5, rtol=1e-4)


def test_pooler_config_overrides_checkpoint(tmp_path) -> None:
    folder = build_bert(str(tmp_path / "bert"), pooling="mean")
    llm = LLM(folder, pooler_config='{"pooling_type": "CLS", "normalize": false}', **ARGS)
    ours = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS[:3])])
    torch.testing.assert_close(ours, hf_embed(folder, TEXTS[:3], "cls", False), atol=2e-5, rtol=1e-4)


def test_cross_encoder_score_parity(tmp_path) -> None:
    folder = build_bert(str(tmp_path / "ce"), cross_encoder=True)
    llm = LLM(folder, **ARGS)
    query = "what is the capital of france?"
    out = llm.score(query, TEXTS)  # 1:N
    ref = hf_scores(folder, [(query, t) for t in TEXTS])
    torch.testing.assert_close(torch.tensor([o.outputs.score for o in out]), ref, atol=2e-5, rtol=1e-4)
    pairs = llm.score(TEXTS[:2], TEXTS[2:4])  # N:N, pairwise
    ref = hf_scores(folder, list(zip(TEXTS[:2], TEXTS[2:4])))
    torch.testing.assert_close(torch.tensor([o.outputs.score for o in pairs]), ref, atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="cross-encoder"):
        llm.embed("the fox")


def test_truncation_matches_transformers(tmp_path) -> None:
    from transformers import AutoTokenizer

    from hearth.entrypoints.pooling_inputs import encode_pair, encode_text

    folder = build_bert(str(tmp_path / "bert"), max_seq_length=16)
    hf = AutoTokenizer.from_pretrained(folder)
    llm = LLM(folder, **ARGS)
    assert llm.engine.model_config.max_model_len == 16  # sentence_bert_config.json's max_seq_length
    long = TEXTS[1]
    assert encode_text(llm.tokenizer, long, 10) == hf(long, truncation=True, max_length=10)["input_ids"]
    ids, types = encode_pair(llm.tokenizer, TEXTS[4], long, 20)
    ref = hf(TEXTS[4], long, truncation=True, max_length=20)
    assert (ids, types) == (ref["input_ids"], ref["token_type_ids"])
    with pytest.raises(ValueError, match="maximum input length is 16"):
        llm.embed(long)
    ours = llm.embed(long, truncate_prompt_tokens=-1)[0]
    assert len(ours.prompt_token_ids) == 16
    ref_vec = hf_embed(folder, [hf.decode(ours.prompt_token_ids[1:-1])])[0]
    torch.testing.assert_close(torch.tensor(ours.outputs.embedding), ref_vec, atol=2e-5, rtol=1e-4)
