// What the decode kernel tests share (decode_kernels_test.cpp: against a scalar model;
// decode_kernels_bits_test.cpp: the bits of one form against another): the sets to test, K/V rows of
// every dtype with their operands, Q rows as pack_q_row writes them, P and O, one kernel call each, and
// one P.V output row against the exact sum within its bound.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/dtype.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa::decode_testing {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr std::uint16_t kNaNBits = 0x7fc0;  // a bf16 quiet NaN
constexpr float kSentinel = -12345.0f;       // in S and O where the kernels must not write
// 40, 57, 100: a partial chunk (of 8 values, an odd 9, and 4; avx2's fast paths read it masked); 48 and
// 80: whole 16-value chunks but Hp = 64 and 96 (avx2's last chunk past the row; its fast paths on 3
// and 5 chunks, a count at run time); 64, 96, 128, 256: the fast paths (96: three 32-column chunks, also
// on the amx tiles); 288: Hp past the FMA kernels' split Q rows and the amx tiles.
constexpr int kHs[] = {40, 48, 57, 64, 80, 96, 100, 128, 256, 288};
constexpr DType kFloatDTypes[] = {DType::f32, DType::bf16, DType::f16};

// Every set with decode kernels this machine runs: the paths' own (decode_kernels_for), and on
// AVX512_BF16 CPUs both of that path's kernel pairs (vdpbf16ps and fp32 FMAs), whichever kernels_for
// hands out here.
inline std::vector<const FlashKernels*> decode_sets() {
  std::vector<const FlashKernels*> out;
  const auto add = [&out](const FlashKernels& k) {
    if (k.decode_qk_rows && k.decode_pv_rows && std::find(out.begin(), out.end(), &k) == out.end()) out.push_back(&k);
  };
  for (Isa isa : supported_isas()) add(decode_kernels_for(isa, Precision::bf16));
#if defined(__x86_64__)
  if (isa_supported(Isa::avx512bf16)) add(avx512bf16_kernels()), add(avx512bf16_fma_decode_kernels());
#endif
  return out;
}

// n rows of `dtype`, ld elements apart, with the operand (bf16-rounded value) of every element h < H;
// elements h >= H of each row and the rows past n (up to `rows_alloc`) are NaN (never read).
struct Rows {
  std::vector<unsigned char> bytes;
  std::vector<float> operand;  // [n][H]
  std::vector<float> scale;    // int8: key j's scale at j * ld_scale
  std::int64_t ld = 0;
  // int8: 1 where n is even (the scales together, as quantize_kv lays them out), 3 where it is odd (a
  // strided view): the kernels' loads of several keys' scales at once and their strided reads.
  std::int64_t ld_scale = 3;
  DType dtype = DType::f32;

  const void* data() const { return bytes.data(); }
  const float* scales() const { return dtype == DType::i8 ? scale.data() : nullptr; }
};

inline Rows make_rows(DType dtype, std::int64_t n, std::int64_t rows_alloc, std::int64_t H, std::mt19937& rng) {
  Rows r;
  r.dtype = dtype;
  r.ld = H + 24;
  r.ld_scale = n % 2 == 0 ? 1 : 3;
  const std::size_t esize = dtype_size(dtype);
  r.bytes.resize(static_cast<std::size_t>(rows_alloc * r.ld) * esize);
  r.operand.resize(static_cast<std::size_t>(n * H));
  r.scale.assign(static_cast<std::size_t>(rows_alloc * r.ld_scale), kNaN);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f), sc(0.001f, 0.05f);
  std::uniform_int_distribution<int> q8(-127, 127);
  std::vector<float> row(static_cast<std::size_t>(r.ld));
  for (std::int64_t j = 0; j < rows_alloc; ++j) {
    void* dst = r.bytes.data() + static_cast<std::size_t>(j * r.ld) * esize;
    if (dtype == DType::i8) {  // NaN has no int8 form: the rows past n get extreme values instead
      auto* d = static_cast<std::int8_t*>(dst);
      const float s = sc(rng);
      if (j < n) r.scale[static_cast<std::size_t>(j * r.ld_scale)] = s;
      for (std::int64_t h = 0; h < r.ld; ++h) {
        d[h] = static_cast<std::int8_t>(j < n && h < H ? q8(rng) : -128);
        if (j < n && h < H) r.operand[static_cast<std::size_t>(j * H + h)] = round_to_bf16(static_cast<float>(d[h]) * s);
      }
      continue;
    }
    for (std::int64_t h = 0; h < r.ld; ++h) row[static_cast<std::size_t>(h)] = j < n && h < H ? val(rng) : kNaN;
    store_row(dst, dtype, row.data(), r.ld);
    for (std::int64_t h = 0; j < n && h < H; ++h)
      r.operand[static_cast<std::size_t>(j * H + h)] = round_to_bf16(load_element(dst, dtype, h));
  }
  return r;
}

