// Packed sequences (Options::cu_seqlens_q/k, FlashAttention's varlen): the mask they define is checked
// against separate problems, one per sequence, in the float64 reference; then every path (the packed
// flash path and decode on every instruction set, the ladder's rungs, the backward) against the
// reference on packings with empty sequences, lengths that divide no block, causal offsets and windows,
// with bit identity across thread counts; every variant of issue #11 together (with the softcap and
// sinks); and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "backward/flash_backward.hpp"
#include "core/backward_problem.hpp"
#include "core/dtype.hpp"
#include "core/problem.hpp"
#include "flash/flash_decode.hpp"
#include "flash/flash_packed.hpp"
#include "kernels/microkernels.hpp"
#include "ladder/ladder.hpp"
#include "reference/reference.hpp"
#include "reference/reference_backward.hpp"
#include "reference/tolerance.hpp"
#include "reference/tolerance_backward.hpp"
#include "testing/attention_case.hpp"
#include "testing/isa_test.hpp"

namespace flashgqa {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;
using testing::Shape;

// A packing: (T_i, S_i) per sequence.
struct Packing {
  std::vector<std::pair<std::int32_t, std::int32_t>> lengths;
  std::vector<std::int32_t> cu_q, cu_k;
  explicit Packing(std::vector<std::pair<std::int32_t, std::int32_t>> l) : lengths(std::move(l)) {
    cu_q = {0};
    cu_k = {0};
    for (const auto& [t, s] : lengths) {
      cu_q.push_back(cu_q.back() + t);
      cu_k.push_back(cu_k.back() + s);
    }
  }
  std::int64_t T() const { return cu_q.back(); }
  std::int64_t S() const { return cu_k.back(); }
  void apply(Options& o) const {
    o.cu_seqlens_q = cu_q.data();
    o.cu_seqlens_k = cu_k.data();
    o.num_sequences = static_cast<std::int64_t>(lengths.size());
  }
  std::string describe() const {
    std::string s = "sequences";
    for (const auto& [t, k] : lengths) s += " " + std::to_string(t) + "x" + std::to_string(k);
    return s;
  }
};

// Lengths that divide no block; empty sequences (no queries, no keys, neither); one long sequence among
// short ones; more queries than keys.
const Packing kPackings[] = {
    Packing({{37, 53}, {1, 1}, {20, 70}}),
    Packing({{0, 5}, {13, 13}, {7, 0}, {0, 0}, {29, 40}}),
    Packing({{3, 120}, {90, 90}, {5, 2}}),
    Packing({{64, 64}, {64, 64}}),
};

struct Mask {
  bool causal;
  std::optional<std::int64_t> offset;
  std::int64_t left, right;
};
const Mask kMasks[] = {
    {false, {}, -1, -1}, {true, {}, -1, -1}, {true, 0, -1, -1}, {true, -3, -1, -1},
    {false, {}, 5, 3},   {true, {}, 17, -1}, {false, 2, -1, 7},
};

std::string to_string(const Mask& m) {
  return std::string(m.causal ? "causal" : "full") + " offset " + (m.offset ? std::to_string(*m.offset) : "default") +
         " window (" + std::to_string(m.left) + ", " + std::to_string(m.right) + ")";
}

Options options_for(const Packing& pk, const Mask& m) {
  Options o;
  pk.apply(o);
  o.causal = m.causal;
  o.causal_offset = m.offset;
  o.window_left = m.left;
  o.window_right = m.right;
  return o;
}

// The packed problem's reference equals, row for row, the references of separate problems on each
// sequence's slice of q, k, v: the definition of packing, checked independently of visible_keys' packed
// branch.
TEST(PackedSequences, ReferenceEqualsSeparateSequences) {
  int seed = 0;
  for (const Packing& pk : kPackings)
    for (const Mask& m : kMasks) {
      AttentionCase c = make_case({1, 2, 3, pk.T(), pk.S(), 16}, DType::f32, DType::f32, Layout::contiguous, ++seed);
      const Options o = options_for(pk, m);
      const Problem p = make_problem(c.out, &c.lse, c.q, c.k, c.v, o);
      const ReferenceResult packed = reference_attention(p);
      for (std::size_t i = 0; i < pk.lengths.size(); ++i) {
        Problem one = p;
        one.sequences.clear();
        one.T = pk.lengths[i].first;
        one.S = pk.lengths[i].second;
        one.causal_offset = m.offset.value_or(one.S - one.T);
        one.q = p.q_row(0, 0, 0, pk.cu_q[i]);
        one.k = p.k_row(0, 0, pk.cu_k[i]);
        one.v = p.v_row(0, 0, pk.cu_k[i]);
        const ReferenceResult alone = reference_attention(one);
        for (std::int64_t kh = 0; kh < p.K; ++kh)
          for (std::int64_t g = 0; g < p.G; ++g)
            for (std::int64_t t = 0; t < one.T; ++t) {
              const std::int64_t rp = packed.row(0, kh, g, pk.cu_q[i] + t), ra = alone.row(0, kh, g, t);
              const double lp = packed.lse[static_cast<std::size_t>(rp)], la = alone.lse[static_cast<std::size_t>(ra)];
              ASSERT_TRUE(lp == la || (std::isnan(lp) && std::isnan(la)))
                  << pk.describe() << " " << to_string(m) << ": lse of sequence " << i << " row " << t;
              for (std::int64_t h = 0; h < p.H; ++h)
                ASSERT_EQ(packed.out[static_cast<std::size_t>(rp * p.H + h)], alone.out[static_cast<std::size_t>(ra * p.H + h)])
                    << pk.describe() << " " << to_string(m) << ": sequence " << i << " row " << t << " h " << h;
            }
      }
    }
}

class PackedSequences : public testing::IsaTest {};

// The packed flash path (and decode, for the short packings) on `isa`, both precisions, G = 1 and 4,
// H = 64/128/256, small blocks that cut sequences and default ones; 1 and 2 threads give the same bits.
TEST_P(PackedSequences, FlashMatchesReferenceAndKeepsBitsAcrossThreads) {
  int seed = 100;
  const Packing decode_packing({{1, 300}, {1, 0}, {1, 77}});  // G * T = 3 * G rows: the decode path
  std::vector<const Packing*> packings;
  for (const Packing& pk : kPackings) packings.push_back(&pk);
  packings.push_back(&decode_packing);
  for (const Packing* pk : packings)
    for (const Mask& m : kMasks)
      for (const auto& [G, H, block_q, block_kv] : {std::tuple{4, 64, 16, 32}, std::tuple{1, 128, 0, 0},
                                                     std::tuple{2, 256, 24, 64}}) {
        Options o = options_for(*pk, m);
        o.block_q = block_q;
        o.block_kv = block_kv;
        o.precision = seed % 2 ? Precision::bf16 : Precision::f32;
        std::vector<float> first;
        for (int threads : {1, 2}) {
          o.threads = threads;
          AttentionCase c = make_case({1, 2, G, pk->T(), pk->S(), H}, DType::bf16, DType::f32, Layout::fa, seed + 1);
          const Problem p = make_problem(c.out, &c.lse, c.q, c.k, c.v, o);
          flash_attention(p, isa());
          const ErrorReport r = check_against_reference(p, reference_attention(p), flash_key_sums(p, isa()));
          EXPECT_TRUE(r.ok) << pk->describe() << " " << to_string(m) << " G " << G << " H " << H << ": " << r.describe();
          if (threads == 1)
            first = c.out_and_lse_values();
          else
            EXPECT_TRUE(testing::bitwise_equal(first, c.out_and_lse_values())) << pk->describe() << " " << to_string(m);
        }
        ++seed;
      }
}

// The backward on `isa` against its reference, and bit identity across thread counts.
TEST_P(PackedSequences, BackwardMatchesReference) {
  int seed = 300;
  for (const Packing& pk : kPackings)
    for (const Mask& m : {kMasks[0], kMasks[1], kMasks[4], kMasks[5]}) {
      Options o = options_for(pk, m);
      o.block_q = 16;
      o.block_kv = 32;
      std::vector<float> first;
      for (int threads : {1, 2}) {
        o.threads = threads;
        const Shape shape{1, 2, 2, pk.T(), pk.S(), 64};
        AttentionCase fwd = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, seed);
        AttentionCase grads = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, seed + 1);
        Options f = o;
        f.algorithm = Algorithm::flash;
        flash_attention(make_problem(fwd.out, &fwd.lse, fwd.q, fwd.k, fwd.v, f), isa());
        const BackwardProblem bp =
            make_backward_problem(grads.out, grads.k, grads.v, grads.q, fwd.q, fwd.k, fwd.v, fwd.out, fwd.lse, o);
        flash_backward(bp, isa());
        const ErrorReport r = check_backward_against_reference(bp, reference_attention_backward(bp));
        EXPECT_TRUE(r.ok) << pk.describe() << " " << to_string(m) << ": " << r.describe();
        std::vector<float> values = grads.out_values();
        for (std::int64_t s = 0; s < pk.S(); ++s)
          for (std::int64_t kh = 0; kh < 2; ++kh)
            for (std::int64_t h = 0; h < 64; h += 7) {
              values.push_back(load_element(bp.dk_row(0, kh, s), bp.dk_dtype, h));
              values.push_back(load_element(bp.dv_row(0, kh, s), bp.dv_dtype, h));
            }
        if (threads == 1)
          first = values;
        else
          EXPECT_TRUE(testing::bitwise_equal(first, values)) << pk.describe() << " " << to_string(m);
      }
      seed += 2;
    }
}

