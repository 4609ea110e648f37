// The one place that maps an Algorithm to its rung.
#include "ladder/ladder.hpp"

#include "flash/flash_packed.hpp"
#include "ladder/rung_kernels.hpp"
#include "reference/tolerance.hpp"

namespace flashgqa {

void run_algorithm(const Problem& p, Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::naive: return naive_attention(p);
    case Algorithm::chunked_unstable: return chunked_unstable_attention(p);
    case Algorithm::chunked: return chunked_attention(p);
    case Algorithm::kernel1: return kernel1_attention(p);
    case Algorithm::flash: return flash_attention(p);
  }
}

KeySums key_sums(const Problem& p, Algorithm algorithm) {
  const std::int64_t bkv = clamp_block(p.block_kv, kSeedBlockKV, p.S);
  switch (algorithm) {
    case Algorithm::naive: return rung_key_sums(p, p.S, /*rescaled=*/false);  // one block of all keys
    case Algorithm::chunked_unstable: return rung_key_sums(p, bkv, /*rescaled=*/false);
    case Algorithm::chunked:
    case Algorithm::kernel1: return rung_key_sums(p, bkv, /*rescaled=*/true);
    case Algorithm::flash: return flash_key_sums(p, active_isa());
  }
  return any_key_sums(p);
}

KeySums linear_key_sums(const Problem& p) {
  return rung_key_sums(p, clamp_block(p.block_kv, kSeedBlockKV, p.S), /*rescaled=*/false);
}

}  // namespace flashgqa
