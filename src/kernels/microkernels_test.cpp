// Every kernel set this machine supports against a scalar model of the contract in microkernels.hpp:
// packing + qk_tile, packing + pv_tile, softmax_tile (masked and not, running state, NaN; bounds that
// mask nothing), and the exp and softcap (tanh) error bounds; pv_tile_rows against packing + pv_tile,
// bit for bit. Partial row tiles, H not a multiple of 32, keys not a multiple of 32, all input dtypes.
#include "kernels/microkernels.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "core/dtype.hpp"
#include "core/aligned_buffer.hpp"
#include "kernels/exp_poly.hpp"

namespace flashgqa {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kSentinel = -12345.0f;  // where a kernel must not write


struct KernelCase {
  Isa isa;
  Precision precision;
  const FlashKernels* kern;
};

// Every (path, precision) this machine runs, with kernels_for's set; and on AVX512_BF16 CPUs the
// avx512bf16 set itself too, where kernels_for hands out the fp32 one (bf16_dot_half_rate()).
std::vector<KernelCase> supported_cases() {
  std::vector<KernelCase> out;
  for (Isa isa : supported_isas())
    for (Precision p : {Precision::bf16, Precision::f32}) out.push_back({isa, p, &kernels_for(isa, p)});
#if defined(__x86_64__)
  if (isa_supported(Isa::avx512bf16) && &kernels_for(Isa::avx512bf16, Precision::bf16) != &avx512bf16_kernels())
    out.push_back({Isa::avx512bf16, Precision::bf16, &avx512bf16_kernels()});
#endif
  return out;
}

std::string name(const KernelCase& c) {
  return std::string(isa_name(c.isa)) + "/" + precision_name(c.precision) + " (" + c.kern->name + ")";
}

// Rows of random values stored in `dtype`, row stride ld elements.
struct Rows {
  DType dtype;
  std::int64_t n, H, ld;
  std::vector<std::uint16_t> bits;  // bf16/f16 storage
  std::vector<float> f32;           // f32 storage