// Every variant of issue #11 at once: packed sequences (with empty ones), causal offsets, windows, the
// logit softcap and attention sinks, forward (packed path and decode) and backward, against the
// reference, with the same bits on 1 and 2 threads.
TEST_P(PackedSequences, EveryVariantTogether) {
  int seed = 900;
  const Packing decode_packing({{1, 200}, {0, 3}, {1, 0}, {1, 45}});
  for (const Packing* pk : {&kPackings[1], &kPackings[2], &decode_packing})
    for (const Mask& m : {kMasks[2], kMasks[3], kMasks[5], kMasks[6]})
      for (const double softcap : {0.0, 3.0}) {
        const std::int64_t G = 2;
        std::vector<float> sinks;
        for (std::int64_t h = 0; h < 2 * G; ++h) sinks.push_back(h == 1 ? -INFINITY : 0.5f * static_cast<float>(h) - 0.7f);
        Options o = options_for(*pk, m);
        o.softcap = softcap;
        o.sinks = sinks.data();
        o.scale = 0.4;
        o.block_q = 16;
        o.block_kv = 32;
        const std::string what = pk->describe() + " " + to_string(m) + " softcap " + std::to_string(softcap);
        std::vector<float> first, first_grads;
        for (int threads : {1, 2}) {
          o.threads = threads;
          const Shape shape{1, 2, G, pk->T(), pk->S(), 64};
          AttentionCase fwd = make_case(shape, DType::bf16, DType::bf16, Layout::fa, seed);
          AttentionCase grads = make_case(shape, DType::bf16, DType::bf16, Layout::fa, seed + 1);
          Options f = o;
          f.algorithm = Algorithm::flash;
          const Problem p = make_problem(fwd.out, &fwd.lse, fwd.q, fwd.k, fwd.v, f);
          flash_attention(p, isa());
          const ErrorReport r = check_against_reference(p, reference_attention(p), flash_key_sums(p, isa()));
          EXPECT_TRUE(r.ok) << what << ": " << r.describe();
          const BackwardProblem bp =
              make_backward_problem(grads.out, grads.k, grads.v, grads.q, fwd.q, fwd.k, fwd.v, fwd.out, fwd.lse, o);
          flash_backward(bp, isa());
          const ErrorReport rb = check_backward_against_reference(bp, reference_attention_backward(bp));
          EXPECT_TRUE(rb.ok) << what << " backward: " << rb.describe();
          std::vector<float> values = fwd.out_and_lse_values(), grad_values = grads.out_values();
          for (std::int64_t j = 0; j < pk->S(); ++j)
            for (std::int64_t h = 0; h < 64; h += 5) {
              grad_values.push_back(load_element(bp.dk_row(0, 1, j), bp.dk_dtype, h));
              grad_values.push_back(load_element(bp.dv_row(0, 0, j), bp.dv_dtype, h));
            }
          if (threads == 1) {
            first = values;
            first_grads = grad_values;
          } else {
            EXPECT_TRUE(testing::bitwise_equal(first, values)) << what;
            EXPECT_TRUE(testing::bitwise_equal(first_grads, grad_values)) << what << " backward";
          }
        }
        seed += 2;
      }
}