// The same operands as f32 rows (the bits every dtype must give).
inline Rows as_f32(const Rows& src, std::int64_t n, std::int64_t rows_alloc, std::int64_t H) {
  Rows r;
  r.dtype = DType::f32;
  r.ld = src.ld;
  r.bytes.resize(static_cast<std::size_t>(rows_alloc * r.ld) * 4);
  r.operand = src.operand;
  std::vector<float> row(static_cast<std::size_t>(r.ld), kNaN);
  for (std::int64_t j = 0; j < rows_alloc; ++j) {
    for (std::int64_t h = 0; h < H; ++h) row[static_cast<std::size_t>(h)] = j < n ? src.operand[static_cast<std::size_t>(j * H + h)] : kNaN;
    std::memcpy(r.bytes.data() + static_cast<std::size_t>(j * r.ld) * 4, row.data(), row.size() * 4);
  }
  return r;
}

// The value an int8 row stands for, exactly: x_j[h] s_j.
inline double exact_int8(const Rows& r, std::int64_t j, std::int64_t h) {
  const auto x = static_cast<const std::int8_t*>(r.data())[j * r.ld + h];
  return static_cast<double>(x) * r.scale[static_cast<std::size_t>(j * r.ld_scale)];
}

// Q rows as pack_q_row writes them: bf16, zero past H; ldq = Hp + 32.
struct QRows {
  AlignedBuffer buf;
  std::vector<float> value;  // [rows][H]
  std::int64_t ldq = 0;
};

inline QRows make_q(int rows, std::int64_t H, std::int64_t Hp, std::mt19937& rng) {
  QRows q;
  q.ldq = Hp + 32;
  q.buf.reset(static_cast<std::size_t>(rows * q.ldq) * 2);
  q.value.resize(static_cast<std::size_t>(rows * H));
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  auto* bits = q.buf.as<std::uint16_t>();
  for (int r = 0; r < rows; ++r)
    for (std::int64_t h = 0; h < q.ldq; ++h) {
      const float x = h < H ? round_to_bf16(val(rng)) : 0.0f;
      bits[r * q.ldq + h] = h < Hp ? float_to_bf16_bits(x) : kNaNBits;
      if (h < H) q.value[static_cast<std::size_t>(r * H + h)] = x;
    }
  return q;
}

// With pieces (DecodeQk::k_pieces): kr's rows read from them, its own bytes not at all.
inline std::vector<float> run_qk(const FlashKernels& k, const QRows& q, const Rows& kr, int rows, std::int64_t n,
                          std::int64_t H, std::int64_t Hp, float scale, std::int64_t lds,
                          const void* const* pieces = nullptr) {
  AlignedBuffer s(static_cast<std::size_t>(rows * lds) * 4);
  std::fill(s.as<float>(), s.as<float>() + rows * lds, kSentinel);
  DecodeQk t{s.as<float>(), lds, q.buf.as<std::uint16_t>(), q.ldq, pieces ? nullptr : kr.data(), kr.dtype, kr.ld, n, H,
             Hp, scale, rows, kr.scales(), kr.ld_scale, pieces};
  k.decode_qk_rows(t);
  return std::vector<float>(s.as<float>(), s.as<float>() + rows * lds);
}

struct PvCase {
  int rows;
  std::int64_t n, nkeys, H, Hp, ldp, ldo;
  bool corr;
};

// P weights in [0, 1] as bf16 bits, NaN from nkeys on (never read).
inline std::vector<std::uint16_t> make_p(const PvCase& c, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(0.0f, 1.0f);
  std::vector<std::uint16_t> p(static_cast<std::size_t>(c.rows * c.ldp), kNaNBits);
  for (int r = 0; r < c.rows; ++r)
    for (std::int64_t j = 0; j < c.nkeys; ++j) p[static_cast<std::size_t>(r * c.ldp + j)] = float_to_bf16_bits(val(rng));
  return p;
}

// O's starting rows: values in [-1, 1] in the first Hp columns, kSentinel past them.
inline std::vector<float> make_o0(const PvCase& c, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  std::vector<float> o0(static_cast<std::size_t>(c.rows * c.ldo), kSentinel);
  for (int r = 0; r < c.rows; ++r)
    for (std::int64_t h = 0; h < c.Hp; ++h) o0[static_cast<std::size_t>(r * c.ldo + h)] = val(rng);
  return o0;
}

// Rescale factors 0.5, 0.75, 1, 0.5, ... for the rows.
inline std::vector<float> step_corr(int rows) {
  std::vector<float> corr(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) corr[static_cast<std::size_t>(r)] = 0.5f + 0.25f * static_cast<float>(r % 3);
  return corr;
}

// O after one decode_pv_rows call from o0 (with DecodePv's pieces and hints as given).
inline std::vector<float> run_pv(const FlashKernels& k, const PvCase& c, const std::vector<std::uint16_t>& p,
                          const std::vector<float>& o0, const std::vector<float>& corr, const Rows& vr,
                          const void* const* pieces = nullptr, bool keep_v = false, bool same_v = false) {
  AlignedBuffer o(static_cast<std::size_t>(c.rows * c.ldo) * 4);
  AlignedBuffer pb(p.size() * 2);
  std::copy(o0.begin(), o0.end(), o.as<float>());
  std::copy(p.begin(), p.end(), pb.as<std::uint16_t>());
  DecodePv t{o.as<float>(), c.ldo,        pb.as<std::uint16_t>(), c.ldp,       pieces ? nullptr : vr.data(),
             vr.dtype,       vr.ld,        c.n,                    c.nkeys,     c.H,
             c.Hp,           c.corr ? corr.data() : nullptr,       c.rows,      vr.scales(),
             vr.ld_scale,    pieces,         keep_v,                               same_v};
  k.decode_pv_rows(t);
  return std::vector<float>(o.as<float>(), o.as<float>() + c.rows * c.ldo);
}

