#include "core/workspace_cache.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "core/aligned_buffer.hpp"
#include "flashgqa/flashgqa.hpp"

namespace flashgqa {
namespace {

constexpr std::size_t kKiB = 1024, kMiB = 1024 * 1024;

class WorkspaceCache : public ::testing::Test {
 protected:
  void SetUp() override { free_workspace_cache(); }
  void TearDown() override { free_workspace_cache(); }
};

TEST_F(WorkspaceCache, AFreedBlockIsHandedOutAgain) {
  void* first = nullptr;
  {
    AlignedBuffer a(256 * kKiB);
    first = a.data();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first) % 64, 0u);
  }
  EXPECT_EQ(workspace_cache_bytes(), 256 * kKiB);
  AlignedBuffer b(200 * kKiB);  // fits the kept block (at most twice its size)
  EXPECT_EQ(b.data(), first);
  EXPECT_EQ(workspace_cache_bytes(), 0u);
  // Written and read whole: the block is as large as asked.
  std::memset(b.data(), 1, b.bytes());
  EXPECT_EQ(b.as<unsigned char>()[b.bytes() - 1], 1);
}

TEST_F(WorkspaceCache, SmallBlocksAreNotKept) {
  { AlignedBuffer a(kCachedBlockMinBytes - 64); }
  EXPECT_EQ(workspace_cache_bytes(), 0u);
  { AlignedBuffer a(kCachedBlockMinBytes); }
  EXPECT_EQ(workspace_cache_bytes(), kCachedBlockMinBytes);
}

TEST_F(WorkspaceCache, ABlockOverTwiceTheRequestStaysKept) {
  void* big = nullptr;
  {
    AlignedBuffer a(1 * kMiB);
    big = a.data();
  }
  AlignedBuffer small(100 * kKiB);
  EXPECT_NE(small.data(), big);
  EXPECT_EQ(workspace_cache_bytes(), 1 * kMiB);
  AlignedBuffer larger(kMiB - 64);
  EXPECT_EQ(larger.data(), big);
}

TEST_F(WorkspaceCache, KeepsAtMostItsCapOldestFirst) {
  // Four blocks fit the cap, five do not.
  const std::size_t block = kWorkspaceCacheBytes / 4 - 512;
  std::vector<AlignedBuffer> held(6);
  std::vector<void*> data;
  for (std::size_t i = 0; i < 6; ++i) held[i].reset(block + i * 64), data.push_back(held[i].data());
  for (AlignedBuffer& b : held) b.reset(0);  // blocks 0..5 freed in order: 0 makes room for 4, 1 for 5
  EXPECT_EQ(workspace_cache_bytes(), 4 * block + (2 + 3 + 4 + 5) * 64);
  // Blocks 2..5 are kept: each comes back for a request of its exact size.
  for (int i = 2; i < 6; ++i) {
    AlignedBuffer b(block + static_cast<std::size_t>(i) * 64);
    EXPECT_EQ(b.data(), data[static_cast<std::size_t>(i)]) << i;
  }
  // A block larger than the cap is never kept.
  free_workspace_cache();
  { AlignedBuffer huge(kWorkspaceCacheBytes + 64); }
  EXPECT_EQ(workspace_cache_bytes(), 0u);
}

TEST_F(WorkspaceCache, FreeWorkspaceCacheHandsEverythingBack) {
  { AlignedBuffer a(128 * kKiB), b(512 * kKiB); }
  EXPECT_EQ(workspace_cache_bytes(), 640 * kKiB);
  EXPECT_EQ(free_workspace_cache(), 640 * kKiB);
  EXPECT_EQ(workspace_cache_bytes(), 0u);
  EXPECT_EQ(free_workspace_cache(), 0u);
}

#ifdef FLASHGQA_POISON_WORKSPACES
TEST_F(WorkspaceCache, SanitizerBuildsHandOutBlocksOfOnes) {
  {
    AlignedBuffer a(256 * kKiB);
    std::memset(a.data(), 0, a.bytes());
  }
  AlignedBuffer b(256 * kKiB);  // the same block, kept: filled again
  for (std::size_t i = 0; i < b.bytes(); i += 4099) ASSERT_EQ(b.as<unsigned char>()[i], 0xff) << i;
  AlignedBuffer fresh(3 * kMiB);
  EXPECT_EQ(fresh.as<unsigned char>()[fresh.bytes() / 2], 0xff);
}
#endif

// Threads that allocate, fill, check and free blocks of assorted sizes at once: no block is handed to
// two holders (each finds its own pattern whole), and the cache ends within its cap.
TEST_F(WorkspaceCache, ThreadsNeverShareABlock) {
  constexpr int kThreads = 6, kRounds = 300;
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &bad] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::uniform_int_distribution<int> size_kib(32, 2048);
      for (int r = 0; r < kRounds; ++r) {
        AlignedBuffer a(static_cast<std::size_t>(size_kib(rng)) * kKiB);
        AlignedBuffer b(static_cast<std::size_t>(size_kib(rng)) * kKiB);
        const auto mark = static_cast<unsigned char>(2 * t + 1);
        std::memset(a.data(), mark, a.bytes());
        std::memset(b.data(), mark + 1, b.bytes());
        std::this_thread::yield();
        int& errors = bad[static_cast<std::size_t>(t)];
        for (std::size_t i = 0; i < a.bytes(); i += 997) errors += a.as<unsigned char>()[i] != mark;
        for (std::size_t i = 0; i < b.bytes(); i += 997) errors += b.as<unsigned char>()[i] != mark + 1;
      }
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[static_cast<std::size_t>(t)], 0) << "thread " << t;
  EXPECT_LE(workspace_cache_bytes(), kWorkspaceCacheBytes);
}


// A child forked while another thread holds the cache's lock still allocates (the lock is taken
// around fork and released on both sides): each child takes and frees a kept-size block, and a child
// that hung would be killed by its alarm.
TEST_F(WorkspaceCache, ForkWhileAnotherThreadAllocates) {
  std::atomic<bool> stop{false};
  std::thread busy([&stop] {
    while (!stop.load()) {
      AlignedBuffer a(128 * kKiB), b(96 * kKiB);
    }
  });
  int failures = 0;
  for (int i = 0; i < 40; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(5);
      { AlignedBuffer a(128 * kKiB), b(2 * kMiB); }
      _exit(workspace_cache_bytes() >= 128 * kKiB ? 0 : 3);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  stop = true;
  busy.join();
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace flashgqa
