// Block sizes of the fast flash path: the seed's bq (query positions per block; a block holds those
// positions for all G heads of one kv head, G*bq rows) and bkv (keys per KV block).
//
// Where the seed sizes blocks to fit VMEM, here they are sized to a cache model:
//   - the packed K and V of one KV block (2 * bkv * Hp operands) are read once per register tile of
//     rows, so they must stay in L2 next to the task's packed Q and fp32 O rows;
//   - a row tile's logits and weights (MR * bkv * (4 + operand bytes)) are written and read back at
//     once, so they should stay in L1 (except in decode, where a task is a single, small row tile).
// The default blocks use a fixed, nominal cache model (kNominalCaches: 48 KiB L1d, 1 MiB L2 per
// core), never the caches of the machine at hand: block sizes change the rounding, so detected
// sizes would give the same input different bits on two machines. The library detects nothing and
// reads no files; an input gives the same bits on every machine that runs the same instruction-set
// path. Blocks measured for one machine (`flashgqa tune`) reach flash only through
// Options::block_q / block_kv.
// See docs/performance.md for the measurements behind the constants.
#pragma once

#include <cstdint>

#include "core/problem.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {

struct CacheSizes {
  std::int64_t l1d = 48 * 1024;   // bytes per core
  std::int64_t l2 = 1024 * 1024;  // bytes per core
};

// The cache model of the default blocks: the L1d of current x86 server cores (Zen 5, Sapphire Rapids)
// and a 1 MiB L2 (docs/performance.md, "Block sizes").
inline constexpr CacheSizes kNominalCaches{};

struct FlashBlocks {
  std::int64_t bq = 0;   // query positions per block (G*bq rows), 1 <= bq <= max(T, 1)
  std::int64_t bkv = 0;  // keys per KV block, >= 1
};

// Blocks for p on kernel set k: p.block_q / p.block_kv when set (nonzero), the default derived from
// kNominalCaches (or the given cache model) otherwise. Throws Error (argument, value, what is
// expected) for sizes whose per-thread workspace would exceed kMaxWorkspaceBytes.
FlashBlocks choose_flash_blocks(const Problem& p, const FlashKernels& k);
FlashBlocks choose_flash_blocks(const Problem& p, const FlashKernels& k, const CacheSizes& caches);

// Per-thread workspace of one task, in bytes, for the given blocks (what choose_flash_blocks bounds).
std::int64_t flash_workspace_bytes(const Problem& p, const FlashKernels& k, const FlashBlocks& b);
constexpr std::int64_t kMaxWorkspaceBytes = std::int64_t{1} << 30;

}  // namespace flashgqa
