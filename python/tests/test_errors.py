"""Bad inputs raise ValueError (shapes, devices, options) or TypeError (types, dtypes) whose message
names the argument, what was found and what was expected. Shapes, strides and option values are
checked by the C++ library alone: its flashgqa::Error message arrives as a ValueError."""
import numpy as np
import pytest

import flashgqa

B, K, G, T, S, H = 1, 2, 3, 4, 5, 8

TORCH_MISSING = "torch is not installed (optional: pip install torch)"


def qkv(dtype=np.float32):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, K, G, T, H)).astype(dtype)
    k = rng.standard_normal((B, K, S, H)).astype(dtype)
    v = rng.standard_normal((B, K, S, H)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda q, k, v: (q, k, v[:, :, :3]), r"v: shape \[1,2,3,8\], expected the shape of k"),
        (lambda q, k, v: (q, k[..., :4], v[..., :4]),
         r"k: shape \[1,2,5,4\] has H = 4, expected 8"),
        (lambda q, k, v: (q, k[:, :1], v[:, :1]), r"k: .* has K = 1, expected 2"),
        (lambda q, k, v: (np.concatenate([q, q]), k, v), r"k: .* has B = 1, expected 2"),
        (lambda q, k, v: (q[0], k, v), r"q: shape \[2,3,4,8\] \[B,Hq,T,H\] has Hq = 3 query "
                                       r"heads, expected a multiple of K = 2 kv heads"),
        (lambda q, k, v: (q[0, 0, 0], k, v), r"q: rank 2, expected 5 \[B,K,G,T,H\], 4 "
                                             r"\[B,Hq,T,H\] or 3 \[total,Hq,H\] \(packed\)"),
        (lambda q, k, v: (q[0, 0], k, v), r"k: rank 4, expected 3 \[total,K,H\]"),
        (lambda q, k, v: (q, k[0], v[0]), r"k: rank 3, expected 4"),
        (lambda q, k, v: (q[..., ::2], k[..., ::2], v[..., ::2]), r"q: innermost stride 2, "
                                                                  r"expected 1"),
    ],
    ids=["v-vs-k", "H", "K", "B", "4d-heads", "rank-2", "packed-k-rank", "k-rank", "inner-stride"],
)
def test_bad_shapes_raise_value_error(make, match):
    q, k, v = make(*qkv())
    with pytest.raises(ValueError, match=match):
        flashgqa.attention(q, k, v)


def test_g_not_dividing_hq_raises_value_error():
    q, k, v = qkv()
    q4 = np.zeros((B, 5, T, H), np.float32)  # 5 query heads over K = 2 kv heads
    with pytest.raises(ValueError, match=r"Hq = 5 query heads, expected a multiple of K = 2"):
        flashgqa.attention(q4, k, v)
    with pytest.raises(ValueError, match=r"Hq = 5 query heads"):
        flashgqa.linear_attention(q4, k, v)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint16, np.complex64, np.bool_])
def test_unsupported_dtypes_raise_type_error(dtype):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"q: dtype .*, expected float32, bfloat16 or float16"):
        flashgqa.attention(q.astype(dtype), k, v)


def test_mixed_dtypes_raise_type_error():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"q, k, v: dtypes float32, float16, float32, expected one"):
        flashgqa.attention(q, k.astype(np.float16), v)


def test_big_endian_raises_type_error():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"q: dtype >f4 is not in native byte order"):
        flashgqa.attention(q.astype(">f4"), k, v)


@pytest.mark.parametrize("bad", [[[1.0, 2.0]], "abc", None, 3.0],
                         ids=["list", "str", "None", "float"])
def test_non_arrays_raise_type_error(bad):
    _, k, v = qkv()
    with pytest.raises(TypeError, match=r"q: got \w+, expected a CPU array"):
        flashgqa.attention(bad, k, v)


