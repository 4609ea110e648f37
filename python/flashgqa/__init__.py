"""flashgqa: exact grouped-query attention on the CPU, for numpy, torch and jax arrays.

Shapes use the seed's letters: B batch, T queries, S keys/values, K kv heads, G query heads per kv
head, H head dim. Two layouts are accepted for q (and the result):

- 5-D ``[B, K, G, T, H]`` (the seed's), with k, v ``[B, K, S, H]``;
- 4-D ``[B, Hq, T, H]`` (PyTorch SDPA's), with k, v ``[B, K, S, H]`` and ``Hq = K * G``
  (query head ``h`` uses kv head ``h // G``, as SDPA's ``enable_gqa=True``);
- 3-D ``[total, Hq, H]`` (FlashAttention's packed varlen layout), with k, v ``[total_k, K, H]``:
  one batch, cut into sequences by ``cu_seqlens_q`` / ``cu_seqlens_k``.

Inputs are taken without copying: any CPU array with DLPack or the buffer protocol (numpy with
float32, float16 or ml_dtypes.bfloat16; torch tensors; jax arrays), strided views included. Only the
last dimension (H) must be contiguous. The result comes back as the kind and dtype of q: numpy in,
numpy out; torch in, torch out; jax in, jax out (computed into a numpy buffer, then handed to
``jax.device_put`` on q's CPU device, which may copy it once). The GIL is released while
computing. Bad arguments raise ValueError (shapes, devices, options) or TypeError (types, dtypes)
with the library's message: shapes, strides and option values are checked by the C++ library only;
this package checks only what the library cannot see (array kinds, devices, dtypes, writability,
option types, integers too large for C++).

``attention_backward`` is the backward pass: from ``dout`` and the forward's q, k, v, out and lse
(``attention(..., return_lse=True)``) it returns ``(dq, dk, dv)``, with the same layouts and rules
(and ``dsinks`` fourth when given the forward's ``sinks=``, gpt-oss's attention sinks).
"""

from __future__ import annotations

import sys

import numpy as np

from . import _flashgqa

__all__ = ["attention", "attention_backward", "attention_with_kvcache", "free_workspace_cache",
           "kvcache_int8_form", "linear_attention", "quantize_kv"]

_FLOAT_DTYPES = _flashgqa.DTYPE_NAMES  # the library's: ("float32", "bfloat16", "float16")


def _one_of(names, prefix=""):
    """'a, b or c' of the names, each with `prefix`."""
    names = [prefix + n for n in names]
    return ", ".join(names[:-1]) + " or " + names[-1]


class _Input:
    """One array argument: its kind, what the binding receives, its dtype name and shape."""

    __slots__ = ("obj", "kind", "arg", "dtype", "shape")

    def __init__(self, obj, kind, arg, dtype, shape):
        self.obj, self.kind, self.arg, self.dtype, self.shape = obj, kind, arg, dtype, tuple(shape)


def _numpy_dtype_name(dtype, name):
    if not dtype.isnative:
        raise TypeError(f"{name}: dtype {dtype} is not in native byte order, expected "
                        f"{_one_of(_FLOAT_DTYPES)}")
    # ml_dtypes.bfloat16 names itself "bfloat16"; numpy has no bfloat16 of its own.
    return dtype.name


def _module_of(obj, module):
    """The module `module` if it is imported and obj is one of its arrays (no import otherwise)."""
    mod = sys.modules.get(module)
    if mod is None:
        return None
    cls = mod.Tensor if module == "torch" else getattr(mod, "Array", None)
    return mod if cls is not None and isinstance(obj, cls) else None


def _expected(dtypes, prefix=""):
    return _one_of(dtypes, prefix) if len(dtypes) > 1 else prefix + dtypes[0]


