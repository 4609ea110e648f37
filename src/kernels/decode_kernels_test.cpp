// The decode kernels (decode_qk_rows, decode_pv_rows; contract in microkernels.hpp) of every kernel set
// this machine runs that has them, against a scalar model in double of the bf16-rounded operands:
// rows 1..8, n = 1..70 (partial key groups and pairs), H = 40 (a partial chunk, Hp > H) to 288 (kHs),
// K/V rows in f32, bf16, f16 and int8 with random per-key scales, strided rows, corr null and not. Also: nothing past the contract is read (NaN there) or written (sentinels), S is
// exactly 0 from n to round_up(n, 16), and the results depend only on the operand values (a bf16 or an
// int8 row gives the bits of the f32 row holding its operands).
//
// Bound (fp32 accumulation, summation orders differ between sets): each logit or output element is
// within (d + 4) 2^-23 sum |terms| of the exact sum, d the number of summands (H products, or the keys
// plus the rescaled O), plus 2^-120 per summand for the subnormals BFDOT / vdpbf16ps flush to zero.
// 2^-23 per step (not 2^-24) covers BFDOT's round-to-odd intermediate; the scale and corr
// multiplications are one more rounding each, in the 4.
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

namespace flashgqa {
namespace {

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
std::vector<const FlashKernels*> decode_sets() {
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
  std::vector<float> scale;    // int8: key j's scale at j * kLdScale
  std::int64_t ld = 0;
  DType dtype = DType::f32;
  static constexpr std::int64_t kLdScale = 3;

  const void* data() const { return bytes.data(); }
  const float* scales() const { return dtype == DType::i8 ? scale.data() : nullptr; }
};

Rows make_rows(DType dtype, std::int64_t n, std::int64_t rows_alloc, std::int64_t H, std::mt19937& rng) {
  Rows r;
  r.dtype = dtype;
  r.ld = H + 24;
  const std::size_t esize = dtype_size(dtype);
  r.bytes.resize(static_cast<std::size_t>(rows_alloc * r.ld) * esize);
  r.operand.resize(static_cast<std::size_t>(n * H));
  r.scale.assign(static_cast<std::size_t>(rows_alloc * Rows::kLdScale), kNaN);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f), sc(0.001f, 0.05f);
  std::uniform_int_distribution<int> q8(-127, 127);
  std::vector<float> row(static_cast<std::size_t>(r.ld));
  for (std::int64_t j = 0; j < rows_alloc; ++j) {
    void* dst = r.bytes.data() + static_cast<std::size_t>(j * r.ld) * esize;
    if (dtype == DType::i8) {  // NaN has no int8 form: the rows past n get extreme values instead
      auto* d = static_cast<std::int8_t*>(dst);
      const float s = sc(rng);
      if (j < n) r.scale[static_cast<std::size_t>(j * Rows::kLdScale)] = s;
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
Rows as_f32(const Rows& src, std::int64_t n, std::int64_t rows_alloc, std::int64_t H) {
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
double exact_int8(const Rows& r, std::int64_t j, std::int64_t h) {
  const auto x = static_cast<const std::int8_t*>(r.data())[j * r.ld + h];
  return static_cast<double>(x) * r.scale[static_cast<std::size_t>(j * Rows::kLdScale)];
}

// Q rows as pack_q_row writes them: bf16, zero past H; ldq = Hp + 32.
struct QRows {
  AlignedBuffer buf;
  std::vector<float> value;  // [rows][H]
  std::int64_t ldq = 0;
};

QRows make_q(int rows, std::int64_t H, std::int64_t Hp, std::mt19937& rng) {
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
std::vector<float> run_qk(const FlashKernels& k, const QRows& q, const Rows& kr, int rows, std::int64_t n,
                          std::int64_t H, std::int64_t Hp, float scale, std::int64_t lds,
                          const void* const* pieces = nullptr) {
  AlignedBuffer s(static_cast<std::size_t>(rows * lds) * 4);
  std::fill(s.as<float>(), s.as<float>() + rows * lds, kSentinel);
  DecodeQk t{s.as<float>(), lds, q.buf.as<std::uint16_t>(), q.ldq, pieces ? nullptr : kr.data(), kr.dtype, kr.ld, n, H,
             Hp, scale, rows, kr.scales(), Rows::kLdScale, pieces};
  k.decode_qk_rows(t);
  return std::vector<float>(s.as<float>(), s.as<float>() + rows * lds);
}

// decode_qk_rows against the model for one set, dtype and H, every rows and n.
void check_qk(const FlashKernels& k, DType dtype, std::int64_t H, std::mt19937& rng) {
  const std::int64_t Hp = round_up(H, kHTile);
  const float scale = 1.0f / std::sqrt(static_cast<float>(H));
  for (std::int64_t n = 1; n <= 70; ++n) {
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

struct PvCase {
  int rows;
  std::int64_t n, nkeys, H, Hp, ldp, ldo;
  bool corr;
};

// P weights in [0, 1] as bf16 bits, NaN from nkeys on (never read).
std::vector<std::uint16_t> make_p(const PvCase& c, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(0.0f, 1.0f);
  std::vector<std::uint16_t> p(static_cast<std::size_t>(c.rows * c.ldp), kNaNBits);
  for (int r = 0; r < c.rows; ++r)
    for (std::int64_t j = 0; j < c.nkeys; ++j) p[static_cast<std::size_t>(r * c.ldp + j)] = float_to_bf16_bits(val(rng));
  return p;
}

// O's starting rows: values in [-1, 1] in the first Hp columns, kSentinel past them.
std::vector<float> make_o0(const PvCase& c, std::mt19937& rng) {
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  std::vector<float> o0(static_cast<std::size_t>(c.rows * c.ldo), kSentinel);
  for (int r = 0; r < c.rows; ++r)
    for (std::int64_t h = 0; h < c.Hp; ++h) o0[static_cast<std::size_t>(r * c.ldo + h)] = val(rng);
  return o0;
}

// Rescale factors 0.5, 0.75, 1, 0.5, ... for the rows.
std::vector<float> step_corr(int rows) {
  std::vector<float> corr(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) corr[static_cast<std::size_t>(r)] = 0.5f + 0.25f * static_cast<float>(r % 3);
  return corr;
}

// O after one decode_pv_rows call from o0 (with DecodePv's pieces and hints as given).
std::vector<float> run_pv(const FlashKernels& k, const PvCase& c, const std::vector<std::uint16_t>& p,
                          const std::vector<float>& o0, const std::vector<float>& corr, const Rows& vr,
                          const void* const* pieces = nullptr, bool keep_v = false, bool same_v = false) {
  AlignedBuffer o(static_cast<std::size_t>(c.rows * c.ldo) * 4);
  AlignedBuffer pb(p.size() * 2);
  std::copy(o0.begin(), o0.end(), o.as<float>());
  std::copy(p.begin(), p.end(), pb.as<std::uint16_t>());
  DecodePv t{o.as<float>(), c.ldo,        pb.as<std::uint16_t>(), c.ldp,       pieces ? nullptr : vr.data(),
             vr.dtype,       vr.ld,        c.n,                    c.nkeys,     c.H,
             c.Hp,           c.corr ? corr.data() : nullptr,       c.rows,      vr.scales(),
             Rows::kLdScale, pieces,         keep_v,                               same_v};
  k.decode_pv_rows(t);
  return std::vector<float>(o.as<float>(), o.as<float>() + c.rows * c.ldo);
}

// Row r of decode_pv_rows' output o (from o0, corr, weights p) against the exact sum, within the fp32
// bound, and the integers form's (int8 on a set that says so: against the exact products, with each
// group of 16 keys' int16 weights, |q_j W / 32767 - w_j| <= W (2^-16 + 2^-22), W = max_j |P_j s_j| in
// the group); the columns past Hp untouched.
void expect_pv_row(const FlashKernels& k, const PvCase& c, const std::vector<std::uint16_t>& p,
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
                                                   std::fabs(P(j) * vr.scale[static_cast<std::size_t>(j * Rows::kLdScale)]));
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
  for (std::int64_t n = 1; n <= 70; ++n) {
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

// The rows' kDecodePieceKeys-key pieces (bf16 or int8), each copied to its own place in `store` (in
// shuffled order, apart; rows past `rows_alloc` NaN, or for int8 127s), and where each is.
std::vector<const void*> scatter_pieces(const Rows& r, std::int64_t rows_alloc, AlignedBuffer& store,
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
                           vr.scales() ? vr.scales() + j0 * Rows::kLdScale : nullptr, Rows::kLdScale};
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
          const auto scale_of = [&](std::int64_t j) { return scales ? scales + j * Rows::kLdScale : nullptr; };
          QRows q = make_q(rows, H, Hp, rng);
          // Rows [first, rows) of one call against one-key calls; rows before first are NaN in both.
          const auto check_qk_bits = [&](int first) {
            const std::vector<float> s = run_qk(k, q, r, rows, n, H, Hp, 0.125f, lds);
            AlignedBuffer one(static_cast<std::size_t>(rows * 16) * 4);
            for (std::int64_t j = 0; j < n; ++j) {
              k.decode_qk_rows({one.as<float>(), 16, q.buf.as<std::uint16_t>(), q.ldq, row(j), dtype, r.ld, 1, H, Hp,
                                0.125f, rows, scale_of(j), Rows::kLdScale});
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
