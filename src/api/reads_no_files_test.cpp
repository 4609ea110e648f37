// The program behind the ctest reads_no_files (reads_no_files_test.sh runs it under strace): library
// calls of every kind, between two marker opens, through the public header only. A library call must
// open no file at all (no tune cache, no /proc, no /sys; see src/flash/block_sizes.hpp), so the script
// fails on any open or openat between the markers.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "flashgqa/flashgqa.hpp"

namespace {

// Paths that do not exist: opening them fails, and the attempt marks the trace.
constexpr const char* kBeginMarker = "/flashgqa-reads-no-files-begin";
constexpr const char* kEndMarker = "/flashgqa-reads-no-files-end";

void mark(const char* path) {
  const int fd = ::open(path, O_RDONLY);
  if (fd >= 0) ::close(fd);
}

// q [B,K,G,T,H], k/v [B,K,S,H] of f32 values in [-1, 1), out like q, lse [B,K,G,T].
void run(flashgqa::Algorithm algorithm, std::int64_t T, std::int64_t S, bool causal,
         flashgqa::Precision precision) {
  constexpr std::int64_t B = 1, K = 2, G = 4, H = 64;
  std::vector<float> q(B * K * G * T * H), k(B * K * S * H), v(B * K * S * H), out(q.size()),
      lse(B * K * G * T);
  std::uint32_t state = 1;  // a linear congruential generator: no <random>, nothing to seed from
  for (std::vector<float>* x : {&q, &k, &v})
    for (float& e : *x) {
      state = state * 1664525u + 1013904223u;
      e = static_cast<float>(state >> 8) / (1 << 23) - 1;
    }
  using flashgqa::DType;
  flashgqa::Options o;
  o.algorithm = algorithm;
  o.causal = causal;
  o.precision = precision;
  flashgqa::attention(flashgqa::contiguous_view(out.data(), DType::f32, {B, K, G, T, H}),
                      flashgqa::contiguous_view(lse.data(), DType::f32, {B, K, G, T}),
                      flashgqa::contiguous_view(q.data(), DType::f32, {B, K, G, T, H}),
                      flashgqa::contiguous_view(k.data(), DType::f32, {B, K, S, H}),
                      flashgqa::contiguous_view(v.data(), DType::f32, {B, K, S, H}), o);
  if (algorithm == flashgqa::Algorithm::chunked)
    flashgqa::linear_attention(flashgqa::contiguous_view(out.data(), DType::f32, {B, K, G, T, H}),
                               flashgqa::contiguous_view(q.data(), DType::f32, {B, K, G, T, H}),
                               flashgqa::contiguous_view(k.data(), DType::f32, {B, K, S, H}),
                               flashgqa::contiguous_view(v.data(), DType::f32, {B, K, S, H}));
}

}  // namespace

int main() {
  using flashgqa::Algorithm;
  using flashgqa::Precision;
  mark(kBeginMarker);
  run(Algorithm::flash, 300, 700, false, Precision::bf16);  // packed path, automatic blocks
  run(Algorithm::flash, 300, 700, true, Precision::f32);
  run(Algorithm::flash, 1, 2000, false, Precision::bf16);   // decode path
  for (Algorithm a : {Algorithm::naive, Algorithm::chunked_unstable, Algorithm::chunked, Algorithm::kernel1})
    run(a, 100, 200, true, Precision::bf16);
  mark(kEndMarker);
  std::printf("reads_no_files: calls done\n");
  return 0;
}
