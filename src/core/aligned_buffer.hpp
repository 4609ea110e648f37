// A 64-byte aligned, uninitialised heap buffer (cache-line and zmm aligned), for workspaces. Blocks of
// kCachedBlockMinBytes or more are kept across calls (workspace_cache.hpp).
#pragma once

#include <cstddef>
#include "core/workspace_cache.hpp"

namespace flashgqa {

class AlignedBuffer {
 public:
  static constexpr std::size_t kAlign = 64;

  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t bytes) { reset(bytes); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      workspace_free(data_, bytes_);
      data_ = o.data_;
      bytes_ = o.bytes_;
      o.data_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~AlignedBuffer() { workspace_free(data_, bytes_); }

  // Reallocates to at least `bytes` (contents lost).
  void reset(std::size_t bytes) {
    workspace_free(data_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
    const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded == 0) return;
    data_ = workspace_alloc(rounded);  // (throws std::bad_alloc, leaving the buffer empty)
    bytes_ = rounded;
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace flashgqa
