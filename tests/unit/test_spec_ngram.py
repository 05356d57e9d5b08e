"""Speculative decoding pieces: prompt-lookup proposals, --speculative-config parsing, verification rules."""
import pytest
import torch

from hearth.engine.spec_decode.config import SpeculativeConfig
from hearth.engine.spec_decode.ngram_proposer import ngram_propose
from hearth.engine.spec_decode.rejection_sampler import greedy_accept, rejection_accept


# ---- prompt lookup ----
def test_ngram_proposes_what_followed_the_latest_match() -> None:
    tokens = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # suffix [1, 2, 3] occurs at 0 (-> 4, 5, ...) and at 7 (-> 7, 8, ...): the latest wins.
    assert ngram_propose(tokens, 2, 1, 3) == [7, 8]
    assert ngram_propose(tokens, 10, 1, 3) == [7, 8, 1, 2, 3]  # stops at the end of the sequence


def test_ngram_tries_longest_n_first() -> None:
    # Last 2 tokens [5, 6] occur once (-> 7); the last token 6 alone occurs later (-> 9).
    tokens = [5, 6, 7, 0, 6, 9, 5, 6]
    assert ngram_propose(tokens, 1, 1, 2) == [7]
    assert ngram_propose(tokens, 1, 1, 1) == [9]


def test_ngram_min_n_and_no_match() -> None:
    tokens = [1, 2, 3, 4, 9, 4]  # only a 1-gram (4) repeats
    assert ngram_propose(tokens, 3, 2, 4) == []
    assert ngram_propose(tokens, 3, 1, 4) == [9, 4]
    assert ngram_propose([1, 2, 3, 4], 3, 1, 3) == []
    assert ngram_propose([7], 3, 1, 3) == []
    assert ngram_propose([7, 7], 0, 1, 3) == []


def test_ngram_on_a_loop() -> None:
    tokens = [10, 11, 12] * 5
    assert ngram_propose(tokens, 4, 2, 4) == [10, 11, 12]


# ---- config ----
def test_config_parses_vllm_shapes() -> None:
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
                                '"prompt_lookup_min": 2}')
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == ("ngram", 4, 4, 2)
    c = SpeculativeConfig.parse({"model": "/x/draft", "num_speculative_tokens": 3})
    assert (c.method, c.model) == ("draft_model", "/x/draft")
    assert SpeculativeConfig.parse(None) is None


@pytest.mark.parametrize("bad, words", [
    ("{not json", "not valid JSON"),
    ({"method": "eagle", "num_speculative_tokens": 2}, "method must be one of"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "must not"),
    ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "unknown key"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs \"model\""),
])
def test_config_errors_name_the_fix(bad, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        SpeculativeConfig.parse(bad)


# ---- verification ----
def test_greedy_accept() -> None:
    assert greedy_accept([4, 5, 6, 7], [4, 5, 6]) == [4, 5, 6, 7]  # all accepted, then the bonus token
    assert greedy_accept([4, 9, 6, 7], [4, 5, 6]) == [4, 9]  # first mismatch: the target's token instead
    assert greedy_accept([3, 5, 6, 7], [4, 5, 6]) == [3]
    assert greedy_accept([8], []) == [8]


def test_rejection_sampling_keeps_the_target_distribution() -> None:
    """First emitted token ~ p, whether a point-mass draft proposes it or a draft sampled from q."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.1, 0.1, 0.7])
    gen = torch.Generator().manual_seed(0)
    trials = 4000
    for draft_probs in (None, q.unsqueeze(0)):
        counts = torch.zeros(4)
        for _ in range(trials):
            draft_token = 1 if draft_probs is None else int(torch.multinomial(q, 1, generator=gen))
            tok = rejection_accept(torch.stack([p, p]), [draft_token], draft_probs, gen)[0]
            counts[tok] += 1
        assert torch.allclose(counts / trials, p, atol=0.03), counts / trials


def test_rejection_sampling_all_accepted_adds_a_bonus_token() -> None:
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert rejection_accept(p, [1, 2], None, torch.Generator().manual_seed(1)) == [1, 2, 0]
    p0 = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert rejection_accept(p0, [1], None, torch.Generator().manual_seed(1)) == [2]  # p(d) = 0: always rejected
