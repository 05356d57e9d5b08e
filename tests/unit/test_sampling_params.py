"""SamplingParams validation: every bad value is a ValueError whose message names the parameter."""
import pytest

from hearth.sampling_params import SamplingParams, SamplingType

NAN = float("nan")
INF = float("inf")

BAD = [
    ("n", 0), ("n", -1), ("n", 1.5),
    ("temperature", -0.1), ("temperature", NAN), ("temperature", INF),
    ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.01), ("top_p", NAN),
    ("top_k", -2), ("top_k", 1.5),
    ("min_p", -0.01), ("min_p", 1.01), ("min_p", NAN),
    ("presence_penalty", 2.01), ("presence_penalty", -2.01), ("presence_penalty", NAN),
    ("frequency_penalty", 2.01), ("frequency_penalty", -2.01), ("frequency_penalty", NAN),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", 2.01),
    ("repetition_penalty", NAN),
    ("max_tokens", 0), ("max_tokens", -5), ("max_tokens", 2.5),
    ("min_tokens", -1), ("min_tokens", 1.5),
    ("logprobs", -1), ("logprobs", 21), ("logprobs", 1.5),
    ("prompt_logprobs", -1), ("prompt_logprobs", 21), ("prompt_logprobs", 2.5),
    ("seed", 1.5), ("seed", "42"),
    ("stop", ""), ("stop", [""]), ("stop", ["ok", ""]), ("stop", [3]),
    ("logit_bias", {5: 100.5}), ("logit_bias", {5: -101.0}), ("logit_bias", {5: NAN}), ("logit_bias", {"x": 1.0}),
    ("logit_bias", {5: "big"}),
]


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_bad_value_raises_value_error_naming_the_parameter(name: str, value) -> None:
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: value})


def test_min_tokens_above_max_tokens() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=4)
    assert SamplingParams(min_tokens=4, max_tokens=4).min_tokens == 4
    assert SamplingParams(min_tokens=100, max_tokens=None).min_tokens == 100


GOOD = [
    ("n", 3), ("temperature", 0.0), ("temperature", 2.0), ("top_p", 1e-9), ("top_p", 1.0), ("top_k", 0),
    ("top_k", 50), ("min_p", 0.0), ("min_p", 1.0), ("presence_penalty", -2.0), ("presence_penalty", 2.0),
    ("frequency_penalty", 2.0), ("repetition_penalty", 2.0), ("repetition_penalty", 0.5), ("max_tokens", None),
    ("max_tokens", 1), ("min_tokens", 0), ("logprobs", 0), ("logprobs", 20), ("prompt_logprobs", 0),
    ("seed", 0), ("seed", -3), ("stop", "x"), ("stop", ["a", "bc"]), ("stop", None), ("stop", []),
    ("logit_bias", {5: 100.0, 6: -100.0}),
]


@pytest.mark.parametrize("name,value", GOOD, ids=[f"{n}={v!r}" for n, v in GOOD])
def test_good_values_are_accepted(name: str, value) -> None:
    SamplingParams(**{name: value})


def test_normalisation() -> None:
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(stop="x").stop_strings == ["x"]
    assert SamplingParams(stop=("a", "b")).stop_strings == ["a", "b"]
    assert SamplingParams().stop_strings == [] and SamplingParams().stop_token_ids == []
    assert SamplingParams(logit_bias={"7": 3}).logit_bias == {7: 3.0}  # JSON keys are strings
    assert SamplingParams(temperature=0.0).sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=0.5).sampling_type == SamplingType.RANDOM
    assert SamplingParams(temperature=0.5, seed=1).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(temperature=0.0, seed=1).sampling_type == SamplingType.GREEDY
    assert not SamplingParams().needs_penalties
    assert SamplingParams(repetition_penalty=1.1).needs_penalties
    assert SamplingParams(presence_penalty=0.1).needs_penalties
    assert SamplingParams(frequency_penalty=-0.1).needs_penalties


def test_check_vocab() -> None:
    SamplingParams(logit_bias={511: 1.0}, stop_token_ids=[0, 511]).check_vocab(512)
    with pytest.raises(ValueError, match="512"):
        SamplingParams(logit_bias={512: 1.0}).check_vocab(512)
    with pytest.raises(ValueError, match="-1"):
        SamplingParams(stop_token_ids=[-1]).check_vocab(512)


def test_n_and_seed_bounds() -> None:
    import pytest

    from hearth.sampling_params import MAX_N, SamplingParams

    SamplingParams(n=MAX_N)
    with pytest.raises(ValueError, match="n must be"):
        SamplingParams(n=MAX_N + 1)
    SamplingParams(seed=2**63 - 1)
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**63)
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**63 - 1, n=2)  # the second sequence's seed would overflow