  Rows(DType d, std::int64_t rows, std::int64_t h, std::mt19937& rng) : dtype(d), n(rows), H(h), ld(h + 5) {
    std::normal_distribution<float> dist;
    bits.assign(static_cast<std::size_t>(n * ld), 0);
    f32.assign(static_cast<std::size_t>(n * ld), 0.0f);
    for (std::int64_t i = 0; i < n * ld; ++i) {
      const float x = dist(rng);
      f32[static_cast<std::size_t>(i)] = x;
      bits[static_cast<std::size_t>(i)] = d == DType::bf16 ? float_to_bf16_bits(x) : float_to_f16_bits(x);
    }
  }
  const void* row(std::int64_t j) const {
    return dtype == DType::f32 ? static_cast<const void*>(f32.data() + j * ld)
                               : static_cast<const void*>(bits.data() + j * ld);
  }
  // The operand value the kernels must see (rounded to bf16 under Precision::bf16).
  double operand(std::int64_t j, std::int64_t h, Precision p) const {
    const float x = load_element(row(j), dtype, h);
    return p == Precision::bf16 ? round_to_bf16(x) : x;
  }
  PackSource source(std::int64_t Hp, Precision p) const {
    return {row(0), dtype, ld, n, H, Hp, p == Precision::bf16};
  }
};

TEST(Microkernels, QkTileMatchesScalarModel) {
  std::mt19937 rng(1);
  for (const KernelCase& kc : supported_cases()) {
    const FlashKernels& k = *kc.kern;
    const std::int64_t ob = k.operand_bytes;
    for (DType dtype : {DType::f32, DType::bf16, DType::f16})
      for (std::int64_t H : {1, 17, 64, 80, 128})
        for (std::int64_t n : {1, 31, 45}) {
          const std::int64_t Hp = round_up(H, kHTile), npad = round_up(n, kPanelKeys);
          Rows q(dtype, k.mr, H, rng), keys(dtype, n, H, rng);
          AlignedBuffer qp(static_cast<std::size_t>(k.mr * Hp * ob)),
              kp(static_cast<std::size_t>(npad * Hp * ob));
          AlignedBuffer s(static_cast<std::size_t>(k.mr * npad * 4));
          for (int r = 0; r < k.mr; ++r) {
            PackSource src = q.source(Hp, kc.precision);
            src.src = q.row(r);
            k.pack_q_row(qp.as<char>() + r * Hp * ob, src);
          }
          k.pack_k(kp.data(), keys.source(Hp, kc.precision));
          const float scale = 0.375f;
          for (int rows : {1, k.mr / 2, k.mr}) {
            for (std::int64_t c = 0; c < npad; c += kPanelKeys)
              k.qk_tile(
                  {s.as<float>() + c, npad, qp.data(), Hp, kp.as<char>() + c * Hp * ob, Hp, scale, rows});
            for (int r = 0; r < rows; ++r)
              for (std::int64_t j = 0; j < npad; ++j) {
                double dot = 0, mag = 0;
                for (std::int64_t h = 0; j < n && h < H; ++h) {
                  const double prod = q.operand(r, h, kc.precision) * keys.operand(j, h, kc.precision);
                  dot += prod;
                  mag += std::fabs(prod);
                }
                // fp32 accumulation over H terms, then the scale: (H + 2) u32 of the magnitudes.
                const double tol = (static_cast<double>(H) + 2) * 0x1p-24 * scale * mag + 1e-30;
                const double got = s.as<float>()[r * npad + j];
                ASSERT_LE(std::fabs(got - scale * dot), tol)
                    << name(kc) << " " << dtype_name(dtype) << " H " << H << " n " << n << " rows " << rows
                    << " r " << r << " j " << j;
              }
          }
        }
  }
}

TEST(Microkernels, PvTileMatchesScalarModel) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (const KernelCase& kc : supported_cases()) {
    const FlashKernels& k = *kc.kern;
    const std::int64_t ob = k.operand_bytes;
    for (DType dtype : {DType::f32, DType::bf16})
      for (std::int64_t H : {16, 64, 96})
        for (std::int64_t n : {2, 33, 64}) {
          const std::int64_t Hp = round_up(H, kHTile), npad = round_up(n, kPanelKeys);
          Rows v(dtype, n, H, rng);
          AlignedBuffer vp(static_cast<std::size_t>(npad * Hp * ob)),
              p(static_cast<std::size_t>(k.mr * npad * ob));
          AlignedBuffer o(static_cast<std::size_t>(k.mr * Hp * 4));
          k.pack_v(vp.data(), v.source(Hp, kc.precision));
          // P in the operand type: bf16 bits, or fp32 (bf16-rounded under Precision::bf16, like softmax).
          std::vector<double> pval(static_cast<std::size_t>(k.mr * npad), 0.0);
          for (int r = 0; r < k.mr; ++r)
            for (std::int64_t j = 0; j < npad; ++j) {
              const float x = j < n ? round_to_bf16(unit(rng)) : 0.0f;
              pval[static_cast<std::size_t>(r * npad + j)] = x;
              if (ob == 2)
                p.as<std::uint16_t>()[r * npad + j] = float_to_bf16_bits(x);
              else
                p.as<float>()[r * npad + j] = x;
            }
          std::vector<float> o0(static_cast<std::size_t>(k.mr * Hp)), corr(static_cast<std::size_t>(k.mr));
          for (auto& x : o0) x = unit(rng);
          for (auto& x : corr) x = unit(rng);
          for (bool rescale : {false, true}) {
            const int rows = rescale ? k.mr : k.mr - 1;
            std::memcpy(o.data(), o0.data(), o0.size() * sizeof(float));
            const std::int64_t nkeys = round_up(n, 2);
            for (std::int64_t c = 0; c < Hp; c += kHTile)
              k.pv_tile({o.as<float>() + c, Hp, p.data(), npad, vp.as<char>() + c * npad * ob, nkeys,
                         rescale ? corr.data() : nullptr, rows});
            for (int r = 0; r < k.mr; ++r)
              for (std::int64_t h = 0; h < Hp; ++h) {
                const double start = o0[static_cast<std::size_t>(r * Hp + h)] *
                                     (rescale ? corr[static_cast<std::size_t>(r)] : 1.0f);
                double acc = start, mag = std::fabs(start);
                for (std::int64_t j = 0; r < rows && h < H && j < n; ++j) {
                  const double term =
                      pval[static_cast<std::size_t>(r * npad + j)] * v.operand(j, h, kc.precision);
                  acc += term;
                  mag += std::fabs(term);
                }
                if (r >= rows) acc = o0[static_cast<std::size_t>(r * Hp + h)];  // untouched
                const double tol = (static_cast<double>(n) + 3) * 0x1p-24 * mag;
                ASSERT_LE(std::fabs(o.as<float>()[r * Hp + h] - acc), tol)
                    << name(kc) << " H " << H << " n " << n << " r " << r << " h " << h;
              }
          }
        }
  }
}

