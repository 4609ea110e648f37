"""No hidden copies: the binding reads numpy, torch and jax memory in place, strided views included.

Evidence: flashgqa._flashgqa._views returns the data pointers, shapes and strides attention() hands
the library (the same code path builds them), compared with the arrays' own pointers and strides;
tracemalloc shows no allocation the size of an input; strided views give the right answer.
"""
import tracemalloc

import numpy as np
import pytest

import flashgqa
from flashgqa import _flashgqa
from error_bounds import ROUNDOFF, Reference, as_f64, assert_within, operands, weights_roundoff

TORCH_MISSING = "torch is not installed (optional: pip install torch)"


def np_pointer(a):
    return a.__array_interface__["data"][0]


def np_element_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def check_against_reference(out, q5, k, v, precision, causal_offset=None):
    """out (any kind) within flashgqa's one-sided bound of the float64 result."""
    q64 = operands(q5, precision)
    ref = Reference(q64, operands(k, precision), operands(v, precision),
                    scale=q64.shape[-1] ** -0.5, causal_offset=causal_offset)
    dtype = str(out.dtype).removeprefix("torch.")
    max_bound, mean_bound = ref.softmax_bounds([(weights_roundoff(precision), k.shape[2])],
                                               ROUNDOFF[dtype])
    assert_within(as_f64(out).reshape(ref.out.shape), ref.out, max_bound, mean_bound, "output")


def test_numpy_strided_views_are_read_in_place(rng):
    B, K, G, T, S, H = 2, 2, 3, 9, 21, 16
    q_mem = rng.standard_normal((B, T, K * G, H), dtype=np.float32)  # FlashAttention's layout
    kv_mem = rng.standard_normal((2, B, S, K, H), dtype=np.float32)
    q = q_mem.transpose(0, 2, 1, 3)  # [B, Hq, T, H], not contiguous
    k, v = kv_mem[0].transpose(0, 2, 1, 3), kv_mem[1].transpose(0, 2, 1, 3)
    out = np.empty((B, K * G, T, H), np.float32)
    views = _flashgqa._views(q, k, v, out)
    assert views["q"]["data"] == np_pointer(q_mem)
    # The head axis of stride s splits into (K, G) with strides (G*s, s).
    sb, sh, st, _ = np_element_strides(q)
    assert views["q"]["shape"] == (B, K, G, T, H)
    assert views["q"]["strides"] == (sb, G * sh, sh, st, 1)
    for name, a in (("k", k), ("v", v)):
        assert views[name]["data"] == np_pointer(a)
        assert views[name]["strides"] == np_element_strides(a)
    assert views["out"]["data"] == np_pointer(out)
    got = flashgqa.attention(q, k, v, out=out, precision="f32")
    assert got is out
    check_against_reference(out, q.reshape(B, K, G, T, H), k, v, "f32")


def test_numpy_bfloat16_is_viewed_not_converted(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    B, K, G, T, S, H = 1, 2, 2, 5, 12, 32
    mem = rng.standard_normal((B, K, G, 2 * T, H)).astype(ml_dtypes.bfloat16)
    q = mem[:, :, :, ::2]  # every other query row: a strided view
    k = rng.standard_normal((B, K, S, H)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((B, K, S, H)).astype(ml_dtypes.bfloat16)
    views = _flashgqa._views(q.view(np.uint16), k.view(np.uint16), v.view(np.uint16))
    assert views["q"]["data"] == np_pointer(mem)
    assert views["q"]["dtype"] == "bfloat16"
    assert views["q"]["strides"] == np_element_strides(q)
    out = flashgqa.attention(q, k, v)
    assert out.dtype == ml_dtypes.bfloat16
    check_against_reference(out, q, k, v, "bf16")


def test_numpy_inputs_are_not_copied_tracemalloc(rng):
    # k and v are 4 MiB each, q and the output a few KiB: any copy of an input by numpy shows up.
    B, K, G, T, S, H = 1, 2, 2, 1, 4096, 128
    q = rng.standard_normal((B, K, G, T, H), dtype=np.float32)
    kv = rng.standard_normal((B, K, 2 * S, H), dtype=np.float32)
    k, v = kv[:, :, :S], kv[:, :, S:]  # strided views into one buffer
    flashgqa.attention(q, k, v, threads=1)  # warm-up: first-call allocations are not counted
    tracemalloc.start()
    try:
        flashgqa.attention(q, k, v, threads=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < k.nbytes // 4, f"peak traced allocation {peak} bytes, k alone is {k.nbytes}"


def test_torch_strided_views_are_read_in_place(rng):
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    B, K, G, T, S, H = 2, 2, 2, 7, 19, 64
    q_mem = torch.randn(B, T, K * G, H, dtype=torch.bfloat16)
    k_mem = torch.randn(B, S, K, H, dtype=torch.bfloat16)
    v_mem = torch.randn(B, S, K, H + 8, dtype=torch.bfloat16)
    q = q_mem.transpose(1, 2)  # [B, Hq, T, H] view of [B, T, Hq, H]
    k = k_mem.transpose(1, 2)
    v = v_mem[..., 8:].transpose(1, 2)  # padded rows: an offset pointer and a row stride of H + 8
    views = _flashgqa._views(q, k, v)
    assert views["q"]["data"] == q.data_ptr() == q_mem.data_ptr()
    assert views["k"]["data"] == k.data_ptr()
    assert views["v"]["data"] == v.data_ptr() == v_mem.data_ptr() + 8 * v_mem.element_size()
    sb, sh, st, _ = q.stride()
    assert views["q"]["strides"] == (sb, G * sh, sh, st, 1)
    assert views["k"]["strides"] == tuple(k.stride())
    assert views["v"]["strides"] == tuple(v.stride())
    got = flashgqa.attention(q, k, v)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    check_against_reference(got, q.reshape(B, K, G, T, H), k, v, "bf16")


def test_torch_output_buffer_is_written_in_place(rng):
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    q = torch.randn(1, 4, 6, 32)
    k, v = torch.randn(1, 2, 10, 32), torch.randn(1, 2, 10, 32)
    out_mem = torch.zeros(1, 6, 4, 32)
    out = out_mem.transpose(1, 2)  # a strided destination
    assert _flashgqa._views(q, k, v, out)["out"]["data"] == out_mem.data_ptr()
    got = flashgqa.attention(q, k, v, out=out, precision="f32")
    assert got is out
    check_against_reference(out_mem.transpose(1, 2), q.reshape(1, 2, 2, 6, 32), k, v, "f32")


def test_jax_arrays_are_read_in_place(rng):
    jax = pytest.importorskip("jax", reason="jax is needed for this test")
    import jax.numpy as jnp

    q = jnp.asarray(rng.standard_normal((1, 2, 2, 4, 16), dtype=np.float32))
    k = jnp.asarray(rng.standard_normal((1, 2, 8, 16), dtype=np.float32))
    v = jnp.asarray(rng.standard_normal((1, 2, 8, 16), dtype=np.float32))
    views = _flashgqa._views(q, k, v)
    for name, a in (("q", q), ("k", k), ("v", v)):
        assert views[name]["data"] == a.unsafe_buffer_pointer()
    got = flashgqa.attention(q, k, v)
    assert isinstance(got, jax.Array)
    check_against_reference(got, q, k, v, "bf16")
