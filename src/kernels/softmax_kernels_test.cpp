// Every kernel set this machine supports against a scalar model of the contract in microkernels.hpp,
// for the softmax and the elementwise kernels: softmax_tile (masked and not, running state, NaN; bounds
// that mask nothing; the avx2 sets bit for bit), the exp and softcap (tanh) error bounds, and
// softmax_grad_pack against the unfused steps, bit for bit. (The tiles and packing:
// microkernels_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/dtype.hpp"
#include "kernels/exp_poly.hpp"
#include "kernels/kernel_cases_testing.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace {

using kernel_testing::kInf;
using kernel_testing::kNaN;
using kernel_testing::KernelCase;
using kernel_testing::name;
using kernel_testing::supported_cases;

// The softmax against the contract, in float64: running max and sum from a previous state, keys
// outside each row's [lo, hi) exactly 0 (lo > 0, hi < n, empty ranges, NaN in masked S), P rounded to bf16 under Precision::bf16, corr, and the "any moved" result.
TEST(Microkernels, SoftmaxTileMatchesScalarModel) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (const KernelCase& kc : supported_cases()) {
    const FlashKernels& k = *kc.kern;
    const std::int64_t ob = k.operand_bytes, n = 96;
    AlignedBuffer s(static_cast<std::size_t>(k.mr * n * 4)), p(static_cast<std::size_t>(k.mr * n * ob));
    for (bool masked : {false, true}) {
      std::vector<float> m(static_cast<std::size_t>(k.mr)), l(m.size()), corr(m.size());
      std::vector<std::int32_t> lo(m.size()), hi(m.size());
      for (int r = 0; r < k.mr; ++r) {
        for (std::int64_t j = 0; j < n; ++j) s.as<float>()[r * n + j] = dist(rng);
        s.as<float>()[r * n + n - 1] = r == 1 ? kNaN : s.as<float>()[r * n + n - 1];  // masked away below
        const auto ri = static_cast<std::size_t>(r);
        lo[ri] = static_cast<std::int32_t>(masked ? (r * 13) % 50 : 0);
        hi[ri] = static_cast<std::int32_t>(masked ? (r * 37) % (n - 1) : n);  // row 0: empty, some lo > hi
        if (masked && lo[ri] > 0) s.as<float>()[r * n + lo[ri] - 1] = kNaN;  // just before the range
        m[static_cast<std::size_t>(r)] = r % 3 == 0 ? -kInf : r % 3 == 1 ? 20.0f : 0.5f;
        l[static_cast<std::size_t>(r)] = r % 3 == 0 ? 0.0f : 3.0f;
      }
      const std::vector<float> m0 = m, l0 = l;
      const bool moved =
          k.softmax_tile({s.as<float>(), n, p.data(), n, m.data(), l.data(), corr.data(),
                          masked ? lo.data() : nullptr, masked ? hi.data() : nullptr, n, k.mr, kc.precision == Precision::bf16});
      bool any_moved = false;
      for (int r = 0; r < k.mr; ++r) {
        const auto ri = static_cast<std::size_t>(r);
        const std::int64_t jlo = lo[ri], jhi = hi[ri];
        if (!masked && r == 1) {  // the NaN key is visible: l is NaN
          EXPECT_TRUE(std::isnan(l[ri])) << name(kc);
          any_moved = true;
          continue;
        }
        double mx = m0[ri];
        for (std::int64_t j = jlo; j < jhi; ++j) mx = std::max<double>(mx, s.as<float>()[r * n + j]);
        EXPECT_EQ(m[ri], static_cast<float>(mx)) << name(kc) << " r " << r;
        const double base = std::isinf(mx) ? 0.0 : mx;
        const double c = std::exp(static_cast<double>(m0[ri]) - base);
        double sum = l0[ri] * c;
        double max_arg = 0.0;  // largest |argument| of an exp in this row
        for (std::int64_t j = 0; j < n; ++j) {
          const double e = j >= jlo && j < jhi ? std::exp(s.as<float>()[r * n + j] - base) : 0.0;
          sum += e;
          const double got =
              ob == 2 ? bf16_bits_to_float(p.as<std::uint16_t>()[r * n + j]) : p.as<float>()[r * n + j];
          if (j < jlo || j >= jhi) {
            ASSERT_EQ(got, 0.0) << name(kc) << " masked key r " << r << " j " << j;
            continue;
          }
          max_arg = std::max(max_arg, std::fabs(s.as<float>()[r * n + j]) + std::fabs(base));
          // exp error (argument rounding |x| 2^-24 plus the polynomial), then the bf16 rounding of P.
          const double rel = kExpMaxRelError +
                             (std::fabs(s.as<float>()[r * n + j]) + std::fabs(base)) * 0x1p-23 +
                             (kc.precision == Precision::bf16 ? 0x1p-8 : 0.0);
          ASSERT_LE(std::fabs(got - e), rel * e) << name(kc) << " r " << r << " j " << j;
        }
        EXPECT_NEAR(corr[ri], c, 2 * kExpMaxRelError * c + 1e-30) << name(kc) << " r " << r;
        // l = l0 corr + sum_j P_j in fp32: each term off by its exp's error (as above, unrounded P),
        // plus n + 1 roundings of the running sum and one of the product: gamma(n + 2) = (n + 2) 2^-24.
        const double l_rel = kExpMaxRelError + max_arg * 0x1p-23 + static_cast<double>(n + 2) * 0x1p-24;
        EXPECT_NEAR(l[ri], sum, l_rel * sum + 1e-30) << name(kc) << " r " << r;
        any_moved |= corr[ri] != 1.0f;
      }
      EXPECT_EQ(moved, any_moved) << name(kc);
    }
  }
}

