"""flashgqa.jax: the XLA FFI op under jax.jit, jax.vmap and jax.grad.

The op runs the same library as flashgqa.attention, so under jit it must give the eager call's bits;
its gradients are checked against the float64 reference within the backward's derived bound
(backward_bounds.py) and against the eager attention_backward bit for bit.
"""
import subprocess
import sys

import numpy as np
import pytest

import jax  # noqa: E402  (required: scripts/test.sh installs it; a skip would not count as tested)
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402

import flashgqa  # noqa: E402
import flashgqa.jax as fj  # noqa: E402
from backward_bounds import BackwardReference, flashgqa_side  # noqa: E402
from error_bounds import as_f64, assert_within, operands, window_mask  # noqa: E402

GRADS = ("dq", "dk", "dv")
NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def inputs(rng, shape, dtype, sdpa=False):
    B, K, G, T, S, H = shape
    qshape = (B, K * G, T, H) if sdpa else (B, K, G, T, H)
    dt = NP_DTYPES[dtype]
    q = rng.standard_normal(qshape).astype(dt)
    k = rng.standard_normal((B, K, S, H)).astype(dt)
    v = rng.standard_normal((B, K, S, H)).astype(dt)
    dout = rng.standard_normal(qshape).astype(dt)
    return q, k, v, dout


def bits(x):
    x = np.asarray(x)
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


SHAPES = [(1, 2, 3, 17, 21, 32), (2, 1, 1, 40, 33, 64), (1, 2, 2, 5, 70, 128)]
# (causal, causal_offset, window)
MASKS = [(False, None, None), (True, None, None), (True, 0, (7, -1)), (False, None, (4, 3))]


@pytest.mark.parametrize("sdpa", [False, True], ids=["5d", "4d"])
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}K{}G{}T{}S{}H{}".format(*s))
def test_jit_forward_and_backward_give_the_eager_bits(rng, shape, dtype, mask, sdpa):
    q, k, v, dout = inputs(rng, shape, dtype, sdpa)
    causal, offset, window = mask
    options = dict(causal=causal, causal_offset=offset, window=window)
    out, lse = jax.jit(lambda q, k, v: fj.attention(q, k, v, return_lse=True, **options))(q, k, v)
    want, want_lse = flashgqa.attention(q, k, v, return_lse=True, **options)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == q.shape[:-1]
    assert np.array_equal(bits(out), bits(want)) and np.array_equal(bits(lse), bits(want_lse))

    grads = jax.jit(jax.vjp(lambda q, k, v: fj.attention(q, k, v, **options), q, k, v)[1])(dout)
    eager = flashgqa.attention_backward(dout, q, k, v, want, want_lse, **options)
    for name, g, w in zip(GRADS, grads, eager):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert np.array_equal(bits(g), bits(w)), f"{name} differs from the eager backward"


@pytest.mark.parametrize("window", [None, (6, 2)], ids=["full", "window"])
@pytest.mark.parametrize("dtype, precision", [("float32", "f32"), ("bfloat16", "bf16")])
def test_grad_matches_float64_gradients(rng, dtype, precision, window):
    B, K, G, T, S, H = 1, 2, 3, 30, 45, 64
    q, k, v, dout = inputs(rng, (B, K, G, T, S, H), dtype)

    def loss(q, k, v):  # sum(out * dout): its gradient is the backward of dout
        out = fj.attention(q, k, v, window=window, precision=precision)
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32))

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    mask = window_mask(T, S, False, None, window or (-1, -1))
    ref = BackwardReference(*(operands(x, precision) for x in (q, k, v, dout)), scale=H**-0.5,
                            mask=mask)
    bounds = ref.bounds([flashgqa_side(precision, dtype)], dtype)
    for name, g in zip(GRADS, got):
        assert_within(g, ref.grads[name], *bounds[name], f"jax.grad {dtype}: {name}")


@pytest.mark.parametrize("sdpa", [False, True], ids=["5d", "4d"])
def test_softcap_under_jit_gives_the_eager_bits(rng, sdpa):
    q, k, v, dout = inputs(rng, (1, 2, 2, 23, 31, 64), "bfloat16", sdpa)
    options = dict(causal=True, window=(9, -1), softcap=5.0, scale=1.0)
    out, lse = jax.jit(lambda q, k, v: fj.attention(q, k, v, return_lse=True, **options))(q, k, v)
    want, want_lse = flashgqa.attention(q, k, v, return_lse=True, **options)
    assert np.array_equal(bits(out), bits(want)) and np.array_equal(bits(lse), bits(want_lse))
    plain = flashgqa.attention(q, k, v, causal=True, window=(9, -1), scale=1.0)
    assert not np.array_equal(bits(out), bits(plain)), "the cap changed nothing"
    grads = jax.jit(jax.vjp(lambda q, k, v: fj.attention(q, k, v, **options), q, k, v)[1])(dout)
    eager = flashgqa.attention_backward(dout, q, k, v, want, want_lse, **options)
    for name, g, w in zip(GRADS, grads, eager):
        assert np.array_equal(bits(g), bits(w)), f"{name} differs from the eager backward"


