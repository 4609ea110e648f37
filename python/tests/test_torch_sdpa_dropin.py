"""flashgqa.torch.scaled_dot_product_attention against torch.nn.functional's: the same results
(within the two-sided bounds of error_bounds.py, as test_against_torch_sdpa.py) and gradients
(backward_bounds.py, as test_backward.py), the layouts SDPA takes, and a clear error for what the
drop-in does not do.

Precision follows the input dtype (float32 and float16: "f32"; bfloat16: "bf16"), so the
operands are identical on both sides; SDPA's is_causal is top-left (flashgqa's causal_offset=0).
"""
import numpy as np
import pytest
import torch

import flashgqa
import flashgqa.torch as ft
from backward_bounds import BackwardReference, flashgqa_side, torch_side
from error_bounds import as_f64, assert_within
from test_against_torch_sdpa import bounds, make_inputs, shape_id
from test_backward import check

F = torch.nn.functional

# (B, K, G, T, S, H)
SHAPES = [(1, 1, 1, 1, 1, 8), (2, 2, 3, 17, 40, 16), (1, 4, 2, 50, 33, 128)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matches_sdpa(rng, shape, dtype, causal):
    q, k, v = make_inputs(rng, shape, dtype, fa_layout=shape[0] == 2)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    got = ft.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert isinstance(got, torch.Tensor) and got.dtype == q.dtype and got.shape == q.shape
    precision = "bf16" if dtype == "bfloat16" else "f32"
    assert_within(got, want, *bounds(q, k, v, dtype, precision, 0 if causal else None),
                  f"drop-in vs SDPA ({dtype})")


@pytest.mark.parametrize("layout", ["3d", "6d", "kv-heads-1", "mha"])
def test_layouts_sdpa_takes(rng, layout):
    # [Hq, T, H] (no batch), two leading batch dimensions, K = 1 and K = Hq without enable_gqa
    # (SDPA broadcasts one kv head).
    shape = {"3d": (1, 2, 3, 9, 12, 16), "6d": (6, 2, 2, 9, 12, 16),
             "kv-heads-1": (2, 1, 4, 9, 12, 16), "mha": (2, 3, 1, 9, 12, 16)}[layout]
    q, k, v = make_inputs(rng, shape, "float32")
    max_bound, mean_bound = bounds(q, k, v, "float32", "f32", 0)
    gqa = layout in ("3d", "6d")
    if layout == "3d":
        q, k, v, max_bound = q[0], k[0], v[0], max_bound[0]
    elif layout == "6d":
        q, k, v = (x.unflatten(0, (2, 3)) for x in (q, k, v))
        max_bound = max_bound.reshape(q.shape)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    got = ft.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    assert got.shape == q.shape
    assert_within(got, want, max_bound, mean_bound, f"drop-in vs SDPA ({layout})")


def test_scale_and_precision_reach_flashgqa(rng):
    for dtype, precision in [("float32", "f32"), ("float16", "f32"), ("bfloat16", "bf16")]:
        q, k, v = make_inputs(rng, (1, 2, 2, 7, 10, 32), dtype)
        got = ft.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.7, enable_gqa=True)
        want = flashgqa.attention(q, k, v, causal=True, causal_offset=0, scale=0.7,
                                  precision=precision)
        assert torch.equal(got, want), dtype


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_gradients_match_sdpa_autograd(rng, shape, causal):
    # float32, each side's bound against the float64 gradients (flashgqa's flash forward and
    # torch's: up to S running-max corrections).
    B, K, G, T, S, H = shape
    q, k, v = make_inputs(rng, shape, "float32")
    dout = torch.from_numpy(rng.standard_normal((B, K * G, T, H), dtype=np.float32))
    grads = []
    for sdpa in (F.scaled_dot_product_attention, ft.scaled_dot_product_attention):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        sdpa(*leaves, is_causal=causal, enable_gqa=True).backward(dout)
        grads.append([x.grad for x in leaves])
    want, got = grads
    five = lambda x: as_f64(x).reshape(B, K, G, T, H)
    ref = BackwardReference(five(q), as_f64(k), as_f64(v), five(dout), scale=H**-0.5,
                            causal_offset=0 if causal else None)
    check(want, None, ref, [torch_side("float32", S)], "float32", "SDPA autograd vs float64")
    check(got, want, ref, [flashgqa_side("f32", "float32", corrections=S),
                           torch_side("float32", S)], "float32", "drop-in vs SDPA autograd")


def test_what_it_does_not_do_raises():
    q, k = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 6, 16)
    sdpa = ft.scaled_dot_product_attention
    cases = [
        (dict(attn_mask=torch.ones(5, 6, dtype=torch.bool)), NotImplementedError, r"^attn_mask: "),
        (dict(dropout_p=0.1), NotImplementedError, r"^dropout_p: 0.1, expected 0.0"),
        (dict(enable_gqa=False), RuntimeError, r"query has 4 heads, key 2: pass enable_gqa=True"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            sdpa(q, k, k, **kwargs)
    # SDPA itself raises for heads that do not broadcast.
    with pytest.raises(RuntimeError, match="must match the size"):
        F.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match=r"^key: tensor on device meta, expected a CPU tensor"):
        sdpa(q, k.to("meta"), k, enable_gqa=True)
    with pytest.raises(NotImplementedError, match=r"^value: head dim 8, expected query's 16"):
        sdpa(q, k, torch.randn(1, 2, 6, 8), enable_gqa=True)
    with pytest.raises(ValueError, match=r"^key, value: leading dimensions \[2\] and \[1\], "
                                         r"expected query's \[1\]"):
        sdpa(q, torch.randn(2, 2, 6, 16), k, enable_gqa=True)
    with pytest.raises(ValueError, match=r"^query: rank 2"):
        sdpa(q[0, 0], k, k)
    with pytest.raises(TypeError, match=r"^q: dtype torch.float64"):
        sdpa(q.double(), k.double(), k.double(), enable_gqa=True)
    with pytest.raises(TypeError, match=r"^value: got ndarray, expected a torch.Tensor"):
        sdpa(q, k, k.numpy(), enable_gqa=True)