// Bounds that mask no key (every row's [lo, hi) = [0, n)) give the bits of no bounds (the sets take
// the unmasked loop for them); one row's hi at n - 1 still masks that row's last key.
TEST(Microkernels, SoftmaxTileBoundsThatMaskNothingGiveTheUnmaskedBits) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (const KernelCase& kc : supported_cases()) {
    const FlashKernels& k = *kc.kern;
    const std::int64_t ob = k.operand_bytes, n = 64;
    const auto rows = static_cast<std::size_t>(k.mr);
    AlignedBuffer s(rows * n * 4);
    for (std::int64_t i = 0; i < k.mr * n; ++i) s.as<float>()[i] = dist(rng);
    std::vector<std::int32_t> lo(rows, 0), hi(rows, static_cast<std::int32_t>(n));
    struct Out {
      AlignedBuffer p;
      std::vector<float> m, l, corr;
      bool moved;
    };
    const auto run = [&](const std::int32_t* lo_r, const std::int32_t* hi_r) {
      Out o{AlignedBuffer(rows * n * static_cast<std::size_t>(ob)), std::vector<float>(rows, 0.5f),
            std::vector<float>(rows, 2.0f), std::vector<float>(rows), false};
      o.moved = k.softmax_tile({s.as<float>(), n, o.p.data(), n, o.m.data(), o.l.data(), o.corr.data(), lo_r, hi_r, n,
                                k.mr, kc.precision == Precision::bf16});
      return o;
    };
    const Out none = run(nullptr, nullptr), whole = run(lo.data(), hi.data());
    ASSERT_EQ(std::memcmp(none.p.data(), whole.p.data(), rows * n * static_cast<std::size_t>(ob)), 0) << name(kc);
    ASSERT_EQ(std::memcmp(none.m.data(), whole.m.data(), rows * 4), 0) << name(kc);
    ASSERT_EQ(std::memcmp(none.l.data(), whole.l.data(), rows * 4), 0) << name(kc);
    ASSERT_EQ(std::memcmp(none.corr.data(), whole.corr.data(), rows * 4), 0) << name(kc);
    ASSERT_EQ(none.moved, whole.moved) << name(kc);
    hi[rows - 1] = static_cast<std::int32_t>(n - 1);
    const Out last = run(lo.data(), hi.data());
    const auto at = [&](const Out& o, std::int64_t i) {
      return ob == 2 ? bf16_bits_to_float(o.p.as<std::uint16_t>()[i]) : o.p.as<float>()[i];
    };
    EXPECT_EQ(at(last, (k.mr - 1) * n + n - 1), 0.0f) << name(kc);
    EXPECT_GT(at(none, (k.mr - 1) * n + n - 1), 0.0f) << name(kc);
    EXPECT_EQ(at(last, n - 1), at(none, n - 1)) << name(kc);  // the other rows as before
  }
}

// The avx2 sets' softmax, bit for bit, against a scalar model of what it computes (exp_poly.hpp): P =
// 2^x, x = fma(s, log2 e, -(m log2 e)), 2^x by the clamps to [kMinExp2, kMaxExp2], n = floor(x),
// Horner in f = x - n with fused multiply-adds, then p 2^n rounded once; P rounded to bf16 where the
// set rounds it. Its 4-vector steps take a shorter exp where every lane's x lies in [-126, 128): the
// rows here put keys far below the max (x < -126, some in the same steps as ordinary ones), a row of
// one value near 2^100 whose rounded m log2 e leaves every key's x at 128 or more (the model's clamp:
// +inf), -inf keys, and a NaN beside ordinary keys (it passes either exp unchanged; the max skips it,
// as a later key of its lane follows).
float exp2_model(float x) {
  using namespace exp_poly;
  if (std::isnan(x)) return x;
  x = std::fmin(std::fmax(x, kMinExp2), kMaxExp2);
  const float n = std::floor(x), f = x - n;
  float p = kC5;
  for (float c : {kC4, kC3, kC2, kC1, 1.0f}) p = std::fma(p, f, c);
  return std::ldexp(p, static_cast<int>(n));
}

