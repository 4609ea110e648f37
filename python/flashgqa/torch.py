"""flashgqa as a PyTorch operator: ``torch.ops.flashgqa.attention`` and its backward, with fake
kernels for ``torch.compile`` and autograd, and a drop-in for
``torch.nn.functional.scaled_dot_product_attention`` on the CPU.

Importing this module registers two operators with ``torch.library``:

- ``torch.ops.flashgqa.attention(q, k, v, causal=False, causal_offset=None, window_left=-1,
  window_right=-1, scale=None, precision="bf16", cu_seqlens_q=None, cu_seqlens_k=None)``
  ``-> (out, lse)`` (and last ``softcap=0.0, sinks=None``): :func:`flashgqa.attention` with
  ``return_lse=True``. out has q's shape and
  dtype, lse is float32 of q's shape without the last dimension (``[B, K, G, T]``, ``[B, Hq, T]``
  or ``[total, Hq]``). lse is always returned, since the backward reads it; it carries no gradient.
- ``torch.ops.flashgqa.attention_backward(dout, q, k, v, out, lse, <the same options>)``
  ``-> (dq, dk, dv, dsinks)``: :func:`flashgqa.attention_backward`; dsinks is the sinks'
  gradient in their shape and dtype, or an empty float32 tensor without sinks.

Both take every layout of :func:`flashgqa.attention`: q ``[B, K, G, T, H]`` (the seed's),
``[B, Hq, T, H]`` (SDPA's) or ``[total, Hq, H]`` (FlashAttention's packed layout, with
``cu_seqlens_q``/``cu_seqlens_k``, int tensors of n + 1 offsets). ``window_left``/``window_right``
are ``window=(left, right)`` (-1: unbounded). Each has a fake kernel (shapes and dtypes only), so
``torch.compile(fullgraph=True)`` traces through them without a graph break, and the forward has
autograd registered through the backward op (double backward is not supported).

Why Python ``torch.library.custom_op`` rather than a C++ ``TORCH_LIBRARY`` extension: the package
already has a nanobind binding that reads torch tensors in place through DLPack and releases the
GIL while computing, so an operator written here adds no copy and no measurable overhead. A C++
registration would link libtorch and tie each wheel to the ABI of one torch version; this module
needs only a torch that has ``torch.library.custom_op`` (2.4 or later), and torch stays optional
for the rest of the package.

Tensors whose last dimension is not contiguous (a broadcast gradient of stride 0, for instance) are
made contiguous before the call, as the library reads H in place; any other strides are read as
they are.
"""

from typing import Optional

try:
    import torch
except ImportError as e:  # this file is flashgqa/torch.py; `import torch` above is PyTorch's
    raise ImportError("flashgqa.torch needs PyTorch (the 'torch' package), which is not "
                      "installed: pip install torch") from e

import flashgqa

__all__ = ["attention", "scaled_dot_product_attention"]

Tensor = torch.Tensor


def _h_contiguous(x):
    """x itself when its last dimension has stride 1 or length <= 1 (what the library reads in
    place), else a contiguous copy."""
    return x if x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()


def _options(causal, causal_offset, window_left, window_right, scale, precision, cu_seqlens_q,
             cu_seqlens_k, softcap, sinks):
    """The op's arguments as keyword arguments of flashgqa.attention / attention_backward."""
    return dict(causal=causal, causal_offset=causal_offset, window=(window_left, window_right),
                scale=scale, precision=precision, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_k=cu_seqlens_k, softcap=softcap,
                sinks=None if sinks is None else sinks.detach())


@torch.library.custom_op("flashgqa::attention", mutates_args=(), device_types="cpu")
def _attention_op(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                  causal_offset: Optional[int] = None, window_left: int = -1,
                  window_right: int = -1, scale: Optional[float] = None,
                  precision: str = "bf16", cu_seqlens_q: Optional[Tensor] = None,
                  cu_seqlens_k: Optional[Tensor] = None, softcap: float = 0.0,
                  sinks: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    q, k, v = (_h_contiguous(x) for x in (q, k, v))
    return flashgqa.attention(q, k, v, return_lse=True, **_options(
        causal, causal_offset, window_left, window_right, scale, precision, cu_seqlens_q,
        cu_seqlens_k, softcap, sinks))


@_attention_op.register_fake
def _(q, k, v, causal=False, causal_offset=None, window_left=-1, window_right=-1, scale=None,
      precision="bf16", cu_seqlens_q=None, cu_seqlens_k=None, softcap=0.0, sinks=None):
    # What flashgqa.attention allocates: contiguous out of q's shape and dtype, float32 lse of
    # q's shape without H.
    return (q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32))


@torch.library.custom_op("flashgqa::attention_backward", mutates_args=(), device_types="cpu")
def _attention_backward_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                           lse: Tensor, causal: bool = False,
                           causal_offset: Optional[int] = None, window_left: int = -1,
                           window_right: int = -1, scale: Optional[float] = None,
                           precision: str = "bf16", cu_seqlens_q: Optional[Tensor] = None,
                           cu_seqlens_k: Optional[Tensor] = None, softcap: float = 0.0,
                           sinks: Optional[Tensor] = None
                           ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dout, q, k, v, out = (_h_contiguous(x) for x in (dout, q, k, v, out))
    grads = flashgqa.attention_backward(dout, q, k, v, out, lse, **_options(
        causal, causal_offset, window_left, window_right, scale, precision, cu_seqlens_q,
        cu_seqlens_k, softcap, sinks))
    # dsinks: the sinks' gradient in their shape and dtype, or empty without sinks (an op
    # returns tensors, not None).
    return grads if sinks is not None else (*grads, _no_dsinks(q))


def _no_dsinks(q):
    return q.new_empty((0,), dtype=torch.float32)


