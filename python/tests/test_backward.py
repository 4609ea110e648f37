"""flashgqa.attention_backward against jax.grad of the seed's attn_naive, torch autograd of
scaled_dot_product_attention and the float64 gradients, each comparison judged by the derived
bounds of backward_bounds.py; layouts and kinds, thread-count bit identity, rows that see no key,
errors.

jax, torch and ml_dtypes are required here (not skipped): the backward has no other Python check.
The out and lse the backward reads come from flashgqa's forward with algo="naive" where a bound
is checked (no running-max corrections: its out and lse are the most accurate, and the bound
charges the backward alone); the tests of the default path use the default forward.
"""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import flashgqa
from backward_bounds import (SEED_BF16, SEED_F32, BackwardReference, flashgqa_side,
                             torch_side)
from error_bounds import as_f64, assert_within, operands
from seed import attn_naive, attn_naive_f32

F = torch.nn.functional
NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
GRADS = ("dq", "dk", "dv")


def shape_id(shape):
    return "B{}K{}G{}T{}S{}H{}".format(*shape[:6])


def random_inputs(rng, shape, dtype, q_scale=1.0):
    """q, dout [B,K,G,T,H], k, v [B,K,S,H] as numpy arrays of `dtype`."""
    B, K, G, T, S, H = shape
    dt = NP_DTYPES[dtype]
    q = (rng.standard_normal((B, K, G, T, H)) * q_scale).astype(dt)
    k = rng.standard_normal((B, K, S, H)).astype(dt)
    v = rng.standard_normal((B, K, S, H)).astype(dt)
    dout = rng.standard_normal((B, K, G, T, H)).astype(dt)
    return q, k, v, dout


def naive_forward(q, k, v, **options):
    """flashgqa's forward with its lse, as a training step keeps them (algo naive: see above)."""
    return flashgqa.attention(q, k, v, algo="naive", return_lse=True, **options)


def check(got, want, ref, sides, dtype, what):
    """Each of (dq, dk, dv) in `got` against `want` (the exact float64 gradients when None) within
    the bound of `sides` for results of `dtype`; any layout, reshaped to the reference's."""
    bounds = ref.bounds(sides, dtype)
    want = want if want is not None else [ref.grads[g] for g in GRADS]
    for name, g, w in zip(GRADS, got, want):
        exact = ref.grads[name]
        assert_within(as_f64(g).reshape(exact.shape), as_f64(w).reshape(exact.shape),
                      *bounds[name], f"{what}: {name}")


# ---- Against jax.grad of the seed's attn_naive. ----

# (B, K, G, T, S, H, sharpness): sharpness multiplies the logits (peakier softmax).
SEED_CASES = [
    (1, 1, 1, 1, 8, 8, 1.0),
    (2, 2, 3, 17, 48, 16, 1.0),
    (1, 2, 4, 64, 128, 64, 1.0),
    (1, 1, 2, 33, 96, 128, 3.0),
    (1, 2, 1, 40, 24, 40, 1.0),
]


def seed_grads(fn, q, k, v, dout):
    """jax.grad of L = sum(fn(q, k, v) * dout) with respect to q, k and v."""
    d = jnp.asarray(dout, dtype=jnp.float32)

    def loss(q, k, v):
        return jnp.sum(fn(q, k, v).astype(jnp.float32) * d)

    return jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", SEED_CASES, ids=shape_id)
