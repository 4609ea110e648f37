// The decode kernels (contract in microkernels.hpp) give the bits of one form in another: rows in
// pieces or together, P.V calls cut at the set's step or whole, V kept or formed again, the FMA kernels
// and vdpbf16ps, the fast paths and the generic one, the integers form on every x86 set.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/decode_kernels_testing.hpp"

namespace flashgqa {
namespace {

using namespace decode_testing;

// Sets with decode_row_pieces: bf16 and int8 rows in pieces at their own addresses (DecodeQk::k_pieces,
// DecodePv::v_pieces; int8's scales together, as always) give the bits of the same rows together, every
// rows, H and n (partial pieces, groups and pairs).
TEST(DecodeKernels, PiecesGiveTheBitsOfRowsTogether) {
  std::vector<const FlashKernels*> sets;
  for (const FlashKernels* k : decode_sets())
    if (k->decode_row_pieces) sets.push_back(k);
  if (sets.empty()) GTEST_SKIP() << "no kernel set here takes pieces";
  std::mt19937 rng(23);
  for (const FlashKernels* k : sets)
    for (DType dtype : {DType::bf16, DType::i8})
      for (std::int64_t H : kHs)
        for (std::int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 64, 65, 70}) {
          const std::int64_t Hp = round_up(H, kHTile), end = round_up(n, 16);
          const Rows kv = make_rows(dtype, n, end, H, rng);
          AlignedBuffer store;
          const std::vector<const void*> pieces = scatter_pieces(kv, end, store, rng);
          for (int rows = 1; rows <= k->decode_max_rows; ++rows) {
            SCOPED_TRACE(std::string(k->name) + " " + dtype_name(dtype) + " H " + std::to_string(H) + " n " +
                         std::to_string(n) + " rows " + std::to_string(rows));
            const QRows q = make_q(rows, H, Hp, rng);
            const float scale = 1.0f / std::sqrt(static_cast<float>(H));
            ASSERT_EQ(run_qk(*k, q, kv, rows, n, H, Hp, scale, end + 16),
                      run_qk(*k, q, kv, rows, n, H, Hp, scale, end + 16, pieces.data()));
            const PvCase c{rows, n, round_up(n, 2), H, Hp, end + 32, Hp + 32, rows % 2 == 0};
            const std::vector<std::uint16_t> p = make_p(c, rng);
            const std::vector<float> o0 = make_o0(c, rng), corr = step_corr(rows);
            ASSERT_EQ(run_pv(*k, c, p, o0, corr, kv), run_pv(*k, c, p, o0, corr, kv, pieces.data()));
          }
        }
}

// decode_pv_rows calls cut at multiples of the set's decode_pv_step_keys (where the decode path cuts
// them: pages, the overlap's pieces) give the bits of one call over the same keys: every set, float
// and int8 rows, every rows, cuts into two and three calls, n past the last cut or not.
TEST(DecodeKernels, PvCallsCutAtTheStepKeysGiveTheBitsOfOne) {
  const std::vector<const FlashKernels*> sets = decode_sets();
  if (sets.empty()) GTEST_SKIP() << "no kernel set with decode kernels runs here";
  std::mt19937 rng(29);
  for (const FlashKernels* k : sets)
    for (DType dtype : {DType::bf16, DType::f16, DType::i8})
      for (std::int64_t H : {64, 96, 128}) {
        const std::int64_t Hp = round_up(H, kHTile), step = k->decode_pv_step_keys;
        for (std::int64_t n : {3 * step, 3 * step + 6, 4 * step + 1}) {
          const std::int64_t nkeys = round_up(n, 2), esize = static_cast<std::int64_t>(dtype_size(dtype));
          const Rows vr = make_rows(dtype, n, nkeys, H, rng);
          for (int rows = 1; rows <= k->decode_max_rows; ++rows) {
            SCOPED_TRACE(std::string(k->name) + " " + dtype_name(dtype) + " H " + std::to_string(H) + " n " +
                         std::to_string(n) + " rows " + std::to_string(rows));
            const PvCase c{rows, n, nkeys, H, Hp, round_up(n, 16) + 32, Hp + 32, true};
            const std::vector<std::uint16_t> p = make_p(c, rng);
            const std::vector<float> o0 = make_o0(c, rng), corr = step_corr(rows);
            const std::vector<float> whole = run_pv(*k, c, p, o0, corr, vr);
            for (const std::vector<std::int64_t>& cuts :
                 {std::vector<std::int64_t>{step}, {2 * step}, {step, 2 * step}, {step, 3 * step}}) {
              AlignedBuffer o(static_cast<std::size_t>(rows * c.ldo) * 4), pb(p.size() * 2);
              std::copy(o0.begin(), o0.end(), o.as<float>());
              std::copy(p.begin(), p.end(), pb.as<std::uint16_t>());
              std::int64_t j0 = 0;
              for (std::size_t i = 0; i <= cuts.size(); ++i) {  // keys [j0, end) in one call
                const std::int64_t end = i < cuts.size() ? std::min(cuts[i], n) : n;
                if (end <= j0) continue;
                const std::int64_t len = end - j0;
                DecodePv t{o.as<float>(), c.ldo, pb.as<std::uint16_t>() + j0, c.ldp,
                           static_cast<const unsigned char*>(vr.data()) + j0 * vr.ld * esize, dtype, vr.ld, len,
                           round_up(len, 2), H, Hp, j0 == 0 ? corr.data() : nullptr, rows,
                           vr.scales() ? vr.scales() + j0 * vr.ld_scale : nullptr, vr.ld_scale};
                k->decode_pv_rows(t);
                j0 = end;
              }
              ASSERT_EQ(whole, std::vector<float>(o.as<float>(), o.as<float>() + rows * c.ldo))
                  << "cut at " << cuts[0] << (cuts.size() > 1 ? " and " + std::to_string(cuts[1]) : "");
            }
          }
        }
      }
}

// DecodePv::keep_v and same_v are hints: a call with same_v after one with keep_v (the row groups of
// one block: other weights, rows and O, the same V) gives the bits of the same call without them, and
// so does a call without same_v after one with keep_v. Every set, float and int8 rows, partial steps.
TEST(DecodeKernels, KeptVGivesTheBitsOfFormingItAgain) {
  const std::vector<const FlashKernels*> sets = decode_sets();
  if (sets.empty()) GTEST_SKIP() << "no kernel set with decode kernels runs here";
  std::mt19937 rng(31);
  for (const FlashKernels* k : sets)
    for (DType dtype : {DType::bf16, DType::f32, DType::i8})
      for (std::int64_t H : {64, 96, 128, 256})
        for (std::int64_t n : {1, 31, 64, 100}) {
          const std::int64_t Hp = round_up(H, kHTile), nkeys = round_up(n, 2);
          const Rows vr = make_rows(dtype, n, nkeys, H, rng);
          SCOPED_TRACE(std::string(k->name) + " " + dtype_name(dtype) + " H " + std::to_string(H) + " n " +
                       std::to_string(n));
          // Three calls on the same V, as three row groups would make them: without the hints, then
          // with them (one after the other, as the contract has it).
          std::vector<PvCase> cases;
          std::vector<std::vector<std::uint16_t>> ps;
          std::vector<std::vector<float>> o0s, results[2];
          const std::vector<float> corr(static_cast<std::size_t>(k->decode_max_rows), 0.75f);
          for (int g = 0; g < 3; ++g) {
            cases.push_back({g == 2 ? 3 : k->decode_max_rows, n, nkeys, H, Hp, round_up(n, 16) + 32, Hp + 32, g == 1});
            ps.push_back(make_p(cases.back(), rng));
            o0s.push_back(make_o0(cases.back(), rng));
          }
          for (bool hints : {false, true})
            for (std::size_t g = 0; g < 3; ++g)
              results[hints].push_back(run_pv(*k, cases[g], ps[g], o0s[g], corr, vr, nullptr, hints && g < 2,
                                              hints && g > 0));
          ASSERT_EQ(results[0], results[1]);
        }
}

#if defined(__x86_64__)
// The FMA decode kernels (two fp32 FMAs per bf16 pair, odd element first) against each other and, where
// bf16_dot_half_rate() (Intel, whose vdpbf16ps rounds each of its two steps in that order), against
// vdpbf16ps: bitwise the same S and O for operands, weights and sums above 2^-126, every dtype.
TEST(DecodeKernels, FmaKernelsGiveTheDotBits) {
  if (!isa_supported(Isa::avx512bf16)) GTEST_SKIP() << "no AVX512_BF16 here";
  std::vector<const FlashKernels*> same = {&avx512bf16_fma_decode_kernels(), &avx512f_decode_kernels()};
  if (bf16_dot_half_rate()) same.push_back(&avx512bf16_kernels());
  std::mt19937 rng(18);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::i8})
    for (std::int64_t H : {40, 128, 288})
      for (std::int64_t n : {1, 17, 64, 333})
        for (int rows : {1, 4, 8}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " H " + std::to_string(H) + " n " + std::to_string(n) +
                       " rows " + std::to_string(rows));
          const std::int64_t Hp = round_up(H, kHTile), lds = round_up(n, 16) + 16;
          const Rows r = make_rows(dtype, n, round_up(n, 16), H, rng);
          const QRows q = make_q(rows, H, Hp, rng);
          const PvCase c{rows, n, round_up(n, 2), H, Hp, round_up(n, 16) + 32, Hp + 32, true};
          const std::vector<std::uint16_t> p = make_p(c, rng);
          std::vector<float> o0(static_cast<std::size_t>(rows * c.ldo), 0.5f), corr(static_cast<std::size_t>(rows), 0.75f);
          const std::vector<float> s0 = run_qk(*same[0], q, r, rows, n, H, Hp, 0.125f, lds);
          const std::vector<float> v0 = run_pv(*same[0], c, p, o0, corr, r);
          for (std::size_t i = 1; i < same.size(); ++i) {
            if (dtype == DType::i8 && same[i]->int8_on_integers != same[0]->int8_on_integers) continue;  // other forms
            ASSERT_EQ(s0, run_qk(*same[i], q, r, rows, n, H, Hp, 0.125f, lds)) << same[i]->name;
            ASSERT_EQ(v0, run_pv(*same[i], c, p, o0, corr, r)) << same[i]->name;
          }
        }
}

