"""The logit softcap (softcap=c: logits c tanh(s / c), Gemma 2), forward and backward, against torch
and jax computing the capped attention explicitly, and against the float64 reference of
error_bounds.py / backward_bounds.py (whose bounds count the cap), each comparison judged by the
derived bounds; plus the option's errors.

torch and jax are required here (not skipped): the softcap has no other Python check.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import flashgqa
from backward_bounds import BackwardReference, flashgqa_side, torch_side
from error_bounds import ROUNDOFF, U32, Reference, as_f64, assert_within, operands, weights_roundoff

SHAPES = [(1, 2, 4, 37, 53, 64), (2, 1, 1, 19, 70, 128), (1, 1, 3, 30, 7, 40)]
CAPS = [1.0, 5.0, 50.0]


def shape_id(shape):
    return "B{}K{}G{}T{}S{}H{}".format(*shape[:6])


def every_case(test):
    """Parametrises a test over SHAPES x CAPS x (full, causal)."""
    for mark in (pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"]),
                 pytest.mark.parametrize("cap", CAPS),
                 pytest.mark.parametrize("shape", SHAPES, ids=shape_id)):
        test = mark(test)
    return test


def random_inputs(rng, shape):
    """q, dout [B,K,G,T,H], k, v [B,K,S,H], float32 numpy."""
    B, K, G, T, S, H = shape
    q = rng.standard_normal((B, K, G, T, H), dtype=np.float32)
    k = rng.standard_normal((B, K, S, H), dtype=np.float32)
    v = rng.standard_normal((B, K, S, H), dtype=np.float32)
    dout = rng.standard_normal((B, K, G, T, H), dtype=np.float32)
    return q, k, v, dout


def mask(T, S, causal):
    """[T, S] visible keys, bottom-right causal (flashgqa's default offset S - T)."""
    return (np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T) if causal else np.ones((T, S), bool)


def torch_capped(q, k, v, scale, cap, causal):
    """softmax(c tanh(scale q k^T / c)) v in torch, any dtype (k, v shared by the G heads)."""
    G, T, S = q.shape[2], q.shape[3], k.shape[2]
    s = scale * torch.einsum("bkgth,bksh->bkgts", q, k)
    s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~torch.from_numpy(mask(T, S, causal)), float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)  # rows that see no key: 0, as flashgqa
    return torch.einsum("bkgts,bksh->bkgth", p, v)


def jax_capped(q, k, v, scale, cap, causal):
    """The same in jax (float32)."""
    T, S = q.shape[3], k.shape[2]
    s = scale * jnp.einsum("bkgth,bksh->bkgts", q, k)
    s = cap * jnp.tanh(s / cap)
    s = jnp.where(mask(T, S, causal), s, -jnp.inf)
    p = jnp.nan_to_num(jax.nn.softmax(s, axis=-1), nan=0.0)
    return jnp.einsum("bkgts,bksh->bkgth", p, v)


@every_case
def test_forward_matches_torch_jax_and_float64(rng, shape, cap, causal):
    B, K, G, T, S, H = shape
    q, k, v, _ = random_inputs(rng, shape)
    scale = 1.0  # logits ~ N(0, H): the cap bites
    offset = S - T if causal else None
    for precision in ("bf16", "f32"):
        ops = [operands(x, precision) for x in (q, k, v)]
        ref = Reference(*ops, scale=scale, causal_offset=offset, softcap=cap)
        out, lse = flashgqa.attention(q, k, v, causal=causal, scale=scale, precision=precision,
                                      softcap=cap, return_lse=True)
        ours = (weights_roundoff(precision), S)
        # torch in float64 on the same operands: exact up to float64 roundings.
        want = torch_capped(*(torch.from_numpy(x) for x in ops), scale, cap, causal).numpy()
        np.testing.assert_allclose(want, ref.out, rtol=0, atol=1e-12)
        assert_within(out, want, *ref.softmax_bounds([ours], ROUNDOFF["float32"]),
                      f"flashgqa {precision} vs torch float64")
        lse, seen = as_f64(lse), np.isfinite(ref.lse)  # rows that see no key: -inf exactly
        assert np.all(lse[~seen] == -np.inf), precision
        assert np.all(np.abs(lse[seen] - ref.lse[seen]) <= ref.lse_bound()[seen]), precision
    # jax in float32 on float32 operands: a second side with float32 weights and no corrections.
    ref = Reference(*(as_f64(x) for x in (q, k, v)), scale=scale, causal_offset=offset, softcap=cap)
    theirs = np.asarray(jax_capped(q, k, v, scale, cap, causal))
    out = flashgqa.attention(q, k, v, causal=causal, scale=scale, precision="f32", softcap=cap)
    assert_within(out, theirs, *ref.softmax_bounds([(U32, S), (U32, 0)], ROUNDOFF["float32"]),
                  "flashgqa f32 vs jax")


