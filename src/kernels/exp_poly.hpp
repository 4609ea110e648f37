// Constants of the exp every softmax kernel uses: exp(x) = 2^(x log2 e), with 2^x split as
// 2^n * 2^f, n = floor(x), f = x - n in [0, 1), and 2^f ~ P(f) = 1 + c1 f + ... + c5 f^5, a relative
// minimax fit with P(0) = 1 exactly (so exp(0) = 1 and an unmoved max rescales by exactly 1).
// Relative error of P: 8.2e-8 in exact arithmetic, 1.5e-7 evaluated by Horner with five fused
// multiply-adds in fp32 (kExpMaxRelError in microkernels.hpp is the tested bound). On AVX-512,
// f is one vreduceps and 2^n is applied by vscalefps (which floors its exponent argument itself), so
// the whole exp is 7 instructions, with exp(-inf) = 0 and NaN -> NaN for free.
//
// Only constants here: the header is included by translation units built with different instruction
// sets, so it must not define functions (an inline function compiled with AVX-512 in one unit may be
// the copy the linker keeps for all of them).
#pragma once

namespace flashgqa::exp_poly {

constexpr float kLog2e = 1.44269504088896341f;
// P(f) = ((((c5 f + c4) f + c3) f + c2) f + c1) f + 1.
constexpr float kC5 = 1.867130050e-03f;
constexpr float kC4 = 9.017030708e-03f;
constexpr float kC3 = 5.579991266e-02f;
constexpr float kC2 = 2.401644439e-01f;
constexpr float kC1 = 6.931512952e-01f;
// The AVX2 and portable paths clamp arguments of 2^x to [kMinExp2, kMaxExp2] (NaN passes): below,
// the result rounds to 0; above, to +inf.
constexpr float kMinExp2 = -150.0f;
constexpr float kMaxExp2 = 129.0f;

}  // namespace flashgqa::exp_poly