// The avx2 set's fast paths (whole groups of keys, the chunks that hold a value of the row:
// with_fast_chunks) give its generic path's bits: each logit of one call over n keys against calls of
// one key each (no whole group of 8, so the generic path), and O after one call against calls of two
// keys each (no whole 16, the generic path again; corr with the first), which the paged path relies on
// as well (a logit is its own key's; each O element takes its keys one by one in increasing order).
// For every H of kHs (fast: 64, 96, 128, 256 unrolled, 48 and 80 counted at run time, 40, 57 and 100
// with a masked last chunk, and bf16 P.V at 288; Q.K at 288 generic on both sides), bf16, f16, f32 and int8
// rows (Q.K only: int8's P.V quantizes per 16 keys of a call) in both int8 forms (the products form
// where a Q row holds a NaN: the other rows then), every row count.
// The AVX-512 vector sets likewise (fast paths at H = 64, 96, 128 and 256); not amx, whose tiles sum
// P.V per 16 keys of a call.
TEST(DecodeKernels, FastPathsGiveTheGenericBits) {
  std::vector<const FlashKernels*> sets;
#if defined(__x86_64__)
  if (isa_supported(Isa::avx2)) sets.push_back(&avx2_decode_kernels());
  if (isa_supported(Isa::avx512f)) sets.push_back(&avx512f_decode_kernels());
  if (isa_supported(Isa::avx512bf16)) {
    sets.push_back(&avx512bf16_kernels());
    sets.push_back(&avx512bf16_fma_decode_kernels());
  }
#endif
  if (sets.empty()) GTEST_SKIP() << "no AVX2 here";
  for (const FlashKernels* set : sets) {
    const FlashKernels& k = *set;
    const auto bits = [](const float* x, std::int64_t n) {
      std::vector<std::uint32_t> b(static_cast<std::size_t>(n));
      std::memcpy(b.data(), x, b.size() * 4);
      return b;
    };
    std::mt19937 rng(20);
    constexpr std::int64_t n = 48;
    for (DType dtype : {DType::bf16, DType::f16, DType::f32, DType::i8})
      for (std::int64_t H : kHs)
        for (int rows = 1; rows <= k.decode_max_rows; ++rows) {
          SCOPED_TRACE(std::string(k.name) + " " + dtype_name(dtype) + " H " + std::to_string(H) + " rows " +
                       std::to_string(rows));
          const std::int64_t Hp = round_up(H, kHTile), lds = n + 16;
          const Rows r = make_rows(dtype, n, n, H, rng);
          const auto row = [&](std::int64_t j) {
            return static_cast<const char*>(r.data()) + j * r.ld * static_cast<std::int64_t>(dtype_size(dtype));
          };
          const float* scales = r.scales();
          const auto scale_of = [&](std::int64_t j) { return scales ? scales + j * r.ld_scale : nullptr; };
          QRows q = make_q(rows, H, Hp, rng);
          // Rows [first, rows) of one call against one-key calls; rows before first are NaN in both.
          const auto check_qk_bits = [&](int first) {
            const std::vector<float> s = run_qk(k, q, r, rows, n, H, Hp, 0.125f, lds);
            AlignedBuffer one(static_cast<std::size_t>(rows * 16) * 4);
            for (std::int64_t j = 0; j < n; ++j) {
              k.decode_qk_rows({one.as<float>(), 16, q.buf.as<std::uint16_t>(), q.ldq, row(j), dtype, r.ld, 1, H, Hp,
                                0.125f, rows, scale_of(j), r.ld_scale});
              for (int i = 0; i < first; ++i)
                ASSERT_TRUE(std::isnan(one.as<float>()[i * 16]) &&
                            std::isnan(s[static_cast<std::size_t>(i * lds + j)]));
              for (int i = first; i < rows; ++i)
                ASSERT_EQ(bits(one.as<float>() + i * 16, 1), bits(s.data() + i * lds + j, 1))
                    << "Q.K, row " << i << " key " << j;
            }
          };
          ASSERT_NO_FATAL_FAILURE(check_qk_bits(0));
          if (dtype == DType::i8) {
            if (rows > 1) {  // the products form
              q.buf.as<std::uint16_t>()[0] = kNaNBits;
              ASSERT_NO_FATAL_FAILURE(check_qk_bits(1));
            }
            continue;
          }
          const PvCase c{rows, n, n, H, Hp, n + 32, Hp + 32, true};
          const std::vector<std::uint16_t> p = make_p(c, rng);
          const std::vector<float> o0 = make_o0(c, rng), corr(static_cast<std::size_t>(rows), 0.75f);
          const std::vector<float> o = run_pv(k, c, p, o0, corr, r);
          AlignedBuffer pieces(o0.size() * 4), pb(p.size() * 2);
          std::copy(o0.begin(), o0.end(), pieces.as<float>());
          std::copy(p.begin(), p.end(), pb.as<std::uint16_t>());
          for (std::int64_t j = 0; j < n; j += 2)
            k.decode_pv_rows({pieces.as<float>(), c.ldo, pb.as<std::uint16_t>() + j, c.ldp, row(j), dtype, r.ld, 2, 2,
                              H, Hp, j == 0 ? corr.data() : nullptr, rows});
          ASSERT_EQ(bits(pieces.as<float>(), rows * c.ldo), bits(o.data(), rows * c.ldo)) << "P.V";
        }
  }
}