TEST(Microkernels, Avx2SoftmaxGivesTheBitsOfItsScalarModel) {
  if (!isa_supported(Isa::avx2)) GTEST_SKIP() << "no AVX2 here";
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const struct {
    const FlashKernels* k;
    bool round_p;
  } sets[] = {{&decode_kernels_for(Isa::avx2, Precision::bf16), true},
              {&kernels_for(Isa::avx2, Precision::bf16), true},
              {&kernels_for(Isa::avx2, Precision::f32), false}};
  constexpr int kRows = 4;
  const std::int64_t n = 128;
  float huge = 0x1p100f;  // the first float from 2^100 on whose x = fma(m, log2 e, -(m log2 e)) >= 128
  while (std::fma(huge, exp_poly::kLog2e, -huge * exp_poly::kLog2e) < 128.0f) huge = std::nextafter(huge, kInf);
  for (const auto& set : sets) {
    const FlashKernels& k = *set.k;
    const std::int64_t ob = k.operand_bytes;
    AlignedBuffer s(static_cast<std::size_t>(kRows * n * 4)), p(static_cast<std::size_t>(kRows * n * ob));
    float* sv = s.as<float>();
    for (int r = 0; r < kRows; ++r)
      for (std::int64_t j = 0; j < n; ++j) {
        float x = dist(rng);
        if (r == 1 && j % 3 == 0) x -= 100.0f;            // x ~ -144: below -126, beside ordinary keys
        if (r == 2) x = huge;
        if (r == 3) x = j == 5 ? 4.0f : j % 7 == 0 ? -kInf : x - 95.0f;  // all but one far below
        if (r == 0 && j == 8) x = kNaN;
        sv[r * n + j] = x;
      }
    std::vector<float> m = {-kInf, 1.5f, -kInf, -kInf}, l = {0.0f, 2.0f, 0.0f, 0.0f}, corr(kRows);
    const std::vector<float> m0 = m;
    k.softmax_tile({sv, n, p.data(), n, m.data(), l.data(), corr.data(), nullptr, nullptr, n, kRows, set.round_p});
    for (int r = 0; r < kRows; ++r) {
      float mx = -kInf;
      for (std::int64_t j = 0; j < n; ++j) mx = std::max(mx, sv[r * n + j]);  // (NaN skipped)
      const float m_new = std::max(m0[static_cast<std::size_t>(r)], mx), m_use = m_new == -kInf ? 0.0f : m_new;
      ASSERT_EQ(m[static_cast<std::size_t>(r)], m_new) << k.name << " r " << r;
      const float neg = -m_use * exp_poly::kLog2e;
      for (std::int64_t j = 0; j < n; ++j) {
        float want = exp2_model(std::fma(sv[r * n + j], exp_poly::kLog2e, neg));
        if (set.round_p) want = round_to_bf16(want);
        const float got = ob == 2 ? bf16_bits_to_float(p.as<std::uint16_t>()[r * n + j]) : p.as<float>()[r * n + j];
        ASSERT_EQ(std::memcmp(&got, &want, 4), 0)
            << k.name << " r " << r << " j " << j << ": " << got << " vs " << want;
      }
      const float want_corr = exp2_model((m0[static_cast<std::size_t>(r)] - m_use) * exp_poly::kLog2e);
      ASSERT_EQ(corr[static_cast<std::size_t>(r)], want_corr) << k.name << " r " << r;
    }
  }
}