def test_matches_jax_grad_of_seed(rng, case, dtype):
    # float32: jax.grad of seed.attn_naive_f32 (the seed's code at float32) against precision
    # "f32". The bound (backward_bounds.py) is rho, the relative error of a recomputed weight
    # (about 3 (gamma(H) + 4 u32) A, A the largest |logit| sum, plus a few eps_exp), and the fp32
    # sums gamma(H), gamma(S), gamma(G T), times sums of absolute terms: about 3e-3 of a
    # gradient's rms per element, 1e-3 of its mean |g| on average. bfloat16: the seed's own
    # attn_naive against "bf16", adding 2^-8 for each rounding to bf16 either side makes (P, dS,
    # the seed's dP, the stored out that D reads, the result): about 0.3 of the rms per element,
    # and, as those roundings are independent (their sum grows as the root of the number of
    # terms), 4% of the mean |g| on average. test_planted_errors_are_caught shows both catch a
    # relative error of 2^-6.
    B, K, G, T, S, H, sharp = case
    q, k, v, dout = random_inputs(rng, case[:6], dtype, q_scale=H**-0.5 * sharp)
    precision = "f32" if dtype == "float32" else "bf16"
    seed_side = SEED_F32 if dtype == "float32" else SEED_BF16
    want = seed_grads(attn_naive_f32 if dtype == "float32" else attn_naive, q, k, v, dout)

    out, lse = naive_forward(q, k, v, scale=1.0, precision=precision)
    got = flashgqa.attention_backward(dout, q, k, v, out, lse, scale=1.0, precision=precision)
    assert [type(g) for g in got] == [np.ndarray] * 3
    assert [g.dtype for g in got] == [q.dtype] * 3
    assert [g.shape for g in got] == [q.shape, k.shape, v.shape]

    ref = BackwardReference(as_f64(q), as_f64(k), as_f64(v), as_f64(dout), scale=1.0)
    check(want, None, ref, [seed_side], dtype, "jax.grad of the seed vs float64")  # the derivation
    check(got, want, ref, [flashgqa_side(precision, dtype), seed_side], dtype,
          f"flashgqa vs jax.grad of the seed ({dtype})")


# ---- Against torch autograd of scaled_dot_product_attention. ----

# (B, K, G, T, S, H)
TORCH_SHAPES = [
    (1, 1, 1, 1, 1, 8),
    (2, 2, 3, 17, 40, 16),
    (1, 2, 4, 64, 64, 64),
    (1, 4, 2, 50, 33, 128),
    (2, 1, 3, 5, 70, 40),
]


