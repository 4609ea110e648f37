// The one place that maps an Algorithm to its rung.
#include "ladder/ladder.hpp"

#include <string>

#include "core/int_math.hpp"
#include "core/memory_limit.hpp"
#include "flash/flash_packed.hpp"
#include "kernels/microkernels.hpp"
#include "ladder/rung_kernels.hpp"
#include "reference/tolerance.hpp"

namespace flashgqa {

// What a rung allocates on p, over-estimated (fp32 operands, whole panels), in double so that no size
// overflows before the check: the rungs before flash hold a row of logits per query (naive: all S keys
// of T rows; the chunked rungs: a chunk of every row of a kv head; kernel1: carries for every row).
// flash's workspace is bounded by its blocks and caps (block_sizes.hpp).
double rung_workspace_bytes(const Problem& p, Algorithm algorithm) {
  const auto d = [](std::int64_t x) { return static_cast<double>(x); };
  const double Hp = d(round_up(p.H, kHTile)) + kHTile, rows = d(p.G) * d(p.T);
  const double bkv = d(padded_keys(clamp_block(p.block_kv, kSeedBlockKV, p.S))) + kPanelKeys;
  switch (algorithm) {
    case Algorithm::naive: {
      const double keys = d(padded_keys(p.S)) + kPanelKeys;
      return 4.0 * (d(p.T) * keys * 2 + d(p.T) * Hp * 2 + 2 * keys * Hp);
    }
    case Algorithm::chunked_unstable:
    case Algorithm::chunked:
      return 4.0 * (rows * bkv * 2 + rows * Hp * 2 + rows * 3 + 2 * bkv * Hp);
    case Algorithm::kernel1: {
      const double bq = d(clamp_block(p.block_q, kKernel1BlockQ, p.T));
      return 4.0 * (2 * rows * (Hp + 2) + d(p.threads) * d(p.G) * bq * (2 * Hp + 2 * bkv) + 2 * bkv * Hp);
    }
    case Algorithm::flash:
      return 0.0;
  }
  return 0.0;
}

void check_rung_workspace(const Problem& p, Algorithm algorithm) {
  check_workspace(rung_workspace_bytes(p, algorithm), std::string("algorithm ") + algorithm_name(algorithm),
                  algorithm == Algorithm::naive ? "a smaller T x S (naive holds the logits of T queries x S keys), or "
                                                  "algorithm flash, whose workspace does not grow with T or S"
                                                : "a smaller G x T or block_kv, or algorithm flash, whose workspace "
                                                  "does not grow with T or S");
}

void run_algorithm(const Problem& p, Algorithm algorithm) {
  check_rung_workspace(p, algorithm);
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
