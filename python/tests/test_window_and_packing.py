"""Sliding windows (window=(left, right)) and packed sequences (cu_seqlens_q/k, the 3-D layout).

Masks are written here independently of the library (error_bounds.window_mask, FlashAttention's
rules) and checked three ways: against torch's SDPA with that mask as an explicit attn_mask (and
with one SDPA call per packed sequence), against jax.nn.dot_product_attention's local_window_size,
and the gradients against torch autograd and the float64 reference. Rows that see no key are 0 in
flashgqa (lse -inf) where SDPA returns NaN: they are compared apart. Bounds: error_bounds.py.
"""
import numpy as np
import pytest
import torch

import flashgqa
from backward_bounds import BackwardReference, flashgqa_side, torch_side
from error_bounds import ROUNDOFF, U32, Reference, as_f64, assert_within, operands, window_mask

F = torch.nn.functional
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GRADS = ("dq", "dk", "dv")


def sdpa(q, k, v, mask):
    """SDPA with a [T, S] bool mask (True: the key takes part), GQA; q [B, Hq, T, H]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(mask),
                                          enable_gqa=True)


def bounds(q, k, v, dtype, precision, mask):
    """Two-sided bounds (flashgqa, torch) of [B, Hq, T, H] results for the mask."""
    B, Hq, T, H = q.shape
    K, S = k.shape[1], k.shape[2]
    ref = Reference(as_f64(q).reshape(B, K, Hq // K, T, H), as_f64(k), as_f64(v),
                    scale=H**-0.5, mask=mask)
    ours = (ROUNDOFF["bfloat16"] if precision == "bf16" else U32, S)
    theirs = (ROUNDOFF[dtype], S)
    max_bound, mean_bound = ref.softmax_bounds([ours, theirs], ROUNDOFF[dtype])
    return max_bound.reshape(B, Hq, T, H), mean_bound


def compare_seen_rows(got, want, q, k, v, dtype, precision, mask, what):
    """Rows that see a key within the bound of both sides; the others 0 in flashgqa."""
    seen = mask.any(axis=1)
    max_bound, mean_bound = bounds(q, k, v, dtype, precision, mask)
    assert_within(got[:, :, seen], want[:, :, seen], max_bound[:, :, seen], mean_bound, what)
    assert (as_f64(got[:, :, ~seen]) == 0).all(), f"{what}: rows that see no key are not 0"


# (left, right, causal, causal_offset)
WINDOWS = [(5, 3, False, None), (0, 0, False, None), (16, -1, True, None), (-1, 7, False, 0),
           (8, 2, False, 0), (3, 40, True, 4), (100, 100, False, -10)]
WINDOW_SHAPES = [(1, 2, 2, 37, 53, 16), (2, 1, 3, 40, 40, 64), (1, 2, 1, 20, 70, 128)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("shape", WINDOW_SHAPES, ids=lambda s: "B{}K{}G{}T{}S{}H{}".format(*s))
def test_window_matches_sdpa_with_mask(rng, shape, window, dtype):
    B, K, G, T, S, H = shape
    left, right, causal, offset = window
    tdt = TORCH_DTYPES[dtype]
    q = torch.from_numpy(rng.standard_normal((B, K * G, T, H), dtype=np.float32)).to(tdt)
    k = torch.from_numpy(rng.standard_normal((B, K, S, H), dtype=np.float32)).to(tdt)
    v = torch.from_numpy(rng.standard_normal((B, K, S, H), dtype=np.float32)).to(tdt)
    precision = "bf16" if dtype == "bfloat16" else "f32"
    mask = window_mask(T, S, causal, offset, (left, right))
    got, lse = flashgqa.attention(q, k, v, causal=causal, causal_offset=offset,
                                  window=(left, right), precision=precision, block_q=16,
                                  block_kv=32, return_lse=True)
    compare_seen_rows(got, sdpa(q, k, v, mask), q, k, v, dtype, precision, mask,
                      f"window {window} vs SDPA with mask")
    assert (lse[:, :, ~mask.any(axis=1)] == -np.inf).all()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window", [(4, 4), (7, 0), (0, 9), (30, 2)], ids=str)
def test_window_matches_jax_local_window(rng, window, causal):
    # jax.nn.dot_product_attention's local_window_size (left, right), T = S (its windows are
    # aligned top-left, which is FlashAttention's bottom-right when T = S). Layout [B, T, N, H].
    import jax
    import jax.numpy as jnp

    B, K, G, T, H = 2, 2, 3, 45, 32
    q = rng.standard_normal((B, T, K * G, H), dtype=np.float32)
    k = rng.standard_normal((B, T, K, H), dtype=np.float32)
    v = rng.standard_normal((B, T, K, H), dtype=np.float32)
    want = jax.nn.dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                        is_causal=causal, local_window_size=window)
    # flashgqa reads the same memory as strided views: q [B, Hq, T, H], k, v [B, K, S, H].
    qt, kt, vt = (np.swapaxes(x, 1, 2) for x in (q, k, v))
    got = flashgqa.attention(qt, kt, vt, causal=causal, window=window, precision="f32")
    mask = window_mask(T, T, causal, None, window)
    max_bound, mean_bound = bounds(torch.from_numpy(qt), torch.from_numpy(kt),
                                   torch.from_numpy(vt), "float32", "f32", mask)
    assert_within(got, np.swapaxes(np.asarray(want), 1, 2), max_bound, mean_bound,
                  f"window {window} vs jax local_window_size")


# (T_i, S_i) per sequence; the first packing has empty sequences and rows that see no key.
PACKINGS = [
    [(37, 53), (1, 1), (0, 6), (20, 70), (9, 0)],
    [(64, 64), (13, 13), (30, 41)],
]


def cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


@pytest.mark.parametrize("mask_kind", ["full", "causal", "causal-window", "window"])
@pytest.mark.parametrize("packing", range(len(PACKINGS)))
def test_packed_layout_matches_one_sdpa_call_per_sequence(rng, packing, mask_kind):
    # FlashAttention's varlen layout: q [total_q, Hq, H], k, v [total_k, K, H], lse [total_q, Hq].
    seqs = PACKINGS[packing]
    cu_q, cu_k = cu([t for t, _ in seqs]), cu([s for _, s in seqs])
    T, S = int(cu_q[-1]), int(cu_k[-1])
    K, G, H = 2, 3, 64
    causal = mask_kind.startswith("causal")
    win = (6, 2) if mask_kind == "window" else (9, -1) if mask_kind == "causal-window" else (-1, -1)
    q = torch.from_numpy(rng.standard_normal((T, K * G, H), dtype=np.float32))
    k = torch.from_numpy(rng.standard_normal((S, K, H), dtype=np.float32))
    v = torch.from_numpy(rng.standard_normal((S, K, H), dtype=np.float32))
    got, lse = flashgqa.attention(q, k, v, causal=causal, window=win, cu_seqlens_q=cu_q,
                                  cu_seqlens_k=torch.from_numpy(cu_k).long(), precision="f32",
                                  return_lse=True)
    assert got.shape == q.shape and lse.shape == (T, K * G)
    mask = window_mask(T, S, causal, None, win, (cu_q, cu_k))
    # One SDPA call per sequence, each with its own mask, concatenated.
    want = torch.zeros(T, K * G, H)
    for i, (Ti, Si) in enumerate(seqs):
        if Ti == 0 or Si == 0:
            continue
        qs, ks, vs = (x.transpose(0, 1)[None] for x in (q[cu_q[i]:cu_q[i + 1]],
                                                          k[cu_k[i]:cu_k[i + 1]],
                                                          v[cu_k[i]:cu_k[i + 1]]))
        out = sdpa(qs, ks, vs, window_mask(Ti, Si, causal, None, win))
        want[cu_q[i]:cu_q[i + 1]] = out[0].transpose(0, 1)
    as4 = lambda x: x.transpose(0, 1)[None]  # [total, heads, H] -> [1, heads, total, H]
    seen = mask.any(axis=1)
    want4 = torch.where(torch.from_numpy(seen)[None, None, :, None], as4(want), 0.0)
    compare_seen_rows(as4(got), want4, as4(q), as4(k), as4(v), "float32", "f32", mask,
                      f"packing {seqs} {mask_kind} vs SDPA per sequence")
    assert (lse[~seen] == -np.inf).all() and torch.isfinite(lse[seen]).all()
    # The same problem in the 4-D layout (a view with B = 1) gives the same bits.
    got4 = flashgqa.attention(as4(q), as4(k), as4(v), causal=causal, window=win,
                              cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, precision="f32")
    assert torch.equal(as4(got), got4)


def test_packed_threads_give_identical_bits(rng):
    seqs = PACKINGS[0]
    cu_q, cu_k = cu([t for t, _ in seqs]), cu([s for _, s in seqs])
    q = rng.standard_normal((int(cu_q[-1]), 4, 128), dtype=np.float32)
    k = rng.standard_normal((int(cu_k[-1]), 2, 128), dtype=np.float32)
    runs = [flashgqa.attention(q, k, k, causal=True, window=(11, -1), cu_seqlens_q=cu_q,
                               cu_seqlens_k=cu_k, threads=n, block_q=8, block_kv=32)
            for n in (1, 2)]
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))


def check_grads(got, want, ref, sides, what):
    bounds = ref.bounds(sides, "float32")
    want = want if want is not None else [ref.grads[g] for g in GRADS]
    for name, g, w in zip(GRADS, got, want):
        exact = ref.grads[name]
        assert_within(as_f64(g).reshape(exact.shape), as_f64(w).reshape(exact.shape),
                      *bounds[name], f"{what}: {name}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_backward_matches_torch_autograd_per_sequence(rng, causal):
    # Every row sees a key (S_i >= T_i > 0), so torch's gradients have no NaN rows.
    seqs = [(20, 33), (7, 7), (40, 52)]
    win = (12, -1) if causal else (5, 9)
    cu_q, cu_k = cu([t for t, _ in seqs]), cu([s for _, s in seqs])
    T, S = int(cu_q[-1]), int(cu_k[-1])
    K, G, H = 2, 2, 32
    q, k, v = (torch.from_numpy(rng.standard_normal(s, dtype=np.float32)).requires_grad_()
               for s in ((T, K * G, H), (S, K, H), (S, K, H)))
    dout = torch.from_numpy(rng.standard_normal((T, K * G, H), dtype=np.float32))
    for i, (Ti, Si) in enumerate(seqs):  # torch: one call per sequence; grads land in q, k, v
        qs, ks, vs = (x.transpose(0, 1)[None] for x in (q[cu_q[i]:cu_q[i + 1]],
                                                          k[cu_k[i]:cu_k[i + 1]],
                                                          v[cu_k[i]:cu_k[i + 1]]))
        out = sdpa(qs, ks, vs, window_mask(Ti, Si, causal, None, win))
        out.backward(dout[cu_q[i]:cu_q[i + 1]].transpose(0, 1)[None])
    want = (q.grad, k.grad, v.grad)
    options = dict(causal=causal, window=win, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                   precision="f32")
    out, lse = flashgqa.attention(q, k, v, return_lse=True, **options)
    got = flashgqa.attention_backward(dout, q, k, v, out, lse, **options)
    assert [g.shape for g in got] == [q.shape, k.shape, v.shape]
    as5 = lambda x, heads: as_f64(x).transpose(1, 0, 2).reshape(1, K, heads // K, -1, H)
    ref = BackwardReference(as5(q, K * G), as5(k, K)[:, :, 0], as5(v, K)[:, :, 0],
                            as5(dout, K * G), scale=H**-0.5,
                            mask=window_mask(T, S, causal, None, win, (cu_q, cu_k)))
    to5 = lambda g: [as5(g[0], K * G), as5(g[1], K)[:, :, 0], as5(g[2], K)[:, :, 0]]
    check_grads(to5(want), None, ref, [torch_side("float32", S)], "torch autograd vs float64")
    check_grads(to5(got), to5(want), ref, [flashgqa_side("f32", "float32"),
                                           torch_side("float32", S)],
                "packed flashgqa vs torch autograd per sequence")


@pytest.mark.parametrize("window", [(5, 3), (0, 0), (20, -1)], ids=str)
@pytest.mark.parametrize("dtype, precision", [("float32", "f32"), ("bfloat16", "bf16")])
def test_window_backward_against_float64(rng, window, dtype, precision):
    import ml_dtypes

    B, K, G, T, S, H = 1, 2, 3, 30, 45, 64
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    q, dout = (rng.standard_normal((B, K, G, T, H)).astype(dt) for _ in range(2))
    k, v = (rng.standard_normal((B, K, S, H)).astype(dt) for _ in range(2))
    options = dict(window=window, precision=precision)
    out, lse = flashgqa.attention(q, k, v, return_lse=True, **options)
    got = flashgqa.attention_backward(dout, q, k, v, out, lse, **options)
    ref = BackwardReference(*(operands(x, precision) for x in (q, k, v, dout)), scale=H**-0.5,
                            mask=window_mask(T, S, False, None, window))
    side = flashgqa_side(precision, dtype)
    bounds = ref.bounds([side], dtype)
    for name, g in zip(GRADS, got):
        assert_within(g, ref.grads[name], *bounds[name], f"window {window} {dtype}: {name}")


def test_bad_windows_and_offsets_raise_clear_errors(rng):
    q = rng.standard_normal((1, 1, 2, 5, 8), dtype=np.float32)
    k = rng.standard_normal((1, 1, 7, 8), dtype=np.float32)
    for window, error, text in [("ab", TypeError, "expected None or a pair"),
                                ((1,), TypeError, "expected None or a pair"),
                                ((1.5, 2), TypeError, "window[0]"),
                                ((None, 2), TypeError, "expected None or a pair"),
                                ((-2, 0), ValueError, "expected each side >= 0, or -1"),
                                ((2**63, 0), ValueError, "window[0]")]:
        with pytest.raises(error, match=text.replace("[", r"\[")):
            flashgqa.attention(q, k, k, window=window)
    cu_q, cu_k = np.array([0, 2, 5]), np.array([0, 3, 7])
    flashgqa.attention(q, k, k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)  # fine
    for kwargs, error, text in [
        (dict(cu_seqlens_q=cu_q), ValueError, "one given without the other"),
        (dict(cu_seqlens_q=cu_q.astype(np.float32), cu_seqlens_k=cu_k), TypeError, "array of ints"),
        (dict(cu_seqlens_q=cu_q[None], cu_seqlens_k=cu_k), TypeError, "1-D array of ints"),
        (dict(cu_seqlens_q=[0, 5], cu_seqlens_k=cu_k), ValueError, "lengths 2 and 3"),
        (dict(cu_seqlens_q=[0], cu_seqlens_k=[0]), ValueError, "expected n \\+ 1 >= 2"),
        (dict(cu_seqlens_q=[0, 2**31, 5], cu_seqlens_k=cu_k), ValueError, "int32"),
        (dict(cu_seqlens_q=[0, 6, 5], cu_seqlens_k=cu_k), ValueError, "expected non-decreasing"),
        (dict(cu_seqlens_q=[0, 2, 4], cu_seqlens_k=cu_k), ValueError, "expected T = 5"),
    ]:
        with pytest.raises(error, match=text):
            flashgqa.attention(q, k, k, **kwargs)
    # The packed 3-D layout: sinks must be [K, G] or [Hq] there too (not any K*G values).
    q3, k3 = q[0, 0].transpose(1, 0, 2), k[0].transpose(1, 0, 2)  # q [5, 2, 8], k [7, 1, 8]: G = 2
    flashgqa.attention(q3, k3, k3, sinks=np.zeros((1, 2), np.float32))  # fine
    with pytest.raises(ValueError, match="sinks: shape"):
        flashgqa.attention(q3, k3, k3, sinks=np.zeros((2, 1), np.float32))
    q2 = np.concatenate([q, q])
    with pytest.raises(ValueError, match="expected B = 1"):
        flashgqa.attention(q2, np.concatenate([k, k]), np.concatenate([k, k]),
                           cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match="expected 3 \\[total,K,H\\]"):
        flashgqa.attention(q[0, 0], k, k)