@pytest.mark.parametrize("scale", [None, 0.3], ids=["default-scale", "scale0.3"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", TORCH_SHAPES, ids=shape_id)
def test_matches_torch_sdpa_autograd(rng, shape, causal, scale):
    # SDPA's layouts (q [B, Hq, T, H]) in float32; is_causal is top-left: causal_offset=0. Torch's
    # side of the bound: float32 roundings and a forward out with up to S corrections.
    B, K, G, T, S, H = shape

    def tensor(*dims):
        return torch.from_numpy(rng.standard_normal(dims, dtype=np.float32))

    q, k, v = (tensor(B, K * G, T, H).requires_grad_(), tensor(B, K, S, H).requires_grad_(),
               tensor(B, K, S, H).requires_grad_())
    dout = tensor(B, K * G, T, H)
    F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                   enable_gqa=True).backward(dout)
    want = (q.grad, k.grad, v.grad)

    options = dict(causal=causal, causal_offset=0 if causal else None, scale=scale,
                   precision="f32")
    out, lse = naive_forward(q, k, v, **options)
    assert lse.shape == (B, K * G, T)
    got = flashgqa.attention_backward(dout, q, k, v, out, lse, **options)
    assert all(isinstance(g, torch.Tensor) and not g.requires_grad for g in got)
    assert [g.dtype for g in got] == [torch.float32] * 3
    assert [g.shape for g in got] == [q.shape, k.shape, v.shape]

    ref = BackwardReference(as_f64(q).reshape(B, K, G, T, H), as_f64(k), as_f64(v),
                            as_f64(dout).reshape(B, K, G, T, H),
                            scale=H**-0.5 if scale is None else scale,
                            causal_offset=0 if causal else None)
    check(want, None, ref, [torch_side("float32", S)], "float32", "torch autograd vs float64")
    check(got, want, ref, [flashgqa_side("f32", "float32"), torch_side("float32", S)], "float32",
          "flashgqa vs torch autograd of SDPA")


# ---- Against the float64 gradients: awkward shapes, causal offsets, precisions. ----

AWKWARD_SHAPES = [
    (1, 2, 1, 7, 30, 40),     # T < S, G = 1, H = 40
    (1, 1, 3, 30, 7, 40),     # T > S, G = 3
    (2, 1, 3, 19, 19, 128),   # H = 128
    (1, 2, 1, 5, 64, 128),
    (1, 1, 3, 64, 9, 40),
]
# (input dtype, precision): float32 at "f32", bfloat16 at "bf16", float32 at the default "bf16",
# whose operands (q, k, v, dout) are rounded to bf16 inside (the reference takes them rounded, and
# the side charges D a bf16 rounding for a dout it may read unrounded), and float16 at "f32".
PRECISIONS = [("float32", "f32"), ("bfloat16", "bf16"), ("float32", "bf16"), ("float16", "f32")]


@pytest.mark.parametrize("offset", ["full", "default", 0, 3], ids=lambda o: f"causal-{o}")
@pytest.mark.parametrize("dtype, precision", PRECISIONS, ids=lambda x: str(x))
@pytest.mark.parametrize("shape", AWKWARD_SHAPES, ids=shape_id)
def test_awkward_shapes_against_float64(rng, shape, dtype, precision, offset):
    B, K, G, T, S, H = shape
    q, k, v, dout = random_inputs(rng, shape, dtype)
    causal = offset != "full"
    causal_offset = offset if isinstance(offset, int) else None
    options = dict(causal=causal, causal_offset=causal_offset, precision=precision)
    out, lse = naive_forward(q, k, v, **options)
    got = flashgqa.attention_backward(dout, q, k, v, out, lse, **options)
    ref = BackwardReference(*(operands(x, precision) for x in (q, k, v, dout)), scale=H**-0.5,
                            causal_offset=(S - T if offset == "default" else causal_offset)
                            if causal else None)
    side = flashgqa_side(precision, "bfloat16" if precision == "bf16" else dtype)
    check(got, None, ref, [side], dtype, f"{dtype} at {precision} vs float64")


PLANTED = {
    "D left out": lambda args: dict(args, out=np.zeros_like(args["out"])),
    "mask one key wider": lambda args: dict(args, causal_offset=args["causal_offset"] + 1),
}


@pytest.mark.parametrize("plant", [*PLANTED, "gradients 2^-6 too large"])
@pytest.mark.parametrize("dtype, precision", PRECISIONS[:2], ids=lambda x: str(x))
def test_planted_errors_are_caught(rng, dtype, precision, plant):
    # The bounds are tight enough to matter: a backward that forgets D, that lets a query see one
    # key too many, or whose gradients are 2^-6 too large (not a formula error: a relative error
    # of the size of a few bf16 roundings) fails the check; the unplanted call passes.
    shape = (2, 2, 3, 17, 48, 16)
    B, K, G, T, S, H = shape
    q, k, v, dout = random_inputs(rng, shape, dtype)
    args = dict(dout=dout, q=q, k=k, v=v, causal=True, causal_offset=S - T, precision=precision)
    args["out"], args["lse"] = naive_forward(q, k, v, causal=True, precision=precision)
    ref = BackwardReference(*(operands(x, precision) for x in (q, k, v, dout)), scale=H**-0.5,
                            causal_offset=S - T)
    sides = [flashgqa_side(precision, dtype)]
    check(flashgqa.attention_backward(**args), None, ref, sides, dtype, "unplanted")
    if plant in PLANTED:
        got = flashgqa.attention_backward(**PLANTED[plant](args))
    else:
        got = [as_f64(g) * (1 + 2**-6) for g in flashgqa.attention_backward(**args)]
    with pytest.raises(AssertionError, match=r"out of bound|mean error"):
        check(got, None, ref, sides, dtype, plant)


def test_sdpa_layout_is_the_5d_layout(rng):
    q, k, v, dout = random_inputs(rng, (2, 2, 3, 6, 9, 16), "bfloat16")
    out, lse = flashgqa.attention(q, k, v, causal=True, return_lse=True)
    grads5 = flashgqa.attention_backward(dout, q, k, v, out, lse, causal=True)
    four = [x.reshape(2, 6, 6, 16) for x in (q, dout, out)]
    q4, dout4, out4 = four
    grads4 = flashgqa.attention_backward(dout4, q4, k, v, out4, lse.reshape(2, 6, 6), causal=True)
    assert grads4[0].shape == q4.shape
    for g4, g5 in zip(grads4, grads5):
        np.testing.assert_array_equal(g4.reshape(g5.shape).view(np.uint16), g5.view(np.uint16))


# ---- The default path: threads, rows that see no key, kinds, a training step. ----


def bits(a):
    return np.asarray(a).view(np.uint8)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_threads_give_identical_bits(rng, dtype, causal):
    q, k, v, dout = random_inputs(rng, (1, 2, 3, 150, 170, 64), dtype)
    out, lse = flashgqa.attention(q, k, v, causal=causal, return_lse=True)
    one = flashgqa.attention_backward(dout, q, k, v, out, lse, causal=causal, threads=1)
    two = flashgqa.attention_backward(dout, q, k, v, out, lse, causal=causal, threads=2)
    for name, a, b in zip(GRADS, one, two):
        assert np.array_equal(bits(a), bits(b)), f"{name}: threads=1 and threads=2 differ"


@pytest.mark.parametrize("offset", [-3, -100], ids=["first-rows-empty", "all-rows-empty"])
def test_rows_that_see_no_key(rng, offset):
    # Query t sees keys j <= t + offset: with offset -3 rows 0..2 see none, with -100 no row
    # sees any. Their lse is -inf; their dq is zero and they add nothing to dk and dv.
    B, K, G, T, S, H = 1, 2, 2, 8, 6, 16
    q, k, v, dout = random_inputs(rng, (B, K, G, T, S, H), "float32")
    out, lse = flashgqa.attention(q, k, v, causal=True, causal_offset=offset, precision="f32",
                                  return_lse=True)
    empty = min(max(-offset, 0), T)
    assert np.isneginf(lse[..., :empty]).all() and np.isfinite(lse[..., empty:]).all()
    dq, dk, dv = flashgqa.attention_backward(dout, q, k, v, out, lse, causal=True,
                                             causal_offset=offset, precision="f32")
    assert (dq[..., :empty, :] == 0).all()
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    ref = BackwardReference(as_f64(q), as_f64(k), as_f64(v), as_f64(dout), scale=H**-0.5,
                            causal_offset=offset)
    # The default (flash) forward: up to S corrections in its out and lse.
    check((dq, dk, dv), None, ref, [flashgqa_side("f32", "float32", corrections=S)], "float32",
          "rows without keys vs float64")
    if empty == T:
        assert (dk == 0).all() and (dv == 0).all()


@pytest.mark.parametrize("T, S", [(0, 5), (4, 0), (0, 0)])
def test_empty_shapes_give_zero_gradients(rng, T, S):
    q, k, v, dout = random_inputs(rng, (1, 2, 2, T, S, 8), "float32")
    out, lse = flashgqa.attention(q, k, v, return_lse=True)
    grads = flashgqa.attention_backward(dout, q, k, v, out, lse)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert all((g == 0).all() for g in grads)


def test_results_take_the_kinds_of_q_and_k(rng):
    q, k, v, dout = random_inputs(rng, (1, 2, 2, 9, 11, 16), "bfloat16")
    out, lse = flashgqa.attention(q, k, v, return_lse=True)
    want = flashgqa.attention_backward(dout, q, k, v, out, lse)

    # jax in, jax out.
    got = flashgqa.attention_backward(*(jnp.asarray(x) for x in (dout, q, k, v, out, lse)))
    for g, w in zip(got, want):
        assert isinstance(g, jax.Array) and g.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(g).view(np.uint16), w.view(np.uint16))

    # q numpy (and dout, out, lse with it), k and v torch: dq numpy, dk and dv torch.
    tk, tv = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) for x in (k, v))
    dq, dk, dv = flashgqa.attention_backward(dout, q, tk, tv, out, lse)
    assert isinstance(dq, np.ndarray) and dq.dtype == ml_dtypes.bfloat16
    assert isinstance(dk, torch.Tensor) and dk.dtype == torch.bfloat16 and dk.shape == tk.shape
    np.testing.assert_array_equal(dq.view(np.uint16), want[0].view(np.uint16))
    np.testing.assert_array_equal(dk.view(torch.int16).numpy().view(np.uint16),
                                  want[1].view(np.uint16))
    np.testing.assert_array_equal(dv.view(torch.int16).numpy().view(np.uint16),
                                  want[2].view(np.uint16))


