"""flashgqa against the seed's own JAX functions, run by JAX on the CPU.

attn_naive, attn_scan_s_stable and linear_attn_scan_s (seed.py) are the seed's code as the seed
gives it (q [B,K,G,T,H] pre-scaled by H^-1/2, k, v [B,K,S,H]; bf16 operands, fp32 accumulation,
weights rounded to bf16 before the second matmul), so flashgqa is called with scale=1.0 and precision
"bf16". Both sides are judged by the two-sided bound of error_bounds.py: each side's own bound
against the exact float64 result, added.
"""
import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the seed's functions need jax (pip install 'jax[cpu]')")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 numpy arrays need ml_dtypes")
import jax.numpy as jnp  # noqa: E402

import flashgqa  # noqa: E402
from error_bounds import ROUNDOFF, Reference, assert_within, operands  # noqa: E402
from seed import attn_naive, attn_scan_s_stable, linear_attn_scan_s  # noqa: E402

# ---- The comparison. ----

# (B, K, G, T, S, H, bkv, sharpness): bkv divides S (the seed's scan needs it); sharpness multiplies
# the logits (peakier softmax).
CASES = [
    (1, 1, 1, 1, 8, 8, 8, 1.0),
    (2, 2, 3, 17, 48, 16, 16, 1.0),
    (1, 2, 4, 64, 128, 64, 32, 1.0),
    (1, 1, 2, 33, 96, 128, 48, 3.0),
    (2, 1, 1, 7, 256, 32, 64, 1.0),
]
ALGOS = ["flash", "naive", "chunked", "chunked-unstable", "kernel1"]
U_BF16 = ROUNDOFF["bfloat16"]


def case_id(case):
    return "B{}K{}G{}T{}S{}H{}".format(*case[:6])


@functools.lru_cache(maxsize=None)
def seed_case(case, dtype):
    """Inputs (numpy, in `dtype`, q pre-scaled), the seed's outputs and the float64 reference."""
    B, K, G, T, S, H, bkv, sharp = case
    rng = np.random.default_rng([B, K, G, T, S, H, bkv, int(sharp * 10), len(dtype)])
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    q = (rng.standard_normal((B, K, G, T, H)) * H**-0.5 * sharp).astype(np_dtype)
    k = rng.standard_normal((B, K, S, H)).astype(np_dtype)
    v = rng.standard_normal((B, K, S, H)).astype(np_dtype)
    jq, jk, jv = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    naive = np.asarray(attn_naive(jq, jk, jv))
    scan = np.asarray(attn_scan_s_stable(jq, jk, jv, bkv=bkv))
    linear = np.asarray(linear_attn_scan_s(jq, jk, jv, bkv=bkv))
    ref = Reference(operands(q, "bf16"), operands(k, "bf16"), operands(v, "bf16"), scale=1.0)
    return q, k, v, naive, scan, linear, ref


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_seed_functions_meet_their_own_bound(case, dtype):
    # Validates the derivation: each of the seed's functions alone is within its one-sided bound.
    S, bkv = case[4], case[6]
    _, _, _, naive, scan, _, ref = seed_case(case, dtype)
    u_out = ROUNDOFF[dtype]
    assert_within(naive, ref.out, *ref.softmax_bounds([(U_BF16, 0)], u_out), "attn_naive")
    assert_within(scan, ref.out, *ref.softmax_bounds([(U_BF16, S // bkv)], u_out),
                  "attn_scan_s_stable")


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_attention_matches_seed(case, dtype, algo):
    S, bkv = case[4], case[6]
    q, k, v, naive, scan, _, ref = seed_case(case, dtype)
    out = flashgqa.attention(q, k, v, scale=1.0, precision="bf16", algo=algo)
    assert out.dtype == q.dtype and out.shape == q.shape
    u_out = ROUNDOFF[dtype]
    ours = (U_BF16, S)  # flashgqa: bf16 weights, at most S running-max corrections
    assert_within(out, naive, *ref.softmax_bounds([ours, (U_BF16, 0)], u_out),
                  f"{algo} vs attn_naive")
    assert_within(out, scan, *ref.softmax_bounds([ours, (U_BF16, S // bkv)], u_out),
                  f"{algo} vs attn_scan_s_stable")


@pytest.mark.parametrize("case", CASES[1:4], ids=case_id)
def test_jax_arrays_in_jax_array_out(case):
    q, k, v, naive, _, _, ref = seed_case(case, "bfloat16")
    out = flashgqa.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), scale=1.0)
    assert isinstance(out, jax.Array) and out.dtype == jnp.bfloat16
    assert_within(out, naive, *ref.softmax_bounds([(U_BF16, case[4]), (U_BF16, 0)],
                                                  ROUNDOFF["bfloat16"]), "jax in, vs attn_naive")


def test_float16_matches_seed():
    case = CASES[2]
    q, k, v, naive, _, _, ref = seed_case(case, "float16")
    out = flashgqa.attention(q, k, v, scale=1.0)
    assert out.dtype == np.float16
    assert_within(out, naive, *ref.softmax_bounds([(U_BF16, case[4]), (U_BF16, 0)],
                                                  ROUNDOFF["float16"]), "float16 vs attn_naive")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_linear_attention_matches_seed(case, dtype):
    q, k, v, _, _, linear, ref = seed_case(case, dtype)
    u_out = ROUNDOFF[dtype]
    assert_within(linear, ref.linear_out, *ref.linear_bounds([U_BF16], u_out),
                  "linear_attn_scan_s vs float64")
    out = flashgqa.linear_attention(q, k, v, scale=1.0, precision="bf16", block_kv=case[6])
    assert out.dtype == q.dtype
    assert_within(out, linear, *ref.linear_bounds([U_BF16, U_BF16], u_out),
                  "linear_attention vs linear_attn_scan_s")
