"""flashgqa.attention_with_kvcache: each sequence against the float64 reference on its gathered dense
keys (error_bounds.py), dense and paged caches (pages 16 and 256, shuffled tables), ragged lengths
with 0 and 1, T = 1..16, k_new/v_new appended in place (numpy, torch), windows, softcap, sinks, the
same bits dense and paged, jax caches read-only, errors.
"""
import ml_dtypes
import numpy as np
import pytest
import torch

import flashgqa
from error_bounds import ROUNDOFF, Reference, as_f64, assert_within, operands, window_mask

NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def make_cache(rng, B, K, G, T, H, seqlens, page_size, dtype, with_new):
    """(q, k_cache, v_cache, block_table, k_new, v_new, dense_k, dense_v): dense_k/v [B, K, S, H]
    hold every sequence's keys (the appended ones too) at their positions."""
    dt = NP_DTYPES[dtype]
    S = max(seqlens) + T
    dense_k = rng.standard_normal((B, K, S, H)).astype(dt)
    dense_v = rng.standard_normal((B, K, S, H)).astype(dt)
    q = rng.standard_normal((B, K, G, T, H)).astype(dt)
    k_new = v_new = None
    if with_new:
        k_new = np.stack([dense_k[b, :, L:L + T] for b, L in enumerate(seqlens)])
        v_new = np.stack([dense_v[b, :, L:L + T] for b, L in enumerate(seqlens)])
    if not page_size:
        kc = np.full((B, K, S + 5, H), np.nan, dtype=dt)
        vc = kc.copy()
        for b, L in enumerate(seqlens):
            kc[b, :, :L], vc[b, :, :L] = dense_k[b, :, :L], dense_v[b, :, :L]
        return q, kc, vc, None, k_new, v_new, dense_k, dense_v
    max_pages = -(-S // page_size)
    pages = rng.permutation(B * max_pages + 2).astype(np.int32)
    table = pages[:B * max_pages].reshape(B, max_pages)
    kc = np.full((B * max_pages + 2, K, page_size, H), np.nan, dtype=dt)
    vc = kc.copy()
    for b, L in enumerate(seqlens):
        for s in range(L):
            kc[table[b, s // page_size], :, s % page_size] = dense_k[b, :, s]
            vc[table[b, s // page_size], :, s % page_size] = dense_v[b, :, s]
    return q, kc, vc, table, k_new, v_new, dense_k, dense_v


def check_sequences(out, lse, q, dense_k, dense_v, seqlens, T, dtype, with_new, causal=True,
                    window=(-1, -1), softcap=None, sinks=None, int8_integers_max_v_scale=None):
    """Each sequence against the reference on its dense keys. int8_integers_max_v_scale (an int8 cache
    in kvcache_int8_form()'s "integers" form: the largest V scale): the operands as they are (those
    kernels round neither K nor V), P's bf16 rounding as u_p, and that form's own errors
    (src/reference/tolerance.hpp, ExtraError): each query row quantized to int16, a logit error of
    |scale| H M_q M_k (2^-16 + 2^-22), and the weights per 16 keys, 16 * 128 (2^-16 + 2^-22) max_j s_j
    on each output."""
    integers = int8_integers_max_v_scale is not None
    precision = "f32" if dtype == "float32" or integers else "bf16"
    u_p = ROUNDOFF["bfloat16"] if precision == "bf16" or integers else ROUNDOFF["float32"]
    H = q.shape[-1]
    for b, L0 in enumerate(seqlens):
        L = L0 + (T if with_new else 0)
        qo = operands(q[b:b + 1], precision)
        ko, vo = operands(dense_k[b:b + 1, :, :L], precision), operands(dense_v[b:b + 1, :, :L], precision)
        mask = window_mask(T, L, causal=causal, window=window)
        ref = Reference(qo, ko, vo, H ** -0.5, softcap=softcap, mask=mask,
                        sinks=None if sinks is None else as_f64(sinks))
        extra_out = 0.0
        if integers:
            ref.delta = ref.delta + H ** -0.5 * H * np.abs(qo).max(initial=0) * np.abs(ko).max(initial=0) * (
                2**-16 + 2**-22)
            extra_out = 16 * 128 * (2**-16 + 2**-22) * int8_integers_max_v_scale
        max_bound, mean_bound = ref.softmax_bounds([(u_p, max(L, 1))], ROUNDOFF[dtype])
        assert_within(out[b:b + 1], ref.out, max_bound + extra_out, mean_bound + extra_out, f"sequence {b} (L {L})")
        finite = np.isfinite(ref.lse[0])
        got = as_f64(lse[b])
        assert (got[~finite] == ref.lse[0][~finite]).all()
        assert (np.abs(got[finite] - ref.lse[0][finite]) <= ref.lse_bound()[0][finite]).all()


SEQLENS = [0, 1, 37, 300, 16]


@pytest.mark.parametrize("page_size", [0, 16, 256], ids=["dense", "page16", "page256"])
@pytest.mark.parametrize("T", [1, 3, 16])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_matches_reference(rng, page_size, T, dtype):
    with_new = T != 3
    q, kc, vc, table, kn, vn, dk, dv = make_cache(rng, 5, 2, 4, T, 64, SEQLENS, page_size, dtype, with_new)
    out, lse = flashgqa.attention_with_kvcache(
        q, kc, vc, cache_seqlens=np.array(SEQLENS), block_table=table, k_new=kn, v_new=vn,
        precision="f32" if dtype == "float32" else "bf16", return_lse=True)
    check_sequences(out, lse, q, dk, dv, SEQLENS, T, dtype, with_new)
    if with_new:  # appended in place
        for b, L in enumerate(SEQLENS):
            for t in range(T):
                s = L + t
                row = kc[b, :, s] if table is None else kc[table[b, s // page_size], :, s % page_size]
                assert row.tobytes() == kn[b, :, t].tobytes()


@pytest.mark.parametrize("variant", ["window", "softcap", "sinks", "noncausal"])
def test_variants(rng, variant):
    T, G, K = 4, 4, 2
    q, kc, vc, table, kn, vn, dk, dv = make_cache(rng, 5, K, G, T, 64, SEQLENS, 16, "bfloat16", True)
    kwargs, check = {}, {}
    if variant == "window":
        kwargs = check = {"window": (9, 0)}
    elif variant == "softcap":
        kwargs = check = {"softcap": 3.0}
    elif variant == "sinks":
        sinks = rng.standard_normal((K, G)).astype(np.float32)
        kwargs = check = {"sinks": sinks}
    else:
        kwargs = check = {"causal": False}
    out, lse = flashgqa.attention_with_kvcache(q, kc, vc, cache_seqlens=SEQLENS, block_table=table,
                                               k_new=kn, v_new=vn, return_lse=True, **kwargs)
    check_sequences(out, lse, q, dk, dv, SEQLENS, T, "bfloat16", True, **check)


def test_dense_and_paged_give_the_same_bits_and_torch_works(rng):
    seqlens = [700, 1, 0, 333]
    results = []
    for page_size in (0, 16, 256):
        q, kc, vc, table, kn, vn, _, _ = make_cache(np.random.default_rng(3), 4, 2, 4, 16, 128, seqlens,
                                                    page_size, "float32", True)
        results.append(flashgqa.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table,
                                                       k_new=kn, v_new=vn, threads=1 + page_size % 3))
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()
    # torch: the cache written in place, the result a torch tensor of q's dtype.
    q, kc, vc, table, kn, vn, _, _ = make_cache(np.random.default_rng(3), 4, 2, 4, 16, 128, seqlens, 16,
                                                "float32", True)
    tk, tv = torch.from_numpy(kc), torch.from_numpy(vc)
    out = flashgqa.attention_with_kvcache(torch.from_numpy(q), tk, tv, cache_seqlens=torch.tensor(seqlens),
                                          block_table=torch.from_numpy(table), k_new=torch.from_numpy(kn),
                                          v_new=torch.from_numpy(vn), threads=1)
    assert isinstance(out, torch.Tensor) and out.numpy().tobytes() == results[1].tobytes()
    assert not np.isnan(kc[table[0, 700 // 16], :, 700 % 16]).any()


def test_shared_prefix_pages(rng):
    """Sequences whose tables share their first pages (a common prompt), each appending into its own
    last page: the bits of the same call on a cache with the prefix copied for each sequence. An
    append into a row another sequence holds (or two appends into one row) is refused before
    anything is written: it would overwrite a key that call reads."""
    K, G, T, H, P = 2, 4, 2, 64, 16
    seqlens = np.array([37, 46, 32], np.int32)  # a 32-key prefix (pages 0 and 1), then each its own page
    pool = rng.standard_normal((9, K, P, H)).astype(np.float32)
    pool[5:7], pool[7:9] = pool[0:2], pool[0:2]  # the prefix's copies
    vpool = rng.standard_normal((9, K, P, H)).astype(np.float32)
    vpool[5:7], vpool[7:9] = vpool[0:2], vpool[0:2]
    q = rng.standard_normal((3, K, G, T, H)).astype(np.float32)
    kn, vn = (rng.standard_normal((3, K, T, H)).astype(np.float32) for _ in range(2))
    results = []
    for table in ([[0, 1, 2], [0, 1, 3], [0, 1, 4]], [[0, 1, 2], [5, 6, 3], [7, 8, 4]]):
        kc, vc = pool.copy(), vpool.copy()
        results.append(flashgqa.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens,
                                                       block_table=np.array(table, np.int32),
                                                       k_new=kn, v_new=vn))
        assert kc[2, :, 37 % P].tobytes() == kn[0, :, 0].tobytes() and kc[4, :, 0].tobytes() == kn[2, :, 0].tobytes()
    assert results[0].tobytes() == results[1].tobytes()
    for lens, table, message in (
            ([37, 37], [[0, 1, 2], [0, 1, 2]], r"sequence 1 appends k_new/v_new into rows 5..6 of page 2, "
                                               r"which sequence 0 also holds \(block_table\[0\]\[2\]\)"),
            ([20, 32], [[0, 1, 2], [0, 1, 3]], r"block_table\[0\]\[1\] = 1: sequence 0 appends k_new/v_new into "
                                               r"rows 4..5 of page 1")):
        kc, vc = pool.copy(), vpool.copy()
        with pytest.raises(ValueError, match=message):
            flashgqa.attention_with_kvcache(q[:2], kc, vc, cache_seqlens=np.array(lens, np.int32),
                                            block_table=np.array(table, np.int32), k_new=kn[:2], v_new=vn[:2])
        assert kc.tobytes() == pool.tobytes() and vc.tobytes() == vpool.tobytes()


def test_sdpa_layout_and_jax_cache(rng):
    jnp = pytest.importorskip("jax.numpy")
    seqlens = [10, 40]
    q, kc, vc, _, _, _, _, _ = make_cache(rng, 2, 2, 3, 2, 32, seqlens, 0, "float32", False)
    want = flashgqa.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens)
    got = flashgqa.attention_with_kvcache(q.reshape(2, 6, 2, 32), kc, vc, cache_seqlens=seqlens)
    assert got.tobytes() == want.reshape(2, 6, 2, 32).tobytes()
    jout = flashgqa.attention_with_kvcache(jnp.asarray(q), jnp.asarray(kc), jnp.asarray(vc), cache_seqlens=seqlens)
    assert np.asarray(jout).tobytes() == want.tobytes()
    with pytest.raises(TypeError, match="immutable"):
        flashgqa.attention_with_kvcache(jnp.asarray(q), jnp.asarray(kc), jnp.asarray(vc), cache_seqlens=seqlens,
                                        k_new=jnp.asarray(kc[:, :, :2]), v_new=jnp.asarray(vc[:, :, :2]))


def test_errors(rng):
    q, kc, vc, table, kn, vn, _, _ = make_cache(rng, 2, 2, 2, 2, 32, [20, 10], 16, "float32", True)
    before = kc.copy()
    with pytest.raises(ValueError, match=r"seqlens\[1\] = 31"):
        flashgqa.attention_with_kvcache(q, kc, vc, cache_seqlens=[20, 31], block_table=table, k_new=kn, v_new=vn)
    bad = table.copy()
    bad[0, 1] = 99
    with pytest.raises(ValueError, match=r"block_table\[0\]\[1\] = 99"):
        flashgqa.attention_with_kvcache(q, kc, vc, cache_seqlens=[20, 10], block_table=bad, k_new=kn, v_new=vn)
    with pytest.raises(ValueError, match="cache_seqlens: 3 lengths"):
        flashgqa.attention_with_kvcache(q, kc, vc, cache_seqlens=[1, 2, 3], block_table=table)
    with pytest.raises(ValueError, match="k_new, v_new"):
        flashgqa.attention_with_kvcache(q, kc, vc, cache_seqlens=[1, 2], block_table=table, k_new=kn)
    with pytest.raises(ValueError, match="k_scale, v_scale: one given without the other"):
        flashgqa.attention_with_kvcache(q, kc, vc, cache_seqlens=[1, 2], k_scale=np.ones(1, np.float32))
    assert np.array_equal(before, kc, equal_nan=True)
