"""Error bounds for the backward pass, derived as error_bounds.py derives the forward's, and the
float64 gradients they are measured against.

Exact gradients of a loss L with dout = dL/dout, per (b, kv head), over the rows r = (g, t) and
the keys j that row r sees (error_bounds.Reference gives P, the exact softmax weights):
  dP[r,j] = dout_r . v_j     D_r = sum_j P dP (= dout_r . out_r)     dS = P (dP - D)
  dq_r = scale sum_j dS k_j       dk_j = scale sum_r dS q_r       dv_j = sum_r P dout_r
Magnitudes, the same sums over absolute values; every rounding error below is a multiple of them:
  N_dP[r,j] = sum_h |dout_rh| |v_jh|     N_D[r] = sum_j P N_dP  (>= |D_r|, >= sum_h |dout_h o_h|)
  W[r,j] = P (N_dP + N_D)   (>= |dS|)
  M_dv = sum_r P |dout_rh|     M_dq = |scale| sum_j W |k_jh|     M_dk = |scale| sum_r W |q_rh|

A side (flashgqa, the seed's jax.grad, torch's autograd) rounds: u_p the weights P entering
dv = P^T dout (and the forward's P.V); u_s the dS entering dq and dk (2 u32 when it stays float32:
the subtraction and the product); u_dP the dP (the seed's bf16 code rounds the cotangent of its
bf16 weights); u_o the forward's out that D is computed from (None: the side differentiates
through its own forward and reads no stored out), whose c running-max corrections add to its error.
The operands q, k, v, dout are rounded identically on every side (the tests pass values the
matmuls take exactly: float32 at "f32", bfloat16 inputs at "bf16"), so they add nothing.
Units as error_bounds.py (u32 = 2^-24, gamma(n), eps_exp = 2^-20); per row, A = max_j |scale|
sum_h |q_h k_jh| and delta = (gamma(H) + 4 u32) A, the logit error. To first order in the units:
  lse_err = delta + 2 eps_exp + 2 gamma(S) + 2 u32 (|lse| + 1) + c (eps_exp + u32)
            (the forward's lse: error_bounds.Reference.lse_bound, plus its corrections)
  rho     = expm1(2 delta + lse_err + u32 (A + |lse|)) + 2 eps_exp + 2 gamma(S) + 4 u32
            (relative error of a weight P = exp(s - lse) recomputed from the logit s and the saved
             lse: the two errors, the subtraction, the exp; it also covers a weight computed by a
             softmax directly, the forward's w_rel without rounding)
  dP error <= (gamma(H) + u_dP) N_dP
  D error  <= kappa_D N_D,  kappa_D = rho + gamma(H) + gamma(S) + u_dP + out_err,
            out_err = u_p + gamma(S) + 2 c (eps_exp + u32) + 2 u_o  (0 without a stored out):
            dout . out over H, with out's own error (weights, P.V sum, corrections, its rounding)
  dS error <= kappa_S W,    kappa_S = rho + u_s + gamma(H) + u_dP + kappa_D
  e_dv = (rho + u_p + gamma(G T)) M_dv    e_dq = (kappa_S + gamma(S)) M_dq
  e_dk = (kappa_S + gamma(G T)) M_dk      (the fp32 sums: over the G T rows, over the S keys)
(rho varies by row and enters the sums row by row.) n sides, each rounding its result to u_out:
  |g_a - g_b| <= sum_i e_i + u_out (n |g| + sum_i e_i)     (n = 1: one side against the exact g).
Mean: u_p (in dv) and u_s, u_dP (in dq, dk) round each (r, j) term independently with zero mean;
their sum has standard deviation <= sqrt(sum_i u_i^2) rms / sqrt(3), rms_dv = sqrt(sum_r P^2
dout^2), rms_dq = |scale| sqrt(sum_j W^2 k^2), rms_dk = |scale| sqrt(sum_r W^2 q^2); the mean |error|
stays below the mean of 4 such deviations plus the rest of e (deterministic) and the rounding.
A NaN never passes (error_bounds.assert_within).
"""

import math
from typing import NamedTuple, Optional

import numpy as np

from error_bounds import EPS_EXP, ROUNDOFF, U32, Reference, gamma, weights_roundoff

U_BF16 = ROUNDOFF["bfloat16"]


class Side(NamedTuple):
    """The roundings of one implementation of the backward pass (see the module docstring)."""

    u_p: float
    u_s: float
    u_dP: float = 0.0
    u_o: Optional[float] = None
    corrections: int = 0


def flashgqa_side(precision, dtype, corrections=0):
    """flashgqa at `precision`, reading a forward out of `dtype` made with `corrections` running-max
    corrections (0 for algo="naive"; S covers any blocking)."""
    u_p = weights_roundoff(precision)
    u_s = (U_BF16 if precision == "bf16" else 0.0) + 2 * U32
    return Side(u_p=u_p, u_s=u_s, u_o=ROUNDOFF[dtype], corrections=corrections)


# jax.grad of the seed's attn_naive (bf16 weights, its cotangents of the bf16 weights, dS and the
# gradients in bf16; for bfloat16 inputs the last is the result's own rounding, u_out) and of
# seed.attn_naive_f32 (all float32). Neither reads a stored out.
SEED_BF16 = Side(u_p=U_BF16, u_s=U_BF16 + 2 * U32, u_dP=U_BF16)
SEED_F32 = Side(u_p=U32, u_s=2 * U32)