@pytest.mark.parametrize("sdpa", [False, True], ids=["5d", "4d"])
def test_sinks_under_jit_and_grad_give_the_eager_bits(rng, sdpa):
    q, k, v, dout = inputs(rng, (2, 2, 3, 11, 17, 32), "float32", sdpa)
    sinks = rng.standard_normal((2, 3) if not sdpa else (6,)).astype(np.float32) + 1.0
    options = dict(causal=True, causal_offset=-3, precision="f32")  # rows 0-2 see only the sink
    out, lse = jax.jit(lambda q, k, v, s: fj.attention(q, k, v, sinks=s, return_lse=True,
                                                       **options))(q, k, v, sinks)
    want, want_lse = flashgqa.attention(q, k, v, sinks=sinks, return_lse=True, **options)
    assert np.array_equal(bits(out), bits(want)) and np.array_equal(bits(lse), bits(want_lse))
    vjp = jax.vjp(lambda q, k, v, s: fj.attention(q, k, v, sinks=s, **options), q, k, v, sinks)[1]
    grads = jax.jit(vjp)(dout)
    eager = flashgqa.attention_backward(dout, q, k, v, want, want_lse, sinks=sinks, **options)
    assert grads[3].shape == sinks.shape and grads[3].dtype == sinks.dtype
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), grads, eager):
        assert np.array_equal(bits(g), bits(w)), f"{name} differs from the eager backward"
    # vmap over the sinks too (a sequential loop: sinks are per head).
    qs, ss = np.stack([q, -q]), np.stack([sinks, sinks - 2.0])
    batched = jax.vmap(lambda q, s: fj.attention(q, k, v, sinks=s, **options))(qs, ss)
    assert np.array_equal(bits(batched[1]), bits(flashgqa.attention(-q, k, v, sinks=sinks - 2.0,
                                                                    **options)))


def test_vmap_folds_leading_axes_into_one_call(rng):
    q, k, v, _ = inputs(rng, (2, 2, 2, 9, 13, 32), "float32")
    qs, ks, vs = np.stack([q, 2 * q, -q]), np.stack([k, k, 0.5 * k]), np.stack([v, -v, v])
    f = lambda q, k, v: fj.attention(q, k, v, causal=True, precision="f32")  # noqa: E731
    batched = jax.jit(jax.vmap(f))(qs, ks, vs)
    nested = jax.vmap(jax.vmap(f))(qs[:, None], ks[:, None], vs[:, None])[:, 0]
    for i in range(3):
        want = flashgqa.attention(qs[i], ks[i], vs[i], causal=True, precision="f32")
        assert np.array_equal(bits(batched[i]), bits(want))
        assert np.array_equal(bits(nested[i]), bits(want))
    # Only q batched: k and v are broadcast.
    only_q = jax.vmap(f, in_axes=(0, None, None))(qs, k, v)
    assert np.array_equal(bits(only_q[1]), bits(flashgqa.attention(qs[1], k, v, causal=True,
                                                                   precision="f32")))
    grads = jax.vmap(jax.grad(lambda q, k, v: f(q, k, v).sum(), argnums=(0, 1, 2)))(qs, ks, vs)
    one = jax.grad(lambda q, k, v: f(q, k, v).sum(), argnums=(0, 1, 2))(qs[2], ks[2], vs[2])
    for g, w in zip(grads, one):
        assert np.array_equal(bits(g[2]), bits(w))


def test_gradient_through_lse_is_refused_not_wrong(rng):
    q, k, v, _ = inputs(rng, (1, 1, 2, 6, 8, 16), "float32")

    def uses_lse(q):
        out, lse = fj.attention(q, k, v, return_lse=True)
        return out.sum() + lse.sum()

    with pytest.raises(NotImplementedError, match="gradient through lse"):
        jax.grad(uses_lse)(q)

    def stops_lse(q):
        out, lse = fj.attention(q, k, v, return_lse=True)
        return out.sum() + jax.lax.stop_gradient(lse).sum()

    g = jax.grad(stops_lse)(q)
    want = jax.grad(lambda q: fj.attention(q, k, v).sum())(q)
    assert np.array_equal(bits(g), bits(want))


def test_bad_arguments_raise_clear_errors(rng):
    q, k, v, _ = inputs(rng, (1, 2, 2, 5, 7, 16), "float32")
    with pytest.raises(TypeError, match="dtype int32"):
        fj.attention(q.astype(np.int32), k, v)
    with pytest.raises(TypeError, match="expected one dtype"):
        fj.attention(q, k.astype(ml_dtypes.bfloat16), v)
    with pytest.raises(ValueError, match="q: rank 3"):
        fj.attention(q[0, 0], k, v)
    with pytest.raises(TypeError, match="window"):
        fj.attention(q, k, v, window="ab")
    with pytest.raises(ValueError, match="precision"):
        fj.attention(q, k, v, precision="f16")
    # Shapes are the library's to check: its message arrives through XLA.
    with pytest.raises(Exception, match="k: shape .* has H = 8, expected 16"):
        jax.block_until_ready(fj.attention(q, k[..., :8], v[..., :8]))
    with pytest.raises(ValueError, match="sinks: shape \\[3\\], expected \\[K, G\\] or \\[Hq\\]"):
        fj.attention(q, k, v, sinks=np.zeros(3, np.float32))
    with pytest.raises(Exception, match="sinks: head 1 .* has sink nan"):
        jax.block_until_ready(fj.attention(q, k, v, sinks=np.array([[0, np.nan], [0, 0]], np.float32)))
    with pytest.raises(Exception, match="window: \\(-2, -1\\)"):
        jax.block_until_ready(fj.attention(q, k, v, window=(-2, -1)))


def test_import_without_jax_names_it():
    code = ("import sys; sys.modules['jax'] = None\n"
            "try:\n    import flashgqa.jax\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "flashgqa.jax needs jax" in out.stdout, out.stdout + out.stderr
