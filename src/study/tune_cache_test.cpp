// The tune cache: round trip, replacement, the tools' opt-in through Options, and foreign or corrupt
// files ignored with a warning.
#include "study/tune_cache.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kernels/cpu_features.hpp"

namespace flashgqa::study {
namespace {

std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("flashgqa_tune_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

TuneEntry entry(std::int64_t T, std::int64_t bq, std::int64_t bkv) {
  TuneEntry e;
  e.key = make_tune_key("avx512bf16", 4, 128, T, T, false, Precision::bf16);
  e.threads = 2;
  e.block_q = bq;
  e.block_kv = bkv;
  e.ms = 12.5;
  return e;
}

TEST(TuneCache, SizeClasses) {
  EXPECT_EQ(size_class(0), 0);
  EXPECT_EQ(size_class(1), 0);
  EXPECT_EQ(size_class(2), 1);
  EXPECT_EQ(size_class(2049), 12);
  EXPECT_EQ(size_class(4096), 12);
  EXPECT_EQ(size_class(4097), 13);
}

TEST(TuneCache, RoundTripAndReplace) {
  const std::string path = temp_path("nested/dir/tune.tsv");
  std::filesystem::remove(path);
  store_tune_entry(path, entry(4096, 64, 512));
  store_tune_entry(path, entry(1024, 32, 256));
  store_tune_entry(path, entry(4000, 128, 1024));  // same class as 4096: replaces it
  std::string warning;
  const auto entries = read_tune_cache(path, &warning);
  EXPECT_TRUE(warning.empty()) << warning;
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].key, entry(4096, 0, 0).key);
  EXPECT_EQ(entries[0].block_q, 128);
  EXPECT_EQ(entries[0].block_kv, 1024);
  EXPECT_DOUBLE_EQ(entries[0].ms, 12.5);
  EXPECT_EQ(entries[0].threads, 2);
  EXPECT_EQ(entries[1].block_q, 32);
}

TEST(TuneCache, LookupUsesTheEnvironmentPath) {
  const std::string path = temp_path("lookup.tsv");
  std::filesystem::remove(path);
  store_tune_entry(path, entry(4096, 96, 768));
  ::setenv("FLASHGQA_TUNE_CACHE", path.c_str(), 1);
  reload_tune_cache();
  const auto hit = lookup_tuned_blocks(entry(3000, 0, 0).key);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->block_q, 96);
  EXPECT_FALSE(lookup_tuned_blocks(entry(100, 0, 0).key).has_value());
  ::unsetenv("FLASHGQA_TUNE_CACHE");
  reload_tune_cache();
}

TEST(TuneCache, FlashTakesTunedBlocksOnlyWhenBothAreAutomatic) {
  const std::string path = temp_path("apply.tsv");
  std::filesystem::remove(path);
  Problem p;
  p.G = 4, p.H = 128, p.T = 3000, p.S = 4096, p.threads = 2, p.precision = Precision::bf16;
  TuneEntry e;
  e.key = make_tune_key("avx512bf16", p.G, p.H, p.T, p.S, false, Precision::bf16);
  e.block_q = 48;
  e.block_kv = 320;
  store_tune_entry(path, e);
  ::setenv("FLASHGQA_TUNE_CACHE", path.c_str(), 1);
  reload_tune_cache();
  EXPECT_TRUE(apply_tuned_blocks(p, "avx512bf16"));
  EXPECT_EQ(p.block_q, 48);
  EXPECT_EQ(p.block_kv, 320);
  Problem explicit_blocks = p;
  explicit_blocks.block_q = 0;
  explicit_blocks.block_kv = 64;  // one explicit size: the cache is not consulted
  EXPECT_FALSE(apply_tuned_blocks(explicit_blocks, "avx512bf16"));
  EXPECT_EQ(explicit_blocks.block_q, 0);
  Problem one_thread = p;  // the thread count is not part of the class: same blocks, same bits
  one_thread.block_q = one_thread.block_kv = 0;
  one_thread.threads = 1;
  EXPECT_TRUE(apply_tuned_blocks(one_thread, "avx512bf16"));
  EXPECT_EQ(one_thread.block_q, 48);
  Problem other_isa = p;
  other_isa.block_q = other_isa.block_kv = 0;
  EXPECT_FALSE(apply_tuned_blocks(other_isa, "avx2"));  // tuned on another path
  Problem causal = other_isa;
  causal.causal = true;
  EXPECT_FALSE(apply_tuned_blocks(causal, "avx512bf16"));  // another class
  ::unsetenv("FLASHGQA_TUNE_CACHE");
  reload_tune_cache();
}

