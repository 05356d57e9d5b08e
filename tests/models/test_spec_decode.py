"""Speculative decoding end to end on tiny random checkpoints: greedy output identical with and without it
(prompt lookup; a draft model that is the target itself, and one that is not), seeded sampling reproducible,
stops landing mid-draft, no leaked KV blocks, acceptance counters moving."""
import pytest

from hearth import LLM, SamplingParams
from hearth.metrics import ServerMetrics
from tests.tiny_models import build_checkpoint, tiny_config

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# Repetitive prompts (drafts get accepted), a short one, a long one; the tiny models also fall into loops.
PROMPTS = [[5, 17, 42, 99, 7] * 4, [300, 12], list(range(20, 80)), [201, 202, 203, 204] * 5]
STEPS = 32
ENGINE = dict(dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64, max_model_len=256)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("spec")
    return {"target": build_checkpoint(str(root / "target"), tiny_config("llama")),
            "other": build_checkpoint(str(root / "other"), tiny_config("llama", num_hidden_layers=1), seed=3)}


@pytest.fixture(scope="module")
def plain(ckpts) -> LLM:
    return LLM(ckpts["target"], **ENGINE)


def _run(llm: LLM, params) -> list:
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]


def _assert_idle(llm: LLM) -> None:
    eng = llm.engine
    assert not eng.has_unfinished_requests()
    assert eng.block_manager.num_used_blocks == 0  # prefix-cached blocks sit in the free list
    assert not eng.seqs and not eng.parents


def test_ngram_greedy_identical_with_stops_mid_draft(ckpts, plain) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=2)
    ref = _run(plain, greedy)
    # Per request: stop tokens and max_tokens that land inside drafts.
    params = [SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, stop_token_ids=[ref[2].token_ids[13]]),
              SamplingParams(temperature=0.0, max_tokens=23, ignore_eos=True)]
    expected = [plain.generate({"prompt_token_ids": p}, sp)[0].outputs[0] for p, sp in zip(PROMPTS, params)]
    spec = LLM(ckpts["target"], speculative_config=NGRAM, **ENGINE)
    got = [o.outputs[0] for o in spec.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]
    for e, g in zip(expected, got):
        assert g.token_ids == e.token_ids
        assert (g.finish_reason, g.stop_reason) == (e.finish_reason, e.stop_reason)
        assert g.text == e.text
    assert len(got[1].token_ids) == 7 and len(got[3].token_ids) == 23
    assert got[2].token_ids[-1] == ref[2].token_ids[13] or got[2].stop_reason is not None
    # Logprobs of every emitted token, as without speculation (verification runs the chunk path: close, not equal).
    assert [lp.token_id for lp in got[0].logprobs] == got[0].token_ids
    for a, b in zip(got[0].logprobs, expected[0].logprobs):
        assert a.rank == b.rank and abs(a.logprob - b.logprob) < 1e-4
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
    st = spec.engine.stats()
    assert st.spec_num_drafts > 0 and st.spec_num_accepted_tokens > 0
    assert st.spec_num_accepted_tokens <= st.spec_num_draft_tokens
    assert sum(st.spec_accepted_per_pos) == st.spec_num_accepted_tokens
    _assert_idle(spec)


@pytest.mark.parametrize("draft", ["target", "other"])
def test_draft_model_greedy_identical(ckpts, plain, draft: str) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    ref = [o.token_ids for o in _run(plain, greedy)]
    spec = LLM(ckpts["target"], speculative_config={"model": ckpts[draft], "num_speculative_tokens": 3}, **ENGINE)
    assert [o.token_ids for o in _run(spec, greedy)] == ref
    st = spec.engine.stats()
    assert st.spec_num_draft_tokens > 0
    if draft == "target":  # the draft is the target: every draft token stands
        assert st.spec_num_accepted_tokens == st.spec_num_draft_tokens
    else:
        assert st.spec_num_accepted_tokens < st.spec_num_draft_tokens / 2
    _assert_idle(spec)


@pytest.mark.parametrize("config", ["ngram", "draft"])
def test_seeded_sampling_reproducible(ckpts, config: str) -> None:
    sc = NGRAM if config == "ngram" else {"model": ckpts["target"], "num_speculative_tokens": 3}
    spec = LLM(ckpts["target"], speculative_config=sc, **ENGINE)
    params = [SamplingParams(temperature=t, top_k=k, seed=s, max_tokens=24, ignore_eos=True, logprobs=1)
              for t, k, s in ((0.3, 0, 1), (0.7, 20, 2), (1.0, 0, 3), (0.2, 5, 4))]
    runs = [[o.outputs[0] for o in spec.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]
            for _ in range(2)]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    for o in runs[0]:
        assert len(o.token_ids) == 24 and all(0 <= t < 512 for t in o.token_ids)
        assert len(o.logprobs) == 24
    st = spec.engine.stats()
    assert st.spec_num_drafts > 0
    if config == "draft":  # the draft samples from q = p (it is the target): min(1, p/q) accepts (nearly) all
        assert st.spec_num_accepted_tokens > 0.9 * st.spec_num_draft_tokens
    _assert_idle(spec)


def test_ineligible_requests_and_preemption(ckpts, plain) -> None:
    """Penalties and min_tokens turn speculation off per request; a cache too small for everyone preempts."""
    params = [SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, repetition_penalty=1.3),
              SamplingParams(temperature=0.0, max_tokens=STEPS, min_tokens=20, stop_token_ids=[1, 2, 3]),
              SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)]
    expected = [o.outputs[0].token_ids for o in plain.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]
    small = dict(ENGINE, kv_cache_space=10 * 8192 / 2 ** 30, max_model_len=128)  # 10 blocks: 4 requests need 18
    spec = LLM(ckpts["target"], speculative_config=NGRAM, **small)
    got = [o.outputs[0].token_ids for o in spec.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]
    assert got == expected
    assert spec.engine.scheduler.num_preemptions > 0
    _assert_idle(spec)


def test_metrics_counters_move(ckpts) -> None:
    spec = LLM(ckpts["target"], speculative_config=NGRAM, **ENGINE)
    metrics = ServerMetrics("tiny")
    metrics.observe_stats(spec.engine.stats())
    _run(spec, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    st = spec.engine.stats()
    metrics.observe_stats(st)
    text = metrics.render().decode()

    def value(name: str) -> float:
        line = next(ln for ln in text.splitlines() if ln.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    assert value("vllm:spec_decode_num_drafts_total") == st.spec_num_drafts > 0
    assert value("vllm:spec_decode_num_draft_tokens_total") == st.spec_num_draft_tokens
    assert value("vllm:spec_decode_num_accepted_tokens_total") == st.spec_num_accepted_tokens > 0
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"}' in text


def test_bad_draft_vocab_is_a_clear_error(ckpts, tmp_path) -> None:
    odd = build_checkpoint(str(tmp_path / "odd"), tiny_config("llama", vocab_size=384))
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(ckpts["target"], speculative_config={"model": odd, "num_speculative_tokens": 2}, **ENGINE)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(ckpts["target"], speculative_config={"method": "ngram"}, **ENGINE)
