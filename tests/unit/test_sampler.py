"""Sampler: greedy, temperature, top-k/top-p/min-p, penalties, logit bias, min_tokens, seeds, logprobs."""
import math

import pytest
import torch

from hearth import LLM, SamplingParams
from hearth.engine.request import Request
from hearth.layers import sampler as sampler_module
from hearth.layers.sampler import Sampler
from tests.tiny_models import build_checkpoint, tiny_config

V = 8
EOS = 1
LOGITS = torch.tensor([1.0, 2.5, -0.5, 3.0, 0.0, -2.0, 2.9, 1.5])  # argmax 3, then 6, 1


def req(prompt: list[int] | None = None, output: list[int] = (), rid: str = "r", **kw) -> Request:
    r = Request(rid, prompt or [0], SamplingParams(**kw), eos_token_ids=[EOS])
    for t in output:
        r.append_output_token(t)
    return r


def rows(*logits: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.as_tensor(x, dtype=torch.float32) for x in logits])


def frequencies(sampler: Sampler, logits: torch.Tensor, n: int, **kw) -> torch.Tensor:
    """n draws from one row: a batch of n rows of one unseeded request (each row is an independent draw)."""
    reqs = [req(**kw)] * n
    out = sampler(logits.expand(n, -1).clone(), reqs)
    return torch.bincount(torch.tensor(out.token_ids), minlength=logits.shape[-1]).double() / n


def assert_follows(freq: torch.Tensor, probs: torch.Tensor, n: int) -> None:
    # Within 5 standard deviations of each expected frequency (plus a tiny floor for p close to 0).
    sd = torch.sqrt(probs.double() * (1 - probs.double()) / n)
    assert torch.all((freq - probs.double()).abs() <= 5 * sd + 1e-3), (freq, probs)


def test_greedy_is_argmax_per_row() -> None:
    s = Sampler(V)
    logits = rows(LOGITS, -LOGITS, LOGITS.roll(2))
    out = s(logits, [req(temperature=0.0, rid=str(i)) for i in range(3)])
    assert out.token_ids == [3, 5, 5]
    assert out.logprobs == [None, None, None]
    assert s(logits[:1], [req(temperature=1e-6)]).token_ids == [3]  # below the greedy threshold


def test_sampler_ignores_padded_vocab_columns() -> None:
    s = Sampler(V)
    padded = torch.cat([LOGITS, torch.tensor([100.0, 100.0])]).unsqueeze(0)
    assert s(padded, [req(temperature=0.0)]).token_ids == [3]
    assert s(padded, [req(temperature=1.0, seed=3)]).token_ids[0] < V


def test_distribution_follows_softmax() -> None:
    s = Sampler(V, seed=1)
    n = 10000
    assert_follows(frequencies(s, LOGITS, n, temperature=1.0), torch.softmax(LOGITS, -1), n)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_scales_logits(temperature: float) -> None:
    s = Sampler(V, seed=2)
    n = 10000
    assert_follows(frequencies(s, LOGITS, n, temperature=temperature), torch.softmax(LOGITS / temperature, -1), n)


def test_top_k_1_and_tiny_top_p_equal_greedy() -> None:
    s = Sampler(V)
    logits = torch.randn(64, V, generator=torch.Generator().manual_seed(0)) * 3
    greedy = logits.argmax(-1).tolist()
    for kw in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        reqs = [req(rid=str(i), temperature=1.5, **kw) for i in range(64)]
        assert s(logits.clone(), reqs).token_ids == greedy, kw
        seeded = [req(rid=str(i), temperature=1.5, seed=i, **kw) for i in range(64)]
        assert s(logits.clone(), seeded).token_ids == greedy, kw


def test_top_k() -> None:
    s = Sampler(V, seed=3)
    n = 10000
    freq = frequencies(s, LOGITS, n, top_k=3)
    keep = torch.full((V,), float("-inf"))
    keep[[3, 6, 1]] = 0.0
    assert set(torch.nonzero(freq).flatten().tolist()) == {1, 3, 6}
    assert_follows(freq, torch.softmax(LOGITS + keep, -1), n)


def test_top_p() -> None:
    s = Sampler(4, seed=4)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    n = 10000
    # The smallest prefix whose mass reaches 0.7 is {0, 1}; 0.9 adds token 2.
    freq = frequencies(s, logits, n, top_p=0.7)
    assert_follows(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), n)
    freq = frequencies(s, logits, n, top_p=0.9)
    assert_follows(freq, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95, n)


