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

// `count` segments of `bytes` bytes each, `stride()` bytes apart (a multiple of the OS page), each
// ending right before a PROT_NONE page; a PROT_NONE page before the first one too. A guard that cannot
// be set throws (the mapping unmapped), so that no test runs without its guards.
class GuardedSegments {
 public:
  GuardedSegments(std::size_t count, std::size_t bytes) {
    const std::size_t page = os_page_bytes();
    const std::size_t body = (bytes + page - 1) / page * page;
    stride_ = body + page;
    size_ = page + count * stride_;
    base_ = static_cast<char*>(mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base_ == MAP_FAILED) throw std::bad_alloc();
    bool ok = mprotect(base_, page, PROT_NONE) == 0;
    for (std::size_t i = 0; i < count && ok; ++i)
      ok = mprotect(base_ + page + i * stride_ + body, page, PROT_NONE) == 0;
    if (!ok) {
      munmap(base_, size_);
      throw std::runtime_error("guarded memory: mprotect failed");
    }
    first_ = base_ + page + body - bytes;
  }
  ~GuardedSegments() { munmap(base_, size_); }
  GuardedSegments(const GuardedSegments&) = delete;
  GuardedSegments& operator=(const GuardedSegments&) = delete;
  char* segment(std::size_t i) const { return first_ + i * stride_; }
  std::size_t stride() const { return stride_; }

 private:
  char* base_ = nullptr;
  char* first_ = nullptr;
  std::size_t size_ = 0, stride_ = 0;
};

// `bytes` bytes between two PROT_NONE pages, the last byte right before the trailing one: one segment.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(std::size_t bytes) : segment_(1, bytes), bytes_(bytes) {}
  char* data() const { return segment_.segment(0); }
  std::size_t bytes() const { return bytes_; }

 private:
  GuardedSegments segment_;
  std::size_t bytes_;
};

}  // namespace flashgqa::testing
