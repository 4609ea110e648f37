// A 64-byte aligned, uninitialised heap buffer (cache-line and zmm aligned), for workspaces.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

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
      std::free(data_);
      data_ = o.data_;
      bytes_ = o.bytes_;
      o.data_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~AlignedBuffer() { std::free(data_); }

  // Reallocates to at least `bytes` (contents lost).
  void reset(std::size_t bytes) {
    std::free(data_);
    data_ = nullptr;
    bytes_ = (bytes + kAlign - 1) / kAlign * kAlign;
    if (bytes_ == 0) return;
    data_ = std::aligned_alloc(kAlign, bytes_);
    if (data_ == nullptr) throw std::bad_alloc();
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