def test_nothing_is_copied(rng):
    # FlashAttention's memory [B, T, Hq, H] / [B, S, K, H], passed as SDPA-layout views.
    B, K, G, T, S, H = 1, 2, 3, 5, 7, 16
    q, dout = (torch.randn(B, T, K * G, H).transpose(1, 2) for _ in range(2))
    k, v = (torch.randn(B, S, K, H).transpose(1, 2) for _ in range(2))
    out, lse = flashgqa.attention(q, k, v, return_lse=True)
    dq, dk, dv = (torch.empty(B, K * G, T, H), torch.empty(B, K, S, H), torch.empty(B, K, S, H))
    views = flashgqa._flashgqa._backward_views(dout, q, k, v, out, lse, dq, dk, dv)
    for name, t in dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse, dq=dq, dk=dk, dv=dv).items():
        assert views[name]["data"] == t.data_ptr(), name
    assert views["q"]["shape"] == (B, K, G, T, H)
    assert views["q"]["strides"] == (T * K * G * H, G * H, H, K * G * H, 1)
    assert views["lse"]["shape"] == (B, K, G, T)


class Attention(torch.autograd.Function):
    """python/README.md's example: flashgqa's forward and backward as a torch autograd op
    (SDPA's layout, top-left causal)."""

    @staticmethod
    def forward(ctx, q, k, v):
        out, lse = flashgqa.attention(q, k, v, causal=True, causal_offset=0, precision="f32",
                                      return_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        # autograd may hand over a broadcast dout (stride 0); flashgqa needs H contiguous.
        return flashgqa.attention_backward(dout.contiguous(), q, k, v, out, lse, causal=True,
                                           causal_offset=0, precision="f32")


def test_training_step(rng):
    # A training step through the README's autograd op gives SDPA's gradients (the default flash
    # forward: up to S corrections in its out and lse).
    B, K, G, T, S, H = 2, 2, 4, 100, 100, 64

    def leaves():
        torch.manual_seed(0)
        return [torch.randn(B, K * G, T, H, requires_grad=True),
                torch.randn(B, K, S, H, requires_grad=True),
                torch.randn(B, K, S, H, requires_grad=True)]

    target = torch.from_numpy(rng.standard_normal((B, K * G, T, H), dtype=np.float32))
    ours, theirs = leaves(), leaves()
    (Attention.apply(*ours) * target).sum().backward()
    (F.scaled_dot_product_attention(*theirs, is_causal=True, enable_gqa=True) * target).sum() \
        .backward()
    q, k, v = ours
    ref = BackwardReference(as_f64(q).reshape(B, K, G, T, H), as_f64(k), as_f64(v),
                            as_f64(target).reshape(B, K, G, T, H), scale=H**-0.5, causal_offset=0)
    check([x.grad for x in ours], [x.grad for x in theirs], ref,
          [flashgqa_side("f32", "float32", corrections=S), torch_side("float32", S)], "float32",
          "training step vs SDPA")
    # A loss whose gradient autograd broadcasts (dout of stride 0) goes through .contiguous().
    q, k, v = leaves()
    Attention.apply(q, k, v).sum().backward()
    assert q.grad.shape == q.shape and torch.isfinite(q.grad).all()


# ---- Errors. ----

B, K, G, T, S, H = 1, 2, 3, 4, 5, 8


def backward_args():
    rng = np.random.default_rng(0)
    q, k, v, dout = random_inputs(rng, (B, K, G, T, S, H), "float32")
    out, lse = flashgqa.attention(q, k, v, return_lse=True)
    return dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse)


