// Constants of the tanh every softcap kernel uses (softcap_n: x -> c tanh(x / c)):
//   tanh(y) ~ y P(y^2) / Q(y^2),  P(u) = 1 + p1 u + p2 u^2 + p3 u^3 + p4 u^4,
//                                 Q(u) = 1 + q1 u + q2 u^2 + q3 u^3 + q4 u^4,
// for |y| <= kTanhClamp, y clamped there first (tanh(9) is 1 - 3e-8, within an fp32 rounding of 1, so
// the clamp costs no accuracy and saturates +-inf to +-1). An odd [9/8] rational with leading
// coefficients 1, so tanh(y) = y exactly for tiny y (and -0 stays -0), fitted for minimal relative
// error on [0, 9] (iteratively reweighted least squares in float64): 2.2e-8 in exact arithmetic,
// 2.8e-7 evaluated in fp32 by Horner with fused multiply-adds and one division, on every path (the
// tested bound is kTanhMaxRelError = 2^-21 = 4.8e-7, microkernels.hpp). NaN passes the clamp (min/max
// take it as their second operand) and the rational, so a NaN logit stays NaN.
//
// Only constants here, as in exp_poly.hpp: the header is included by translation units built with
// different instruction sets.
#pragma once

namespace flashgqa::tanh_poly {

constexpr float kTanhClamp = 9.0f;
constexpr float kP1 = 1.338398796e-01f;
constexpr float kP2 = 3.499005410e-03f;
constexpr float kP3 = 2.066142574e-05f;
constexpr float kP4 = 1.342007083e-08f;
constexpr float kQ1 = 4.671730944e-01f;
constexpr float kQ2 = 2.589024135e-02f;
constexpr float kQ3 = 3.291054026e-04f;
constexpr float kQ4 = 7.804826123e-07f;

}  // namespace flashgqa::tanh_poly
