"""flashgqa as a JAX op: inside ``jax.jit``, under ``jax.vmap``, differentiable with ``jax.grad``.

``flashgqa.jax.attention`` calls the C++ library through XLA's FFI (handlers in
python/src/jax_ffi.cpp, registered here with ``jax.ffi.register_ffi_target`` for the CPU): XLA
hands the handler its buffers, no host callback runs and nothing is copied. Gradients come from
``jax.custom_vjp`` backed by the library's backward pass (FlashAttention-2's, the same bits for any
thread count).

Layouts: q ``[B, K, G, T, H]`` (the seed's) or ``[B, Hq, T, H]`` (SDPA's, ``Hq = K * G``), k and v
``[B, K, S, H]``; lse ``[B, K, G, T]`` or ``[B, Hq, T]``. ``jax.vmap`` over leading axes folds them
into B inside the handler (``vmap_method="broadcast_all"``: one call, not a loop), except for calls
with ``sinks``, which are per head and so vmapped as a loop of calls.

The lse that ``return_lse=True`` returns is an output of the forward, not differentiable: a loss
that depends on it raises ``NotImplementedError`` when differentiated (rather than a silently
wrong gradient); wrap it in ``jax.lax.stop_gradient`` when its gradient is not wanted.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError("flashgqa.jax needs jax (pip install 'jax[cpu]'); "
                      f"importing it failed: {e}") from e

try:
    from . import _flashgqa_jax
except ImportError as e:
    raise ImportError("flashgqa.jax: this flashgqa was built without jax's XLA FFI headers (jax "
                      "was not importable by the Python that built it); reinstall it from a "
                      "Python that has jax, e.g. `pip install --no-build-isolation .`") from e

for _name, _capsule in _flashgqa_jax.handlers().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

__all__ = ["attention", "attention_backward"]

_DTYPES = ("float32", "bfloat16", "float16")


class _Options(NamedTuple):
    """The static (hashable) options of one call, as the handlers' attributes."""

    causal: bool
    causal_offset: int | None
    window: tuple[int, int]
    scale: float | None
    precision: str
    threads: int
    layout_rank: int
    softcap: float

    def attrs(self):
        # Attribute types must match the handler's binding exactly (numpy scalars).
        return dict(
            causal=np.bool_(self.causal),
            has_causal_offset=np.bool_(self.causal_offset is not None),
            causal_offset=np.int64(self.causal_offset or 0),
            window_left=np.int64(self.window[0]), window_right=np.int64(self.window[1]),
            has_scale=np.bool_(self.scale is not None),
            scale=np.float64(self.scale if self.scale is not None else 0.0),
            precision=self.precision, threads=np.int64(self.threads),
            layout_rank=np.int64(self.layout_rank), softcap=np.float64(self.softcap))


def _check_int(x, name, lo=-(2**63), hi=2**63 - 1):
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name}: {x!r}, expected an int")
    if not lo <= int(x) <= hi:
        raise ValueError(f"{name}: {x} does not fit, expected an int in [{lo}, {hi}]")
    return int(x)


def _options(q, k, v, causal, causal_offset, window, scale, precision, threads, softcap):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if str(x.dtype) not in _DTYPES:
            raise TypeError(f"{name}: dtype {x.dtype}, expected float32, bfloat16 or float16")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v: dtypes {q.dtype}, {k.dtype}, {v.dtype}, expected one dtype")
    if q.ndim not in (4, 5):
        raise ValueError(f"q: rank {q.ndim}, expected 5 [B,K,G,T,H] or 4 [B,Hq,T,H]")
    if k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"k, v: ranks {k.ndim}, {v.ndim}, expected 4 [B,K,S,H]")
    if window is None:
        window = (-1, -1)
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window: {window!r}, expected None or a pair (left, right) of ints")
    window = (_check_int(window[0], "window[0]"), _check_int(window[1], "window[1]"))
    if causal_offset is not None:
        causal_offset = _check_int(causal_offset, "causal_offset")
    if scale is not None:
        scale = float(scale)
    if precision not in ("bf16", "f32"):
        raise ValueError(f"precision: {precision!r}, expected 'bf16' or 'f32'")
    threads = 0 if threads is None else _check_int(threads, "threads", 0, 2**31 - 1)
    softcap = 0.0 if softcap is None else float(softcap)  # the library checks its value
    return _Options(bool(causal), causal_offset, window, scale, precision, threads, q.ndim, softcap)


def _lse_shape(q, opts):
    return q.shape[:-1]


def _vmap_method(sinks):
    # Leading axes fold into B in one call; sinks are per head, so a call with sinks loops instead.
    return "sequential" if sinks.size else "broadcast_all"


