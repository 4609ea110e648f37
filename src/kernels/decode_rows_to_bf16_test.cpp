// FlashKernels::decode_rows_to_bf16 and decode_int8_rows_to_bf16 (contract in microkernels.hpp) of every
// set this machine runs that has them: f16 and f32 rows become exactly round_to_bf16's words (nearest
// even, NaN kept a quiet NaN), int8 rows the bf16 words of x * scale in fp32 (nearest even, subnormal
// products kept; scales of every size, zero among them); zero in [H, ldd), for H = 40..288 and ldd a
// multiple of 16 that is not one of 32 (a half chunk at the end). Float values at every edge: ties, NaN, infinities, zeros of both signs, subnormals, and the largest
// finite values (which round to infinity). Nothing past the n rows is written. That the decode path's
// results on the converted rows are those on the rows themselves: kvcache_test.cpp's
// FloatCachesGiveTheBitsOfTheirBf16Operands.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/dtype.hpp"
#include "core/int_math.hpp"
#include "flashgqa/flashgqa.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace {

constexpr std::uint16_t kSentinel = 0xdead;

// Values at the edges of bf16 rounding, then random ones of every magnitude.
std::vector<float> edge_values(std::mt19937& rng, std::size_t count) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                          std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffc12345u),  // NaNs
                          std::bit_cast<float>(0x3f808000u), std::bit_cast<float>(0x3f818000u),  // ties: down, up
                          std::bit_cast<float>(0x3f807fffu), std::bit_cast<float>(0x3f808001u),
                          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), std::bit_cast<float>(0x807fffffu),
                          65504.0f, 6.1e-5f, 5.96e-8f};
  std::uniform_int_distribution<std::uint32_t> bits;
  while (v.size() < count) v.push_back(std::bit_cast<float>(bits(rng)));
  return v;
}

// The decode sets of this machine's paths whose `field` (a converter) is set.
template <typename Field>
std::vector<const FlashKernels*> sets_with(Field FlashKernels::*field) {
  std::vector<const FlashKernels*> sets;
  for (Isa isa : supported_isas()) {
    const FlashKernels& k = decode_kernels_for(isa, Precision::bf16);
    if (k.*field != nullptr) sets.push_back(&k);
  }
  return sets;
}

TEST(DecodeKernels, RowsToBf16GiveRoundToBf16Words) {
  const std::vector<const FlashKernels*> sets = sets_with(&FlashKernels::decode_rows_to_bf16);
  if (sets.empty()) GTEST_SKIP() << "no kernel set here converts rows";
  std::mt19937 rng(31);
  int checked = 0;
  for (const FlashKernels* k : sets)
    for (DType dtype : {DType::f32, DType::f16})
      for (std::int64_t H : {40, 48, 128, 256, 288})
        for (std::int64_t extra : {0, 16}) {
          const std::int64_t ldd = round_up(H, 16) + extra, ld = H + 7, n = 1 + static_cast<std::int64_t>(rng() % 37);
          SCOPED_TRACE(std::string(k->name) + " " + dtype_name(dtype) + " H " + std::to_string(H) + " ldd " +
                       std::to_string(ldd) + " n " + std::to_string(n));
          const std::vector<float> values = edge_values(rng, static_cast<std::size_t>(n * ld));
          std::vector<unsigned char> src(static_cast<std::size_t>(n * ld) * dtype_size(dtype));
          for (std::int64_t j = 0; j < n; ++j)
            store_row(src.data() + static_cast<std::size_t>(j * ld) * dtype_size(dtype), dtype, values.data() + j * ld, ld);
          if (dtype == DType::f16)  // f16 NaNs with payloads, signalling ones too (store_row writes one NaN)
            for (std::int64_t j = 0; j < n; ++j) {
              const std::uint16_t nans[] = {0x7c01u, 0x7d55u, 0xfe01u, 0x7fffu, 0xfc3au};
              reinterpret_cast<std::uint16_t*>(src.data())[j * ld + (j * 7) % H] = nans[j % 5];
            }
          AlignedBuffer dst(static_cast<std::size_t>((n + 1) * ldd) * 2);
          std::fill_n(dst.as<std::uint16_t>(), (n + 1) * ldd, kSentinel);
          k->decode_rows_to_bf16(dst.as<std::uint16_t>(), ldd, src.data(), dtype, ld, n, H);
          for (std::int64_t j = 0; j < n; ++j)
            for (std::int64_t h = 0; h < ldd; ++h) {
              const float x =
                  h < H ? load_element(src.data() + static_cast<std::size_t>(j * ld) * dtype_size(dtype), dtype, h) : 0.0f;
              const std::uint16_t want = h < H ? float_to_bf16_bits(x) : 0;
              ASSERT_EQ(dst.as<std::uint16_t>()[j * ldd + h], want) << "row " << j << " column " << h << ": " << x;
            }
          for (std::int64_t h = 0; h < ldd; ++h) ASSERT_EQ(dst.as<std::uint16_t>()[n * ldd + h], kSentinel) << "past n";
          ++checked;
        }
  EXPECT_EQ(checked, static_cast<int>(sets.size()) * 20);
}

