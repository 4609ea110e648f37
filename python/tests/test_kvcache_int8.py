"""int8 KV caches: flashgqa.quantize_kv (its bound, every array kind, errors) and
attention_with_kvcache on int8 caches with k_scale/v_scale: against the float64 reference on the
values the cache stands for (int8 x scale), in flashgqa.kvcache_int8_form()'s "products" form
bit-equal to a float32 cache of those products, in its "integers" form within that form's bound
(src/reference/tolerance.hpp, ExtraError), dense and paged, k_new/v_new quantized into the cache in
place (numpy, torch), errors.
"""
import ml_dtypes
import numpy as np
import pytest
import torch

import flashgqa
from test_kvcache import SEQLENS, check_sequences, make_cache


def dequantized(x8, scale):
    """The float32 products an int8 cache stands for."""
    return (x8.astype(np.float32) * scale[..., None].astype(np.float32)).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_quantize_kv_meets_its_bound(rng, dtype):
    x = (rng.standard_normal((3, 2, 5, 72)) * np.array([1e-3, 1.0, 100.0])[:, None, None, None])
    x = x.astype({"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype])
    x[1, 1, 2] = 0  # a row of zeros
    x8, scale = flashgqa.quantize_kv(x)
    assert x8.dtype == np.int8 and x8.shape == x.shape
    assert scale.dtype == np.float32 and scale.shape == x.shape[:-1]
    xf = x.astype(np.float64)
    np.testing.assert_array_equal(scale, (np.abs(x.astype(np.float32)).max(-1) / np.float32(127)))
    assert scale[1, 1, 2] == 0 and (x8[1, 1, 2] == 0).all()
    err = np.abs(xf - dequantized(x8, scale).astype(np.float64))
    assert (err <= scale[..., None].astype(np.float64) * (0.5 + 127 * 2.0**-23) + 2.0**-143).all()
    assert np.abs(x8).max() == 127


def test_quantize_kv_kinds_and_errors():
    x = np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32)
    want8, want_s = flashgqa.quantize_kv(x)
    t8, ts = flashgqa.quantize_kv(torch.from_numpy(x))
    assert isinstance(t8, torch.Tensor) and t8.dtype == torch.int8 and ts.dtype == torch.float32
    assert t8.numpy().tobytes() == want8.tobytes() and ts.numpy().tobytes() == want_s.tobytes()
    jnp = pytest.importorskip("jax.numpy")
    j8, js = flashgqa.quantize_kv(jnp.asarray(x))
    assert str(j8.dtype) == "int8" and np.asarray(j8).tobytes() == want8.tobytes()
    assert np.asarray(js).tobytes() == want_s.tobytes()
    strided = np.zeros((2, 3, 20), np.float32)[:, :, :16]
    strided[:] = x
    s8, ss = flashgqa.quantize_kv(strided)
    assert s8.tobytes() == want8.tobytes() and ss.tobytes() == want_s.tobytes()
    bad = x.copy()
    bad[1, 2, 5] = np.inf
    with pytest.raises(ValueError, match=r"x: row \[1,2\] has a non-finite value at 5"):
        flashgqa.quantize_kv(bad)
    with pytest.raises(TypeError, match="x: dtype int8"):
        flashgqa.quantize_kv(want8)
    with pytest.raises(ValueError, match="0-D"):
        flashgqa.quantize_kv(np.float32(1.0))


def int8_cache(kc, vc, table, seqlens, T, with_new):
    """The cache quantized (rows no sequence holds are NaN in the float cache: zero them first)."""
    kc, vc = (np.where(np.isnan(x.astype(np.float32)), 0, x.astype(np.float32)).astype(x.dtype) for x in (kc, vc))
    k8, ks = flashgqa.quantize_kv(kc)
    v8, vs = flashgqa.quantize_kv(vc)
    return k8, ks, v8, vs


def dense_products(k8, ks, table, seqlens, S, page_size):
    """[B, K, S, H] float32 products at each sequence's positions (for the reference)."""
    B = len(seqlens)
    full = dequantized(k8, ks)
    if table is None:
        return full[:, :, :S]
    out = np.zeros((B, full.shape[1], S, full.shape[3]), np.float32)
    for b in range(B):
        for s in range(S):
            out[b, :, s] = full[table[b, s // page_size], :, s % page_size]
    return out


@pytest.mark.parametrize("page_size", [0, 16, 256], ids=["dense", "page16", "page256"])
@pytest.mark.parametrize("T", [1, 4, 16])
def test_int8_cache_matches_reference_and_its_float32_products(rng, page_size, T):
    with_new = T == 4
    q, kc, vc, table, kn, vn, _, _ = make_cache(rng, 5, 2, 4, T, 64, SEQLENS, page_size, "bfloat16", with_new)
    k8, ks, v8, vs = int8_cache(kc, vc, table, SEQLENS, T, with_new)
    out, lse = flashgqa.attention_with_kvcache(q, k8, v8, k_scale=ks, v_scale=vs, cache_seqlens=SEQLENS,
                                               block_table=table, k_new=kn, v_new=vn, return_lse=True)
    # After the call the int8 cache holds the appended keys too: its products are what was attended to.
    S = max(SEQLENS) + T
    dk = dense_products(k8, ks, table, SEQLENS, S, page_size)
    dv = dense_products(v8, vs, table, SEQLENS, S, page_size)
    if flashgqa.kvcache_int8_form(G=4, T=T, H=64) == "integers":
        check_sequences(out, lse, q, dk, dv, SEQLENS, T, "bfloat16", with_new,
                        int8_integers_max_v_scale=float(np.nanmax(np.abs(vs))))
    else:
        check_sequences(out, lse, q, dk, dv, SEQLENS, T, "bfloat16", with_new)
        # The same bits as a float32 cache holding those products.
        kf, vf = dequantized(k8, ks), dequantized(v8, vs)
        want = flashgqa.attention_with_kvcache(q, kf, vf, block_table=table,
                                               cache_seqlens=[L + (T if with_new else 0) for L in SEQLENS])
        assert out.tobytes() == want.tobytes()
    if with_new:  # k_new quantized in place, with its scales
        for b, L in enumerate(SEQLENS):
            n8, ns = flashgqa.quantize_kv(kn[b])
            for t in range(T):
                s = L + t
                page, row = (b, s) if table is None else (table[b, s // page_size], s % page_size)
                assert k8[page, :, row].tobytes() == n8[:, t].tobytes()
                assert ks[page, :, row].tobytes() == ns[:, t].tobytes()


def test_int8_torch_cache_appends_in_place(rng):
    seqlens = [100, 3]
    q, kc, vc, table, kn, vn, _, _ = make_cache(rng, 2, 2, 4, 2, 128, seqlens, 16, "bfloat16", True)
    k8, ks, v8, vs = (torch.from_numpy(a) for a in int8_cache(kc, vc, table, seqlens, 2, True))
    tq = torch.from_numpy(q.astype(np.float32)).bfloat16()
    out = flashgqa.attention_with_kvcache(tq, k8, v8, k_scale=ks, v_scale=vs, cache_seqlens=torch.tensor(seqlens),
                                          block_table=torch.from_numpy(table),
                                          k_new=torch.from_numpy(kn.astype(np.float32)).bfloat16(),
                                          v_new=torch.from_numpy(vn.astype(np.float32)).bfloat16())
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    n8, ns = flashgqa.quantize_kv(kn[0])
    page, row = table[0, 100 // 16], 100 % 16
    assert k8[page, :, row].numpy().tobytes() == n8[:, 0].tobytes()
    assert ks[page, :, row].numpy().tobytes() == ns[:, 0].tobytes()


def test_int8_errors(rng):
    q, kc, vc, table, kn, vn, _, _ = make_cache(rng, 2, 2, 2, 2, 32, [20, 10], 16, "bfloat16", True)
    k8, ks, v8, vs = int8_cache(kc, vc, table, [20, 10], 2, True)
    before = k8.copy(), ks.copy()
    with pytest.raises(ValueError, match="k_scale: null, expected float32 scales"):
        flashgqa.attention_with_kvcache(q, k8, v8, cache_seqlens=[20, 10], block_table=table)
    with pytest.raises(ValueError, match="v_scale: shape"):
        flashgqa.attention_with_kvcache(q, k8, v8, k_scale=ks, v_scale=vs[:, :, :8], cache_seqlens=[20, 10],
                                        block_table=table)
    with pytest.raises(TypeError, match="k_scale: dtype float16, expected float32"):
        flashgqa.attention_with_kvcache(q, k8, v8, k_scale=ks.astype(np.float16), v_scale=vs,
                                        cache_seqlens=[20, 10], block_table=table)
    bad = kn.copy()
    bad[1, 0, 1, 3] = np.nan
    with pytest.raises(ValueError, match=r"k_new: \[1,0,1,3\] is not finite"):
        flashgqa.attention_with_kvcache(q, k8, v8, k_scale=ks, v_scale=vs, cache_seqlens=[20, 10],
                                        block_table=table, k_new=bad, v_new=vn)
    assert k8.tobytes() == before[0].tobytes() and ks.tobytes() == before[1].tobytes()
    with pytest.raises(ValueError, match="k_scale: given for a bfloat16 cache"):
        flashgqa.attention_with_kvcache(q, kc, vc, k_scale=ks, v_scale=vs, cache_seqlens=[20, 10],
                                        block_table=table)
    with pytest.raises(TypeError, match="q: dtype int8"):
        flashgqa.attention_with_kvcache(q.astype(np.int8), k8, v8, k_scale=ks, v_scale=vs, cache_seqlens=[20, 10],
                                        block_table=table)
    with pytest.raises(TypeError, match="k: dtype int8"):
        flashgqa.attention(q, k8[:2], v8[:2])


def test_int8_jax_cache_reads_like_numpy(rng):
    jnp = pytest.importorskip("jax.numpy")
    q, kc, vc, _, _, _, _, _ = make_cache(rng, 2, 2, 3, 1, 64, [50, 7], 0, "float32", False)
    k8, ks, v8, vs = int8_cache(kc, vc, None, [50, 7], 1, False)
    want = flashgqa.attention_with_kvcache(q, k8, v8, k_scale=ks, v_scale=vs, cache_seqlens=[50, 7])
    got = flashgqa.attention_with_kvcache(jnp.asarray(q), *(jnp.asarray(a) for a in (k8, v8)),
                                          k_scale=jnp.asarray(ks), v_scale=jnp.asarray(vs), cache_seqlens=[50, 7])
    assert np.asarray(got).tobytes() == want.tobytes()


def test_int8_form_per_call_shape():
    """kvcache_int8_form(G, T, H): the no-argument form for calls of one row group, the products form
    past the decode kernels (G > 8, G*T > 128, H > 256), and G, T, H together or not at all."""
    base = flashgqa.kvcache_int8_form()
    assert base in ("integers", "products")
    assert flashgqa.kvcache_int8_form(G=4, T=1, H=128) == base
    assert flashgqa.kvcache_int8_form(G=1, T=1, H=64) == base
    for G, T, H in [(16, 1, 128), (4, 33, 128), (4, 1, 512)]:
        assert flashgqa.kvcache_int8_form(G=G, T=T, H=H) == "products", (G, T, H)
    with pytest.raises(ValueError, match="together"):
        flashgqa.kvcache_int8_form(G=4)
    with pytest.raises(ValueError, match="at least 1"):
        flashgqa.kvcache_int8_form(G=0, T=1, H=128)
