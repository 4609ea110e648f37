"""Error bounds for the Python tests, derived as in src/reference/tolerance.hpp, and the float64
reference they are measured against.

Every comparison is between "sides": approximate implementations (flashgqa, the seed's JAX code,
torch's SDPA), each following the rule bf16/fp32 operands, fp32 accumulation, softmax weights
rounded to u_p before P.V, output rounded to u_out, and, when there is only one side, the exact
float64 result. The triangle inequality through the exact result bounds the difference of two sides
by the sum of their own bounds.

Units: u32 = 2^-24 (fp32 accumulation); u_p = roundoff of the weights entering P.V (2^-8 when they
are rounded to bf16, u32 otherwise); u_out = roundoff of the output dtype (2^-8 bf16, 2^-11 f16,
2^-24 f32); gamma(n) = n u32 / (1 - n u32) (an n-term fp32 sum); eps_exp = 2^-20, the library's
kExpRelError, a generous budget too for XLA's and torch's float32 exp (a few ulp). The operands are
rounded identically on every side (round to nearest even), so they contribute no error.

Softmax attention, per query row, with A = max_j |scale| sum_h |q_h k_jh| over the visible keys:
  logit error          delta = (gamma(H) + 4 u32) A          (dot product, scale, l - m)
  weight rel. error    w_rel = exp(2 delta) - 1 + 2 eps_exp + u_p + 2 gamma(S) + 2 u32
                               + 2 c (eps_exp + u32)
     (numerator and denominator logits, both exps, P rounding, denominator sum, the division; c is
      the number of running-max corrections a side multiplies a weight by: the product of those
      exps is not common to all keys, so their errors do not cancel in o = acc / denom. c = 0 for
      the seed's attn_naive, S / bkv for attn_scan_s_stable, and S, the most blocks there can be,
      for flashgqa, whose automatic block size the test does not fix.)
  per element, over the sides i:
     e = sum_i (w_rel_i + gamma(S)) sum_j p_j |v_jh|          (weights, then the fp32 P.V sum)
     |o_a - o_b| <= e + u_out (n |o_ref| + e)                  (n sides round their output)
  mean: the P roundings are independent zero-mean errors; their sum over j has standard deviation
  <= sqrt(sum_i u_p_i^2) sqrt(sum_j (p_j v_jh)^2) / sqrt(3), and the mean of |error| over elements
  stays below the mean of 4 such deviations plus the deterministic terms (e without the u_p part,
  and the output rounding).
  lse (one side against the reference): |lse - lse_ref| <= delta + 2 eps_exp + 2 gamma(S)
                                                          + 2 u32 (|lse_ref| + 1)
Sinks (gpt-oss; src/reference/tolerance.hpp): the denominator gains the exact e^sink with no value,
  p_j are over that larger denominator, and each side's w_rel and the lse bound gain
  w_sink = eps_exp + u32 (2 A + 3 ln(S + 1) + |sink| + 3) for a finite sink (0 for -inf): the row
  end's one rescale factor, whose exponent m - sink is rounded (m the row max, or the naive rung's
  lse of the keys), and its products and sum.
Linear attention (weights w_j = scale q.k_j, a_j = |scale| sum_h |q_h k_jh|), per side:
  e_i = (gamma(H) + 2 u32)(1 + u_p_i) sum_j a_j |v_jh| + (u_p_i + gamma(S)) sum_j |w_j v_jh|
  (the logit error, carried through the rounding to u_p; the rounding itself; the fp32 P.V sum);
  |o_a - o_b| <= sum_i e_i + u_out (n |o_ref| + sum_i e_i); mean as above with |w_j v_jh|.
With a logit softcap c (logits c tanh(s / c)): the cap's slope 1 - tanh^2 <= 1 passes delta at most
unchanged, and an implementation's cap adds eps_tanh = 2^-21 (the library's kTanhMaxRelError, a
budget too for torch's and XLA's float32 tanh) plus 3 u32 of the capped logit, at most min(A, c):
  delta = (gamma(H) + 4 u32) A + (eps_tanh + 3 u32) min(A, c).
A NaN never passes: every check is `err <= bound`, which is False for NaN.
"""

import math

import numpy as np

U32 = 2.0**-24
EPS_EXP = 2.0**-20
EPS_TANH = 2.0**-21
ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": U32}


def gamma(n):
    return n * U32 / (1.0 - n * U32)