@pytest.mark.parametrize(
    "name, change, error, match",
    [
        ("dout", lambda a: a[..., :4], ValueError, r"dout: shape \[1,2,3,4,4\]"),
        ("dout", lambda a: a[:, :, :2], ValueError, r"dout: shape \[1,2,2,4,8\]"),
        ("out", lambda a: a[..., :3, :], ValueError, r"out: shape \[1,2,3,3,8\]"),
        ("lse", lambda a: a[..., :3], ValueError, r"lse: shape \[1,2,3,3\]"),
        ("lse", lambda a: a[..., None], ValueError, r"lse: rank 5"),
        ("lse", lambda a: a.astype(np.float64), TypeError,
         r"lse: dtype float64, expected float32$"),
        ("lse", lambda a: a.astype(ml_dtypes.bfloat16), TypeError,
         r"lse: dtype bfloat16, expected float32$"),
        ("dout", lambda a: a.astype(np.float16), TypeError,
         r"dout: dtype float16, expected q's dtype float32"),
        ("out", lambda a: a.astype(np.float64), TypeError,
         r"out: dtype float64, expected float32, bfloat16 or float16"),
        ("dout", torch.from_numpy, TypeError,
         r"dout: a torch tensor, expected a numpy array \(or other buffer\), the kind of q"),
        ("out", jnp.asarray, TypeError, r"out: a jax array, expected a numpy array"),
        ("lse", torch.from_numpy, TypeError, r"lse: a torch tensor, expected a numpy array"),
        ("dout", lambda a: None, TypeError, r"dout: got NoneType, expected a CPU array"),
        ("dout", lambda a: a[..., ::2], ValueError, r"dout: .*stride"),
    ],
    ids=["dout-H", "dout-G", "out-T", "lse-T", "lse-rank", "lse-f64", "lse-bf16", "dout-f16",
         "out-f64", "dout-torch", "out-jax", "lse-torch", "dout-None", "dout-stride"],
)
def test_bad_arguments_name_the_argument(name, change, error, match):
    args = backward_args()
    args[name] = change(args[name])
    with pytest.raises(error, match=match):
        flashgqa.attention_backward(**args)