// The integers form is defined to the bit (exact int32 sums, then the same fp32 steps), so the avx2
// set's vpmaddwd kernels, the avx512bf16 set's vpdpwssd ones and the amx set's (the avx512bf16 ones)
// give the same S and O, H <= 256 (wider Q.K rows take the products form, whose sums each set orders
// its own way). Each row's S and O are its own, so the calls of more rows than the avx2 set takes are
// compared row block by row block.
TEST(DecodeKernels, IntegersFormIsTheSameOnEveryX86Set) {
  if (!isa_supported(Isa::avx512bf16)) GTEST_SKIP() << "no AVX512_BF16 (and VNNI) here";
  const FlashKernels& a = avx2_decode_kernels();
  std::vector<const FlashKernels*> others{&avx512bf16_kernels()};
  if (isa_supported(Isa::amx)) others.push_back(&amx_kernels());
  ASSERT_TRUE(a.int8_on_integers);
  std::mt19937 rng(19);
  for (const FlashKernels* b : others) {
    ASSERT_TRUE(b->int8_on_integers);
    for (std::int64_t H : {40, 48, 64, 96, 128, 192, 256})
      for (std::int64_t n : {1, 17, 64, 333})
        for (int rows : {1, 3, 4, 8, 12, 16}) {
          if (rows > b->decode_max_rows) continue;
          SCOPED_TRACE(std::string(b->name) + " H " + std::to_string(H) + " n " + std::to_string(n) + " rows " +
                       std::to_string(rows));
          const std::int64_t Hp = round_up(H, kHTile), lds = round_up(n, 16) + 16;
          const Rows r = make_rows(DType::i8, n, round_up(n, 16), H, rng);
          const QRows q = make_q(rows, H, Hp, rng);
          const PvCase c{rows, n, round_up(n, 2), H, Hp, round_up(n, 16) + 32, Hp + 32, true};
          const std::vector<std::uint16_t> p = make_p(c, rng);
          std::vector<float> o0(static_cast<std::size_t>(rows * c.ldo), 0.5f), corr = step_corr(rows);
          const std::vector<float> sb = run_qk(*b, q, r, rows, n, H, Hp, 0.125f, lds);
          const std::vector<float> ob = run_pv(*b, c, p, o0, corr, r);
          for (int r0 = 0; r0 < rows; r0 += a.decode_max_rows) {  // the avx2 set on rows [r0, r0 + m)
            const int m = std::min(a.decode_max_rows, rows - r0);
            QRows qa = make_q(m, H, Hp, rng);
            std::memcpy(qa.buf.data(), q.buf.as<std::uint16_t>() + r0 * q.ldq, static_cast<std::size_t>(m * q.ldq) * 2);
            const std::vector<float> sa = run_qk(a, qa, r, m, n, H, Hp, 0.125f, lds);
            ASSERT_TRUE(std::equal(sa.begin(), sa.end(), sb.begin() + r0 * lds)) << "S, rows from " << r0;
            PvCase ca = c;
            ca.rows = m;
            const std::vector<std::uint16_t> pa(p.begin() + r0 * c.ldp, p.begin() + (r0 + m) * c.ldp);
            const std::vector<float> oa0(o0.begin() + r0 * c.ldo, o0.begin() + (r0 + m) * c.ldo);
            const std::vector<float> ca_corr(corr.begin() + r0, corr.begin() + r0 + m);
            const std::vector<float> oa = run_pv(a, ca, pa, oa0, ca_corr, r);
            ASSERT_TRUE(std::equal(oa.begin(), oa.end(), ob.begin() + r0 * c.ldo)) << "O, rows from " << r0;
          }
        }
  }
}
#endif

}  // namespace
}  // namespace flashgqa