def weights_roundoff(precision):
    """u_p: the roundoff of the softmax (or linear) weights entering the second matmul."""
    return ROUNDOFF["bfloat16"] if precision == "bf16" else U32


def as_f64(x):
    """A float64 numpy copy of any array (numpy incl. ml_dtypes.bfloat16, torch, jax)."""
    if type(x).__module__.startswith("torch"):
        return x.detach().float().numpy().astype(np.float64)
    return np.asarray(x).astype(np.float64)


def operands(x, precision):
    """x as the matmuls see it: rounded to bfloat16 under precision "bf16", in float64."""
    import ml_dtypes

    x = as_f64(x)
    if precision == "bf16":
        x = x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    return x


def _visible(T, S, causal_offset):
    """[T, S] mask of the keys each query sees (all when causal_offset is None)."""
    if causal_offset is None:
        return np.ones((T, S), dtype=bool)
    return np.arange(S)[None, :] <= np.arange(T)[:, None] + causal_offset


class Reference:
    """Exact (float64) attention of q [B,K,G,T,H], k, v [B,K,S,H] and the sums the bounds need."""

    def __init__(self, q, k, v, scale, causal_offset=None, softcap=None, mask=None, sinks=None):
        """mask: [T, S] bool of the keys each query sees, in place of causal_offset.
        sinks: None or float64 [K, G] sink logits (each a denominator term e^sink, no value)."""
        self.T, self.S, self.H = q.shape[3], k.shape[2], q.shape[4]
        K, G = q.shape[1], q.shape[2]
        sink = (np.full((1, K, G, 1, 1), -np.inf) if sinks is None
                else np.asarray(sinks, dtype=np.float64).reshape(1, K, G, 1, 1))
        self.sink = sink
        vis = mask if mask is not None else _visible(self.T, self.S, causal_offset)
        logits = scale * np.einsum("bkgth,bksh->bkgts", q, k)
        absdot = abs(scale) * np.einsum("bkgth,bksh->bkgts", np.abs(q), np.abs(k))
        self.A = np.where(vis, absdot, 0.0).max(axis=-1, initial=0.0)[..., None]  # [B,K,G,T,1]
        self.softcap = softcap or None
        self.delta = (gamma(self.H) + 4 * U32) * self.A  # the logit error (docstring)
        if self.softcap:
            self.tanh = np.tanh(logits / self.softcap)  # the backward's slope is 1 - tanh^2
            logits = self.softcap * self.tanh
            self.delta = self.delta + (EPS_TANH + 3 * U32) * np.minimum(self.A, self.softcap)
        masked = np.where(vis, logits, -np.inf)
        m = np.maximum(masked.max(axis=-1, keepdims=True, initial=-np.inf), sink)
        m = np.where(np.isfinite(m), m, 0.0)
        ex = np.where(vis, np.exp(masked - m), 0.0)
        den = ex.sum(axis=-1, keepdims=True) + np.exp(sink - m)
        p = np.divide(ex, den, out=np.zeros_like(ex), where=den > 0)
        self.scale, self.p = scale, p  # [B,K,G,T,S] weights, 0 for keys a query does not see
        self.out = np.einsum("bkgts,bksh->bkgth", p, v)
        self.pv_abs = np.einsum("bkgts,bksh->bkgth", p, np.abs(v))
        self.pv_rms = np.sqrt(np.einsum("bkgts,bksh->bkgth", p**2, v**2))
        with np.errstate(divide="ignore"):
            self.lse = np.where(den[..., 0] > 0, np.log(den[..., 0]) + m[..., 0], -np.inf)
        # Linear attention: w = scale q.k over the visible keys, no softmax.
        w = np.where(vis, logits, 0.0)
        self.linear_out = np.einsum("bkgts,bksh->bkgth", w, v)
        self.linear_av = np.einsum("bkgts,bksh->bkgth", np.where(vis, absdot, 0.0), np.abs(v))
        self.linear_wv = np.einsum("bkgts,bksh->bkgth", np.abs(w), np.abs(v))
        self.linear_wv_rms = np.sqrt(np.einsum("bkgts,bksh->bkgth", w**2, v**2))

    def sink_error(self):
        """w_sink per row [B,K,G,T,1]: 0 where the sink is -inf (none)."""
        finite = np.isfinite(self.sink)
        sink = np.where(finite, np.abs(self.sink), 0)
        return np.where(finite, EPS_EXP + U32 * (2 * self.A + 3 * math.log(self.S + 1) + sink + 3), 0.0)

    def softmax_bounds(self, sides, u_out):
        """(max bound per element, mean bound) for sides = [(u_p, corrections), ...]."""
        S = self.S
        delta = self.delta
        e = 0.0
        u_p_sq = 0.0
        for u_p, corrections in sides:
            w_rel = (np.expm1(2 * delta) + 2 * EPS_EXP + u_p + 2 * gamma(S) + 2 * U32
                     + 2 * corrections * (EPS_EXP + U32) + self.sink_error())
            e = e + (w_rel + gamma(S)) * self.pv_abs
            u_p_sq += u_p**2
        n = len(sides)
        rounding = u_out * (n * np.abs(self.out) + e)
        max_bound = e + rounding
        deterministic = e - sum(u_p for u_p, _ in sides) * self.pv_abs
        sigma = math.sqrt(u_p_sq) * self.pv_rms / math.sqrt(3.0)
        mean_bound = float(np.mean(4 * sigma + deterministic + rounding))
        return max_bound, mean_bound

    def lse_bound(self):
        delta = self.delta[..., 0]
        finite = np.where(np.isfinite(self.lse), np.abs(self.lse), 0.0)
        return (delta + 2 * EPS_EXP + 2 * gamma(self.S) + 2 * U32 * (finite + 1.0)
                + self.sink_error()[..., 0])

    def linear_bounds(self, sides_u_p, u_out):
        """(max bound per element, mean bound) for linear attention, sides_u_p = [u_p, ...]."""
        e = 0.0
        for u_p in sides_u_p:
            e = e + ((gamma(self.H) + 2 * U32) * (1 + u_p) * self.linear_av
                     + (u_p + gamma(self.S)) * self.linear_wv)
        n = len(sides_u_p)
        rounding = u_out * (n * np.abs(self.linear_out) + e)
        deterministic = e - sum(sides_u_p) * self.linear_wv
        sigma = math.sqrt(sum(u**2 for u in sides_u_p)) * self.linear_wv_rms / math.sqrt(3.0)
        return e + rounding, float(np.mean(4 * sigma + deterministic + rounding))