// Row r of decode_pv_rows' output o (from o0, corr, weights p) against the exact sum, within the fp32
// bound, and the integers form's (int8 on a set that says so: against the exact products, with each
// group of 16 keys' int16 weights, |q_j W / 32767 - w_j| <= W (2^-16 + 2^-22), W = max_j |P_j s_j| in
// the group); the columns past Hp untouched.
inline void expect_pv_row(const FlashKernels& k, const PvCase& c, const std::vector<std::uint16_t>& p,
                   const std::vector<float>& o0, const std::vector<float>& corr, const Rows& vr,
                   const std::vector<float>& o, int r) {
  const std::int64_t read = c.nkeys < c.n ? c.nkeys : c.n;  // keys past n count as zero rows
  const bool integers = vr.dtype == DType::i8 && k.int8_on_integers;
  const auto P = [&](std::int64_t j) {
    return static_cast<double>(bf16_bits_to_float(p[static_cast<std::size_t>(r * c.ldp + j)]));
  };
  std::vector<double> W((static_cast<std::size_t>(read) + 15) / 16, 0.0);
  for (std::int64_t j = 0; j < read && integers; ++j)
    W[static_cast<std::size_t>(j / 16)] = std::max(W[static_cast<std::size_t>(j / 16)],
                                                   std::fabs(P(j) * vr.scale[static_cast<std::size_t>(j * vr.ld_scale)]));
  for (std::int64_t h = 0; h < c.Hp; ++h) {
    const double start = static_cast<double>(o0[static_cast<std::size_t>(r * c.ldo + h)]) *
                         (c.corr ? corr[static_cast<std::size_t>(r)] : 1.0f);
    double exact = start, mag = std::fabs(start), quant = 0.0;
    for (std::int64_t j = 0; j < read && h < c.H; ++j) {
      const double v = integers ? exact_int8(vr, j, h) : vr.operand[static_cast<std::size_t>(j * c.H + h)];
      const double x = P(j) * v;
      exact += x;
      mag += std::fabs(x);
      if (integers)
        quant += W[static_cast<std::size_t>(j / 16)] * (0x1p-16 + 0x1p-22) *
                 std::fabs(static_cast<double>(static_cast<const std::int8_t*>(vr.data())[j * vr.ld + h]));
    }
    const double bound = (static_cast<double>(c.nkeys) + 4) * 0x1p-23 * mag + (c.nkeys + 1) * 0x1p-120 + quant;
    ASSERT_NEAR(o[static_cast<std::size_t>(r * c.ldo + h)], exact, bound) << "r " << r << " h " << h;
  }
  for (std::int64_t h = c.Hp; h < c.ldo; ++h) ASSERT_EQ(o[static_cast<std::size_t>(r * c.ldo + h)], kSentinel) << "h " << h;
}

// The rows' kDecodePieceKeys-key pieces (bf16 or int8), each copied to its own place in `store` (in
// shuffled order, apart; rows past `rows_alloc` NaN, or for int8 127s), and where each is.
inline std::vector<const void*> scatter_pieces(const Rows& r, std::int64_t rows_alloc, AlignedBuffer& store,
                                        std::mt19937& rng) {
  const std::int64_t count = (rows_alloc + kDecodePieceKeys - 1) / kDecodePieceKeys;
  const std::int64_t row_bytes = r.ld * static_cast<std::int64_t>(dtype_size(r.dtype));
  const std::int64_t slot = (kDecodePieceKeys + 1) * row_bytes;  // a piece and a filler row between pieces
  std::vector<std::int64_t> order(static_cast<std::size_t>(count + 2));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  store.reset(static_cast<std::size_t>((count + 2) * slot));
  if (r.dtype == DType::i8) std::memset(store.data(), 127, store.bytes());
  else std::fill_n(store.as<std::uint16_t>(), store.bytes() / 2, kNaNBits);
  std::vector<const void*> pieces;
  const auto* rows = static_cast<const char*>(r.data());
  for (std::int64_t i = 0; i < count; ++i) {
    char* at = store.as<char>() + order[static_cast<std::size_t>(i)] * slot;
    const std::int64_t keys = std::min<std::int64_t>(kDecodePieceKeys, rows_alloc - i * kDecodePieceKeys);
    std::memcpy(at, rows + i * kDecodePieceKeys * row_bytes, static_cast<std::size_t>(keys * row_bytes));
    pieces.push_back(at);
  }
  return pieces;
}

}  // namespace flashgqa::decode_testing
