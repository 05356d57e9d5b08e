"""The fused C kernels (RMSNorm + residual, rotary, gated activations, sampling) against the torch code they replace."""
import pytest
import torch
import torch.nn.functional as F

from hearth import kernels
from hearth.kernels import fused
from hearth.layers.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(not kernels.available(), reason="hearth kernels unavailable here")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _ref_rms(x, w, offset, eps, residual=None):
    if residual is not None:
        x = x + residual
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * (w.float() + offset)
    return h.to(x.dtype), x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 7, 300])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_matches_torch(dtype, tokens, offset):
    torch.manual_seed(0)
    x, r = torch.randn(tokens, 576).to(dtype), torch.randn(tokens, 576).to(dtype) * 3
    w = torch.randn(576)
    ref, ref_sum = _ref_rms(x, w, offset, 1e-5, r)
    out, total = fused.rms_norm(x, w, offset, 1e-5, r)
    torch.testing.assert_close(total, ref_sum, rtol=0, atol=0)  # the sum is rounded exactly as torch rounds it
    torch.testing.assert_close(out.float(), ref.float(), rtol=TOL[dtype], atol=TOL[dtype])
    alone = fused.rms_norm(x, w, offset, 1e-5)
    torch.testing.assert_close(alone.float(), _ref_rms(x, w, offset, 1e-5)[0].float(), rtol=TOL[dtype],
                               atol=TOL[dtype])


def test_rms_norm_per_head_view_and_refusals():
    x = torch.randn(3, 4 * 16 + 2 * 16)[:, :64].reshape(3, 4, 16)  # a split of a fused projection, per head
    w = torch.randn(16)
    out = fused.rms_norm(x, w, 0.0, 1e-6)
    torch.testing.assert_close(out, _ref_rms(x, w, 0.0, 1e-6)[0], rtol=1e-5, atol=1e-5)
    assert fused.rms_norm(torch.randn(4, 8).to(torch.float64), w[:8], 0.0, 1e-6) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rot", [32, 16])
