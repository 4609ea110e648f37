// Memory that faults on a stray access: buffers and segments that end right before an inaccessible
// (PROT_NONE) page, so a read or write one byte past their end stops the test with SIGSEGV instead of
// passing unseen. POSIX only (mmap, mprotect).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <new>
#include <stdexcept>

namespace flashgqa::testing {

inline std::size_t os_page_bytes() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

// A fresh read-write mapping of `size` bytes with PROT_NONE pages at its start and at first_guard + i
// guard_stride for i < guards; throws (unmapping it) where a guard cannot be set, so that no test runs
// without its guards.
inline char* map_with_guards(std::size_t size, std::size_t first_guard, std::size_t guard_stride,
                             std::size_t guards) {
  char* base = static_cast<char*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (base == MAP_FAILED) throw std::bad_alloc();
  const std::size_t page = os_page_bytes();
  bool ok = mprotect(base, page, PROT_NONE) == 0;
  for (std::size_t i = 0; i < guards && ok; ++i)
    ok = mprotect(base + first_guard + i * guard_stride, page, PROT_NONE) == 0;
  if (!ok) {
    munmap(base, size);
    throw std::runtime_error("guarded memory: mprotect failed");
  }
  return base;
}

// `bytes` bytes between two PROT_NONE pages, the last byte right before the trailing one.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(std::size_t bytes) : bytes_(bytes) {
    const std::size_t page = os_page_bytes();
    const std::size_t body = (bytes + page - 1) / page * page;
    size_ = body + 2 * page;
    base_ = map_with_guards(size_, page + body, 0, 1);
    data_ = base_ + page + body - bytes;
  }
  ~GuardedBuffer() { munmap(base_, size_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  char* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  char* base_ = nullptr;
  char* data_ = nullptr;
  std::size_t size_ = 0, bytes_ = 0;
};

// `count` segments of `bytes` bytes each, `stride()` bytes apart (a multiple of the OS page), each
// ending right before a PROT_NONE page; a PROT_NONE page before the first one too.
class GuardedSegments {
 public:
  GuardedSegments(std::size_t count, std::size_t bytes) : count_(count) {
    const std::size_t page = os_page_bytes();
    const std::size_t body = (bytes + page - 1) / page * page;
    stride_ = body + page;
    size_ = page + count * stride_;
    base_ = map_with_guards(size_, page + body, stride_, count);
    first_ = base_ + page + body - bytes;
  }
  ~GuardedSegments() { munmap(base_, size_); }
  GuardedSegments(const GuardedSegments&) = delete;
  GuardedSegments& operator=(const GuardedSegments&) = delete;
  char* segment(std::size_t i) const { return first_ + i * stride_; }
  std::size_t stride() const { return stride_; }
  std::size_t count() const { return count_; }

 private:
  char* base_ = nullptr;
  char* first_ = nullptr;
  std::size_t size_ = 0, stride_ = 0, count_ = 0;
};

}  // namespace flashgqa::testing