// Batched decode as packed sequences of one query each: each sequence's rows are one q block, so the
// decode path takes them (its rows share one sequence's keys) when the kernel set has decode kernels.
TEST_P(PackedSequences, BatchedDecodeTakesTheDecodePath) {
  const Packing pk({{1, 300}, {1, 0}, {2, 77}, {1, 1000}});
  AttentionCase c = make_case({1, 2, 4, pk.T(), pk.S(), 128}, DType::bf16, DType::f32, Layout::fa, 77);
  Options o = options_for(pk, kMasks[1]);
  o.algorithm = Algorithm::flash;
  const Problem p = make_problem(c.out, &c.lse, c.q, c.k, c.v, o);
  const FlashKernels& k = decode_kernels_for(isa(), p.precision);
  EXPECT_EQ(flash_decode_applies(p, k), k.decode_qk_rows != nullptr) << "G x the longest sequence = 8 rows";
  flash_attention(p, isa());
  const ErrorReport r = check_against_reference(p, reference_attention(p), flash_key_sums(p, isa()));
  EXPECT_TRUE(r.ok) << r.describe();
  Options wide = o;
  const Packing three({{3, 50}, {1, 20}});
  wide.cu_seqlens_q = three.cu_q.data();
  wide.cu_seqlens_k = three.cu_k.data();
  wide.num_sequences = 2;
  AttentionCase w = make_case({1, 2, 4, three.T(), three.S(), 128}, DType::bf16, DType::f32, Layout::fa, 78);
  EXPECT_FALSE(flash_decode_applies(make_problem(w.out, &w.lse, w.q, w.k, w.v, wide), k)) << "12 rows in a block";
}