def test_rope_in_place_matches_torch(dtype, rot):
    torch.manual_seed(1)
    rope = RotaryEmbedding(32, rot, 128, 10000.0)
    qkv = torch.randn(5, (4 + 2 + 2) * 32).to(dtype)
    q, k, _ = qkv.split([128, 64, 64], dim=-1)
    q, k = q.view(5, 4, 32), k.view(5, 2, 32)
    pos = torch.tensor([0, 3, 7, 100, 127])
    cos, sin = rope.cos[pos].unsqueeze(1), rope.sin[pos].unsqueeze(1)
    ref_q, ref_k = rope._apply(q.clone(), cos, sin), rope._apply(k.clone(), cos, sin)
    assert fused.rope_neox_(q, k, rope.cos, rope.sin, pos, rot)
    torch.testing.assert_close(q.float(), ref_q.float(), rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(k.float(), ref_k.float(), rtol=TOL[dtype], atol=TOL[dtype])
    assert not fused.rope_neox_(q, k, rope.cos, rope.sin, pos.int(), rot)  # wrong index dtype: torch path


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("tokens", [1, 33])
def test_act_and_mul_matches_torch(dtype, act, tokens):
    torch.manual_seed(2)
    x = (torch.randn(tokens, 2 * 1003) * 4).to(dtype)  # odd d: vector body plus scalar tail
    x[0, 0], x[0, 1] = -100.0, 100.0  # saturated ends of the exp
    gate, up = x.chunk(2, dim=-1)
    a = F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")
    ref = a * up
    out = fused.act_and_mul(x, act)
    torch.testing.assert_close(out.float(), ref.float(), rtol=TOL[dtype] * 2, atol=TOL[dtype] * 2)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_act_and_mul_is_finite_and_exact_at_the_exps_clamp_ends(act):
    """The one vector exp (csrc/simd_avx2.h) clamps to where 2^n is a finite normal float: gates far past either
    end (exp of +-88.4 and beyond) give torch's value, never inf or NaN, in the 16-lane, 8-lane and scalar bodies."""
    ends = torch.tensor([-1e4, -1e3, -100.0, -88.5, -88.37, -87.4, -87.3, 87.3, 87.4, 88.37, 88.5, 100.0, 1e3, 1e4])
    d = 16 + 8 + 7  # one 16-lane vector, one 8-lane vector, a scalar tail
    gate = ends.repeat(d // len(ends) + 1)[:d].roll(1).repeat(3, 1)
    gate[1], gate[2] = gate[0].roll(5), gate[0].roll(11)  # every value in every body
    x = torch.cat([gate, torch.full_like(gate, 1.5)], dim=-1)
    a = F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")
    out = fused.act_and_mul(x, act)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, a * 1.5, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_write_matches_index_copy(dtype):
    qkv = torch.randn(4, (4 + 2 + 2) * 8).to(dtype)
    _, k, v = qkv.split([32, 16, 16], dim=-1)
    k, v = k.view(4, 2, 8), v.view(4, 2, 8)
    slots = torch.tensor([5, 0, 17, 9])
    kc, vc = torch.zeros(20, 2, 8, dtype=dtype), torch.zeros(20, 2, 8, dtype=dtype)
    assert fused.kv_write(k, v, kc, vc, slots)
    rk, rv = torch.zeros_like(kc).index_copy_(0, slots, k), torch.zeros_like(vc).index_copy_(0, slots, v)
    assert torch.equal(kc, rk) and torch.equal(vc, rv)
    with pytest.raises(IndexError):
        fused.kv_write(k, v, kc, vc, torch.tensor([5, 0, 20, 9]))
    assert not fused.kv_write(k.float() if dtype != torch.float32 else k.half(), v, kc, vc, slots)


def _cdf64(logits, inv_t):
    return torch.softmax(logits.double() * inv_t.double().unsqueeze(1), dim=-1).cumsum(-1)


@pytest.mark.parametrize("vocab", [1000, 32003, 151936])
def test_sample_inverts_the_softmax_cdf(vocab):
    """The token is where the fp64 cumulative softmax passes u (at several temperatures, a padded row stride too):
    exactly for a small vocabulary, and within the kernel's fp32 running-sum rounding (1e-5 of the mass) for large
    ones, where flat distributions put boundaries ~1e-6 apart."""
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(24, vocab + 64, generator=g)[:, :vocab] * 4
    u = torch.rand(24, generator=g)
    inv_t = torch.tensor([1.0, 2.0, 0.5, 10.0] * 6)
    got = fused.sample(logits, u, inv_t)
    cdf = _cdf64(logits, inv_t)
    want = torch.searchsorted(cdf, u.double().unsqueeze(1), right=True).squeeze(1)
    if vocab <= 1000:
        assert torch.equal(got, want)
    before = torch.where(got > 0, cdf.gather(1, (got - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0.0)
    at = cdf.gather(1, got.unsqueeze(1)).squeeze(1)
    assert ((before <= u + 1e-5) & (u <= at + 1e-5)).all(), (got, want)
    assert (got != want).sum() <= 2


def test_sample_never_draws_a_token_without_mass_and_refuses_rows_without_any():
    logits = torch.full((4, 1003), float("-inf"))
    logits[0, 1000] = 1.0  # the only token, in the last (partial) block
    logits[1, 5], logits[1, 1002] = 2.0, 2.0  # two equal tokens: u < 0.5 the first, else the second
    logits[2, 7] = 0.0
    logits[2, 8] = -200.0  # exp(-200) underflows: no mass, even at u -> 1
    u = torch.tensor([0.9999999, 0.7, 0.9999999, 0.5])
    out = fused.sample(logits, u, torch.ones(4))
    assert out[:3].tolist() == [1000, 1002, 7] and out[3] == -1  # row 3: no finite maximum
    assert fused.sample(logits[1:2], torch.tensor([0.2]), torch.ones(1)).tolist() == [5]
    assert fused.sample(logits.double(), u, torch.ones(4)) is None  # fp32 only


@pytest.mark.parametrize("rows", [1, 3, 32])
@pytest.mark.parametrize("vocab", [1, 7, 17, 1003, 151936])
def test_argmax_picks_what_torch_picks(rows, vocab):
    """First maximal index, ties included (values drawn from a few levels, so maxima repeat inside one vector, across
    the vector / tail boundary and across the chunks a single row is split into), -inf rows, NaN as the maximum, and
    a padded row stride: equal to torch.argmax everywhere."""
    g = torch.Generator().manual_seed(rows * 100003 + vocab)
    logits = torch.randint(0, 5, (rows, vocab + 5), generator=g).float()[:, :vocab]
    assert torch.equal(fused.argmax(logits), logits.argmax(dim=-1))
    logits = torch.randn(rows, vocab, generator=g)
    logits[0] = float("-inf")
    if vocab > 2:
        logits[-1, vocab // 2] = float("nan")
        logits[-1, vocab - 1] = float("nan")
    assert torch.equal(fused.argmax(logits), logits.argmax(dim=-1))
    assert fused.argmax(logits.double()) is None


def test_greedy_sampler_matches_torch_argmax():
    from hearth.layers.sampler import _argmax
    logits = torch.randn(5, 2000)
    logits[2, 1999] = logits[2].max() + 1  # the last entry, in the scalar tail
    assert torch.equal(_argmax(logits), logits.argmax(dim=-1))
    assert torch.equal(_argmax(logits[:, :1500]), logits[:, :1500].argmax(dim=-1))  # a strided view
