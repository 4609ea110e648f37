// The decode kernels (decode_qk_rows, decode_pv_rows; contract in microkernels.hpp) of every kernel set
// this machine runs that has them, against a scalar model in double of the bf16-rounded operands:
// rows 1..8, n = 1..70 (partial key groups and pairs; 29 of them under an emulator, key_counts), H = 40
// (a partial chunk, Hp > H) to 288 (kHs), K/V rows in f32, bf16, f16 and int8 with random per-key
// scales, strided rows, corr null and not. Also: nothing past the contract is read (NaN there) or
// written (sentinels), S is exactly 0 from n to round_up(n, 16), and the results depend only on the
// operand values (a bf16 or an int8 row gives the bits of the f32 row holding its operands).
//
// Bound (fp32 accumulation, summation orders differ between sets): each logit or output element is
// within (d + 4) 2^-23 sum |terms| of the exact sum, d the number of summands (H products, or the keys
// plus the rescaled O), plus 2^-120 per summand for the subnormals BFDOT / vdpbf16ps flush to zero.
// 2^-23 per step (not 2^-24) covers BFDOT's round-to-odd intermediate; the scale and corr
// multiplications are one more rounding each, in the 4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/decode_kernels_testing.hpp"

namespace flashgqa {
namespace {

using namespace decode_testing;

// The key counts n the scalar-model checks below sweep: 1..70 (partial groups of 8 and 16 keys, pairs,
// the int8 form's 32-key slices), or under an emulator (FLASHGQA_TEST_EMULATED=1, which
// scripts/test-aarch64.sh sets: there these three tests took 158 s of its qemu suite) 1..17 (every n
// mod 16) and the counts around 32, 48 and 64 keys: the same cases of every kernel's tails, 29 of the 70.
std::vector<std::int64_t> key_counts() {
  const char* flag = std::getenv("FLASHGQA_TEST_EMULATED");
  const bool emulated = flag != nullptr && std::string(flag) == "1";
  // Around a multiple of 16: one key short of it, on it, one past it.
  const auto near_16s = [](std::int64_t i) { return i % 16 <= 1 || i % 16 == 15; };
  std::vector<std::int64_t> n;
  for (std::int64_t i = 1; i <= 70; ++i)
    if (!emulated || i <= 17 || near_16s(i) || i == 23 || i == 40 || i == 70) n.push_back(i);
  return n;
}

// decode_qk_rows against the model for one set, dtype and H, every rows and n.
void check_qk(const FlashKernels& k, DType dtype, std::int64_t H, std::mt19937& rng) {
  const std::int64_t Hp = round_up(H, kHTile);
  const float scale = 1.0f / std::sqrt(static_cast<float>(H));
  for (const std::int64_t n : key_counts()) {
    const std::int64_t end = round_up(n, 16), lds = end + 16;
    const Rows kr = make_rows(dtype, n, end, H, rng);
    const Rows kf = as_f32(kr, n, end, H);
    for (int rows = 1; rows <= k.decode_max_rows; ++rows) {
      SCOPED_TRACE(std::string(k.name) + " " + dtype_name(dtype) + " H " + std::to_string(H) + " n " +
                   std::to_string(n) + " rows " + std::to_string(rows));
      const QRows q = make_q(rows, H, Hp, rng);
      const std::vector<float> s = run_qk(k, q, kr, rows, n, H, Hp, scale, lds);
      // The integers form (int8 on a set that says so, H <= 256): against the exact products x s, with
      // each Q row's quantization, |q - q_int m / 32767| <= m (2^-16 + 2^-22), on sum_h |x s|.
      const bool integers = dtype == DType::i8 && k.int8_on_integers && Hp <= 256;
      for (int r = 0; r < rows; ++r) {
        double m = 0.0;
        for (std::int64_t h = 0; h < H; ++h) m = std::max(m, std::fabs(static_cast<double>(q.value[static_cast<std::size_t>(r * H + h)])));
        for (std::int64_t j = 0; j < n; ++j) {
          double exact = 0.0, mag = 0.0, kabs = 0.0;
          for (std::int64_t h = 0; h < H; ++h) {
            const double kv = integers ? exact_int8(kr, j, h) : kr.operand[static_cast<std::size_t>(j * H + h)];
            const double x = static_cast<double>(q.value[static_cast<std::size_t>(r * H + h)]) * kv;
            exact += x;
            mag += std::fabs(x);
            kabs += std::fabs(kv);
          }
          const double bound = (static_cast<double>(H) + 4) * 0x1p-23 * scale * mag + H * 0x1p-120 +
                               (integers ? scale * m * (0x1p-16 + 0x1p-22) * kabs : 0.0);
          ASSERT_NEAR(s[static_cast<std::size_t>(r * lds + j)], scale * exact, bound) << "r " << r << " j " << j;
        }
        for (std::int64_t j = n; j < end; ++j) ASSERT_EQ(s[static_cast<std::size_t>(r * lds + j)], 0.0f) << "j " << j;
        for (std::int64_t j = end; j < lds; ++j) ASSERT_EQ(s[static_cast<std::size_t>(r * lds + j)], kSentinel) << "j " << j;
      }
      // The operands decide the bits: the f32 rows holding them give the same S.
      if (dtype != DType::f32 && !integers) {
        ASSERT_EQ(s, run_qk(k, q, kf, rows, n, H, Hp, scale, lds));
      }
    }
  }
}

void check_pv_case(const FlashKernels& k, const PvCase& c, const Rows& vr, const Rows& vf, std::mt19937& rng) {
  const std::vector<std::uint16_t> p = make_p(c, rng);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f), cval(0.0f, 1.0f);
  std::vector<float> o0(static_cast<std::size_t>(c.rows * c.ldo), kSentinel), corr(static_cast<std::size_t>(c.rows));
  for (int r = 0; r < c.rows; ++r) {
    corr[static_cast<std::size_t>(r)] = cval(rng);
    for (std::int64_t h = 0; h < c.Hp; ++h) o0[static_cast<std::size_t>(r * c.ldo + h)] = val(rng);
  }
  const std::vector<float> o = run_pv(k, c, p, o0, corr, vr);
  for (int r = 0; r < c.rows; ++r) ASSERT_NO_FATAL_FAILURE(expect_pv_row(k, c, p, o0, corr, vr, o, r));
  // The operands decide the bits (the products form): the f32 rows holding them give the same O.
  if (vr.dtype != DType::f32 && !(vr.dtype == DType::i8 && k.int8_on_integers)) {
    ASSERT_EQ(o, run_pv(k, c, p, o0, corr, vf));
  }
}

// decode_pv_rows against the model for one set, dtype and H: every rows and n, corr null and not,
// nkeys = round_up(n, 2) and, for some n, fewer.
void check_pv(const FlashKernels& k, DType dtype, std::int64_t H, std::mt19937& rng) {
  const std::int64_t Hp = round_up(H, kHTile);
  for (const std::int64_t n : key_counts()) {
    const std::int64_t alloc = round_up(n, 2);
    const Rows vr = make_rows(dtype, n, alloc, H, rng);
    const Rows vf = as_f32(vr, n, alloc, H);
    for (int rows = 1; rows <= k.decode_max_rows; ++rows)
      for (bool corr : {false, true}) {
        SCOPED_TRACE(std::string(k.name) + " " + dtype_name(dtype) + " H " + std::to_string(H) + " n " +
                     std::to_string(n) + " rows " + std::to_string(rows) + (corr ? " corr" : ""));
        PvCase c{rows, n, alloc, H, Hp, round_up(n, 16) + 32, Hp + 32, corr};
        check_pv_case(k, c, vr, vf, rng);
        if (n % 7 == 0) {
          c.nkeys = n / 2 / 2 * 2;
          check_pv_case(k, c, vr, vf, rng);
        }
      }
  }
}

TEST(DecodeKernels, QkRowsMatchTheScalarModel) {
  const auto sets = decode_sets();
  if (sets.empty()) GTEST_SKIP() << "no kernel set with decode kernels runs here";
  std::mt19937 rng(15);
  for (const FlashKernels* k : sets)
    for (DType d : kFloatDTypes)
      for (std::int64_t H : kHs) ASSERT_NO_FATAL_FAILURE(check_qk(*k, d, H, rng));
}

TEST(DecodeKernels, PvRowsMatchTheScalarModel) {
  const auto sets = decode_sets();
  if (sets.empty()) GTEST_SKIP() << "no kernel set with decode kernels runs here";
  std::mt19937 rng(16);
  for (const FlashKernels* k : sets)
    for (DType d : kFloatDTypes)
      for (std::int64_t H : kHs) ASSERT_NO_FATAL_FAILURE(check_pv(*k, d, H, rng));
}

TEST(DecodeKernels, Int8RowsMatchTheScalarModel) {
  const auto sets = decode_sets();
  if (sets.empty()) GTEST_SKIP() << "no kernel set with decode kernels runs here";
  std::mt19937 rng(17);
  for (const FlashKernels* k : sets)
    for (std::int64_t H : kHs) {
      ASSERT_NO_FATAL_FAILURE(check_qk(*k, DType::i8, H, rng));
      ASSERT_NO_FATAL_FAILURE(check_pv(*k, DType::i8, H, rng));
    }
}

// The integers form's other paths (microkernels.hpp): a Q row with a NaN takes the products form (NaN
// logits for that row, finite ones for the others); a group of 16 keys whose weights are all below
// 2^-100 is taken key by key in fp32 (the row's only non-zero group here, within expect_pv_row's bound
// of it, where the int16 weights would have divided by W); a NaN weight makes its row's O NaN.
TEST(DecodeKernels, Int8IntegersFormFallbacks) {
  std::mt19937 rng(19);
  int sets = 0;
  for (const FlashKernels* k : decode_sets()) {
    if (!k->int8_on_integers) continue;
    ++sets;
    const std::int64_t H = 128, Hp = 128, n = 48;
    SCOPED_TRACE(k->name);
    const Rows r = make_rows(DType::i8, n, n, H, rng);
    // Q: row 1 holds a NaN.
    QRows q = make_q(4, H, Hp, rng);
    q.buf.as<std::uint16_t>()[1 * q.ldq + 5] = kNaNBits;
    const std::int64_t lds = n + 16;
    const std::vector<float> s = run_qk(*k, q, r, 4, n, H, Hp, 0.125f, lds);
    for (int row = 0; row < 4; ++row)
      for (std::int64_t j = 0; j < n; ++j)
        ASSERT_EQ(std::isnan(s[static_cast<std::size_t>(row * lds + j)]), row == 1) << "row " << row << " j " << j;
    // Q: row 2 below kI16MinQ (max |q| ~ 2^-114, where 32767 / max |q| overflows fp32): the products
    // form, within its bound of the exact products plus 2^-126 |k| per term for the Q values that are
    // subnormal (which vdpbf16ps flushes). The overflow had made every q_int -32768: logits of the
    // size of the exact ones, with other signs.
    QRows tiny = make_q(4, H, Hp, rng);
    for (std::int64_t h = 0; h < H; ++h) {
      const std::uint16_t bits = float_to_bf16_bits(tiny.value[static_cast<std::size_t>(2 * H + h)] * 0x1p-114f);
      tiny.buf.as<std::uint16_t>()[2 * tiny.ldq + h] = bits;
      tiny.value[static_cast<std::size_t>(2 * H + h)] = bf16_bits_to_float(bits);
    }
    const std::vector<float> st = run_qk(*k, tiny, r, 4, n, H, Hp, 0.125f, lds);
    for (std::int64_t j = 0; j < n; ++j) {
      double exact = 0.0, mag = 0.0, kabs = 0.0;
      for (std::int64_t h = 0; h < H; ++h) {
        const double x = static_cast<double>(tiny.value[static_cast<std::size_t>(2 * H + h)]) * exact_int8(r, j, h);
        exact += x;
        mag += std::fabs(x);
        kabs += std::fabs(exact_int8(r, j, h));
      }
      ASSERT_NEAR(st[static_cast<std::size_t>(2 * lds + j)], 0.125 * exact,
                  0.125 * ((H + 4) * 0x1p-23 * mag + 0x1p-9 * mag + 0x1p-126 * kabs))
          << "tiny row, j " << j;
    }
    // PV: row 0's first group tiny (key by key) and its other weights 0, so that group is its whole
    // sum; row 1 holds a NaN weight; rows 2, 3 plain.
    PvCase c{4, n, n, H, Hp, n + 32, Hp + 32, false};
    std::vector<std::uint16_t> p = make_p(c, rng);
    for (std::int64_t j = 0; j < n; ++j)
      p[static_cast<std::size_t>(j)] = j < 16 ? float_to_bf16_bits(1e-33f * static_cast<float>(j + 1)) : 0;
    p[static_cast<std::size_t>(c.ldp + 20)] = kNaNBits;
    std::vector<float> o0(static_cast<std::size_t>(c.rows * c.ldo), kSentinel);
    for (int row = 0; row < c.rows; ++row) std::fill_n(o0.begin() + row * c.ldo, Hp, 0.0f);
    const std::vector<float> corr;
    const std::vector<float> o = run_pv(*k, c, p, o0, corr, r);
    for (int row : {0, 2, 3}) ASSERT_NO_FATAL_FAILURE(expect_pv_row(*k, c, p, o0, corr, r, o, row));
    for (std::int64_t h = 0; h < H; ++h) ASSERT_TRUE(std::isnan(o[static_cast<std::size_t>(c.ldo + h)])) << "h " << h;
  }
  if (sets == 0) GTEST_SKIP() << "no kernel set here takes int8 in the integers form";
}

}  // namespace
}  // namespace flashgqa