TEST(DecodeKernels, Int8RowsToBf16GiveTheirProductsWords) {
  const std::vector<const FlashKernels*> sets = sets_with(&FlashKernels::decode_int8_rows_to_bf16);
  if (sets.empty()) GTEST_SKIP() << "no kernel set here converts int8 rows";
  std::mt19937 rng(37);
  std::uniform_int_distribution<int> q8(-128, 127);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-140, 100);
  int checked = 0;
  for (const FlashKernels* k : sets)
    for (std::int64_t H : {40, 48, 64, 128, 256, 288})
      for (std::int64_t extra : {0, 16}) {
        const std::int64_t ldd = round_up(H, 16) + extra, ld = H + 5, n = 1 + static_cast<std::int64_t>(rng() % 37);
        const std::int64_t ld_scale = 3;
        SCOPED_TRACE(std::string(k->name) + " H " + std::to_string(H) + " ldd " + std::to_string(ldd) + " n " +
                     std::to_string(n));
        std::vector<std::int8_t> src(static_cast<std::size_t>(n * ld));
        for (auto& x : src) x = static_cast<std::int8_t>(q8(rng));
        std::vector<float> scale(static_cast<std::size_t>(n * ld_scale), std::numeric_limits<float>::quiet_NaN());
        // 0, subnormal products, everything up to 2^100, negative scales, and an infinity or a NaN (a
        // scale no quantize_kv writes: the words are still the products' own).
        for (std::int64_t j = 0; j < n; ++j) {
          float s = j % 7 == 3 ? 0.0f : std::ldexp(mant(rng), expo(rng));
          if (j % 5 == 4) s = -s;
          if (j % 11 == 6) s = std::numeric_limits<float>::infinity();
          if (j % 13 == 9) s = std::numeric_limits<float>::quiet_NaN();
          scale[static_cast<std::size_t>(j * ld_scale)] = s;
        }
        AlignedBuffer dst(static_cast<std::size_t>((n + 1) * ldd) * 2);
        std::fill_n(dst.as<std::uint16_t>(), (n + 1) * ldd, kSentinel);
        k->decode_int8_rows_to_bf16(dst.as<std::uint16_t>(), ldd, src.data(), ld, scale.data(), ld_scale, n, H);
        for (std::int64_t j = 0; j < n; ++j)
          for (std::int64_t h = 0; h < ldd; ++h) {
            const float x = h < H ? static_cast<float>(src[static_cast<std::size_t>(j * ld + h)]) *
                                        scale[static_cast<std::size_t>(j * ld_scale)]
                                  : 0.0f;
            const std::uint16_t want = h < H ? float_to_bf16_bits(x) : 0;
            ASSERT_EQ(dst.as<std::uint16_t>()[j * ldd + h], want) << "row " << j << " column " << h << ": " << x;
          }
        for (std::int64_t h = 0; h < ldd; ++h) ASSERT_EQ(dst.as<std::uint16_t>()[n * ldd + h], kSentinel) << "past n";
        ++checked;
      }
  EXPECT_EQ(checked, static_cast<int>(sets.size()) * 12);
}

}  // namespace
}  // namespace flashgqa
