// The roofline formulas against hand-computed values, including the seed's own numbers.
#include "study/roofline.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace flashgqa::study {
namespace {

TEST(Roofline, SeedTpuV6eBalanceIs561) {
  const Machine v6e{9.2e14, 1.64e12};
  EXPECT_NEAR(balance(v6e), 560.98, 0.01);  // the seed: "i_v6e = f/b ≈ 561"
}

TEST(Roofline, NaiveTrainingIntensityIs128TOver160PlusT) {
  for (std::int64_t T : {1, 7, 128, 1024, 4096, 1 << 20}) {
    const Shape s{1, 1, 4, T, T, 128};
    const double t = static_cast<double>(T);
    EXPECT_NEAR(naive_intensity(s), 128 * t / (160 + t), 1e-9 * t) << T;
    EXPECT_LT(naive_intensity(s), 128.0);  // "never exceeds 128"
  }
  // Never compute-bound on the v6e, whatever the length.
  EXPECT_TRUE(std::isinf(naive_compute_bound_length(4, 128, 561.0)));
}

TEST(Roofline, FlashIntensityAndItsComputeBoundLength) {
  // G·T·S/(G·T + S) with T = S grows as G·T/(G + 1).
  EXPECT_DOUBLE_EQ(flash_intensity(Shape{1, 1, 4, 1000, 1000, 128}), 4.0 * 1000 * 1000 / 5000);
  // The seed: T > i (G + 1)/G ≈ 702 on the v6e.
  EXPECT_NEAR(flash_compute_bound_length(4, 561.0), 701.25, 1e-9);
  // Decode: T = 1 gives G·S/(G + S) < G.
  EXPECT_LT(flash_intensity(Shape{1, 1, 4, 1, 32768, 128}), 4.0);
}

TEST(Roofline, HandComputedFlopsAndPrediction) {
  const Shape s{1, 8, 4, 4096, 4096, 128};
  EXPECT_DOUBLE_EQ(attention_flops(s, false), 4.0 * 8 * 4 * 4096.0 * 4096 * 128);  // 2.75e11
  EXPECT_DOUBLE_EQ(attention_flops(s, true), 4.0 * 8 * 4 * (4096.0 * 4097 / 2) * 128);  // T (T + 1) / 2 pairs
  // The visible area, not half of T S: T = 512 queries at the end of S = 8192 keys see nearly all.
  const Shape tail{1, 1, 1, 512, 8192, 128};
  EXPECT_DOUBLE_EQ(attention_flops(tail, true), 4.0 * 128 * (512.0 * 7680 + 512.0 * 513 / 2));
  EXPECT_DOUBLE_EQ(attention_flops(tail, true, 0), 4.0 * 128 * (512.0 * 513 / 2));  // top-left
  const Machine m{462e9, 30e9};
  const Prediction p = predict(attention_flops(s, false), flash_intensity(s), m);
  EXPECT_NEAR(p.t_math, 0.5949, 1e-4);  // the compute floor, 0.595 s
  EXPECT_TRUE(p.compute_bound());
  // Naive on the same machine: 4·B·K·(G·T·H + S·H + G·T·S) bytes at 30 GB/s.
  const Prediction n = predict(attention_flops(s, false), naive_intensity(s), m);
  const double bytes = 4.0 * 8 * (4 * 4096.0 * 128 + 4096.0 * 128 + 4 * 4096.0 * 4096);
  EXPECT_NEAR(n.t_comms, bytes / 30e9, 1e-12);
  EXPECT_DOUBLE_EQ(n.time(), std::max(n.t_math, n.t_comms));
}

TEST(Roofline, KernelOneMovesMoreThanFlashLessThanChunked) {
  const Shape s{1, 2, 4, 4096, 4096, 128};
  EXPECT_LT(kernel1_intensity(s, 1024), flash_intensity(s));
  EXPECT_LT(chunked_intensity(s, 1024), naive_intensity(s));  // naive's traffic plus carries
  EXPECT_GT(kernel1_intensity(s, 4096), kernel1_intensity(s, 512));  // fewer KV steps, fewer round trips
}

TEST(Roofline, MemoryGrowsAsTSOnlyForNaive) {
  const Shape small{1, 2, 4, 4096, 4096, 128}, big{1, 2, 4, 8192, 8192, 128};
  const double naive_ratio = memory_bytes(Algorithm::naive, big, DType::bf16, 0, 0, 2) /
                             memory_bytes(Algorithm::naive, small, DType::bf16, 0, 0, 2);
  const double flash_ratio = memory_bytes(Algorithm::flash, big, DType::bf16, 64, 512, 2) /
                             memory_bytes(Algorithm::flash, small, DType::bf16, 64, 512, 2);
  EXPECT_GT(naive_ratio, 3.3);  // the [T, S] logits (x4) outweigh the inputs (x2): 3.42 here
  EXPECT_LT(flash_ratio, 2.1);  // linear in T and S
}

}  // namespace
}  // namespace flashgqa::study