def torch_side(dtype, S):
    """torch's SDPA autograd: weights rounded at worst to the input dtype, out of that dtype from
    a forward with up to S corrections (its CPU flash kernel is blocked)."""
    u = ROUNDOFF[dtype]
    return Side(u_p=u, u_s=u + 2 * U32, u_o=u, corrections=S)


class BackwardReference(Reference):
    """Exact (float64) gradients of q [B,K,G,T,H], k, v [B,K,S,H] for dout [B,K,G,T,H], and the
    magnitudes their bounds need."""

    def __init__(self, q, k, v, dout, scale, causal_offset=None):
        super().__init__(q, k, v, scale, causal_offset)
        p = self.p
        dp = np.einsum("bkgth,bksh->bkgts", dout, v)
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
        self.grads = {
            "dq": scale * np.einsum("bkgts,bksh->bkgth", ds, k),
            "dk": scale * np.einsum("bkgts,bkgth->bksh", ds, q),
            "dv": np.einsum("bkgts,bkgth->bksh", p, dout),
        }
        n_dp = np.einsum("bkgth,bksh->bkgts", np.abs(dout), np.abs(v))
        self.w = p * (n_dp + (p * n_dp).sum(axis=-1, keepdims=True))
        self.abs_q, self.abs_k, self.abs_dout = np.abs(q), np.abs(k), np.abs(dout)
        self.G = q.shape[2]
        s = abs(scale)
        self.magnitude = {
            "dq": s * np.einsum("bkgts,bksh->bkgth", self.w, self.abs_k),
            "dk": s * np.einsum("bkgts,bkgth->bksh", self.w, self.abs_q),
            "dv": np.einsum("bkgts,bkgth->bksh", p, self.abs_dout),
        }
        self.rms = {
            "dq": s * np.sqrt(np.einsum("bkgts,bksh->bkgth", self.w**2, k**2)),
            "dk": s * np.sqrt(np.einsum("bkgts,bkgth->bksh", self.w**2, q**2)),
            "dv": np.sqrt(np.einsum("bkgts,bkgth->bksh", p**2, dout**2)),
        }

    def _row_errors(self, kappa_dq, kappa_dk, kappa_dv):
        """{g: e_g} for per-row relative factors [B,K,G,T,1] on W (dq, dk) and P (dv)."""
        s = abs(self.scale)
        return {
            "dq": s * np.einsum("bkgts,bksh->bkgth", kappa_dq * self.w, self.abs_k),
            "dk": s * np.einsum("bkgts,bkgth->bksh", kappa_dk * self.w, self.abs_q),
            "dv": np.einsum("bkgts,bkgth->bksh", kappa_dv * self.p, self.abs_dout),
        }

    def bounds(self, sides, u_out):
        """{"dq"|"dk"|"dv": (max bound per element, mean bound)} for the sides compared, each
        rounding its gradients to u_out."""
        S, H, rows = self.S, self.H, self.G * self.T
        delta = (gamma(H) + 4 * U32) * self.A  # [B,K,G,T,1]
        lse = np.where(np.isfinite(self.lse), np.abs(self.lse), 0.0)[..., None]
        e_sum = {g: 0.0 for g in self.grads}
        det_sum = {g: 0.0 for g in self.grads}
        random_sq = {g: 0.0 for g in self.grads}
        for side in sides:
            c = side.corrections
            lse_err = (delta + 2 * EPS_EXP + 2 * gamma(S) + 2 * U32 * (lse + 1)
                       + c * (EPS_EXP + U32))
            rho = (np.expm1(2 * delta + lse_err + U32 * (self.A + lse)) + 2 * EPS_EXP
                   + 2 * gamma(S) + 4 * U32)
            out_err = (0.0 if side.u_o is None else
                       side.u_p + gamma(S) + 2 * c * (EPS_EXP + U32) + 2 * side.u_o)
            kappa_d = rho + gamma(H) + gamma(S) + side.u_dP + out_err
            kappa_s = rho + side.u_s + gamma(H) + side.u_dP + kappa_d
            e = self._row_errors(kappa_s + gamma(S), kappa_s + gamma(rows),
                                 rho + side.u_p + gamma(rows))
            # The independent roundings: u_p in dv; u_s and dP's u_dP in dS, for dq and dk.
            random = {"dq": (side.u_s, side.u_dP), "dk": (side.u_s, side.u_dP),
                      "dv": (side.u_p,)}
            for g in self.grads:
                e_sum[g] = e_sum[g] + e[g]
                det_sum[g] = det_sum[g] + e[g] - sum(random[g]) * self.magnitude[g]
                random_sq[g] += sum(u**2 for u in random[g])
        n = len(sides)
        result = {}
        for g, exact in self.grads.items():
            rounding = u_out * (n * np.abs(exact) + e_sum[g])
            sigma = math.sqrt(random_sq[g]) * self.rms[g] / math.sqrt(3.0)
            result[g] = (e_sum[g] + rounding,
                         float(np.mean(4 * sigma + det_sum[g] + rounding)))
        return result