def _forward(q, k, v, sinks, opts):
    call = jax.ffi.ffi_call(
        "flashgqa_attention",
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(_lse_shape(q, opts), jnp.float32)),
        vmap_method=_vmap_method(sinks))
    return call(q, k, v, sinks, **opts.attrs())


def _backward(dout, q, k, v, out, lse, sinks, opts):
    """(dq, dk, dv, dsinks); dsinks is empty without sinks."""
    call = jax.ffi.ffi_call(
        "flashgqa_attention_backward",
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
         jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct(sinks.shape, jnp.float32)),
        vmap_method=_vmap_method(sinks))
    return call(dout.astype(q.dtype), q, k, v, out, lse, sinks, **opts.attrs())


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, sinks, opts):
    return _forward(q, k, v, sinks, opts)


def _attention_fwd(q, k, v, sinks, opts):
    q, k, v, sinks = q.value, k.value, v.value, sinks.value  # symbolic_zeros=True: primals wrapped
    out, lse = _forward(q, k, v, sinks, opts)
    return (out, lse), (q, k, v, sinks, out, lse)


def _attention_bwd(opts, residuals, cotangents):
    q, k, v, sinks, out, lse = residuals
    dout, dlse = cotangents
    if not isinstance(dlse, jax.custom_derivatives.SymbolicZero):
        raise NotImplementedError(
            "flashgqa.jax.attention: the gradient through lse is not supported (its cotangent "
            "is not zero); differentiate only out, or wrap lse in jax.lax.stop_gradient")
    if isinstance(dout, jax.custom_derivatives.SymbolicZero):
        return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v), jnp.zeros_like(sinks)
    return _backward(dout, q, k, v, out, lse, sinks, opts)


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


def _sinks(sinks, q, k):
    """sinks ([K, G] or [Hq], any float dtype) as the handlers' flat float32 [K*G] (empty: none)."""
    if sinks is None:
        return jnp.zeros((0,), jnp.float32)
    sinks = jnp.asarray(sinks)
    if not jnp.issubdtype(sinks.dtype, jnp.floating):
        raise TypeError(f"sinks: dtype {sinks.dtype}, expected a floating-point dtype")
    heads = q.shape[1] * (q.shape[2] if q.ndim == 5 else 1)
    if sinks.size != heads or sinks.ndim not in (1, 2):
        raise ValueError(f"sinks: shape {list(sinks.shape)}, expected [K, G] or [Hq] with "
                         f"{heads} query heads")
    return sinks.astype(jnp.float32).reshape(-1)


def attention(q, k, v, *, causal=False, causal_offset=None, window=None, scale=None,
              precision="bf16", return_lse=False, threads=None, softcap=None, sinks=None):
    """Exact grouped-query softmax attention as a JAX op (jit, vmap, grad).

    The options mean what they mean in :func:`flashgqa.attention`: ``causal`` (query t sees keys
    ``j <= t + causal_offset``, default offset ``S - T``), ``window=(left, right)``
    (FlashAttention's window_size, -1 unbounded), ``scale`` (default ``1/sqrt(H)``), ``precision``
    ("bf16": the seed's rule; "f32"), ``threads`` (None: all cores), ``softcap`` (Gemma 2's
    ``c tanh(s / c)`` on the logits; None or 0: off). They are static: each distinct set compiles
    its own call. ``sinks`` (gpt-oss's attention sinks, ``[K, G]`` or ``[Hq]``, any float dtype)
    is an array like q, k and v: differentiable, with its gradient in its own shape and dtype.

    Returns out (q's shape and dtype), or ``(out, lse)`` with ``return_lse`` (lse float32, q's
    shape without H; not differentiable, see the module docstring).
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    opts = _options(q, k, v, causal, causal_offset, window, scale, precision, threads, softcap)
    out, lse = _attention(q, k, v, _sinks(sinks, q, k), opts)
    return (out, lse) if return_lse else out


def attention_backward(dout, q, k, v, out, lse, *, causal=False, causal_offset=None, window=None,
                       scale=None, precision="bf16", threads=None, softcap=None, sinks=None):
    """The backward pass as a JAX op: ``(dq, dk, dv)`` from ``dout`` and the forward's q, k, v,
    out and lse (``attention(..., return_lse=True)`` with the same options); with ``sinks``,
    ``(dq, dk, dv, dsinks)``, dsinks float32 in the sinks' shape."""
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    opts = _options(q, k, v, causal, causal_offset, window, scale, precision, threads, softcap)
    flat = _sinks(sinks, q, k)
    dq, dk, dv, dsinks = _backward(jnp.asarray(dout), q, k, v, jnp.asarray(out), jnp.asarray(lse),
                                   flat, opts)
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks.reshape(jnp.shape(sinks)))