def _import(obj, name, writable=False, dtypes=_FLOAT_DTYPES):
    """Classifies one array argument and prepares the zero-copy object the binding reads.
    `dtypes`: the dtype names the argument may have (lse: float32 only)."""
    if isinstance(obj, np.ndarray):
        dtype = _numpy_dtype_name(obj.dtype, name)
        if dtype not in dtypes:  # (uint16 too: the binding would read it as bfloat16)
            raise TypeError(f"{name}: dtype {dtype}, expected {_expected(dtypes)}")
        if writable and not obj.flags.writeable:
            raise ValueError(f"{name}: numpy array is read-only, expected a writable array")
        # numpy's DLPack export does not know bfloat16: hand over the same memory as uint16,
        # which the binding reads as bfloat16 bits (a view, not a copy).
        arg = obj.view(np.uint16) if dtype == "bfloat16" else obj
        return _Input(obj, "numpy", arg, dtype, obj.shape)

    torch = _module_of(obj, "torch")
    if torch is not None:
        if obj.device.type != "cpu":
            raise ValueError(f"{name}: torch tensor on device {obj.device}, expected a CPU tensor")
        dtype = str(obj.dtype).removeprefix("torch.")
        if dtype not in dtypes:
            raise TypeError(f"{name}: dtype {obj.dtype}, expected {_expected(dtypes, 'torch.')}")
        if obj.is_sparse or obj.layout != torch.strided:
            raise TypeError(f"{name}: torch tensor with layout {obj.layout}, expected a strided "
                            "(dense) tensor")
        # No autograd: detach() is a view of the same memory, which DLPack can then export.
        return _Input(obj, "torch", obj.detach(), dtype, obj.shape)

    jax = _module_of(obj, "jax")
    if jax is not None:
        if writable:
            raise TypeError(f"{name}: jax arrays are immutable, expected a writable numpy "
                            "array or torch tensor (or leave it out)")
        try:
            platforms = {d.platform for d in obj.devices()}
        except Exception:  # a tracer inside jax.jit has no devices and no memory
            raise TypeError(f"{name}: abstract jax value {type(obj).__name__}, expected a "
                            "concrete array (flashgqa cannot run inside jax.jit)") from None
        if platforms != {"cpu"}:
            raise ValueError(f"{name}: jax array on {sorted(platforms)}, expected a CPU array")
        dtype = str(obj.dtype)
        if dtype not in dtypes:
            raise TypeError(f"{name}: dtype {dtype}, expected {_expected(dtypes)}")
        return _Input(obj, "jax", obj, dtype, obj.shape)

    # Anything else with DLPack or the buffer protocol is read through a numpy view of its memory.
    if hasattr(obj, "__dlpack_device__"):
        device_type = obj.__dlpack_device__()[0]
        if device_type not in (1, 3):  # kDLCPU, kDLCUDAHost
            raise ValueError(f"{name}: {type(obj).__name__} on DLPack device type {device_type}, "
                             "expected a CPU array")
    if hasattr(obj, "__dlpack__"):
        try:
            view = np.from_dlpack(obj, copy=False)
        except TypeError:  # numpy < 2.1 has no copy argument; from_dlpack never copies there
            view = np.from_dlpack(obj)
        except BufferError as e:
            raise TypeError(f"{name}: {type(obj).__name__} cannot be read through DLPack "
                            f"({e}), expected a CPU array") from None
    else:
        try:
            view = np.asarray(memoryview(obj))
        except TypeError:
            raise TypeError(f"{name}: got {type(obj).__name__}, expected a CPU array with DLPack "
                            "or the buffer protocol (numpy, torch, jax)") from None
    if writable and not view.flags.writeable:
        raise ValueError(f"{name}: {type(obj).__name__} is read-only, expected a writable array")
    inp = _import(view, name, writable, dtypes)
    inp.obj, inp.kind = obj, "other"
    return inp


def _import_qkv(q, k, v):
    qi, ki, vi = _import(q, "q"), _import(k, "k"), _import(v, "v")
    if not qi.dtype == ki.dtype == vi.dtype:  # this module's rule: the result takes q's dtype
        raise TypeError(f"q, k, v: dtypes {qi.dtype}, {ki.dtype}, {vi.dtype}, expected one dtype "
                        "for all three")
    return qi, ki, vi