def test_min_p() -> None:
    s = Sampler(4, seed=5)
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    n = 10000
    freq = frequencies(s, logits, n, min_p=0.2)  # keep p >= 0.2 * 0.5 = 0.1
    assert_follows(freq, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95, n)


def test_unfiltered_rows_are_untouched_by_batch_mates_filters() -> None:
    """A request without top-k/top-p/min-p keeps its whole distribution when a batch-mate uses them."""
    logits = torch.randn(4, 512, generator=torch.Generator().manual_seed(0)) * 3
    reqs = [req(rid="plain"), req(rid="k", top_k=5), req(rid="p", top_p=0.5), req(rid="m", min_p=0.1)]
    out = Sampler._top_k_top_p_min_p(logits.clone(), reqs)
    assert torch.equal(out[0], logits[0])
    assert torch.isinf(out[1]).sum() == 512 - 5
    # Only top_p < 1 truncates by mass: top-k alone keeps exactly k tokens, min-p alone keeps p >= min_p * p_max.
    probs = torch.softmax(logits[3], -1)
    assert torch.equal(torch.isfinite(out[3]), probs >= 0.1 * probs.max())


def test_candidate_filtering_equals_full_sort() -> None:
    """top-k / top-p / min-p order only the top candidates of a large vocabulary; the result must equal the
    full-sort filter, also for rows whose kept prefix outgrows the candidates (full-sort fallback)."""
    g = torch.Generator().manual_seed(0)
    v = 5000
    peaked = torch.randn(4, v, generator=g) * 4
    flat = torch.randn(1, v, generator=g) * 0.01  # top-p 0.9 keeps ~4500 tokens: past the candidates
    params = [{"top_p": 0.9}, {"top_k": 1024, "min_p": 0.01}, {"top_k": 2000, "top_p": 0.99}, {"min_p": 0.5},
              {"top_p": 0.9}]
    logits = torch.cat([peaked, flat])
    reqs = [req(rid=str(i), **kw) for i, kw in enumerate(params)]
    want = sampler_module._filter_prefix(logits, reqs, v)
    for rows in ([0, 1, 2, 3], [0, 1, 2, 3, 4]):
        got = Sampler._top_k_top_p_min_p(logits[rows].clone(), [reqs[i] for i in rows])
        assert torch.equal(got, want[rows])
    assert sampler_module._filter_prefix(logits[:4], reqs[:4], 2000) is not None  # candidates were enough
    assert sampler_module._filter_prefix(logits[[4]], [reqs[4]], 1024) is None  # the fallback was needed


def test_repetition_penalty_over_prompt_and_output() -> None:
    s = Sampler(V)
    logits = LOGITS.clone().unsqueeze(0)
    r = req(prompt=[3, 2, 3], output=[6], repetition_penalty=2.0)
    out = s.apply_processors(logits.clone(), [r])[0]
    expected = LOGITS.clone()
    expected[3] = 3.0 / 2.0  # positive: divided
    expected[2] = -0.5 * 2.0  # negative: multiplied
    expected[6] = 2.9 / 2.0  # output tokens count too
    assert torch.equal(out, expected)


def test_presence_and_frequency_penalties_over_output_only() -> None:
    s = Sampler(V)
    r = req(prompt=[0, 0, 7], output=[4, 4, 4, 6], presence_penalty=0.5, frequency_penalty=0.25)
    out = s.apply_processors(LOGITS.clone().unsqueeze(0), [r])[0]
    expected = LOGITS.clone()
    expected[4] -= 3 * 0.25 + 0.5
    expected[6] -= 1 * 0.25 + 0.5
    assert torch.allclose(out, expected, atol=0, rtol=1e-6)
    assert out[0] == LOGITS[0] and out[7] == LOGITS[7]  # prompt tokens: untouched
    # Negative values reward repetition.
    r = req(output=[5], presence_penalty=-1.0, frequency_penalty=-2.0)
    out = s.apply_processors(LOGITS.clone().unsqueeze(0), [r])[0]
    assert out[5] == LOGITS[5] + 3.0
    # No output yet: nothing changes.
    r = req(prompt=[4, 4], presence_penalty=2.0, frequency_penalty=2.0)
    assert torch.equal(s.apply_processors(LOGITS.clone().unsqueeze(0), [r])[0], LOGITS)


