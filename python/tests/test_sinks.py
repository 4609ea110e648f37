"""Attention sinks (``sinks=``): flashgqa against the gpt-oss reference in torch float64 (the sink
appended as an extra logit column, softmax, the column dropped), forward and backward (torch autograd,
dsinks included), within the derived bounds of error_bounds.py and backward_bounds.py; the sinks'
kinds, dtypes and shapes; rows that see no key; errors.
"""
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import flashgqa
from backward_bounds import BackwardReference, flashgqa_side
from error_bounds import ROUNDOFF, Reference, as_f64, assert_within, operands

NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
ALGOS = ["flash", "naive", "chunked", "chunked-unstable", "kernel1"]


def gpt_oss_attention(q, k, v, sinks, scale, causal_offset=None):
    """gpt-oss's attention with sinks in torch float64: q [B,K,G,T,H], k, v [B,K,S,H], sinks [K,G]."""
    B, K, G, T, H = q.shape
    S = k.shape[2]
    logits = scale * torch.einsum("bkgth,bksh->bkgts", q, k)
    if causal_offset is not None:
        visible = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + causal_offset
        logits = logits.masked_fill(~visible, -torch.inf)
    sink = sinks.reshape(1, K, G, 1, 1).expand(B, K, G, T, 1)
    # A row with no visible key and a -inf sink is 0/0: flashgqa's rule is out 0 (lse -inf).
    weights = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1].nan_to_num(0.0)
    lse = torch.logsumexp(torch.cat([logits, sink], dim=-1), dim=-1)
    return torch.einsum("bkgts,bksh->bkgth", weights, v), lse


def random_case(rng, shape, dtype, spread=2.0):
    B, K, G, T, S, H = shape
    dt = NP_DTYPES[dtype]
    q = rng.standard_normal((B, K, G, T, H)).astype(dt)
    k = rng.standard_normal((B, K, S, H)).astype(dt)
    v = rng.standard_normal((B, K, S, H)).astype(dt)
    sinks = (rng.standard_normal((K, G)) * spread).astype(np.float32)
    if K * G > 2:
        sinks.flat[1] = -np.inf  # no sink for that head
    return q, k, v, sinks


def t64(x):
    return torch.from_numpy(as_f64(x))


# (B, K, G, T, S, H)
SHAPES = [(1, 1, 1, 1, 1, 8), (2, 2, 3, 17, 40, 16), (1, 2, 4, 33, 64, 64), (1, 4, 2, 50, 33, 128)]


def shape_id(shape):
    return "B{}K{}G{}T{}S{}H{}".format(*shape)


