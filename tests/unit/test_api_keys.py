"""The key file's validation and the KeyRing's limits, on a fake clock (no server)."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from hearth.entrypoints.openai.api_keys import KeyRing, LimitExceeded, parse_key_file
from hearth.entrypoints.openai.serving_keys import key_ring


def write(tmp_path, text: str) -> str:
    path = tmp_path / "keys.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text,needle", [
    ("[[keys]]\nname = 'a'\n", "key must be a non-empty string"),
    ("[[keys]]\nkey = 'k'\n", "name must be a non-empty string"),
    ("[[keys]]\nname = 'a'\nkey = 'k'\nrequests_per_minute = 0\n", "requests_per_minute must be a whole number"),
    ("[[keys]]\nname = 'a'\nkey = 'k'\ntokens_per_day = 1.5\n", "tokens_per_day must be a whole number"),
    ("[[keys]]\nname = 'a'\nkey = 'k'\nrpm = 3\n", "unknown field(s) ['rpm']"),
    ("[[keys]]\nname = 'a'\nkey = 'k'\nmodels = 'x'\n", "models must be a list"),
    ("[[keys]]\nname = 'a'\nkey = 'k'\n[[keys]]\nname = 'a'\nkey = 'j'\n", "repeated: ['a']"),
    ("[[keys]]\nname = 'a'\nkey = 'k'\n[[keys]]\nname = 'b'\nkey = 'k'\n", "the same key"),
    ("admin_key = 'k'\n[[keys]]\nname = 'admin'\nkey = 'j'\n", "repeated: ['admin']"),
    ("adminkey = 'k'\n", "unknown top-level field(s) ['adminkey']"),
    ("", "no keys"),
    ("[[keys]\n", "not valid TOML"),
])
def test_bad_key_files_name_the_mistake(tmp_path, text, needle):
    with pytest.raises(ValueError) as e:
        parse_key_file(write(tmp_path, text))
    assert needle in str(e.value)
    assert "'k'" not in str(e.value) and "'j'" not in str(e.value)  # never echo a key


def test_missing_file_and_flag_conflict(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        parse_key_file(str(tmp_path / "nope.toml"))
    with pytest.raises(ValueError, match="pass one"):
        key_ring("k", write(tmp_path, "admin_key = 'a'\n"), None)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def ring(tmp_path, text: str) -> tuple[KeyRing, Clock, Clock]:
    mono, wall = Clock(), Clock()
    wall.t = 86400 * 20000 + 3600.0  # 01:00 UTC
    return KeyRing(parse_key_file(write(tmp_path, text)), None, CollectorRegistry(), mono, wall), mono, wall


def test_lookup_is_exact_and_repr_hides_the_key(tmp_path):
    keys, _, _ = ring(tmp_path, "admin_key = 'sk-adm'\n[[keys]]\nname = 'a'\nkey = 'sk-a'\n")
    assert keys.lookup(b"Bearer sk-a").name == "a"
    assert keys.lookup(b"Bearer sk-adm").admin
    for wrong in [b"Bearer sk-", b"Bearer sk-a ", b"sk-a", b"", b"Bearer sk-ad"]:
        assert keys.lookup(wrong) is None
    assert "sk-a" not in repr(keys.specs)


def test_requests_per_minute_window(tmp_path):
    keys, mono, _ = ring(tmp_path, "[[keys]]\nname = 'a'\nkey = 'k'\nrequests_per_minute = 2\n")
    spec = keys.specs[0]
    keys.release(keys.admit(spec))
    mono.t += 30
    keys.release(keys.admit(spec))
    with pytest.raises(LimitExceeded) as e:
        keys.admit(spec)
    assert e.value.retry_after == 30 and "requests_per_minute = 2" in str(e.value)
    mono.t += 30  # the first request leaves the window
    keys.release(keys.admit(spec))


def test_tokens_per_day_resets_at_utc_midnight(tmp_path):
    keys, _, wall = ring(tmp_path, "[[keys]]\nname = 'a'\nkey = 'k'\ntokens_per_day = 10\n")
    spec = keys.specs[0]
    u = keys.admit(spec)
    keys.add_tokens("a", u, 7, 3)
    keys.release(u)
    with pytest.raises(LimitExceeded) as e:
        keys.admit(spec)
    assert e.value.retry_after == 23 * 3600 and "tokens_per_day = 10" in str(e.value)
    wall.t += 23 * 3600
    keys.release(keys.admit(spec))
    assert keys.usage["a"].prompt_tokens == 7 and keys.usage["a"].day_tokens == 0


def test_concurrency_and_reload_keeps_usage(tmp_path):
    keys, _, _ = ring(tmp_path, "[[keys]]\nname = 'a'\nkey = 'k'\nmax_concurrent_requests = 1\n")
    first = keys.admit(keys.specs[0])
    with pytest.raises(LimitExceeded, match="max_concurrent_requests = 1"):
        keys.admit(keys.specs[0])
    keys.release(first)
    keys.release(keys.admit(keys.specs[0]))
    keys.path = write(tmp_path, "[[keys]]\nname = 'a'\nkey = 'k2'\n")
    assert keys.reload()
    assert keys.lookup(b"Bearer k") is None and keys.lookup(b"Bearer k2").requests_per_minute is None
    assert keys.usage["a"].requests == 2
    keys.path = write(tmp_path, "not toml [")
    assert not keys.reload() and keys.lookup(b"Bearer k2") is not None


def test_token_quota_is_held_before_and_given_back_after(tmp_path):
    import asyncio
    from types import SimpleNamespace

    from hearth.entrypoints.openai.api_keys import Meter, current_meter
    from hearth.entrypoints.openai.errors import APIError
    from hearth.entrypoints.openai.token_quota import meter, reserve, tokens_needed

    keys, _, _ = ring(tmp_path, "[[keys]]\nname = 'a'\nkey = 'k'\ntokens_per_day = 50\n")
    spec = keys.specs[0]
    u = keys.admit(spec)
    params = SimpleNamespace(max_tokens=64, n=1)
    assert tokens_needed([(f"r{i}", [1], params) for i in range(32)], 2048) == 32 * 65
    assert tokens_needed([("r", [1, 2], SimpleNamespace(max_tokens=None, n=2))], 10) == 2 + 2 * 8
    assert tokens_needed([("r", [1, 2, 3], object())], 10) == 3  # pooling: the prompt only
    token = current_meter.set(Meter(keys, "a", u, spec.tokens_per_day))
    try:
        with pytest.raises(APIError) as e:
            reserve(32 * 65)
        assert e.value.status == 429 and "tokens_per_day = 50" in e.value.message and u.reserved == 0
        charge = reserve(30)
        with pytest.raises(APIError):  # 30 held: 21 more do not fit
            reserve(21)

        class Stream:
            async def __aiter__(self):
                for _ in range(4):
                    yield SimpleNamespace(new_token_ids=[7])

        async def drain() -> None:
            async for _ in meter(Stream(), [("r", [1, 2], None)], charge):
                pass
        asyncio.run(drain())
    finally:
        current_meter.reset(token)
    assert u.day_tokens == 2 + 4 and u.reserved == 0  # used 6 of the 30 held; the rest went back


def test_a_request_sent_to_another_process_reserves_against_what_was_left(tmp_path):
    """Ray Serve: the ingress passes what is left of the key's quota; the replica's reserve() (the same one as
    hearth serve's) refuses what does not fit in it, and counts what the request used for the ingress."""
    import pickle

    from hearth.entrypoints.openai.api_keys import Meter, current_meter
    from hearth.entrypoints.openai.errors import APIError
    from hearth.entrypoints.openai.token_quota import quota_left, remote_meter, reserve

    keys, _, _ = ring(tmp_path, "[[keys]]\nname = 'a'\nkey = 'k'\ntokens_per_day = 50\n")
    spec = keys.specs[0]
    u = keys.admit(spec)
    keys.add_tokens("a", u, 20, 10)
    u.reserved = 5  # another request of the key is running
    token = current_meter.set(Meter(keys, "a", u, spec.tokens_per_day))
    try:
        left = pickle.loads(pickle.dumps(quota_left()))  # (what crosses to the replica)
    finally:
        current_meter.reset(token)
    assert (left.name, left.tokens_per_day, left.spent) == ("a", 50, 35)

    remote = remote_meter(left)  # the replica's side
    token = current_meter.set(remote)
    try:
        with pytest.raises(APIError) as e:
            reserve(16)
        assert e.value.status == 429 and "key 'a' has 15 of its tokens_per_day = 50 left" in e.value.message
        reserve(15).use(3, 12)
    finally:
        current_meter.reset(token)
    assert (remote.usage.prompt_tokens, remote.usage.completion_tokens) == (3, 12)  # reported back
    assert remote_meter(None).tokens_per_day is None  # a key without a quota: counted, never refused
