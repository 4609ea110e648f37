"""Error bounds for the backward pass, derived as error_bounds.py derives the forward's (and as
src/reference/tolerance_backward.hpp does for the C++ tests), and the float64 gradients they are
measured against.

Exact gradients of a loss L with dout = dL/dout, per (b, kv head), over the rows r = (g, t) and
the keys j that row r sees (error_bounds.Reference gives P, the exact softmax weights, and o):
  dP[r,j] = dout_r . v_j     D_r = sum_j P dP = dout_r . o_r     X = dP - D     dS = P X
  dq_r = scale sum_j dS k_j       dk_j = scale sum_r dS q_r       dv_j = sum_r P dout_r

A side (flashgqa, jax.grad of the seed's code, torch's autograd) makes these roundings, each an
independent zero-mean error of relative size at most u:
  u_p   P entering dv = P^T dout;
  u_s   dS entering dq and dk (P rounded before dS, dS itself, and 2 u32 for the fp32 subtraction
        and product);
  u_dP  dP (the seed's bf16 code rounds the cotangent of its bf16 weights);
  u_Dj  per key in D: the forward's weights rounded before out = P v (a side that reads the stored
        out) or dP rounded (the seed, whose D is sum_j w dP);
  u_Dh  per h in D = dout . out: out stored in its dtype, and dout as stored rather than rounded;
and c running-max corrections in the forward whose out and lse it reads. The operands q, k, v and
dout are rounded identically on every side and in the reference, so they add nothing.

Units as error_bounds.py: u32 = 2^-24, gamma(n), eps_exp = 2^-20. Per row, A = max_j |scale| sum_h
|q_h k_jh| and delta = (gamma(H) + 4 u32) A (the logit error); N_dP[r,j] = sum_h |dout_rh v_jh| and
N_D[r] = sum_j P N_dP (the absolute sums of the fp32 dot products).
  lse_err = delta + 2 eps_exp + 2 gamma(S) + 2 u32 (|lse| + 1) + c (eps_exp + u32)
            (the forward's lse: error_bounds.Reference.lse_bound, plus its corrections)
  rho     = expm1(2 delta + lse_err + u32 (A + |lse|)) + 2 eps_exp + 2 gamma(S) + 4 u32
            (relative error of a weight exp(s - lse) recomputed from the logit s and the saved lse:
             both errors, the subtraction, the exp; it also covers a weight a softmax computes
             directly, the forward's w_rel without rounding)
  D:  det_D  = (rho + 2 c (eps_exp + u32)) sum_j P |dP_j| + (gamma(S) + gamma(H)) N_D
      rand_D = u_Dj sum_j P |dP_j| + u_Dh sum_h |dout_h o_h|
      (D's error enters every pair of the row alike: in dq_r it multiplies sum_j P k_j, whose
       exact value is known, rather than sum_j P |k_j|)
  dS per pair:  det_S = P (rho |X| + gamma(H) N_dP)     rand_S = P (u_s |X| + u_dP |dP|)
  dq_rh: scale [sum_j (det_S + rand_S) |k_jh| + (det_D + rand_D)(|sum_j P k_jh|
                + (rho + u_s) sum_j P |k_jh|)] + gamma(S) scale sum_j |dS| |k_jh|
  dk_jh: scale sum_r (det_S + rand_S + P (det_D + rand_D)) |q_rh|
         + gamma(G T) scale sum_r |dS| |q_rh|
  dv_jh: sum_r (rho + u_p + gamma(G T)) P |dout_rh|
Sinks: P and lse are over the denominator with e^sink (error_bounds.Reference), lse_err gains
w_sink (error_bounds.py), and the sinks' gradient dsink = -sum_{b,t} P_sink D_r, P_sink =
exp(sink - lse), is bounded per term by P_sink (rho_s |D| + (1 + rho_s) E_D), rho_s =
expm1(lse_err) (1 + u32) + 2 u32, E_D = det_D + rand_D; flashgqa sums it in float64 and stores it as
float32 (u32).
First order in the units. e_i, a side's bound, is the sum of its det and rand parts; n sides, each
rounding its result to the output dtype (unit roundoff u_out, and spacing eta_out of its subnormals,
which small gradients reach in float16):
  |g_a - g_b| <= sum_i e_i + u_out (n |g| + sum_i e_i) + n eta_out / 2
(n = 1: one side against the exact g).
Mean: the rand parts are sums of independent zero-mean errors, so their standard deviation is
sqrt(3)^-1 times the root of the sum of squares of their terms (u |term|), and the mean |error| over
a gradient's elements stays below the mean of 4 such deviations plus the det parts and the
rounding. A NaN never passes (error_bounds.assert_within).
"""

from typing import NamedTuple

import numpy as np

from error_bounds import EPS_EXP, ROUNDOFF, U32, Reference, gamma, weights_roundoff

U_BF16 = ROUNDOFF["bfloat16"]
# The spacing of each dtype's subnormals (its smallest positive number).
SUBNORMAL_SPACING = {"float32": 2.0**-149, "bfloat16": 2.0**-133, "float16": 2.0**-24}