def _host_array(x, name, expected):
    """A small argument (offsets, sinks) of any array kind or a list as a numpy array: torch tensors
    on the CPU only, detached (bfloat16 ones as float32, which numpy lacks)."""
    torch = _module_of(x, "torch")
    if torch is not None:
        if x.device.type != "cpu":
            raise ValueError(f"{name}: torch tensor on device {x.device}, expected a CPU tensor")
        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
    try:
        return np.asarray(x)
    except Exception as e:
        raise TypeError(f"{name}: got {type(x).__name__} ({e}), expected {expected}") from None


def _offsets(x, name):
    """cu_seqlens_*: None, or n + 1 integer offsets (any array kind or a list) as contiguous int32."""
    if x is None:
        return None
    a = _host_array(x, name, "a 1-D array of ints")
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise TypeError(f"{name}: {a.ndim}-D array of {a.dtype}, expected a 1-D array of ints "
                        "(n + 1 offsets)")
    if a.size and (a.min() < -2**31 or a.max() > 2**31 - 1):
        raise ValueError(f"{name}: offsets from {a.min()} to {a.max()}, expected int32 values")
    return np.ascontiguousarray(a, dtype=np.int32)


def _empty_like_kind(qi, shape, dtype):
    """A new C-order array of q's kind (numpy for jax and other inputs), and the binding's view."""
    if qi.kind == "torch":
        import torch

        t = torch.empty(shape, dtype=getattr(torch, dtype), device="cpu")
        return t, t
    if dtype == "bfloat16":  # numpy's bfloat16 is ml_dtypes' (jax's too)
        import ml_dtypes

        a = np.empty(shape, dtype=ml_dtypes.bfloat16)
        return a, a.view(np.uint16)
    a = np.empty(shape, dtype=dtype)
    return a, a


def _finish(qi, result):
    """Hands a computed result back in q's kind (jax: a jax array made from the numpy buffer, on
    q's CPU device; jax may copy it once)."""
    if qi.kind == "jax":
        import jax

        return jax.device_put(result, next(iter(qi.obj.devices())))
    return result


def _output(qi, out, name="out"):
    """The output array to return and the object the binding writes: `out` itself (its shape is
    checked by the library) or a new one."""
    if out is None:
        return _empty_like_kind(qi, qi.shape, qi.dtype)
    return out, _import(out, name, writable=True).arg


def _sinks_heads(qi, ki):
    """(K, G) of q and k, or None when their shapes do not say (the library then reports q or k)."""
    if len(qi.shape) == 5:
        return qi.shape[1], qi.shape[2]
    if len(qi.shape) == 4 and len(ki.shape) == 4 and ki.shape[1] > 0 and qi.shape[1] % ki.shape[1] == 0:
        return ki.shape[1], qi.shape[1] // ki.shape[1]
    if len(qi.shape) == 3 and len(ki.shape) == 3 and ki.shape[1] > 0 and qi.shape[1] % ki.shape[1] == 0:
        return ki.shape[1], qi.shape[1] // ki.shape[1]  # packed: q [total, Hq, H], k [total, K, H]
    return None


def _import_sinks(sinks, qi, ki):
    """The sink logits as the library takes them: a contiguous float32 numpy array of K*G values
    (query head h = k*G + g), from any float array of shape [K, G] or [Hq] (numpy, torch, jax or
    anything with DLPack or the buffer protocol); None stays None. This one argument is copied
    (K*G numbers): its dtype is converted."""
    if sinks is None:
        return None
    array = _host_array(sinks, "sinks", "a float array of shape [K, G] or [Hq]")
    if array.dtype.kind != "f" and array.dtype.name != "bfloat16":
        raise TypeError(f"sinks: dtype {array.dtype}, expected a floating-point dtype")
    heads = _sinks_heads(qi, ki)
    if heads is not None:
        K, G = heads
        if tuple(array.shape) not in ((K, G), (K * G,)):
            raise ValueError(f"sinks: shape {list(array.shape)}, expected [K, G] = [{K}, {G}] or "
                             f"[Hq] = [{K * G}]")
    return np.ascontiguousarray(array.reshape(-1), dtype=np.float32)


