#include "flash/block_sizes.hpp"

#include <algorithm>
#include <string>

namespace flashgqa {

std::int64_t flash_workspace_bytes(const Problem& p, const FlashKernels& k, const FlashBlocks& b) {
  const std::int64_t Hp = round_up(p.H, kHTile);
  const std::int64_t rows = round_up(p.G * b.bq, k.mr);
  const std::int64_t npad = round_up(b.bkv, kPanelKeys);
  const std::int64_t operand_bytes = k.operand_bytes;
  return rows * Hp * (operand_bytes + 4) + rows * 8 +  // Q rows, O rows, m and l
         2 * npad * Hp * operand_bytes +               // packed K and V block
         k.mr * npad * (4 + operand_bytes);            // S and P tiles
}

FlashBlocks choose_flash_blocks(const Problem& p, const FlashKernels& k) {
  return choose_flash_blocks(p, k, kNominalCaches);
}

FlashBlocks choose_flash_blocks(const Problem& p, const FlashKernels& k, const CacheSizes& caches) {
  const std::int64_t Hp = round_up(p.H, kHTile);
  const std::int64_t operand_bytes = k.operand_bytes;
  FlashBlocks b;
  // bkv: the packed K+V block in a quarter of L2, the S and P tiles of one row tile in half of L1;
  // a multiple of the panel width, at least one panel, at most 512 (beyond, the per-block work is
  // already amortised and only the causal diagonal waste grows).
  std::int64_t bkv = std::min(caches.l2 / 4 / (2 * Hp * operand_bytes), caches.l1d / 2 / (k.mr * (4 + operand_bytes)));
  bkv = std::clamp<std::int64_t>(bkv / kPanelKeys * kPanelKeys, kPanelKeys, 512);
  // bq: the task's packed Q and fp32 O rows in a quarter of L2, rows a multiple of the register tile
  // when G allows it.
  std::int64_t rows = caches.l2 / 4 / (Hp * (operand_bytes + 4));
  rows = std::max<std::int64_t>(rows / k.mr * k.mr, k.mr);
  std::int64_t bq = std::max<std::int64_t>(rows / p.G, 1);
  b.bq = p.block_q > 0 ? p.block_q : bq;
  // A task of a single row tile (decode: G*T <= MR) reuses a packed block only once, so the S and P
  // tiles are small whatever bkv is; larger blocks measured faster there (fewer, longer packing
  // streams from DRAM): the L2 bound alone.
  if (p.G * std::min(b.bq, std::max<std::int64_t>(p.T, 1)) <= k.mr)
    bkv = std::clamp<std::int64_t>(caches.l2 / 4 / (2 * Hp * operand_bytes) / kPanelKeys * kPanelKeys, kPanelKeys, 512);
  b.bkv = p.block_kv > 0 ? p.block_kv : bkv;
  // Never larger than the problem.
  b.bq = std::max<std::int64_t>(std::min(b.bq, p.T), 1);
  b.bkv = std::max<std::int64_t>(std::min(b.bkv, round_up(std::max<std::int64_t>(p.S, 1), kPanelKeys)), 1);
  if (flash_workspace_bytes(p, k, b) > kMaxWorkspaceBytes) {
    const std::string what = std::to_string(b.bq) + "/" + std::to_string(b.bkv);
    throw Error(
        "block_q/block_kv: " + what + " needs " + std::to_string(flash_workspace_bytes(p, k, b) >> 20) +
        " MiB of workspace per thread for G = " + std::to_string(p.G) + ", H = " + std::to_string(p.H) +
        ", expected sizes that need at most " + std::to_string(kMaxWorkspaceBytes >> 20) + " MiB");
  }
  return b;
}

}  // namespace flashgqa