def test_numpy_gradient_with_torch_q_is_refused():
    args = {name: torch.from_numpy(a) for name, a in backward_args().items()}
    args["dout"] = args["dout"].numpy()
    with pytest.raises(TypeError, match=r"dout: a numpy array \(or other buffer\), expected a "
                                        r"torch tensor, the kind of q"):
        flashgqa.attention_backward(**args)


def test_sdpa_layout_lse_must_be_3d():
    args = backward_args()
    for name in ("q", "dout", "out"):
        args[name] = args[name].reshape(B, K * G, T, H)
    with pytest.raises(ValueError, match=r"lse: .*\(K from k\)|lse: rank"):
        flashgqa.attention_backward(**args)  # lse still [B, K, G, T]
    args["lse"] = args["lse"].reshape(B, K * G, T)
    flashgqa.attention_backward(**args)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(precision="fp8"), ValueError, r"precision: unknown precision 'fp8'"),
        (dict(threads=-2), ValueError, r"threads: -2, expected >= 0"),
        (dict(block_kv=2.5), TypeError, r"block_kv: 2.5, expected an int or None"),
        (dict(causal_offset=2**63), ValueError, r"causal_offset: 9223372036854775808 does not "
                                                r"fit in a C\+\+ int64"),
        (dict(scale=float("nan")), ValueError, r"scale: .*, expected a finite number"),
    ],
    ids=["precision", "threads", "block-type", "offset-range", "scale-nan"],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        flashgqa.attention_backward(**backward_args(), causal=True, **kwargs)
