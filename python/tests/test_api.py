"""The Python front: layouts, result kinds and dtypes, out=, return_lse, causal offsets, linear
attention, edge shapes and the released GIL, against the float64 reference of error_bounds.py."""
import threading
import time

import numpy as np
import pytest

import flashgqa
from error_bounds import (ROUNDOFF, Reference, as_f64, assert_within, operands,
                          weights_roundoff)

TORCH_MISSING = "torch is not installed (optional: pip install torch)"


def random_qkv(rng, B, K, G, T, S, H, dtype=np.float32):
    q = rng.standard_normal((B, K, G, T, H)).astype(dtype)
    k = rng.standard_normal((B, K, S, H)).astype(dtype)
    v = rng.standard_normal((B, K, S, H)).astype(dtype)
    return q, k, v


def reference(q, k, v, precision, causal_offset=None, scale=None):
    q64 = operands(q, precision)
    scale = q64.shape[-1] ** -0.5 if scale is None else scale
    return Reference(q64, operands(k, precision), operands(v, precision), scale, causal_offset)


def check(out, ref, precision, S, what):
    dtype = str(out.dtype).removeprefix("torch.")
    bounds = ref.softmax_bounds([(weights_roundoff(precision), S)], ROUNDOFF[dtype])
    assert_within(as_f64(out).reshape(ref.out.shape), ref.out, *bounds, what)


def test_sdpa_layout_is_the_5d_layout(rng):
    q, k, v = random_qkv(rng, 2, 2, 3, 6, 9, 16)
    out5 = flashgqa.attention(q, k, v)
    out4 = flashgqa.attention(q.reshape(2, 6, 6, 16), k, v)
    assert out4.shape == (2, 6, 6, 16)
    np.testing.assert_array_equal(out4.reshape(out5.shape), out5)  # the same memory, same math


@pytest.mark.parametrize("precision", ["bf16", "f32"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_numpy_dtype_in_dtype_out(rng, dtype, precision):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    q, k, v = random_qkv(rng, 1, 2, 2, 11, 30, 32, np_dtype)
    out = flashgqa.attention(q, k, v, precision=precision)
    assert isinstance(out, np.ndarray) and out.dtype == np_dtype and out.shape == q.shape
    check(out, reference(q, k, v, precision), precision, 30, f"{dtype} {precision}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_dtype_in_dtype_out(rng, dtype):
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    q, k, v = (torch.from_numpy(a).to(getattr(torch, dtype))
               for a in random_qkv(rng, 2, 1, 4, 5, 13, 64))
    out = flashgqa.attention(q, k, v)
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and out.shape == q.shape
    check(out, reference(q, k, v, "bf16"), "bf16", 13, f"torch {dtype}")


def test_out_of_another_dtype(rng):
    q, k, v = random_qkv(rng, 1, 1, 2, 4, 8, 16)
    out = np.empty(q.shape, np.float16)
    assert flashgqa.attention(q, k, v, out=out) is out
    check(out, reference(q, k, v, "bf16"), "bf16", 8, "float16 out")


@pytest.mark.parametrize("causal_offset", [None, 0, 3, -2, -9], ids=lambda o: f"offset{o}")
@pytest.mark.parametrize("layout", ["5d", "4d"])
def test_causal_and_lse_match_reference(rng, causal_offset, layout):
    B, K, G, T, S, H = 1, 2, 2, 8, 12, 32
    q, k, v = random_qkv(rng, B, K, G, T, S, H)
    offset = S - T if causal_offset is None else causal_offset
    ref = reference(q, k, v, "bf16", causal_offset=offset)
    q_in = q if layout == "5d" else q.reshape(B, K * G, T, H)
    out, lse = flashgqa.attention(q_in, k, v, causal=True, causal_offset=causal_offset,
                                  return_lse=True)
    assert lse.dtype == np.float32 and lse.shape == q_in.shape[:-1]
    check(out, ref, "bf16", S, "causal out")
    lse = as_f64(lse).reshape(ref.lse.shape)
    empty = ~np.isfinite(ref.lse)  # rows that see no key: lse -inf, output 0
    assert np.all(lse[empty] == -np.inf)
    assert np.all(np.abs(lse[~empty] - ref.lse[~empty]) <= ref.lse_bound()[~empty])


def test_lse_comes_back_in_the_kind_of_q(rng):
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    q, k, v = (torch.from_numpy(a) for a in random_qkv(rng, 1, 1, 1, 3, 4, 8))
    out, lse = flashgqa.attention(q, k, v, return_lse=True)
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    assert lse.shape == (1, 1, 1, 3)


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_matches_reference(rng, causal):
    B, K, G, T, S, H = 2, 1, 3, 6, 20, 16
    q, k, v = random_qkv(rng, B, K, G, T, S, H)
    ref = reference(q, k, v, "bf16", causal_offset=S - T if causal else None, scale=0.5)
    out = flashgqa.linear_attention(q.reshape(B, K * G, T, H), k, v, causal=causal, scale=0.5,
                                    block_kv=8)
    assert out.shape == (B, K * G, T, H)
    bounds = ref.linear_bounds([weights_roundoff("bf16")], ROUNDOFF["float32"])
    assert_within(out.reshape(ref.out.shape), ref.linear_out, *bounds, "linear attention")


def test_empty_shapes(rng):
    q, k, v = random_qkv(rng, 1, 2, 2, 0, 5, 8)  # T = 0: nothing to write
    assert flashgqa.attention(q, k, v).shape == q.shape
    q, k, v = random_qkv(rng, 1, 2, 2, 3, 0, 8)  # S = 0: output 0, lse -inf
    out, lse = flashgqa.attention(q, k, v, return_lse=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)


def test_explicit_blocks_and_threads(rng):
    q, k, v = random_qkv(rng, 1, 2, 4, 33, 70, 64)
    ref = reference(q, k, v, "bf16")
    for algo, block_q, block_kv in [("flash", 8, 16), ("kernel1", 5, 7), ("chunked", None, 9)]:
        out = flashgqa.attention(q, k, v, algo=algo, block_q=block_q, block_kv=block_kv,
                                 threads=1)
        check(out, ref, "bf16", 70, f"{algo} blocks {block_q}/{block_kv}")


def forward_call(q, k, v):
    return lambda: flashgqa.attention(q, k, v, threads=1)


def backward_call(q, k, v):
    out, lse = flashgqa.attention(q, k, v, return_lse=True)
    return lambda: flashgqa.attention_backward(q, q, k, v, out, lse, threads=1)  # dout = q


@pytest.mark.parametrize("make_call", [forward_call, backward_call], ids=["forward", "backward"])
def test_gil_is_released_while_computing(rng, make_call):
    # One thread computes a long attention on one core while this one ticks every millisecond:
    # with the GIL held for the whole call, this thread would pause for about the whole call.
    q, k, v = random_qkv(rng, 1, 1, 8, 256, 1024, 128)
    for _ in range(6):  # grow S until one call takes >= 0.2 s, far above scheduling hiccups
        call = make_call(q, k, v)
        start = time.perf_counter()
        call()
        single = time.perf_counter() - start
        if single >= 0.2:
            break
        k, v = np.concatenate([k, k], axis=2), np.concatenate([v, v], axis=2)
    done = threading.Event()

    def work():
        call()
        done.set()

    worker = threading.Thread(target=work)
    ticks = []
    worker.start()
    while not done.is_set():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    worker.join()
    longest = float(np.max(np.diff(ticks))) if len(ticks) > 1 else single
    assert longest < 0.5 * single, (
        f"longest pause {longest:.3f} s during a {single:.3f} s call: the GIL was held")