def _like_sinks(sinks, values):
    """values (float32 numpy, K*G) as an array of the kind, dtype and shape of `sinks`."""
    torch = _module_of(sinks, "torch")
    if torch is not None:
        return torch.from_numpy(values).to(sinks.dtype).reshape(sinks.shape)
    jax = _module_of(sinks, "jax")
    if jax is not None:
        import jax.numpy as jnp

        return jax.device_put(jnp.asarray(values, dtype=sinks.dtype).reshape(sinks.shape),
                              next(iter(sinks.devices())))
    array = np.asarray(sinks)
    return values.astype(array.dtype).reshape(array.shape)


def attention(q, k, v, *, causal=False, causal_offset=None, window=None, cu_seqlens_q=None,
              cu_seqlens_k=None, scale=None, precision="bf16", algo="flash", return_lse=False,
              block_q=None, block_kv=None, threads=None, out=None, softcap=None, sinks=None):
    """Exact softmax attention, grouped-query: each kv head serves G query heads.

    Args:
      q: ``[B, K, G, T, H]``, or SDPA's ``[B, Hq, T, H]`` with ``Hq = K * G``, or
        FlashAttention's packed ``[total, Hq, H]``.
      k, v: ``[B, K, S, H]`` (``[total_k, K, H]`` with a packed q).
        q, k and v share one dtype: float32, float16 or bfloat16 (numpy: ml_dtypes.bfloat16).
        Any CPU array with DLPack or the buffer protocol, read in place (strided views welcome;
        the last dimension H must have stride 1).
      causal: mask keys after each query: query t sees key j when ``j <= t + causal_offset``.
      causal_offset: default ``S - T`` (bottom-right aligned, as FlashAttention); ``0`` is
        top-left, as ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``.
      window: ``(left, right)``, FlashAttention's ``window_size``: query t sees key j when
        ``t + offset - left <= j <= t + offset + right`` (offset as for causal; -1 = unbounded on
        that side). With ``causal`` the right side is 0. Cost follows the visible keys.
      cu_seqlens_q, cu_seqlens_k: packed sequences (FlashAttention's varlen): n + 1 int offsets
        each, from 0 to T and to S, on one batch (B = 1, or the 3-D packed layout). Sequence i is
        queries ``[cu_q[i], cu_q[i+1])`` against keys ``[cu_k[i], cu_k[i+1])``; nothing crosses a
        boundary; causal (default offset: each sequence's own ``S_i - T_i``) and windows apply
        within each sequence.
      scale: multiplies the logits ``q . k``; default ``1 / sqrt(H)``. The seed pre-scales q and
        uses 1.0.
      precision: ``"bf16"`` (the seed's rule: q, k, v and the softmax weights enter the matmuls
        rounded to bfloat16, accumulation in float32) or ``"f32"``.
      algo: ``"flash"`` (default), ``"naive"``, ``"chunked"``, ``"chunked-unstable"``,
        ``"kernel1"``: the seed's ladder.
      return_lse: also return ``lse = log(sum_j exp(scale * q . k_j))`` (float32, natural log)
        of shape ``[B, K, G, T]`` (5-D q), ``[B, Hq, T]`` (4-D q) or ``[total, Hq]`` (3-D q);
        ``-inf`` for rows that see no key.
      block_q, block_kv: rows of q per block and keys per KV block; None chooses.
      threads: worker threads; None uses all cores.
      out: optional writable array of q's shape (float32, float16 or bfloat16) to write into.
      softcap: logit softcap c (Gemma 2): each logit ``s = scale * q . k`` becomes
        ``c * tanh(s / c)`` before the softmax; None or 0 is off, else a finite c > 0. The lse is
        that of the capped logits.
      sinks: attention sinks (gpt-oss): one learned logit per query head, shape ``[K, G]`` or
        ``[Hq]`` (query head ``h = k*G + g``), any float dtype and array kind (converted to
        float32). Each row's softmax denominator gains ``exp(sink)`` with no value attached, and
        the lse includes it; ``-inf`` is no sink for that head; NaN and ``+inf`` are errors.
        Rows that see no key then give 0 and lse = the sink.

    Returns:
      ``out`` of q's shape, kind and dtype (or the given ``out``); with ``return_lse``, the pair
      ``(out, lse)``. Rows that see no key give 0.
    """
    qi, ki, vi = _import_qkv(q, k, v)
    result, out_arg = _output(qi, out)
    lse, lse_arg = (_empty_like_kind(qi, qi.shape[:-1], "float32") if return_lse
                    else (None, None))
    # The options go as given: the binding converts them (TypeError for a wrong type, ValueError
    # for an int too large for C++) and the library checks their values.
    _flashgqa.attention(
        qi.arg, ki.arg, vi.arg, out_arg, lse_arg, causal=bool(causal),
        causal_offset=causal_offset, window=window,
        cu_seqlens_q=_offsets(cu_seqlens_q, "cu_seqlens_q"),
        cu_seqlens_k=_offsets(cu_seqlens_k, "cu_seqlens_k"), scale=scale, precision=precision, algo=algo,
        block_q=block_q, block_kv=block_kv, threads=threads, softcap=softcap,
        sinks=_import_sinks(sinks, qi, ki))
    result = result if out is not None else _finish(qi, result)
    return (result, _finish(qi, lse)) if return_lse else result