def test_penalties_apply_per_row() -> None:
    s = Sampler(V)
    reqs = [req(output=[3], rid="a", frequency_penalty=1.0), req(output=[3], rid="b"),
            req(prompt=[3], rid="c", repetition_penalty=1.5)]
    out = s.apply_processors(LOGITS.expand(3, -1).clone(), reqs)
    assert out[0, 3] == 2.0 and out[1, 3] == 3.0 and out[2, 3] == 2.0
    assert torch.equal(out[1], LOGITS)


def test_logit_bias() -> None:
    s = Sampler(V)
    r = req(logit_bias={5: 10.0, 3: -4.0}, temperature=0.0)
    out = s.apply_processors(LOGITS.clone().unsqueeze(0), [r])[0]
    expected = LOGITS.clone()
    expected[5] += 10.0
    expected[3] -= 4.0
    assert torch.equal(out, expected)
    assert s(LOGITS.clone().unsqueeze(0), [r]).token_ids == [5]
    r = req(logit_bias={0: 100.0}, seed=0)
    assert s(LOGITS.clone().unsqueeze(0), [r]).token_ids == [0]
    r = req(logit_bias={3: -100.0, 6: -100.0}, temperature=0.0)
    assert s(LOGITS.clone().unsqueeze(0), [r]).token_ids == [1]


def test_min_tokens_blocks_eos_and_stop_ids() -> None:
    s = Sampler(V)
    logits = LOGITS.clone()
    logits[EOS] = 50.0
    logits[4] = 40.0
    logits = logits.unsqueeze(0)
    kw = {"min_tokens": 2, "stop_token_ids": [4], "temperature": 0.0}
    r = req(output=[7], **kw)  # 1 output token < 2: eos and stop ids are banned
    out = s.apply_processors(logits.clone(), [r])[0]
    assert out[EOS] == float("-inf") and out[4] == float("-inf")
    assert torch.equal(out[[0, 2, 3, 5, 6, 7]], logits[0, [0, 2, 3, 5, 6, 7]])
    assert s(logits.clone(), [r]).token_ids == [3]
    r = req(output=[7, 7], **kw)  # reached min_tokens: nothing banned
    assert torch.equal(s.apply_processors(logits.clone(), [r])[0], logits[0])
    assert s(logits.clone(), [r]).token_ids == [EOS]
    r = req(output=[7], ignore_eos=True, **kw)  # eos is not a stop with ignore_eos; stop ids still are
    out = s.apply_processors(logits.clone(), [r])[0]
    assert out[EOS] == 50.0 and out[4] == float("-inf")


def test_seeded_requests_ignore_batch_composition() -> None:
    gen = torch.Generator().manual_seed(0)
    steps = [torch.randn(5, 64, generator=gen) * 2 for _ in range(12)]  # fixed logits, one row per slot

    def run(batch: list[tuple[int, dict]], sampler_seed: int) -> dict[str, list[int]]:
        """batch: (logits row, params) per request; returns each request's tokens over the steps."""
        s = Sampler(64, seed=sampler_seed)
        reqs = [req(rid=f"{i}", **kw) for i, (_, kw) in enumerate(batch)]
        got: dict[str, list[int]] = {r.request_id: [] for r in reqs}
        for logits in steps:
            out = s(logits[[row for row, _ in batch]].clone(), reqs)
            for r, t in zip(reqs, out.token_ids):
                got[r.request_id].append(t)
                r.append_output_token(t)
        return got

    target = {"seed": 1234, "temperature": 1.0}
    alone = run([(0, target)], 0)["0"]
    assert len(set(alone)) > 3  # really random, not greedy
    mixed = run([(2, {"temperature": 0.8}), (0, target), (3, {"seed": 7, "top_k": 5}), (4, {"temperature": 0.0}),
                 (1, {"top_p": 0.5, "frequency_penalty": 1.0})], 99)
    assert mixed["1"] == alone
    twice = run([(0, target), (0, target)], 5)
    assert twice["0"] == alone and twice["1"] == alone
    assert run([(0, {"seed": 1235})], 0)["0"] != alone