@every_case
def test_backward_matches_torch_autograd(rng, shape, cap, causal):
    # torch autograd of the explicitly capped attention: in float64 (the exact gradients, checked
    # against the float64 reference) and in float32 (a second side, as SDPA's in test_backward.py).
    B, K, G, T, S, H = shape
    q, k, v, dout = random_inputs(rng, shape)
    scale = 1.0
    ref = BackwardReference(*(as_f64(x) for x in (q, k, v, dout)), scale=scale,
                            causal_offset=S - T if causal else None, softcap=cap)
    grads = {}
    for dtype in (torch.float64, torch.float32):
        tq, tk, tv = (torch.from_numpy(x).to(dtype).requires_grad_() for x in (q, k, v))
        torch_capped(tq, tk, tv, scale, cap, causal).backward(torch.from_numpy(dout).to(dtype))
        grads[dtype] = (tq.grad, tk.grad, tv.grad)
    for name, g in zip(("dq", "dk", "dv"), grads[torch.float64]):
        np.testing.assert_allclose(g.numpy(), ref.grads[name], rtol=1e-9, atol=1e-12, err_msg=name)

    out, lse = flashgqa.attention(q, k, v, causal=causal, scale=scale, precision="f32", softcap=cap,
                                  algo="naive", return_lse=True)
    got = flashgqa.attention_backward(dout, q, k, v, out, lse, causal=causal, scale=scale,
                                      precision="f32", softcap=cap)
    bounds = ref.bounds([flashgqa_side("f32", "float32")], "float32")
    for name, g in zip(("dq", "dk", "dv"), got):
        assert_within(g, ref.grads[name], *bounds[name], f"flashgqa vs float64: {name}")
    bounds = ref.bounds([flashgqa_side("f32", "float32"), torch_side("float32", 0)], "float32")
    for name, g, w in zip(("dq", "dk", "dv"), got, grads[torch.float32]):
        assert_within(g, w, *bounds[name], f"flashgqa vs torch float32 autograd: {name}")


def test_backward_bf16_matches_float64(rng):
    shape = (1, 2, 2, 33, 45, 64)
    B, K, G, T, S, H = shape
    q, k, v, dout = random_inputs(rng, shape)
    out, lse = flashgqa.attention(q, k, v, causal=True, softcap=2.0, algo="naive", return_lse=True)
    got = flashgqa.attention_backward(dout, q, k, v, out, lse, causal=True, softcap=2.0)
    ref = BackwardReference(*(operands(x, "bf16") for x in (q, k, v, dout)), scale=H**-0.5,
                            causal_offset=S - T, softcap=2.0)
    bounds = ref.bounds([flashgqa_side("bf16", "float32")], "float32")
    for name, g in zip(("dq", "dk", "dv"), got):
        assert_within(g, ref.grads[name], *bounds[name], f"bf16: {name}")


def test_threads_give_identical_bits(rng):
    q, k, v, dout = random_inputs(rng, (1, 2, 4, 100, 300, 64))
    results = []
    for threads in (1, 2):
        out, lse = flashgqa.attention(q, k, v, softcap=3.0, return_lse=True, threads=threads)
        grads = flashgqa.attention_backward(dout, q, k, v, out, lse, softcap=3.0, threads=threads)
        results.append([np.asarray(x).tobytes() for x in (out, lse, *grads)])
    assert results[0] == results[1]


def test_none_and_zero_are_off(rng):
    q, k, v, _ = random_inputs(rng, (1, 1, 2, 9, 20, 32))
    plain = flashgqa.attention(q, k, v)
    assert flashgqa.attention(q, k, v, softcap=None).tobytes() == plain.tobytes()
    assert flashgqa.attention(q, k, v, softcap=0).tobytes() == plain.tobytes()
    assert flashgqa.attention(q, k, v, softcap=1.0).tobytes() != plain.tobytes()


@pytest.mark.parametrize("cap, error, match", [
    (-1.0, ValueError, "softcap"), (float("nan"), ValueError, "softcap"),
    (float("inf"), ValueError, "softcap"), (1e-40, ValueError, "softcap"),
    ("3", TypeError, "softcap"), (10**400, ValueError, "softcap"),
])
def test_bad_softcap_names_the_argument(rng, cap, error, match):
    q, k, v, _ = random_inputs(rng, (1, 1, 1, 2, 3, 8))
    with pytest.raises(error, match=match):
        flashgqa.attention(q, k, v, softcap=cap)