def _int32_table(x, name, ndim):
    """cache_seqlens (1-D) or block_table (2-D): any int array kind or a list as contiguous int32."""
    a = _host_array(x, name, f"a {ndim}-D array of ints")
    if a.ndim != ndim or (a.size and a.dtype.kind not in "iu"):
        raise TypeError(f"{name}: {a.ndim}-D array of {a.dtype}, expected a {ndim}-D array of ints")
    if a.size and (a.min() < -2**31 or a.max() > 2**31 - 1):
        raise ValueError(f"{name}: values from {a.min()} to {a.max()}, expected int32 values")
    return np.ascontiguousarray(a, dtype=np.int32)


def attention_with_kvcache(q, k_cache, v_cache, *, cache_seqlens, block_table=None, k_new=None,
                           v_new=None, k_scale=None, v_scale=None, causal=True, causal_offset=None,
                           scale=None, window=None, softcap=None, sinks=None, threads=None,
                           precision="bf16", block_kv=None, return_lse=False, out=None):
    """Attention of T new queries per sequence against a KV cache (FlashAttention's
    ``flash_attn_with_kvcache``), every sequence at its own length.

    Args:
      q: ``[B, K, G, T, H]`` or ``[B, Hq, T, H]`` (``Hq = K * G``): the T newest positions of each
        sequence.
      k_cache, v_cache: dense ``[B, K, S_max, H]``, or paged ``[num_pages, K, page_size, H]`` with
        ``block_table`` (page_size a multiple of 16). float32, float16, bfloat16, or int8 with
        ``k_scale``/``v_scale`` (from :func:`quantize_kv`); read in place, and written in place
        (numpy, torch) when ``k_new``/``v_new`` are given.
      cache_seqlens: ``[B]`` ints, the keys already in each sequence's cache.
      block_table: ``[B, max_pages]`` ints: sequence b's key s lives in page
        ``block_table[b, s // page_size]``, row ``s % page_size``. None: a dense cache. Tables
        may share pages (a common prefix), but an append into a row that another sequence, or
        the same one at another position, holds raises ValueError.
      k_new, v_new: ``[B, K, T, H]`` of the cache's dtype (any float dtype for an int8 cache, which
        quantizes them as :func:`quantize_kv` does and writes their scales), written at keys
        ``cache_seqlens[b] .. cache_seqlens[b] + T - 1`` of each sequence before attending
        (cache_seqlens is not changed: add T yourself for the next step). Not for jax caches
        (immutable).
      k_scale, v_scale: an int8 cache's float32 scales, the cache's shape without H (``[B, K,
        S_max]`` or ``[num_pages, K, page_size]``): key s stands for ``k_cache[..., s, :] *
        k_scale[..., s]`` (the product in float32, then rounded as a float32 cache's values).
      causal: bottom-right per sequence (default True): query t sees key j when
        ``j <= t + L_b - T``, L_b the sequence's keys in this call; ``causal_offset`` replaces
        ``L_b - T`` for every sequence.
      scale, window, softcap, sinks, threads, precision, block_kv, out: as ``attention``.
      return_lse: also return lse ``[B, K, G, T]`` (or ``[B, Hq, T]``).

    Returns:
      ``out`` (q's shape, kind and dtype), or ``(out, lse)`` with ``return_lse``.
    """
    appending = k_new is not None or v_new is not None
    qi = _import(q, "q")
    ki = _import(k_cache, "k_cache", writable=appending, dtypes=_FLOAT_DTYPES + ("int8",))
    vi = _import(v_cache, "v_cache", writable=appending, dtypes=_FLOAT_DTYPES + ("int8",))
    ks = (_import(k_scale, "k_scale", writable=appending, dtypes=("float32",)).arg
          if k_scale is not None else None)
    vs = (_import(v_scale, "v_scale", writable=appending, dtypes=("float32",)).arg
          if v_scale is not None else None)
    kn = _import(k_new, "k_new").arg if k_new is not None else None
    vn = _import(v_new, "v_new").arg if v_new is not None else None
    result, out_arg = _output(qi, out)
    lse, lse_arg = (_empty_like_kind(qi, qi.shape[:-1], "float32") if return_lse
                    else (None, None))
    _flashgqa.attention_with_kvcache(
        qi.arg, ki.arg, vi.arg, out_arg, lse_arg,
        cache_seqlens=_int32_table(cache_seqlens, "cache_seqlens", 1),
        block_table=None if block_table is None else _int32_table(block_table, "block_table", 2),
        k_new=kn, v_new=vn, causal=bool(causal), causal_offset=causal_offset, window=window,
        scale=scale, precision=precision, block_kv=block_kv, threads=threads, softcap=softcap,
        sinks=_import_sinks(sinks, qi, ki), k_scale=ks, v_scale=vs)
    result = result if out is not None else _finish(qi, result)
    return (result, _finish(qi, lse)) if return_lse else result


