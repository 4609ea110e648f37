"""flashgqa against torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True).

SDPA's layout is q [B, Hq, T, H], k, v [B, K, S, H], which flashgqa takes as is (4-D q). SDPA's
is_causal mask is top-left (query t sees keys j <= t): flashgqa's causal_offset=0. Its
bottom-right alignment (flashgqa's default offset S - T) is checked through an explicit attn_mask.

Operands are identical on both sides: float32 and float16 inputs run flashgqa at precision "f32"
(no bf16 rounding of the operands, as torch), bfloat16 inputs at the default "bf16". torch's own
weights are rounded at worst to the input dtype. The bound is the two-sided one of error_bounds.py.
"""
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (optional: pip install torch)")
F = torch.nn.functional
if not hasattr(F, "scaled_dot_product_attention"):
    pytest.skip("this torch has no scaled_dot_product_attention", allow_module_level=True)

import flashgqa  # noqa: E402
from error_bounds import ROUNDOFF, U32, Reference, as_f64, assert_within  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# (B, K, G, T, S, H)
SHAPES = [
    (1, 1, 1, 1, 1, 8),
    (2, 2, 3, 17, 40, 16),
    (1, 2, 4, 64, 64, 64),
    (1, 4, 2, 50, 33, 128),
    (2, 1, 8, 5, 200, 32),
]


def shape_id(shape):
    return "B{}K{}G{}T{}S{}H{}".format(*shape)


def sdpa_gqa(q, k, v, **kwargs):
    try:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    except TypeError:  # torch < 2.5: no enable_gqa
        pytest.skip("this torch's scaled_dot_product_attention has no enable_gqa (torch < 2.5)")


def make_inputs(rng, shape, dtype, fa_layout=False):
    """q [B,Hq,T,H], k, v [B,K,S,H] as torch tensors; with fa_layout, strided views of
    FlashAttention's [B,T,Hq,H] / [B,S,K,H] memory."""
    B, K, G, T, S, H = shape
    tdt = TORCH_DTYPES[dtype]
    if fa_layout:
        q = torch.from_numpy(rng.standard_normal((B, T, K * G, H), dtype=np.float32)).to(tdt)
        k = torch.from_numpy(rng.standard_normal((B, S, K, H), dtype=np.float32)).to(tdt)
        v = torch.from_numpy(rng.standard_normal((B, S, K, H), dtype=np.float32)).to(tdt)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q = torch.from_numpy(rng.standard_normal((B, K * G, T, H), dtype=np.float32)).to(tdt)
    k = torch.from_numpy(rng.standard_normal((B, K, S, H), dtype=np.float32)).to(tdt)
    v = torch.from_numpy(rng.standard_normal((B, K, S, H), dtype=np.float32)).to(tdt)
    return q, k, v


def bounds(q, k, v, dtype, precision, causal_offset=None):
    B, Hq, T, H = q.shape
    K, S = k.shape[1], k.shape[2]
    q5 = as_f64(q).reshape(B, K, Hq // K, T, H)
    ref = Reference(q5, as_f64(k), as_f64(v), scale=H**-0.5, causal_offset=causal_offset)
    ours = (ROUNDOFF["bfloat16"] if precision == "bf16" else U32, S)
    theirs = (ROUNDOFF[dtype], S)  # torch's weights: at worst rounded to the input dtype
    max_bound, mean_bound = ref.softmax_bounds([ours, theirs], ROUNDOFF[dtype])
    return max_bound.reshape(B, Hq, T, H), mean_bound


@pytest.mark.parametrize("fa_layout", [False, True], ids=["sdpa-layout", "fa-layout-strided"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matches_sdpa(rng, shape, dtype, causal, fa_layout):
    q, k, v = make_inputs(rng, shape, dtype, fa_layout)
    precision = "bf16" if dtype == "bfloat16" else "f32"
    want = sdpa_gqa(q, k, v, is_causal=causal)
    got = flashgqa.attention(q, k, v, causal=causal, causal_offset=0 if causal else None,
                             precision=precision)
    assert isinstance(got, torch.Tensor) and got.dtype == q.dtype and got.shape == q.shape
    max_bound, mean_bound = bounds(q, k, v, dtype, precision, 0 if causal else None)
    assert_within(got, want, max_bound, mean_bound, f"flashgqa vs SDPA ({dtype})")


@pytest.mark.parametrize("shape", [(1, 2, 2, 9, 30, 16), (2, 1, 3, 32, 32, 64)], ids=shape_id)
def test_bottom_right_causal_matches_sdpa_with_mask(rng, shape):
    # flashgqa's default causal_offset is S - T (bottom-right, as FlashAttention).
    q, k, v = make_inputs(rng, shape, "float32")
    T, S = shape[3], shape[4]
    mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
    want = sdpa_gqa(q, k, v, attn_mask=mask)
    got = flashgqa.attention(q, k, v, causal=True, precision="f32")
    max_bound, mean_bound = bounds(q, k, v, "float32", "f32", S - T)
    assert_within(got, want, max_bound, mean_bound, "bottom-right causal vs SDPA with mask")


def test_requires_grad_tensor_is_read_without_autograd(rng):
    q, k, v = make_inputs(rng, (1, 1, 2, 4, 6, 8), "float32")
    q.requires_grad_(True)
    got = flashgqa.attention(q, k, v, precision="f32")
    assert not got.requires_grad
    want = sdpa_gqa(q.detach(), k, v)
    assert_within(got, want, *bounds(q, k, v, "float32", "f32"), "requires_grad input")