class FakeDeviceArray:
    """An array on a CUDA device, as DLPack describes it (kDLCUDA = 2)."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kwargs):
        raise AssertionError("flashgqa must check the device before asking for the data")


def test_non_cpu_arrays_raise_value_error():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k: FakeDeviceArray on DLPack device type 2, expected a "
                                         r"CPU array"):
        flashgqa.attention(q, FakeDeviceArray(), v)


def test_non_cpu_torch_tensor_raises_value_error():
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    q, k, v = qkv()
    meta = torch.empty(B, K, G, T, H, device="meta")  # no memory at all: never a CPU tensor
    with pytest.raises(ValueError, match=r"q: torch tensor on device meta, expected a CPU tensor"):
        flashgqa.attention(meta, torch.from_numpy(k), torch.from_numpy(v))


def test_torch_wrong_dtype_raises_type_error():
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    q, k, v = (torch.from_numpy(a) for a in qkv(np.float64))
    with pytest.raises(TypeError, match=r"q: dtype torch.float64, expected torch.float32"):
        flashgqa.attention(q, k, v)


def test_jax_output_buffer_raises_type_error():
    jnp = pytest.importorskip("jax.numpy", reason="jax is needed for this test")
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"out: jax arrays are immutable"):
        flashgqa.attention(q, k, v, out=jnp.zeros(q.shape))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(precision="fp8"), r"precision: unknown precision 'fp8', expected bf16 or f32"),
        (dict(algo="fast"), r"algo: unknown algorithm 'fast', expected naive, chunked-unstable, "
                            r"chunked, kernel1 or flash"),
        (dict(block_kv=-1), r"block_kv: -1, expected >= 0"),
        (dict(algo="naive", block_q=4), r"block_q/block_kv: naive takes no blocks"),
        (dict(threads=-2), r"threads: -2, expected >= 0"),
        (dict(scale=float("inf")), r"scale: .*, expected a finite number"),
    ],
)
def test_bad_options_raise_value_error(kwargs, match):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=match):
        flashgqa.attention(q, k, v, **kwargs)


def test_bad_option_types_raise_type_error():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"block_kv: 2.5, expected an int or None"):
        flashgqa.attention(q, k, v, block_kv=2.5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(causal=True, causal_offset=True), r"causal_offset: True, expected an int or None"),
        (dict(threads="2"), r"threads: '2', expected an int or None"),
        (dict(block_q=np.float32(4)), r"block_q: .*4.*, expected an int or None"),
        (dict(scale="0.5"), r"scale: '0.5', expected a float or None"),
        (dict(algo=3), r"algo: 3, expected a str, one of naive, chunked-unstable, chunked, "
                       r"kernel1 or flash"),
        (dict(precision=16), r"precision: 16, expected a str, one of bf16 or f32"),
    ],
    ids=["bool-offset", "str-threads", "float-block", "str-scale", "int-algo", "int-precision"],
)
def test_more_bad_option_types_raise_type_error(kwargs, match):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=match) as info:
        flashgqa.attention(q, k, v, **kwargs)
    assert "incompatible function arguments" not in str(info.value)


# Integers the C++ types cannot hold: a ValueError naming the argument and the range, not
# nanobind's dump of the function signature.
INT64_RANGE = r"\[-9223372036854775808, 9223372036854775807\]"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(causal=True, causal_offset=2**63),
         r"causal_offset: 9223372036854775808 does not fit in a C\+\+ int64, expected an int in "
         + INT64_RANGE),
        (dict(causal=True, causal_offset=-2**63 - 1),
         r"causal_offset: -9223372036854775809 does not fit in a C\+\+ int64"),
        (dict(threads=2**31), r"threads: 2147483648 does not fit in a C\+\+ int, expected an int "
                              r"in \[-2147483648, 2147483647\]"),
        (dict(threads=-2**31 - 1), r"threads: -2147483649 does not fit in a C\+\+ int"),
        (dict(block_q=2**64), r"block_q: 18446744073709551616 does not fit in a C\+\+ int64, "
                              r"expected an int in " + INT64_RANGE),
        (dict(block_kv=np.uint64(2**64 - 1)), r"block_kv: 18446744073709551615 does not fit in a "
                                              r"C\+\+ int64"),
        (dict(scale=10**400), r"scale: 1000.* does not fit in a double, expected a finite number"),
    ],
    ids=["offset-2^63", "offset-below", "threads-2^31", "threads-below", "block_q-2^64",
         "block_kv-uint64", "scale-huge"],
)
def test_integers_too_large_raise_value_error(kwargs, match):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=match) as info:
        flashgqa.attention(q, k, v, **kwargs)
    assert "incompatible function arguments" not in str(info.value)
    if "block_q" not in kwargs:  # linear_attention has no block_q
        with pytest.raises(ValueError, match=match):
            flashgqa.linear_attention(q, k, v, **kwargs)


def test_integers_in_range_pass():
    q, k, v = qkv()
    want = flashgqa.attention(q, k, v, causal=True, causal_offset=1, block_kv=2, threads=1)
    got = flashgqa.attention(q, k, v, causal=True, causal_offset=np.int64(1),
                             block_kv=np.uint8(2), threads=np.int32(1))
    np.testing.assert_array_equal(got, want)
    # The largest int64 offset fits (every key visible); huge blocks are the library's to refuse.
    far = flashgqa.attention(q, k, v, causal=True, causal_offset=2**63 - 1)
    np.testing.assert_allclose(far, flashgqa.attention(q, k, v), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"block_q/block_kv: 1099511627776, expected <= 16777216"):
        flashgqa.attention(q, k, v, block_q=2**40)


def test_sdpa_layout_errors_come_from_the_library():
    """A 4-D q is split by the library's split_heads with k's K; what cannot be split, and what
    does not match after the split, is reported by the library."""
    q, k, v = qkv()
    q4 = q.reshape(B, K * G, T, H)
    with pytest.raises(ValueError, match=r"q: K = 0 kv heads to split the Hq = 6 query heads of "
                                         r"shape \[1,6,4,8\] \[B,Hq,T,H\], expected K >= 1 "
                                         r"\(K from k\)"):
        flashgqa.attention(q4, k[:, :0], v[:, :0])
    with pytest.raises(ValueError, match=r"k: rank 3, expected 4 \[B,K,S,H\]"):
        flashgqa.attention(q4, k[0], v[0])
    with pytest.raises(ValueError, match=r"out: shape \[1,2,3,4,4\], expected the shape of q "
                                         r"\[1,2,3,4,8\]"):
        flashgqa.attention(q4, k, v, out=np.empty((B, K * G, T, 4), np.float32))
    with pytest.raises(ValueError, match=r"out: shape \[1,2,2,4,8\], expected the shape of q "
                                         r"\[1,2,3,4,8\]"):  # 4 heads split by K = 2: G = 2
        flashgqa.attention(q4, k, v, out=np.empty((B, 4, T, H), np.float32))
    with pytest.raises(ValueError, match=r"out: shape \[1,5,4,8\] \[B,Hq,T,H\] has Hq = 5 query "
                                         r"heads, expected a multiple of K = 2 kv heads "
                                         r"\(K from k\)"):
        flashgqa.attention(q4, k, v, out=np.empty((B, 5, T, H), np.float32))
    with pytest.raises(ValueError, match=r"out: rank 4, expected 5 \[B,K,G,T,H\]"):
        flashgqa.attention(q, k, v, out=np.empty((B, K * G, T, H), np.float32))
    with pytest.raises(ValueError, match=r"q: rank 6, expected at most 5 dimensions"):
        flashgqa.attention(q[None], k, v)


def test_bad_out_raises():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"out: shape \[1,2,3,4,4\], expected the shape of q"):
        flashgqa.attention(q, k, v, out=np.empty((B, K, G, T, 4), np.float32))
    read_only = np.empty(q.shape, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"out: numpy array is read-only"):
        flashgqa.attention(q, k, v, out=read_only)
    with pytest.raises(ValueError, match=r"out: memory overlaps q"):
        flashgqa.attention(q, k, v, out=q)