def quantize_kv(x):
    """Symmetric int8 quantization of a K or V cache for :func:`attention_with_kvcache`, one
    float32 scale per row (the last axis, H): ``scale = max |x| / 127``, ``x_int8 = x / scale``
    rounded to nearest even (a row of zeros: scale 0). So ``|x - x_int8 * scale| <=
    scale * (1/2 + 127 * 2**-23) + 2**-143`` (the last term only matters for rows below ~2**-119).

    Args:
      x: any float array (numpy, torch, jax), rank 1 to 5, H contiguous: e.g. a cache
        ``[B, K, S, H]`` or ``[num_pages, K, page_size, H]``, or new keys ``[B, K, T, H]``.

    Returns:
      ``(x_int8, scale)``: int8 of x's shape and float32 of x's shape without its last axis, of
      x's kind. Raises ValueError for a NaN or infinite value (it has no scale).
    """
    xi = _import(x, "x")
    if len(xi.shape) < 1:
        raise ValueError("x: a 0-D array, expected rows along a last axis (rank 1 to 5)")
    x8, x8_arg = _empty_like_kind(xi, xi.shape, "int8")
    sc, sc_arg = _empty_like_kind(xi, xi.shape[:-1], "float32")
    _flashgqa.quantize_kv(xi.arg, x8_arg, sc_arg)
    return _finish(xi, x8), _finish(xi, sc)


def free_workspace_cache():
    """Hands back to the system the workspace memory flashgqa keeps between calls, and returns its
    size in bytes. Every call's scratch blocks of 64 KiB or more are kept for the next calls, up to 64
    MiB in all (the oldest handed back first), so that short calls (decode above all) do not fault in
    fresh pages each time; this releases them now (a later call allocates again). Safe from any
    thread."""
    return int(_flashgqa.free_workspace_cache())


