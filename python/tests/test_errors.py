"""Bad inputs raise ValueError (shapes, devices, options) or TypeError (types, dtypes) whose message
names the argument, what was found and what was expected."""
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
        (lambda q, k, v: (q[0, 0], k, v), r"q: shape \[3,4,8\], expected 5-D"),
        (lambda q, k, v: (q, k[0], v[0]), r"k: rank 3, expected 4"),
        (lambda q, k, v: (q[..., ::2], k[..., ::2], v[..., ::2]), r"q: innermost stride 2, "
                                                                  r"expected 1"),
    ],
    ids=["v-vs-k", "H", "K", "B", "4d-heads", "rank-3", "k-rank", "inner-stride"],
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
    with pytest.raises(TypeError, match=r"q: dtype .*, expected float32, float16 or bfloat16"):
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
        (dict(precision="fp8"), r"precision: 'fp8', expected bf16 or f32"),
        (dict(algo="fast"), r"algorithm: 'fast', expected naive, chunked-unstable"),
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