TEST(TuneCache, ToolsOptInThroughOptionsForFlashWithAutomaticBlocks) {
  const std::string path = temp_path("options.tsv");
  std::filesystem::remove(path);
  const Shape shape{1, 2, 4, 3000, 4096, 128};  // B, K, G, T, S, H
  TuneEntry e;
  e.key = make_tune_key(isa_name(active_isa()), shape.G, shape.H, shape.T, shape.S, false,
                        Precision::bf16);
  e.block_q = 48;
  e.block_kv = 320;
  store_tune_entry(path, e);
  ::setenv("FLASHGQA_TUNE_CACHE", path.c_str(), 1);
  reload_tune_cache();
  const Options tuned = with_tuned_blocks(Options{}, shape);
  EXPECT_EQ(tuned.block_q, 48);
  EXPECT_EQ(tuned.block_kv, 320);
  Options explicit_blocks;
  explicit_blocks.block_kv = 64;  // explicit blocks win
  EXPECT_EQ(with_tuned_blocks(explicit_blocks, shape).block_q, 0);
  EXPECT_EQ(with_tuned_blocks(explicit_blocks, shape).block_kv, 64);
  Options kernel1;
  kernel1.algorithm = Algorithm::kernel1;  // flash only
  EXPECT_EQ(with_tuned_blocks(kernel1, shape).block_q, 0);
  Options causal;
  causal.causal = true;  // another class
  EXPECT_EQ(with_tuned_blocks(causal, shape).block_q, 0);
  Shape empty = shape;
  empty.T = 0;  // nothing computed, nothing looked up
  EXPECT_EQ(with_tuned_blocks(Options{}, empty).block_q, 0);
  ::unsetenv("FLASHGQA_TUNE_CACHE");
  reload_tune_cache();
}

TEST(TuneCache, ForeignAndCorruptFilesAreIgnoredWithAWarning) {
  const std::string path = temp_path("bad.tsv");
  const char* contents[] = {
      "not a cache\n",
      "",
      "# flashgqa tune cache v1\ncpu\tavx\t4\t128\t0\tbf16\t12\t12\t2\t64\n",             // short line
      "# flashgqa tune cache v1\ncpu\tavx\t4\t128\t0\tbf16\t12\t12\t2\t64\tx\t1.0\n",      // non-number
      "# flashgqa tune cache v1\ncpu\tavx\t4\t128\t0\tbf16\t12\t12\t2\t-5\t512\t1.0\n",    // bad block
      "# flashgqa tune cache v1\ncpu\tavx\t4\t128\t2\tbf16\t12\t12\t2\t64\t512\t1.0\n",    // bad flag
      "# flashgqa tune cache v1\n\x01\x02\xff garbage \t\t\t\n",
  };
  for (const char* c : contents) {
    { std::ofstream(path, std::ios::binary) << c; }
    std::string warning;
    EXPECT_TRUE(read_tune_cache(path, &warning).empty()) << c;
    EXPECT_FALSE(warning.empty()) << c;
    // Storing over a bad file replaces it with a good one.
    EXPECT_NO_THROW(store_tune_entry(path, entry(512, 16, 128)));
    warning.clear();
    EXPECT_EQ(read_tune_cache(path, &warning).size(), 1u);
    EXPECT_TRUE(warning.empty());
  }
  std::string warning;
  EXPECT_TRUE(read_tune_cache(temp_path("missing.tsv"), &warning).empty());
  EXPECT_TRUE(warning.empty());  // a missing file is no error
}

}  // namespace
}  // namespace flashgqa::study