// Rows of `dtype` whose keys j >= n hold NaN, stored in pieces of kDecodePieceKeys keys: in order, or
// (reversed) key j's piece j / 16 at stored piece (pieces - 1 - j / 16). One piece more than n needs.
struct PieceRows {
  std::int64_t n, pieces;
  Rows rows;
  bool reversed;
  std::vector<const void*> piece_rows;
  PieceRows(DType dtype, std::int64_t keys, std::int64_t H, bool rev, std::mt19937& rng)
      : n(keys), pieces(round_up(keys, kDecodePieceKeys) / kDecodePieceKeys + 1),
        rows(dtype, pieces * kDecodePieceKeys, H, rng), reversed(rev) {
    for (std::int64_t j = n; j < pieces * kDecodePieceKeys; ++j) {
      const std::int64_t at = stored_piece(j / kDecodePieceKeys) * kDecodePieceKeys + j % kDecodePieceKeys;
      for (std::int64_t h = 0; h < rows.ld; ++h) {
        rows.f32[static_cast<std::size_t>(at * rows.ld + h)] = kNaN;
        rows.bits[static_cast<std::size_t>(at * rows.ld + h)] = dtype == DType::bf16 ? 0x7fc0 : 0x7e00;
      }
    }
    for (std::int64_t i = 0; i < pieces; ++i) piece_rows.push_back(rows.row(stored_piece(i) * kDecodePieceKeys));
  }
  std::int64_t stored_piece(std::int64_t i) const { return reversed ? pieces - 1 - i : i; }
  // The n keys: contiguous when not reversed, else through the pieces.
  PackSource source(std::int64_t Hp) const {
    PackSource src = rows.source(Hp, Precision::bf16);
    src.n = n;
    if (reversed) src.src = nullptr, src.pieces = piece_rows.data();
    return src;
  }
};