@_attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, causal=False, causal_offset=None, window_left=-1,
      window_right=-1, scale=None, precision="bf16", cu_seqlens_q=None, cu_seqlens_k=None,
      softcap=0.0, sinks=None):
    dsinks = sinks.new_empty(sinks.shape) if sinks is not None else _no_dsinks(q)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


def _setup_context(ctx, inputs, output):
    # inputs: q, k, v, then the options in schema order, which go unchanged to the backward op.
    q, k, v, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = options
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    # lse is non-differentiable: dlse is None or zeros, and adds nothing. The options' gradients
    # are None, but for the sinks (the last option), which are learned.
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv, dsinks = torch.ops.flashgqa.attention_backward(dout, q, k, v, out, lse,
                                                               *ctx.options)
    sinks = ctx.options[-1]
    return ((dq, dk, dv) + (None,) * (len(ctx.options) - 1)
            + (dsinks if sinks is not None else None,))


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, *, causal=False, causal_offset=None, window=None, cu_seqlens_q=None,
              cu_seqlens_k=None, scale=None, precision="bf16", return_lse=False, softcap=None,
              sinks=None):
    """:func:`flashgqa.attention` through ``torch.ops.flashgqa.attention``: differentiable in q,
    k and v, traceable by ``torch.compile``. Same layouts, options and meaning (window
    ``(left, right)``, -1 unbounded; cu_seqlens as int tensors; softcap None or 0: off; sinks a
    float tensor ``[K, G]`` or ``[Hq]``, differentiable).
    Returns out, or ``(out, lse)`` with ``return_lse`` (lse without gradient)."""
    if window is None:
        window = (-1, -1)
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window: {window!r}, expected None or a pair (left, right) of ints")
    left, right = window
    out, lse = torch.ops.flashgqa.attention(q, k, v, causal, causal_offset, left, right, scale,
                                            precision, cu_seqlens_q, cu_seqlens_k,
                                            0.0 if softcap is None else float(softcap), sinks)
    return (out, lse) if return_lse else out


# Input dtype -> precision: the operands keep the input's precision, as SDPA's do.
_SDPA_PRECISION = {torch.float32: "f32", torch.float16: "f32", torch.bfloat16: "bf16"}


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, *, scale=None, enable_gqa=False):
    """A drop-in for ``torch.nn.functional.scaled_dot_product_attention`` on CPU tensors,
    computed by flashgqa (differentiable through ``torch.ops.flashgqa.attention``).

    query ``[..., Hq, T, H]``, key and value ``[..., K, S, H]`` with the same leading dimensions
    (none: one batch), as SDPA. ``is_causal`` is SDPA's top-left mask (query t sees keys
    ``j <= t``: flashgqa's ``causal_offset=0``). With ``enable_gqa=False``, K must equal Hq (or be
    1, which SDPA broadcasts); with ``enable_gqa=True``, Hq must be a multiple of K.

    Precision follows the input dtype: float32 and float16 inputs run at ``precision="f32"``
    (operands as given, float32 accumulation), bfloat16 at ``"bf16"`` (bfloat16 operands and
    softmax weights, float32 accumulation), as SDPA's CPU kernels round at worst to the input dtype.

    Not supported, with an error naming the argument rather than a silent difference:
    ``attn_mask`` (NotImplementedError; use flashgqa.torch.attention's causal_offset, window or
    cu_seqlens for the masks that are key ranges), ``dropout_p > 0`` (NotImplementedError),
    tensors off the CPU (ValueError), a value head dim other than the query's
    (NotImplementedError), float64 (TypeError, from flashgqa).
    """
    if attn_mask is not None:
        raise NotImplementedError(
            "attn_mask: flashgqa's scaled_dot_product_attention takes no explicit mask, expected "
            "None (is_causal=True, or flashgqa.torch.attention's causal_offset, window and "
            "cu_seqlens_q/cu_seqlens_k for masks that are key ranges)")
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p: {dropout_p}, expected 0.0 (flashgqa has no "
                                  "dropout)")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: got {type(x).__name__}, expected a torch.Tensor")
        if x.device.type != "cpu":
            raise ValueError(f"{name}: tensor on device {x.device}, expected a CPU tensor "
                             "(flashgqa runs on the CPU)")
        if x.dim() < 3:
            raise ValueError(f"{name}: rank {x.dim()}, expected [..., heads, length, head_dim] "
                             "(rank 3 or more)")
    lead = query.shape[:-3]
    if key.shape[:-3] != lead or value.shape[:-3] != lead:
        raise ValueError(f"key, value: leading dimensions {list(key.shape[:-3])} and "
                         f"{list(value.shape[:-3])}, expected query's {list(lead)}")
    if value.shape[-1] != query.shape[-1]:
        raise NotImplementedError(f"value: head dim {value.shape[-1]}, expected query's "
                                  f"{query.shape[-1]} (flashgqa needs one head dim)")
    hq, kv = query.shape[-3], key.shape[-3]
    if not enable_gqa and kv not in (hq, 1):
        # SDPA's own error for heads that do not broadcast.
        raise RuntimeError(f"The size of tensor a ({hq}) must match the size of tensor b ({kv}) "
                           f"at non-singleton dimension {query.dim() - 3} (query has {hq} heads, "
                           f"key {kv}: pass enable_gqa=True for grouped-query attention)")
    precision = _SDPA_PRECISION.get(query.dtype, "f32")  # other dtypes: flashgqa's TypeError
    q, k, v = (x.reshape(-1, *x.shape[-3:]) for x in (query, key, value))  # [B, heads, len, H]
    out = attention(q, k, v, causal=bool(is_causal), causal_offset=0 if is_causal else None,
                    scale=scale, precision=precision)
    return out.reshape(query.shape)
