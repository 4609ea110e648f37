#include "core/workspace_cache.hpp"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include <pthread.h>

#include "flashgqa/flashgqa.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define FLASHGQA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FLASHGQA_ASAN 1
#endif
#endif
#ifdef FLASHGQA_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace flashgqa {
namespace {

struct Block {
  void* data;
  std::size_t bytes;
};

struct Cache {
  std::mutex mutex;
  std::vector<Block> kept;  // oldest first
  std::size_t bytes = 0;    // of the kept blocks
};

Cache* make_cache();

// Never destroyed: buffers freed during static destruction still find it.
Cache& cache() {
  static Cache* c = make_cache();
  return *c;
}

// fork() while another thread holds the lock would leave it held in the child for good: the lock is
// taken around fork and released on both sides (the forking thread holds it, in the child too).
Cache* make_cache() {
  auto* c = new Cache;
  pthread_atfork([] { cache().mutex.lock(); }, [] { cache().mutex.unlock(); }, [] { cache().mutex.unlock(); });
  return c;
}

void* new_block(std::size_t bytes) {
  void* data = std::aligned_alloc(64, bytes);
  if (data == nullptr) throw std::bad_alloc();
  return data;
}

// A kept block is off limits under AddressSanitizer (a use after its buffer freed it is reported, as
// without the cache) until it is handed out or freed.
void mark_kept(const Block& b, bool kept) {
#ifdef FLASHGQA_ASAN
  if (kept)
    ASAN_POISON_MEMORY_REGION(b.data, b.bytes);
  else
    ASAN_UNPOISON_MEMORY_REGION(b.data, b.bytes);
#else
  (void)b, (void)kept;
#endif
}

// data, filled with 0xff bytes in sanitizer builds (see the header).
void* handed_out(void* data, std::size_t bytes) {
#ifdef FLASHGQA_POISON_WORKSPACES
  std::memset(data, 0xff, bytes);
#else
  (void)bytes;
#endif
  return data;
}

}  // namespace

void* workspace_alloc(std::size_t bytes) {
  if (bytes >= kCachedBlockMinBytes) {
    Cache& c = cache();
    const std::lock_guard<std::mutex> lock(c.mutex);
    std::size_t best = c.kept.size();
    for (std::size_t i = 0; i < c.kept.size(); ++i)
      if (c.kept[i].bytes >= bytes && c.kept[i].bytes / 2 <= bytes &&
          (best == c.kept.size() || c.kept[i].bytes < c.kept[best].bytes))
        best = i;
    if (best < c.kept.size()) {
      void* data = c.kept[best].data;
      mark_kept(c.kept[best], false);
      c.bytes -= c.kept[best].bytes;
      c.kept.erase(c.kept.begin() + static_cast<std::ptrdiff_t>(best));
      return handed_out(data, bytes);
    }
  }
  return handed_out(new_block(bytes), bytes);
}

void workspace_free(void* block, std::size_t bytes) noexcept {
  if (block == nullptr) return;
  if (bytes < kCachedBlockMinBytes || bytes > kWorkspaceCacheBytes) return std::free(block);
  Cache& c = cache();
  const std::lock_guard<std::mutex> lock(c.mutex);
  try {
    c.kept.reserve(c.kept.size() + 1);  // the one step that may throw: then the block is freed instead
  } catch (...) {
    return std::free(block);
  }
  std::size_t n = 0;  // the oldest blocks, freed to make room
  for (; c.bytes + bytes > kWorkspaceCacheBytes; ++n) {
    mark_kept(c.kept[n], false);
    std::free(c.kept[n].data);
    c.bytes -= c.kept[n].bytes;
  }
  c.kept.erase(c.kept.begin(), c.kept.begin() + static_cast<std::ptrdiff_t>(n));
  c.kept.push_back({block, bytes});
  mark_kept(c.kept.back(), true);
  c.bytes += bytes;
}

std::size_t workspace_cache_bytes() {
  Cache& c = cache();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return c.bytes;
}

std::size_t free_workspace_cache() {
  std::vector<Block> kept;
  {
    Cache& c = cache();
    const std::lock_guard<std::mutex> lock(c.mutex);
    kept.swap(c.kept);
    c.bytes = 0;
  }
  std::size_t bytes = 0;
  for (const Block& b : kept) mark_kept(b, false), std::free(b.data), bytes += b.bytes;
  return bytes;
}

}  // namespace flashgqa
