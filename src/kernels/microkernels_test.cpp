// Every kernel set this machine supports against a scalar model of the contract in microkernels.hpp:
// packing + qk_tile, packing + pv_tile; pv_tile_rows against packing + pv_tile, bit for bit; the tiles
// touching only their rows and keys; packing's rounding, and bf16 rows packed as the f32 rows holding
// their values. Partial row tiles, H not a multiple of 32, keys not a multiple of 32, all input
// dtypes. (The softmax and the elementwise kernels: softmax_kernels_test.cpp.)
#include "kernels/microkernels.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "core/aligned_buffer.hpp"
#include "kernels/kernel_cases_testing.hpp"

namespace flashgqa {
namespace {

using kernel_testing::kNaN;
using kernel_testing::KernelCase;
using kernel_testing::name;
using kernel_testing::supported_cases;

constexpr float kSentinel = -12345.0f;  // where a kernel must not write

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

// Packing bf16 rows gives the bits of packing f32 rows that hold the same values, quiet NaNs with a
// payload included: pack_k and pack_v of every set, H short of a multiple of 32 and not, keys short
// of a panel, rows ld apart (odd strides). (The avx512f set packs bf16 K as words, transposed before
// they are widened, and takes its general loop for 32 h that hold a NaN. Signaling NaNs are left
// out: the avx512bf16 set keeps bf16 words as they are, and quiets f32 NaNs as it rounds them.)
TEST(Microkernels, PackingBf16RowsGivesTheBitsOfTheirValues) {
  std::mt19937 rng(31);
  for (const KernelCase& kc : supported_cases()) {
    const FlashKernels& k = *kc.kern;
    const std::int64_t ob = k.operand_bytes;
    for (std::int64_t H : {17, 40, 64, 128, 288})
      for (std::int64_t n : {1, 15, 16, 33, 77})
        for (bool nans : {false, true}) {
          const std::int64_t Hp = round_up(H, kHTile), npad = round_up(n, kPanelKeys);
          Rows b(DType::bf16, n, H, rng), f(DType::f32, n, H, rng);
          if (nans) {  // quiet NaNs, one with a payload, in some rows
            b.bits[static_cast<std::size_t>((n / 2) * b.ld + H / 3)] = 0x7fc0;
            b.bits[static_cast<std::size_t>((n - 1) * b.ld + H - 1)] = 0xffc5;
          }
          for (std::size_t i = 0; i < b.bits.size(); ++i) f.f32[i] = bf16_bits_to_float(b.bits[i]);
          for (const bool is_k : {true, false}) {
            const std::size_t bytes = static_cast<std::size_t>(npad * Hp * ob);
            AlignedBuffer from_b(bytes), from_f(bytes);
            std::memset(from_b.data(), 0x5a, bytes);
            std::memset(from_f.data(), 0x5a, bytes);
            (is_k ? k.pack_k : k.pack_v)(from_b.data(), b.source(Hp, kc.precision));
            (is_k ? k.pack_k : k.pack_v)(from_f.data(), f.source(Hp, kc.precision));
            ASSERT_EQ(std::memcmp(from_b.data(), from_f.data(), bytes), 0)
                << name(kc) << (is_k ? " pack_k" : " pack_v") << " H " << H << " n " << n << " NaNs " << nans;
          }
        }
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

}  // namespace
}  // namespace flashgqa