@pytest.mark.parametrize("offset", [None, 0, -3], ids=["full", "causal0", "causal-3"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_forward_matches_gpt_oss_reference(rng, shape, dtype, algo, offset):
    q, k, v, sinks = random_case(rng, shape, dtype)
    precision = "f32" if dtype == "float32" else "bf16"
    scale = shape[5] ** -0.5
    causal = offset is not None
    out, lse = flashgqa.attention(q, k, v, sinks=sinks, algo=algo, precision=precision,
                                  causal=causal, causal_offset=offset, return_lse=True)
    qo, ko, vo = (operands(x, precision) for x in (q, k, v))
    want, want_lse = gpt_oss_attention(t64(qo), t64(ko), t64(vo), t64(sinks), scale, offset)
    ref = Reference(qo, ko, vo, scale, offset, sinks=as_f64(sinks))
    # The float64 reference of the bounds is gpt-oss's math.
    np.testing.assert_allclose(ref.out, want.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ref.lse, want_lse.numpy(), rtol=1e-12, atol=1e-12)
    side = (ROUNDOFF["bfloat16"] if precision == "bf16" else ROUNDOFF["float32"], shape[4])
    assert_within(out, want.numpy(), *ref.softmax_bounds([side], ROUNDOFF[dtype]), f"{algo} out")
    finite = np.isfinite(ref.lse)
    assert (lse[~finite] == ref.lse[~finite]).all()
    err = np.abs(as_f64(lse)[finite] - ref.lse[finite])
    assert (err <= ref.lse_bound()[finite]).all(), f"{algo} lse"


def test_rows_that_see_no_key_give_the_sink(rng):
    q, k, v, sinks = random_case(rng, (1, 2, 2, 6, 9, 16), "float32")
    out, lse = flashgqa.attention(q, k, v, sinks=sinks, causal=True, causal_offset=-2,
                                  return_lse=True)
    assert (out[:, :, :, :2] == 0).all()
    assert (lse[0, :, :, :2] == sinks[:, :, None]).all()


def test_minus_infinity_sinks_are_no_sinks(rng):
    q, k, v, _ = random_case(rng, (1, 2, 3, 20, 30, 32), "bfloat16")
    plain, plain_lse = flashgqa.attention(q, k, v, causal=True, return_lse=True)
    none, none_lse = flashgqa.attention(q, k, v, causal=True, return_lse=True,
                                        sinks=np.full((2, 3), -np.inf))
    assert plain.tobytes() == none.tobytes() and plain_lse.tobytes() == none_lse.tobytes()


def test_sinks_of_any_kind_dtype_and_shape(rng):
    """[K, G] and [Hq], numpy float64/float16/bfloat16, torch, jax and a list: the same values give
    the same bits (they are converted to float32)."""
    q, k, v, _ = random_case(rng, (1, 2, 2, 7, 11, 16), "float32")
    values = np.array([[0.5, -1.25], [3.0, -np.inf]])
    want = flashgqa.attention(q, k, v, sinks=values.astype(np.float32))
    for sinks in (values, values.reshape(-1), values.astype(np.float16),
                  values.astype(ml_dtypes.bfloat16), torch.tensor(values),
                  torch.tensor(values, dtype=torch.bfloat16).reshape(4), jnp.asarray(values),
                  values.tolist()):
        got = flashgqa.attention(q, k, v, sinks=sinks)
        assert got.tobytes() == want.tobytes(), type(sinks)
    # SDPA's 4-D layout takes them the same way.
    q4 = q.reshape(1, 4, 7, 16)
    got = flashgqa.attention(q4, k, v, sinks=values.reshape(4))
    assert got.tobytes() == want.reshape(1, 4, 7, 16).tobytes()


@pytest.mark.parametrize("offset", [None, -2], ids=["full", "causal-2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES[1:], ids=shape_id)
def test_backward_matches_torch_autograd(rng, shape, dtype, offset):
    """dq, dk, dv and dsinks against torch autograd of gpt-oss's float64 attention, within the bound
    of backward_bounds.py (the forward is algo naive, as test_backward.py's)."""
    q, k, v, sinks = random_case(rng, shape, dtype)
    dout = rng.standard_normal(q.shape).astype(NP_DTYPES[dtype])
    precision = "f32" if dtype == "float32" else "bf16"
    scale = shape[5] ** -0.5
    causal = offset is not None
    options = dict(causal=causal, causal_offset=offset, precision=precision, sinks=sinks)
    out, lse = flashgqa.attention(q, k, v, algo="naive", return_lse=True, **options)
    got = flashgqa.attention_backward(dout, q, k, v, out, lse, **options)
    assert len(got) == 4 and got[3].shape == sinks.shape and got[3].dtype == np.float32

    qo, ko, vo, do = (operands(x, precision) for x in (q, k, v, dout))
    leaves = [t64(x).requires_grad_() for x in (qo, ko, vo, sinks)]
    o, _ = gpt_oss_attention(*leaves, scale, offset)
    o.backward(t64(do))
    # (torch's softmax backward of a row with no key and a -inf sink, 0/0 forward, is NaN; the
    # gradient of a -inf sink is 0.)
    want = [x.grad.nan_to_num(0.0).numpy() for x in leaves]
    ref = BackwardReference(qo, ko, vo, do, scale, offset, sinks=as_f64(sinks))
    for name, w in zip(("dq", "dk", "dv", "dsinks"), want):
        np.testing.assert_allclose(ref.grads[name], w, rtol=1e-10, atol=1e-12, err_msg=name)
    bounds = ref.bounds([flashgqa_side(precision, dtype)], dtype)
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        assert_within(g, w, *bounds[name], f"flashgqa vs torch autograd: {name}")


def test_dsinks_take_the_kind_dtype_and_shape_of_sinks(rng):
    q, k, v, sinks = random_case(rng, (1, 2, 2, 5, 8, 16), "float32")
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, lse = flashgqa.attention(q, k, v, sinks=sinks, return_lse=True)
    base = flashgqa.attention_backward(dout, q, k, v, out, lse, sinks=sinks)[3]
    s = torch.tensor(sinks, dtype=torch.bfloat16).reshape(4)
    out, lse = flashgqa.attention(q, k, v, sinks=s, return_lse=True)
    d = flashgqa.attention_backward(dout, q, k, v, out, lse, sinks=s)[3]
    assert isinstance(d, torch.Tensor) and d.dtype == torch.bfloat16 and d.shape == (4,)
    j = flashgqa.attention_backward(dout, q, k, v, out, lse, sinks=jnp.asarray(sinks))[3]
    assert j.shape == (2, 2) and j.dtype == jnp.float32
    assert base.shape == (2, 2)
    # Without sinks the backward still returns three gradients.
    out, lse = flashgqa.attention(q, k, v, return_lse=True)
    assert len(flashgqa.attention_backward(dout, q, k, v, out, lse)) == 3


def test_learned_sinks_in_a_training_step(rng):
    """Sinks as a torch parameter: forward and backward as an autograd Function, one SGD step."""

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, sinks):
            out, lse = flashgqa.attention(q, k, v, sinks=sinks, return_lse=True, precision="f32")
            ctx.save_for_backward(q, k, v, out, lse, sinks)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse, sinks = ctx.saved_tensors
            return flashgqa.attention_backward(dout.contiguous(), q, k, v, out, lse, sinks=sinks,
                                               precision="f32")

    q, k, v = (torch.randn(*s, dtype=torch.float32) for s in ((1, 8, 12, 32), (1, 2, 12, 32),
                                                               (1, 2, 12, 32)))
    sinks = torch.zeros(8, requires_grad=True)
    loss = Attention.apply(q, k, v, sinks).square().mean()
    loss.backward()
    ref_sinks = torch.zeros(8, dtype=torch.float64, requires_grad=True)
    o, _ = gpt_oss_attention(q.double().reshape(1, 2, 4, 12, 32), k.double(), v.double(),
                             ref_sinks.reshape(2, 4), 32**-0.5)
    o.square().mean().backward()
    torch.testing.assert_close(sinks.grad.double(), ref_sinks.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("sinks, error, match", [
    (np.array([[0.0, np.nan], [1.0, 2.0]]), ValueError, r"sinks: head 1 \(k 0, g 1\) has sink nan"),
    (np.array([[0.0, 1.0], [np.inf, 2.0]]), ValueError, r"sinks: head 2 \(k 1, g 0\) has sink inf"),
    (np.zeros((2, 3)), ValueError, r"sinks: shape \[2, 3\], expected \[K, G\] = \[2, 2\] or \[Hq\] = \[4\]"),
    (np.zeros(5), ValueError, r"sinks: shape \[5\]"),
    (np.zeros((2, 2), dtype=np.int32), TypeError, r"sinks: dtype int32, expected a floating-point"),
    ("sinks", TypeError, r"sinks: dtype <U5"),
])
def test_bad_sinks_name_the_argument(rng, sinks, error, match):
    q, k, v, _ = random_case(rng, (1, 2, 2, 3, 4, 8), "float32")
    with pytest.raises(error, match=match):
        flashgqa.attention(q, k, v, sinks=sinks)