def kvcache_int8_form(G=None, T=None, H=None):
    """How :func:`attention_with_kvcache` computes with an int8 cache on this machine's path
    (precision "bf16"): ``"products"``, the bits of a float32 cache holding ``x_int8 * scale``; or
    ``"integers"`` (AVX-512 BF16 and AMX CPUs: vpdpwssd; AVX2 CPUs without AVX-512: vpmaddwd, the same
    bits), the int8 values as they are, each query row and each 16 keys' softmax weights (times the V
    scales) quantized to int16, the scales applied after exact integer sums: faster, within the error
    bound stated in ``src/reference/tolerance.hpp`` (ExtraError).

    Without arguments: the form of calls whose query rows fit one row group (T = 1 at G <= 8). With
    ``G`` (query heads per kv head), ``T`` (new tokens) and ``H`` (head size), all three: the form such
    a call takes. The integers form needs G <= 8, G*T <= 128 and H <= 256, on AMX CPUs fewer than 16
    query rows (G*T < 16: T <= 3 at G = 4) and on AVX-512 BF16 CPUs whose vdpbf16ps runs at full rate
    (AMD Zen 4) fewer than 32 (T <= 7 at G = 4): from there, each KV block's int8 rows become their
    bf16 products once for all the row groups, for the bf16 tiles, which is faster there.
    """
    if G is None and T is None and H is None:
        return _flashgqa.kvcache_int8_form()
    if G is None or T is None or H is None:
        raise ValueError("kvcache_int8_form: give G, T and H together (or none of them)")
    return _flashgqa.kvcache_int8_form(int(G), int(T), int(H))


_KIND_NAMES = {"numpy": "a numpy array (or other buffer)", "torch": "a torch tensor",
               "jax": "a jax array"}


def _result_kind(inp):
    """The kind of array a result made for `inp` has: numpy, torch or jax (other arrays: numpy)."""
    return "numpy" if inp.kind == "other" else inp.kind


def _import_like_q(qi, obj, name, dtypes=None):
    """An array that goes with q (the forward's out and lse, the gradient dout): q's kind, and q's
    dtype unless `dtypes` names others."""
    xi = _import(obj, name, dtypes=dtypes or _FLOAT_DTYPES)
    if _result_kind(xi) != _result_kind(qi):
        raise TypeError(f"{name}: {_KIND_NAMES[_result_kind(xi)]}, expected "
                        f"{_KIND_NAMES[_result_kind(qi)]}, the kind of q")
    if dtypes is None and xi.dtype != qi.dtype:
        raise TypeError(f"{name}: dtype {xi.dtype}, expected q's dtype {qi.dtype}")
    return xi