// pv_tile_rows (where a set has it) against pack_v then pv_tile, bit for bit: V's rows in every dtype,
// contiguous and in pieces (laid out in reverse), H short of Hp and not, keys past v.n never read (NaN
// there), partial row tiles, nkeys short of the keys, with and without the rescale.
TEST(Microkernels, PvTileRowsGivesThePackedBits) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  int sets = 0;
  for (const KernelCase& kc : supported_cases()) {
    const FlashKernels& k = *kc.kern;
    if (k.pv_tile_rows == nullptr || k.operand_bytes != 2) continue;
    ++sets;
    for (DType dtype : {DType::bf16, DType::f16, DType::f32})
      for (std::int64_t H : {40, 64, 128})
        for (std::int64_t n : {1, 16, 33, 77})
          for (bool in_pieces : {false, true}) {
            const std::int64_t Hp = round_up(H, kHTile), npad = round_up(n, kPanelKeys);
            const PieceRows v(dtype, n, H, in_pieces, rng);
            const PackSource src = v.source(Hp);
            AlignedBuffer vp(static_cast<std::size_t>(npad * Hp * 2)), p(static_cast<std::size_t>(k.mr * npad * 2));
            for (std::int64_t i = 0; i < k.mr * npad; ++i)
              p.as<std::uint16_t>()[i] = float_to_bf16_bits(round_to_bf16(unit(rng)));
            k.pack_v(vp.data(), src);
            std::vector<float> o0(static_cast<std::size_t>(k.mr * Hp)), corr(static_cast<std::size_t>(k.mr));
            for (auto& x : o0) x = unit(rng);
            for (auto& x : corr) x = unit(rng);
            AlignedBuffer want(o0.size() * 4), got(o0.size() * 4);
            for (int rows : {1, 5, k.mr})
              for (bool rescale : {false, true})
                for (std::int64_t nkeys : {round_up(n, 2), std::max<std::int64_t>(round_up(n, 2) - 4, 0)}) {
                  std::memcpy(want.data(), o0.data(), o0.size() * 4);
                  std::memcpy(got.data(), o0.data(), o0.size() * 4);
                  const float* c = rescale ? corr.data() : nullptr;
                  for (std::int64_t h = 0; h < Hp; h += kHTile) {
                    k.pv_tile({want.as<float>() + h, Hp, p.data(), npad, vp.as<char>() + h * npad * 2, nkeys, c, rows});
                    k.pv_tile_rows({got.as<float>() + h, Hp, p.data(), npad, src, h, nkeys, c, rows});
                  }
                  ASSERT_EQ(std::memcmp(want.data(), got.data(), o0.size() * 4), 0)
                      << name(kc) << " " << dtype_name(dtype) << " H " << H << " n " << n << " pieces " << in_pieces
                      << " rows " << rows << " rescale " << rescale << " nkeys " << nkeys;
                }
          }
  }
#if defined(__x86_64__)
  if (isa_supported(Isa::avx512bf16)) {
    EXPECT_GT(sets, 0) << "avx512bf16 has pv_tile_rows";
  }
#endif
}

// The tile kernels touch only what the contract names: Q, P and O rows beyond `rows` are not read or
// written (their buffers end at the last row: AddressSanitizer's run checks it), S rows beyond `rows`
// keep their sentinels, and P columns and V keys from nkeys on are not read as values (NaN there).
// Rows 1..mr, nkeys short of the panel.
TEST(Microkernels, TilesTouchOnlyTheirRowsAndKeys) {
  for (const KernelCase& kc : supported_cases()) {
    const FlashKernels& k = *kc.kern;
    const std::int64_t ob = k.operand_bytes, Hp = 64, npad = 64, nkeys = 38, lds = npad + 16;
    const auto put = [ob](void* base, std::int64_t i, float x) {
      if (ob == 2)
        static_cast<std::uint16_t*>(base)[i] = float_to_bf16_bits(x);
      else
        static_cast<float*>(base)[i] = x;
    };
    AlignedBuffer kp(static_cast<std::size_t>(npad * Hp * ob)), vp(static_cast<std::size_t>(npad * Hp * ob));
    for (std::int64_t i = 0; i < npad * Hp; ++i) put(kp.data(), i, 0.25f), put(vp.data(), i, 0.5f);
    // V keys nkeys.. NaN: the bf16 panels hold keys in pairs along words, the fp32 ones one per row.
    for (std::int64_t c = 0; c < Hp / kHTile; ++c)
      for (std::int64_t j = nkeys; j < npad; ++j)
        for (std::int64_t h = 0; h < kHTile; ++h)
          put(vp.data(), c * npad * kHTile + (ob == 2 ? (j / 2) * 2 * kHTile + 2 * h + j % 2 : j * kHTile + h), kNaN);
    for (int rows = 1; rows <= k.mr; ++rows) {
      AlignedBuffer q(static_cast<std::size_t>(rows * Hp * ob)), p(static_cast<std::size_t>(rows * npad * ob));
      for (std::int64_t i = 0; i < rows * Hp; ++i) put(q.data(), i, 1.0f);
      for (std::int64_t i = 0; i < rows * npad; ++i) put(p.data(), i, i % npad < nkeys ? 1.0f : kNaN);
      std::vector<float> s(static_cast<std::size_t>((k.mr + 1) * lds), kSentinel);
      AlignedBuffer sa(s.size() * 4), oa(static_cast<std::size_t>(rows * Hp * 4));  // O: exactly its rows
      std::memcpy(sa.data(), s.data(), s.size() * 4);
      std::fill(oa.as<float>(), oa.as<float>() + rows * Hp, 1.0f);
      for (std::int64_t c = 0; c < npad; c += kPanelKeys)
        k.qk_tile({sa.as<float>() + c, lds, q.data(), Hp, kp.as<char>() + c * Hp * ob, Hp, 2.0f, rows});
      for (std::int64_t c = 0; c < Hp; c += kHTile)
        k.pv_tile({oa.as<float>() + c, Hp, p.data(), npad, vp.as<char>() + c * npad * ob, nkeys, nullptr, rows});
      for (int r = 0; r <= k.mr; ++r)
        for (std::int64_t j = 0; j < lds; ++j) {
          const float want = r < rows && j < npad ? 2.0f * 0.25f * static_cast<float>(Hp) : kSentinel;
          ASSERT_EQ(sa.as<float>()[r * lds + j], want) << name(kc) << " S rows " << rows << " r " << r << " j " << j;
        }
      for (int r = 0; r < rows; ++r)
        for (std::int64_t h = 0; h < Hp; ++h) {
          const float want = 1.0f + 0.5f * static_cast<float>(nkeys);
          ASSERT_EQ(oa.as<float>()[r * Hp + h], want) << name(kc) << " O rows " << rows << " r " << r << " h " << h;
        }
    }
  }
}

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

