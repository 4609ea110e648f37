"""The seed's JAX functions, verbatim (q [B,K,G,T,H] pre-scaled by H^-1/2, k, v [B,K,S,H];
bf16 operands, fp32 accumulation, weights rounded to bf16 before the second matmul), for the tests
that compare flashgqa with them (test_against_seed.py, test_backward.py). Importing it needs jax.

attn_naive_f32 at the end is not the seed's: it is attn_naive with float32 where the seed writes
bfloat16 (operands and weights unrounded), flashgqa's precision="f32" rule, so that jax.grad of it
is a float32 reference for the backward pass.
"""
import functools

import jax
import jax.numpy as jnp

# ---- The seed's code, verbatim. ----


@jax.jit
def attn_naive(q, k, v):
  b, kvh, g, t, h = q.shape
  _, _, s, _ = k.shape
  assert k.shape == (b, kvh, s, h)
  assert v.shape == k.shape
  # jnp.einsum('bkgth,bksh->bkgts', q, k)
  l = jax.lax.dot_general(
      q.astype(jnp.bfloat16),
      k.astype(jnp.bfloat16),
      (((4,), (3,)), ((0, 1), (0, 1))),
      preferred_element_type=jnp.float32,
  )
  w = jax.nn.softmax(l, axis=-1)
  # jnp.einsum('bkgts,bksh->bkgth', w, v)
  o = jax.lax.dot_general(
      w.astype(jnp.bfloat16),
      v.astype(jnp.bfloat16),
      (((4,), (2,)), ((0, 1), (0, 1))),
      preferred_element_type=jnp.float32,
  )
  return o.astype(q.dtype)


@functools.partial(jax.jit, static_argnames=('bkv',))
def linear_attn_scan_s(q, k, v, *, bkv=1024):
  _, _, s, _ = k.shape

  def body_fun(i, o):
    kb = jax.lax.dynamic_slice_in_dim(k, i * bkv, bkv, axis=2)
    wb = jax.lax.dot_general(
        q.astype(jnp.bfloat16),
        kb.astype(jnp.bfloat16),
        (((4,), (3,)), ((0, 1), (0, 1))),
        preferred_element_type=jnp.float32,
    )
    vb = jax.lax.dynamic_slice_in_dim(v, i * bkv, bkv, axis=2)
    o += jax.lax.dot_general(
        wb.astype(jnp.bfloat16),
        vb.astype(jnp.bfloat16),
        (((4,), (2,)), ((0, 1), (0, 1))),
        preferred_element_type=jnp.float32,
    )
    return o

  init_val = jnp.zeros(q.shape, dtype=jnp.float32)
  return jax.lax.fori_loop(0, s // bkv, body_fun, init_val).astype(q.dtype)


@functools.partial(jax.jit, static_argnames=('bkv',))
def attn_scan_s_stable(q, k, v, *, bkv=1024):
  b, kvh, g, t, h = q.shape
  _, _, s, _ = k.shape
  assert k.shape == (b, kvh, s, h)
  assert v.shape == k.shape
  assert s % bkv == 0

  def body_fun(i, val):
    o, denom, m = val
    kb = jax.lax.dynamic_slice_in_dim(k, i * bkv, bkv, axis=2)
    lb = jax.lax.dot_general(
        q.astype(jnp.bfloat16),
        kb.astype(jnp.bfloat16),
        (((4,), (3,)), ((0, 1), (0, 1))),
        preferred_element_type=jnp.float32,
    )
    m_new = jnp.maximum(m, lb.max(axis=-1))
    corr = jnp.exp(m - m_new)
    wb = jnp.exp(lb - m_new[..., None])
    denom = denom * corr + wb.sum(axis=-1)
    vb = jax.lax.dynamic_slice_in_dim(v, i * bkv, bkv, axis=2)
    o = o * corr[..., None] + jax.lax.dot_general(
        wb.astype(jnp.bfloat16),
        vb.astype(jnp.bfloat16),
        (((4,), (2,)), ((0, 1), (0, 1))),
        preferred_element_type=jnp.float32,
    )
    return o, denom, m_new

  o = jnp.zeros(q.shape, dtype=jnp.float32)
  denom = jnp.zeros(q.shape[:-1], dtype=jnp.float32)
  m = jnp.full(q.shape[:-1], -jnp.inf, dtype=jnp.float32)
  init_val = (o, denom, m)
  o, denom, m = jax.lax.fori_loop(0, s // bkv, body_fun, init_val)
  return (o / denom[..., None]).astype(q.dtype)


# ---- Not the seed's: attn_naive at float32. ----


@jax.jit
def attn_naive_f32(q, k, v):
  # attn_naive line for line, jnp.float32 in place of jnp.bfloat16; HIGHEST keeps XLA's float32
  # matmuls float32 on every backend.
  l = jax.lax.dot_general(
      q.astype(jnp.float32),
      k.astype(jnp.float32),
      (((4,), (3,)), ((0, 1), (0, 1))),
      preferred_element_type=jnp.float32,
      precision=jax.lax.Precision.HIGHEST,
  )
  w = jax.nn.softmax(l, axis=-1)
  o = jax.lax.dot_general(
      w.astype(jnp.float32),
      v.astype(jnp.float32),
      (((4,), (2,)), ((0, 1), (0, 1))),
      preferred_element_type=jnp.float32,
      precision=jax.lax.Precision.HIGHEST,
  )
  return o.astype(q.dtype)