TEST(Microkernels, ExpMeetsItsDocumentedBound) {
  std::vector<float> x;
  for (float v = -103.0f; v <= 88.0f; v += 0.0137f) x.push_back(v);
  for (float v = -1.0f; v <= 1.0f; v += 1.0f / 1024) x.push_back(v);
  for (const KernelCase& kc : supported_cases()) {
    const FlashKernels& k = *kc.kern;
    std::vector<float> y(x.size());
    k.exp_n(y.data(), x.data(), static_cast<std::int64_t>(x.size()));
    double worst = 0;  // relative error in units of the documented bound
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double ref = std::exp(static_cast<double>(x[i]));
      if (ref < 0x1p-126) continue;  // subnormal results: absolute error below 2^-126
      const double bound = kExpMaxRelError + std::fabs(x[i]) * 0x1p-23;
      worst = std::max(worst, std::fabs(y[i] - ref) / ref / bound);
    }
    EXPECT_LE(worst, 1.0) << name(kc);
    // Special values: exact 1 at 0 (so an unmoved max rescales by exactly 1), 0 far below, NaN stays.
    const float special[] = {0.0f, -kInf, -200.0f, kNaN, 200.0f, -110.0f};
    float out[6];
    k.exp_n(out, special, 6);
    EXPECT_EQ(out[0], 1.0f) << name(kc);
    EXPECT_EQ(out[1], 0.0f) << name(kc);
    EXPECT_EQ(out[2], 0.0f) << name(kc);
    EXPECT_TRUE(std::isnan(out[3])) << name(kc);
    EXPECT_EQ(out[4], kInf) << name(kc);
    EXPECT_LE(std::fabs(out[5] - std::exp(-110.0)), 0x1p-126) << name(kc);
  }
}

TEST(Microkernels, SoftcapMeetsItsDocumentedBound) {
  // cap tanh(x / cap) against float64 over the tanh's whole range (|x / cap| up to 12, past the clamp),
  // finely near 0 and geometrically down to tiny x, for a strong, a Gemma-sized and an odd cap.
  std::vector<float> y;
  for (float v = -12.0f; v <= 12.0f; v += 0.00071f) y.push_back(v);
  for (float v = 1e-30f; v < 1.0f; v *= 1.013f) y.push_back(v), y.push_back(-v);
  for (const KernelCase& kc : supported_cases()) {
    const FlashKernels& k = *kc.kern;
    for (const float cap : {1.0f, 50.0f, 0.37f}) {
      std::vector<float> x(y.size());
      for (std::size_t i = 0; i < y.size(); ++i) x[i] = y[i] * cap;
      std::vector<float> out = x;
      k.softcap_n(out.data(), static_cast<std::int64_t>(out.size()), cap);
      double worst = 0;  // error relative to the result, in units of the documented bound
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double ref = cap * std::tanh(static_cast<double>(x[i]) / cap);
        const double bound = (kTanhMaxRelError + 3 * 0x1p-24) * std::fabs(ref) + 1e-300;
        worst = std::max(worst, std::fabs(out[i] - ref) / bound);
      }
      EXPECT_LE(worst, 1.0) << name(kc) << " cap " << cap;
    }
    // The rational alone (cap 1): within kTanhMaxRelError of tanh.
    std::vector<float> t = y;
    k.softcap_n(t.data(), static_cast<std::int64_t>(t.size()), 1.0f);
    double worst = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      const double ref = std::tanh(static_cast<double>(y[i]));
      worst = std::max(worst, std::fabs(t[i] - ref) / std::fabs(ref) / kTanhMaxRelError);
    }
    EXPECT_LE(worst, 1.0) << name(kc);
    // Special values: tiny x unchanged (cap 1: no rounding of x / cap), -0 stays -0, NaN stays NaN;
    // +-inf and huge x saturate to +-cap.
    float special[] = {0.0f, -0.0f, 1e-20f, -3e-39f, kNaN, kInf, -kInf, 1e30f};
    k.softcap_n(special, 5, 1.0f);
    k.softcap_n(special + 5, 3, 30.0f);
    EXPECT_EQ(special[0], 0.0f) << name(kc);
    EXPECT_TRUE(special[1] == 0.0f && std::signbit(special[1])) << name(kc);
    EXPECT_EQ(special[2], 1e-20f) << name(kc);
    EXPECT_EQ(special[3], -3e-39f) << name(kc);
    EXPECT_TRUE(std::isnan(special[4])) << name(kc);
    EXPECT_NEAR(special[5], 30.0f, 30.0 * 2 * kTanhMaxRelError) << name(kc);
    EXPECT_NEAR(special[6], -30.0f, 30.0 * 2 * kTanhMaxRelError) << name(kc);
    EXPECT_NEAR(special[7], 30.0f, 30.0 * 2 * kTanhMaxRelError) << name(kc);
  }
}