def attention_backward(dout, q, k, v, out, lse, *, causal=False, causal_offset=None, window=None,
                       cu_seqlens_q=None, cu_seqlens_k=None, scale=None, precision="bf16",
                       block_q=None, block_kv=None, threads=None, softcap=None, sinks=None):
    """The gradients of :func:`attention`: ``(dq, dk, dv)`` of a loss L from ``dout = dL/dout``.

    FlashAttention-2's backward: the softmax weights P are recomputed from q, k and the forward's
    lse; ``D = rowsum(dout * out)``; ``dv = P^T dout``, ``dS = P (dout v^T - D)``,
    ``dq = scale dS k``, ``dk = scale dS^T q``. dk and dv sum over the G query heads of each kv
    head. The result does not depend on ``threads`` (same bits for any count).

    Args:
      dout: the gradient of the loss with respect to ``out``; q's shape, kind and dtype.
      q, k, v: the forward's inputs, as for :func:`attention` (5-D ``[B, K, G, T, H]`` or SDPA's
        4-D ``[B, Hq, T, H]`` q; k, v ``[B, K, S, H]``; one dtype; read in place).
      out, lse: the forward's output and float32 log-sum-exp, as
        ``attention(q, k, v, return_lse=True, ...)`` returned them with the same causal,
        causal_offset, scale and precision: out of q's shape, lse ``[B, K, G, T]`` (5-D q) or
        ``[B, Hq, T]`` (4-D q); both of q's kind.
      causal, causal_offset, window, cu_seqlens_q, cu_seqlens_k, scale, softcap: as for
        :func:`attention` (the forward's values). With a softcap c, ``dS`` is also multiplied by
        the cap's derivative ``1 - tanh^2(s / c)``.
      precision: ``"bf16"``: q, k, v and dout enter the matmuls rounded to bfloat16, and so do the
        weights P before ``dv = P^T dout`` and ``dS`` before ``dq`` and ``dk``; every
        accumulation (``D`` too) is float32. ``"f32"``: all operands stay float32.
      block_q, block_kv: the backward's q and KV blocks; None chooses.
      threads: worker threads; None uses all cores.
      sinks: the forward's sinks (see :func:`attention`), when it had them.

    Returns:
      ``(dq, dk, dv)``: dq of q's shape, kind and dtype; dk and dv of k's shape, kind and dtype.
      With ``sinks``, ``(dq, dk, dv, dsinks)``: dsinks of the sinks' shape, kind and dtype,
      ``dsink = -sum_{b,t} exp(sink - lse) * rowsum(dout * out)`` (summed in float64).
      Rows that saw no key give zero dq rows and add nothing to dk, dv and dsinks.
    """
    qi, ki, vi = _import_qkv(q, k, v)
    di = _import_like_q(qi, dout, "dout")
    oi = _import_like_q(qi, out, "out")
    li = _import_like_q(qi, lse, "lse", dtypes=("float32",))
    dq, dq_arg = _empty_like_kind(qi, qi.shape, qi.dtype)
    dk, dk_arg = _empty_like_kind(ki, ki.shape, ki.dtype)
    dv, dv_arg = _empty_like_kind(ki, ki.shape, ki.dtype)
    sinks_arg = _import_sinks(sinks, qi, ki)
    dsinks = None if sinks is None else np.empty_like(sinks_arg)
    _flashgqa.attention_backward(
        di.arg, qi.arg, ki.arg, vi.arg, oi.arg, li.arg, dq_arg, dk_arg, dv_arg,
        causal=bool(causal), causal_offset=causal_offset, window=window,
        cu_seqlens_q=_offsets(cu_seqlens_q, "cu_seqlens_q"),
        cu_seqlens_k=_offsets(cu_seqlens_k, "cu_seqlens_k"), scale=scale, precision=precision,
        block_q=block_q, block_kv=block_kv, threads=threads, softcap=softcap, sinks=sinks_arg,
        dsinks=dsinks)
    grads = _finish(qi, dq), _finish(ki, dk), _finish(ki, dv)
    return grads if sinks is None else grads + (_like_sinks(sinks, dsinks),)


def linear_attention(q, k, v, *, causal=False, causal_offset=None, window=None, scale=None,
                     precision="bf16", block_kv=None, threads=None, out=None):
    """The seed's linear attention (no softmax): ``out[t] = sum_j (scale * q_t . k_j) v_j``.

    Shapes, dtypes, kinds and the options causal, causal_offset, window, scale, precision (under "bf16"
    the logits are rounded to bfloat16 before the second matmul), block_kv (keys per chunk),
    threads and out are those of :func:`attention`: q ``[B, K, G, T, H]`` or ``[B, Hq, T, H]``,
    k, v ``[B, K, S, H]``; returns an array of q's shape, kind and dtype.
    """
    qi, ki, vi = _import_qkv(q, k, v)
    result, out_arg = _output(qi, out)
    _flashgqa.linear_attention(
        qi.arg, ki.arg, vi.arg, out_arg, causal=bool(causal), causal_offset=causal_offset,
        window=window, scale=scale, precision=precision, block_kv=block_kv, threads=threads)
    return result if out is not None else _finish(qi, result)