class Side(NamedTuple):
    """The roundings of one implementation of the backward pass (see the module docstring)."""

    u_p: float
    u_s: float
    u_dP: float = 0.0
    u_Dj: float = 0.0
    u_Dh: float = 0.0
    corrections: int = 0


def flashgqa_side(precision, dtype, corrections=0):
    """flashgqa at `precision` for inputs of `dtype`, reading a forward out and lse made with
    `corrections` running-max corrections (0 for algo="naive"; S covers any blocking)."""
    u_p = weights_roundoff(precision)
    bf16 = precision == "bf16"
    # dS may be formed from P rounded to u_p, and is rounded itself under bf16 (flashgqa.hpp); D
    # reads out as stored and may read dout as stored rather than rounded (float32 inputs).
    u_s = u_p + (U_BF16 if bf16 else 0.0) + 2 * U32
    u_d = U_BF16 if bf16 and dtype != "bfloat16" else 0.0
    return Side(u_p=u_p, u_s=u_s, u_Dj=u_p, u_Dh=ROUNDOFF[dtype] + u_d, corrections=corrections)


# jax.grad of the seed's attn_naive (bf16 weights; the cotangents of its bf16 weights, dS and the
# gradients in bf16, the last the result's own rounding for bfloat16 inputs: u_out), and of
# seed.attn_naive_f32 (all float32). Neither reads a stored out: D = sum_j w dP.
SEED_BF16 = Side(u_p=U_BF16, u_s=U_BF16 + 2 * U32, u_dP=U_BF16, u_Dj=U_BF16)
SEED_F32 = Side(u_p=U32, u_s=2 * U32, u_Dj=U32)


def torch_side(dtype, S):
    """torch's SDPA autograd: weights rounded at worst to the input dtype, out stored in it, from a
    forward with up to S corrections (its CPU flash kernel is blocked)."""
    u = ROUNDOFF[dtype]
    return Side(u_p=u, u_s=u + 2 * U32, u_Dj=u, u_Dh=u, corrections=S)