INSTANTIATE_TEST_SUITE_P(AllIsas, PackedSequences, ::testing::ValuesIn(testing::kAllIsas), testing::isa_test_name);

// Every rung of the ladder (through the public attention) against the reference.
TEST(PackedSequences, EveryRungMatchesReference) {
  int seed = 500;
  for (const auto& e : kAlgorithmNames)
    for (const Packing& pk : kPackings)
      for (const Mask& m : {kMasks[1], kMasks[3], kMasks[4]}) {
        if (e.value == Algorithm::chunked_unstable && !m.causal) continue;  // covered; keeps the list short
        Options o = options_for(pk, m);
        o.algorithm = e.value;
        o.block_kv = e.value == Algorithm::naive ? 0 : 16;
        o.block_q = e.value == Algorithm::kernel1 || e.value == Algorithm::flash ? 8 : 0;
        AttentionCase c = make_case({1, 2, 3, pk.T(), pk.S(), 64}, DType::f32, DType::bf16, Layout::padded, ++seed);
        attention(c.out, c.lse, c.q, c.k, c.v, o);
        const Problem p = make_problem(c.out, &c.lse, c.q, c.k, c.v, o);
        const ErrorReport r = check_against_reference(p, reference_attention(p), key_sums(p, e.value));
        EXPECT_TRUE(r.ok) << e.name << " " << pk.describe() << " " << to_string(m) << ": " << r.describe();
      }
}

// Rows of sequences without keys get 0 and lse -inf; keys of sequences without queries are seen by none.
TEST(PackedSequences, SequencesWithoutKeysGiveZeroRows) {
  const Packing pk({{4, 0}, {3, 9}, {0, 6}, {2, 0}});
  AttentionCase c = make_case({1, 1, 2, pk.T(), pk.S(), 32}, DType::f32, DType::f32, Layout::contiguous, 9);
  Options o;
  pk.apply(o);
  attention(c.out, c.lse, c.q, c.k, c.v, o);
  for (std::int64_t g = 0; g < 2; ++g)
    for (std::int64_t t : {0, 1, 2, 3, 7, 8}) {
      EXPECT_EQ(c.lse_at(0, 0, g, t), -INFINITY) << "row " << t;
      EXPECT_EQ(c.out_at(0, 0, g, t, 5), 0.0f) << "row " << t;
    }
  EXPECT_TRUE(std::isfinite(c.lse_at(0, 0, 1, 5)));
}

void expect_error(const Options& o, const Shape& s, const std::string& part) {
  AttentionCase c = make_case(s, DType::f32, DType::f32, Layout::contiguous, 1);
  try {
    attention(c.out, c.q, c.k, c.v, o);
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(PackedSequences, BadOffsetsAreRejected) {
  const Shape s{1, 1, 1, 10, 12, 8};
  std::vector<std::int32_t> q = {0, 4, 10}, k = {0, 5, 12};
  Options o;
  o.cu_seqlens_q = q.data();
  o.cu_seqlens_k = k.data();
  o.num_sequences = 2;
  AttentionCase good = make_case(s, DType::f32, DType::f32, Layout::contiguous, 1);
  EXPECT_NO_THROW(attention(good.out, good.q, good.k, good.v, o));
  expect_error(o, {2, 1, 1, 10, 12, 8}, "expected B = 1");
  q = {1, 4, 10};
  expect_error(o, s, "cu_seqlens_q[0] = 1, expected 0");
  q = {0, 11, 10};
  expect_error(o, s, "cu_seqlens_q[2] = 10 < cu_seqlens_q[1] = 11");
  q = {0, 4, 9};
  expect_error(o, s, "cu_seqlens_q[2] = 9, expected T = 10");
  q = {0, 4, 10};
  k = {0, 5, 13};
  expect_error(o, s, "cu_seqlens_k[2] = 13, expected S = 12");
  k = {0, 5, 12};
  o.num_sequences = 0;
  expect_error(o, s, "num_sequences: 0");
  o.num_sequences = 2;
  o.cu_seqlens_k = nullptr;
  expect_error(o, s, "cu_seqlens_k: null");
  o.cu_seqlens_k = k.data();
  o.window_left = -2;
  expect_error(o, s, "window: (-2, -1), expected each side >= 0, or -1");
}

}  // namespace
}  // namespace flashgqa
