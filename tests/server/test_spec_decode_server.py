"""Speculative decoding through the real server: streamed multi-token steps give the same text as the plain
server, and /metrics reports the acceptance counters."""
import json

from tests.server.conftest import TINY_ARGS, ServerProcess, start_server

PROMPT = [5, 17, 42, 99, 7] * 4  # repetitive: prompt lookup finds drafts


def test_streamed_spec_output_matches_plain_server(server: ServerProcess, tiny_model: str, tmp_path) -> None:
    spec_cfg = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1})
    spec = start_server([tiny_model, *TINY_ARGS, "--speculative-config", spec_cfg], str(tmp_path / "spec.log"))
    try:
        kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0.0, logprobs=1,
                      extra_body={"ignore_eos": True})
        plain = server.client().completions.create(**kwargs)
        chunks = list(spec.client().completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
        assert text == plain.choices[0].text
        assert tokens == plain.choices[0].logprobs.tokens
        assert chunks[-1].choices[0].finish_reason == "length"
        assert spec.metric("vllm:spec_decode_num_drafts_total") > 0
        assert 0 < spec.metric("vllm:spec_decode_num_accepted_tokens_total") <= \
            spec.metric("vllm:spec_decode_num_draft_tokens_total")
        assert spec.metric("vllm:generation_tokens_total") == 40
    finally:
        spec.stop()