def window_mask(T, S, causal=False, causal_offset=None, window=(-1, -1), cu_seqlens=None):
    """[T, S] bool: the keys each query sees under FlashAttention's rules, written independently of
    the library: query t sees key j when j <= t + offset (causal) and t + offset - left <= j <=
    t + offset + right (window; -1 unbounded), offset default S - T; with cu_seqlens = (cu_q, cu_k)
    only within its own sequence, positions and the default offset taken per sequence."""
    if cu_seqlens is None:
        cu_seqlens = ([0, T], [0, S])
    cu_q, cu_k = cu_seqlens
    mask = np.zeros((T, S), dtype=bool)
    left, right = window
    for i in range(len(cu_q) - 1):
        Ti, Si = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
        off = Si - Ti if causal_offset is None else causal_offset
        t = np.arange(Ti)[:, None]
        j = np.arange(Si)[None, :]
        m = np.ones((Ti, Si), dtype=bool)
        if causal:
            m &= j <= t + off
        if left >= 0:
            m &= j >= t + off - left
        if right >= 0:
            m &= j <= t + off + right
        mask[cu_q[i]:cu_q[i + 1], cu_k[i]:cu_k[i + 1]] = m
    return mask


def assert_within(got, want, max_bound, mean_bound, what):
    """|got - want| <= max_bound everywhere (NaN fails) and mean |got - want| <= mean_bound."""
    got, want = as_f64(got), as_f64(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    err = np.abs(got - want)
    ok = err <= max_bound  # False for NaN
    if not ok.all():
        i = np.unravel_index(np.argmin(np.where(ok, np.inf, -1.0)), err.shape)
        raise AssertionError(f"{what}: {np.count_nonzero(~ok)} of {err.size} elements out of "
                             f"bound; at {i}: got {got[i]}, want {want[i]}, err {err[i]:.3g} > "
                             f"bound {np.broadcast_to(max_bound, err.shape)[i]:.3g}")
    mean_err = float(err.mean()) if err.size else 0.0
    assert mean_err <= mean_bound, (f"{what}: mean error {mean_err:.3g} > mean bound "
                                    f"{mean_bound:.3g}")