// softmax_grad_pack against what the backward does without it: exp_n, dS = P (dP - D), pack_v of P and
// dS over the rows, pack_q_row of the dS rows. Bit for bit (the values here stay above 2^-126), in two
// calls as the backward makes them (a register tile from row 0, then the odd last row with the q
// block's padding rows), with masked ranges not on 16-key boundaries, an empty row, and NaN in S and
// dP outside each row's keys (never read as values).
TEST(Microkernels, SoftmaxGradPackMatchesTheUnfusedSteps) {
  for (const KernelCase& kc : supported_cases()) {
    const FlashKernels& k = *kc.kern;
    if (k.softmax_grad_pack == nullptr || kc.precision != Precision::bf16) continue;
    constexpr int rows = 13, split = 12;  // rows [0, 12) then [12, 13)
    const std::int64_t n = 96, rpad = padded_keys(rows), ob = k.operand_bytes;
    SCOPED_TRACE(name(kc));
    std::mt19937 rng(11);
    std::normal_distribution<float> dist;
    std::vector<float> S(static_cast<std::size_t>(rows * n)), dP(S.size()), lse(rows), D(rows);
    std::vector<std::int32_t> lo(rows), hi(rows);
    for (int r = 0; r < rows; ++r) {
      lo[static_cast<std::size_t>(r)] = r == 5 ? 0 : (r * 7) % 40;
      hi[static_cast<std::size_t>(r)] = r == 5 ? 0 : static_cast<std::int32_t>(n - (r * 5) % 37);
      lse[static_cast<std::size_t>(r)] = 4.0f + 0.25f * static_cast<float>(r);
      D[static_cast<std::size_t>(r)] = dist(rng);
      for (std::int64_t j = 0; j < n; ++j) {
        const bool seen = j >= lo[static_cast<std::size_t>(r)] && j < hi[static_cast<std::size_t>(r)];
        S[static_cast<std::size_t>(r * n + j)] = seen ? 2.0f * dist(rng) : kNaN;
        dP[static_cast<std::size_t>(r * n + j)] = seen ? dist(rng) : kNaN;
      }
    }
    // The unfused steps on fp32 P and dS rows (zero outside each row's keys).
    std::vector<float> P(S.size(), 0.0f), dS(S.size(), 0.0f), x(static_cast<std::size_t>(n));
    for (int r = 0; r < rows; ++r) {
      const auto at = static_cast<std::size_t>(r * n);
      for (std::int64_t j = 0; j < n; ++j) x[static_cast<std::size_t>(j)] = S[at + j] - lse[static_cast<std::size_t>(r)];
      k.exp_n(x.data(), x.data(), n);
      for (std::int64_t j = lo[static_cast<std::size_t>(r)]; j < hi[static_cast<std::size_t>(r)]; ++j) {
        P[at + j] = x[static_cast<std::size_t>(j)];
        dS[at + j] = P[at + j] * (dP[at + j] - D[static_cast<std::size_t>(r)]);
      }
    }
    const auto panels_bytes = static_cast<std::size_t>(rpad * n * ob);
    AlignedBuffer want_pt(panels_bytes), want_dst(panels_bytes), want_dsr(static_cast<std::size_t>(rows * n * ob));
    k.pack_v(want_pt.data(), {P.data(), DType::f32, n, rows, n, n, true});
    k.pack_v(want_dst.data(), {dS.data(), DType::f32, n, rows, n, n, true});
    for (int r = 0; r < rows; ++r)
      k.pack_q_row(want_dsr.as<char>() + r * n * ob, {dS.data() + r * n, DType::f32, 0, 0, n, n, true});
    // The fused kernel, as the backward calls it.
    AlignedBuffer pt(panels_bytes), dst(panels_bytes), dsr(static_cast<std::size_t>(rows * n * ob));
    std::memset(pt.data(), 0xff, panels_bytes);  // every byte must be written
    std::memset(dst.data(), 0xff, panels_bytes);
    for (const auto& [r0, nr, out] : {std::tuple{0, split, split}, std::tuple{split, rows - split, int(rpad) - split}}) {
      const auto i = static_cast<std::size_t>(r0);
      k.softmax_grad_pack({S.data() + r0 * n, dP.data() + r0 * n, n, lse.data() + i, D.data() + i, lo.data() + i,
                           hi.data() + i, n, pt.as<char>() + r0 * kHTile * ob, dst.as<char>() + r0 * kHTile * ob,
                           rpad * kHTile, dsr.as<char>() + r0 * n * ob, n, nr, out});
    }
    EXPECT_EQ(std::memcmp(pt.data(), want_pt.data(), panels_bytes), 0) << name(kc) << ": P panels";
    EXPECT_EQ(std::memcmp(dst.data(), want_dst.data(), panels_bytes), 0) << name(kc) << ": dS panels";
    EXPECT_EQ(std::memcmp(dsr.data(), want_dsr.data(), static_cast<std::size_t>(rows * n * ob)), 0)
        << name(kc) << ": dS rows";
  }
}

}  // namespace
}  // namespace flashgqa