class BackwardReference(Reference):
    """Exact (float64) gradients of q [B,K,G,T,H], k, v [B,K,S,H] for dout [B,K,G,T,H], and the
    sums their bounds need."""

    def __init__(self, q, k, v, dout, scale, causal_offset=None, softcap=None, mask=None, sinks=None):
        super().__init__(q, k, v, scale, causal_offset, softcap, mask, sinks)
        p = self.p
        dp = np.einsum("bkgth,bksh->bkgts", dout, v)
        x = dp - (p * dp).sum(axis=-1, keepdims=True)
        # The softcap's slope sigma = 1 - tanh^2(s / c) (1 without a cap): dS = P (dP - D) sigma.
        self.slope = 1.0 - self.tanh**2 if self.softcap else np.ones_like(p)
        ds = p * x * self.slope
        self.grads = {
            "dq": scale * np.einsum("bkgts,bksh->bkgth", ds, k),
            "dk": scale * np.einsum("bkgts,bkgth->bksh", ds, q),
            "dv": np.einsum("bkgts,bkgth->bksh", p, dout),
        }
        self.p_sink = None
        if sinks is not None:  # dsink = -sum_{b,t} P_sink D
            finite = np.isfinite(self.lse)[..., None]
            self.p_sink = np.where(finite, np.exp(self.sink - np.where(finite, self.lse[..., None], 0)), 0)
            self.d = (p * dp).sum(axis=-1, keepdims=True)  # [B,K,G,T,1]
            self.grads["dsinks"] = -(self.p_sink * self.d).sum(axis=(0, 3, 4))  # [K, G]
        self.q, self.k, self.dout = q, k, dout
        self.abs_x, self.abs_dp = np.abs(x), np.abs(dp)
        self.n_dp = np.einsum("bkgth,bksh->bkgts", np.abs(dout), np.abs(v))
        self.rows = q.shape[2] * self.T  # G T: the depth of the sums for dk and dv
        # Per row [B,K,G,T,1]: the sums D's error is made of, and sum_j P k (dq's D term).
        self.pdp_abs = (p * self.abs_dp).sum(axis=-1, keepdims=True)
        self.pdp_rms = np.sqrt(((p * dp) ** 2).sum(axis=-1, keepdims=True))
        self.n_d = (p * self.n_dp).sum(axis=-1, keepdims=True)
        self.do_abs = np.abs(dout * self.out).sum(axis=-1, keepdims=True)
        self.do_rms = np.sqrt(((dout * self.out) ** 2).sum(axis=-1, keepdims=True))
        self.pk = np.abs(np.einsum("bkgts,bksh->bkgth", p, k))
        self.pk_abs = np.einsum("bkgts,bksh->bkgth", p, np.abs(k))
        s = abs(scale)
        self.abs_sum = {  # sum of |terms|, for the fp32 sums' gamma(n)
            "dq": s * np.einsum("bkgts,bksh->bkgth", np.abs(ds), np.abs(k)),
            "dk": s * np.einsum("bkgts,bkgth->bksh", np.abs(ds), np.abs(q)),
            "dv": np.einsum("bkgts,bkgth->bksh", p, np.abs(dout)),
        }

    def _side(self, side):
        """One side's {g: (bound e, variance of its random part)}."""
        S, H = self.S, self.H
        p, s, c = self.p, abs(self.scale), side.corrections
        lse = np.where(np.isfinite(self.lse), np.abs(self.lse), 0.0)[..., None]
        delta = self.delta
        lse_err = (delta + 2 * EPS_EXP + 2 * gamma(S) + 2 * U32 * (lse + 1)
                   + c * (EPS_EXP + U32) + self.sink_error())
        rho = (np.expm1(2 * delta + lse_err + U32 * (self.A + lse)) + 2 * EPS_EXP
               + 2 * gamma(S) + 4 * U32)  # [B,K,G,T,1]
        det_d = ((rho + 2 * c * (EPS_EXP + U32)) * self.pdp_abs
                 + (gamma(S) + gamma(H)) * self.n_d)
        rand_d = side.u_Dj * self.pdp_abs + side.u_Dh * self.do_abs
        var_d = ((side.u_Dj * self.pdp_rms) ** 2 + (side.u_Dh * self.do_rms) ** 2) / 3
        det_s = p * (rho * self.abs_x + gamma(H) * self.n_dp)
        rand_s = p * (side.u_s * self.abs_x + side.u_dP * self.abs_dp)
        var_s = p**2 * ((side.u_s * self.abs_x) ** 2 + (side.u_dP * self.abs_dp) ** 2) / 3
        if self.softcap:
            # dS = P X sigma: the errors above scale with sigma <= 1; sigma's own error, from the
            # capped logit's (delta): dt = delta / c + 2 u32 |t|, e_sigma = 2 |t| dt + dt^2 + 2 u32,
            # and one more product rounding (u32).
            sigma, t = self.slope, np.abs(self.tanh)
            dt = delta / self.softcap + 2 * U32 * t
            e_sigma = 2 * t * dt + dt**2 + 2 * U32
            det_s = (det_s + rand_s) * (sigma + e_sigma) - rand_s * sigma + p * self.abs_x * (e_sigma + U32)
            rand_s = rand_s * sigma
            var_s = var_s * sigma**2
        abs_k, abs_q = np.abs(self.k), np.abs(self.q)

        d_weight = self.pk + (rho + side.u_s) * self.pk_abs  # |sum_j P~ k|
        e_dq = (s * (np.einsum("bkgts,bksh->bkgth", det_s + rand_s, abs_k)
                     + (det_d + rand_d) * d_weight) + gamma(S) * self.abs_sum["dq"])
        var_dq = s**2 * (np.einsum("bkgts,bksh->bkgth", var_s, self.k**2) + var_d * d_weight**2)
        e_dk = (s * np.einsum("bkgts,bkgth->bksh", det_s + rand_s + p * (det_d + rand_d), abs_q)
                + gamma(self.rows) * self.abs_sum["dk"])
        var_dk = s**2 * np.einsum("bkgts,bkgth->bksh", var_s + p**2 * var_d, self.q**2)
        e_dv = np.einsum("bkgts,bkgth->bksh", (rho + side.u_p + gamma(self.rows)) * p,
                         np.abs(self.dout))
        var_dv = side.u_p**2 * np.einsum("bkgts,bkgth->bksh", p**2, self.dout**2) / 3
        # The det part is e less the rand terms' maxima: u times the same sums.
        rand_dq = s * (np.einsum("bkgts,bksh->bkgth", rand_s, abs_k) + rand_d * d_weight)
        rand_dk = s * np.einsum("bkgts,bkgth->bksh", rand_s + p * rand_d, abs_q)
        rand_dv = side.u_p * self.abs_sum["dv"]
        result = {"dq": (e_dq, e_dq - rand_dq, var_dq), "dk": (e_dk, e_dk - rand_dk, var_dk),
                  "dv": (e_dv, e_dv - rand_dv, var_dv)}
        if self.p_sink is not None:
            rho_s = np.expm1(lse_err) * (1 + U32) + 2 * U32
            e_ds = (self.p_sink * (rho_s * np.abs(self.d) + (1 + rho_s) * (det_d + rand_d))).sum(axis=(0, 3, 4))
            result["dsinks"] = (e_ds, e_ds, 0.0 * e_ds)
        return result

    def bounds(self, sides, dtype):
        """{"dq"|"dk"|"dv": (max bound per element, mean bound)} for the sides compared, each
        rounding its gradients to `dtype`."""
        per_side = [self._side(side) for side in sides]
        n, u_out, eta_out = len(sides), ROUNDOFF[dtype], SUBNORMAL_SPACING[dtype]
        result = {}
        for g, exact in self.grads.items():
            e = sum(b[g][0] for b in per_side)
            det = sum(b[g][1] for b in per_side)
            sigma = np.sqrt(sum(b[g][2] for b in per_side))
            if g == "dsinks":  # float64 sums stored as float32, whatever the gradients' dtype
                rounding = U32 * (n * np.abs(exact) + e)
            else:
                rounding = u_out * (n * np.abs(exact) + e) + n * eta_out / 2
            result[g] = (e + rounding, float(np.mean(4 * sigma + det + rounding)))
        return result