def test_unseeded_requests_use_the_sampler_seed() -> None:
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(1))
    a = [Sampler(64, seed=3)(logits.clone(), [req()]).token_ids[0] for _ in range(5)]
    b = [Sampler(64, seed=3)(logits.clone(), [req()]).token_ids[0] for _ in range(5)]
    assert a == b


def test_logprobs_and_ranks() -> None:
    s = Sampler(V)
    logits = rows(LOGITS, LOGITS)
    raw = torch.log_softmax(LOGITS, -1)
    order = raw.argsort(descending=True).tolist()  # [3, 6, 1, 7, 0, 4, 2, 5]
    reqs = [req(rid="a", temperature=0.0, logprobs=3),
            req(rid="b", temperature=0.0, logprobs=0, logit_bias={5: 100.0})]
    out = s(logits, reqs)
    assert out.token_ids == [3, 5]
    a, b = out.logprobs
    assert (a.token_id, a.rank) == (3, 1) and a.logprob == pytest.approx(raw[3].item(), abs=1e-6)
    assert [t for t, _ in a.top] == order[:3]
    assert [lp for _, lp in a.top] == pytest.approx(raw[order[:3]].tolist(), abs=1e-6)
    # Logprobs are of the raw distribution (before logit bias): token 5 is the least likely of 8.
    assert (b.token_id, b.rank, b.top) == (5, 8, [])
    assert b.logprob == pytest.approx(raw[5].item(), abs=1e-6)
    # Requests without logprobs get None next to ones that want them.
    out = s(logits, [req(rid="c", temperature=0.0), req(rid="d", temperature=0.0, logprobs=5)])
    assert out.logprobs[0] is None and len(out.logprobs[1].top) == 5
    assert math.isclose(sum(math.exp(v) for v in raw.tolist()), 1.0, rel_tol=1e-6)


def test_logprob_rank_of_a_sampled_token() -> None:
    s = Sampler(V, seed=0)
    raw = torch.log_softmax(LOGITS, -1)
    ranks = {t: int((raw > raw[t]).sum()) + 1 for t in range(V)}
    reqs = [req(rid=str(i), temperature=3.0, logprobs=2) for i in range(200)]
    out = s(LOGITS.expand(200, -1).clone(), reqs)
    assert len(set(out.token_ids)) > 3
    for t, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == t and lp.rank == ranks[t] and lp.logprob == pytest.approx(raw[t].item(), abs=1e-6)


# ---- seeds through the whole engine ----

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    # NOTE: one checkpoint per session, shared by the unit-test modules that need one (tokenizer.json is written last).
    folder = tmp_path_factory.getbasetemp() / "unit_tiny_llama"
    if not (folder / "tokenizer.json").exists():
        build_checkpoint(str(folder), tiny_config("llama"))
    return str(folder)


def test_seeded_generation_is_independent_of_the_batch(tiny_llama: str) -> None:
    llm = LLM(tiny_llama, dtype="float32", max_model_len=64)
    prompt = {"prompt_token_ids": [5, 17, 42, 99, 7]}
    seeded = SamplingParams(temperature=1.0, seed=42, max_tokens=6, ignore_eos=True)
    alone = llm.generate(prompt, seeded)[0].outputs[0].token_ids
    assert len(alone) == 6 and len(set(alone)) > 2
    others = [{"prompt_token_ids": [300, 12]}, {"prompt_token_ids": list(range(20, 50))}, prompt]
    batch = llm.generate(
        [others[0], prompt, others[1], others[2]],
        [SamplingParams(temperature=1.0, max_tokens=7, ignore_eos=True), seeded,
         SamplingParams(temperature=1.0, seed=7, max_tokens=8, ignore_eos=True),
         SamplingParams(temperature=0.7, max_tokens=6, ignore_eos=True)])
    assert batch[1].outputs[0].token_ids == alone
    fresh = LLM(tiny_llama, dtype="float32", max_model_len=64, seed=123)
    assert fresh.generate(prompt, seeded)[0].outputs[0].token_ids == alone
    # n=2 with a seed: two different sequences, the first the same as n=1 with that seed.
    pair = llm.generate(prompt, SamplingParams(n=2, temperature=1.0, seed=42, max_tokens=6, ignore_eos=True))
    assert pair[0].outputs[0].token_ids == alone and pair[0].outputs[1].token_ids != alone