TEST(Microkernels, PackingRoundsLikeTheReference) {
  // Values that round differently under truncation, ties to even, subnormals, NaN: the packed K
  // operand (through qk with a one-hot Q) must equal round_to_bf16 of the input exactly.
  const float inputs[] = {1.00390625f, 1.01171875f, -3.0e-39f,  1.0e-40f,
                          65504.0f,    3.4e38f,     1.2345678f, -0.0f};
  for (const KernelCase& kc : supported_cases()) {
    if (kc.precision != Precision::bf16) continue;
    const FlashKernels& k = *kc.kern;
    const std::int64_t ob = k.operand_bytes, H = 32, Hp = 32, n = 8;
    std::vector<float> src(static_cast<std::size_t>(n * H), 0.0f);
    for (std::int64_t j = 0; j < n; ++j) src[static_cast<std::size_t>(j * H + 3)] = inputs[j];
    AlignedBuffer kp(static_cast<std::size_t>(kPanelKeys * Hp * ob)), qp(static_cast<std::size_t>(Hp * ob));
    AlignedBuffer s(static_cast<std::size_t>(kPanelKeys * 4));
    k.pack_k(kp.data(), {src.data(), DType::f32, H, n, H, Hp, true});
    std::vector<float> one_hot(static_cast<std::size_t>(H), 0.0f);
    one_hot[3] = 1.0f;
    k.pack_q_row(qp.data(), {one_hot.data(), DType::f32, 0, 0, H, Hp, true});
    k.qk_tile({s.as<float>(), kPanelKeys, qp.data(), Hp, kp.data(), Hp, 1.0f, 1});
    for (std::int64_t j = 0; j < n; ++j) {
      const float want = round_to_bf16(inputs[j]);
      const float got = s.as<float>()[j];
      // vdpbf16ps treats subnormal inputs as zero: allowed (below 2^-126 in absolute value).
      if (std::fabs(want) < 0x1p-126f)
        EXPECT_LE(std::fabs(got), 0x1p-126f) << name(kc) << " j " << j;
      else
        EXPECT_EQ(got, want) << name(kc) << " j " << j;
    }
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
