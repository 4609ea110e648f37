// What the decode path's two ways of running a task share (flash_decode.cpp: the plan, the tasks,
// the row groups; flash_decode_packed.cpp: the packed blocks): a call's plan, a thread's workspace,
// and where a key's K/V row and int8 scales lie, dense or paged. Internal to those two files.
#pragma once

#include <cstdint>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/dtype.hpp"
#include "core/prefetch.hpp"
#include "core/problem.hpp"
#include "flash/flash_decode.hpp"
#include "flash/kv_splits.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa::decode_task {

// Packed blocks: rows per group (the S and P tiles of a group: 64 x bkv).
constexpr std::int64_t kPackedGroupRows = 64;

struct Plan {
  const FlashKernels* kern = nullptr;
  const FlashKernels* tiles = nullptr;  // the packed blocks' tiles and packers (decode_tile_set(*kern))
  const KvPages* pages = nullptr;  // null: K/V rows at p.k_row / p.v_row
  std::int64_t M = 0, R = 0, Hp = 0;  // M = G*T rows per task, in groups of R
  std::int64_t align = 1;  // blocks start at multiples of it (kPageAlign and the set's P.V step)
  bool convert_k = false, convert_v = false;  // each block's f16/f32 rows to bf16 once (row groups)
  bool one_call = false;  // pages go in one call per block (flash_decode.cpp, for_each_piece)
  bool packed = false;    // packed blocks (flash_decode_packed.cpp)
  bool v_in_place = false;  // packed blocks: P.V on V's bf16 rows where they lie (pv_tile_rows), no V panels
  std::int64_t heads = 1;  // the most kv heads of a task group (paged; see the top of flash_decode.cpp)
  TaskPlan work;  // one q block of all T positions per (b, kv head) (per sequence when packed)
};

// The set whose pack_q_row writes a task's Q rows into the workspace, and whose operands P is held
// in: the tiles' on packed blocks, else the decode set's own (bf16: flash_decode.cpp takes only sets
// of 2-byte operands for decode).
inline const FlashKernels& q_row_set(const Plan& plan) { return plan.packed ? *plan.tiles : *plan.kern; }

// A thread's scratch, sized for the largest of the plans a call runs (one, or one per sequence of a
// KV-cache call); flash_decode.cpp.
struct Workspace {
  // q holds each row's operands as the plan's pack_q_row writes them (the tiles' operand_bytes when
  // packed, else bf16), p the group's P tile likewise.
  AlignedBuffer q, o, m, l, corr, lo, hi, s, p, gather, gather_scales, pieces, k_bf16, v_bf16, k_panels, v_panels,
      k_pieces, v_pieces;
  std::int64_t ld = 0;  // of S and P, in elements
  std::int64_t M = 0;   // rows of each head's q, o, m, l and corr (heads of a task group one after another)
  explicit Workspace(const std::vector<Plan>& plans);
};

// Row s of kv head kh of a paged source (`base`: the cache's first element, `page_stride` and
// `row_stride` in elements).
inline const char* paged_row(const KvPages& pages, const void* base, DType dtype, std::int64_t page_stride,
                             std::int64_t head_stride, std::int64_t row_stride, std::int64_t kh, std::int64_t s) {
  const std::int64_t page = pages.table[s / pages.page_size];
  return static_cast<const char*>(base) +
         (page * page_stride + kh * head_stride + (s % pages.page_size) * row_stride) *
             static_cast<std::int64_t>(dtype_size(dtype));
}

// Row s of kv head kh of batch entry b, K (is_k) or V, dense or paged.
inline const char* key_row(const Problem& p, const KvPages* pages, bool is_k, std::int64_t b, std::int64_t kh,
                           std::int64_t s) {
  if (pages == nullptr) return static_cast<const char*>(is_k ? p.k_row(b, kh, s) : p.v_row(b, kh, s));
  return is_k ? paged_row(*pages, p.k, p.k_dtype, pages->k_page_stride, p.k_stride[1], p.k_stride[2], kh, s)
              : paged_row(*pages, p.v, p.v_dtype, pages->v_page_stride, p.v_stride[1], p.v_stride[2], kh, s);
}

// Where a piece's keys' scales are (int8 K/V): the first key's, and the floats between keys.
struct PieceScales {
  const float* scale = nullptr;  // null: not int8
  std::int64_t ld = 0;
};

// The scales of row `row` of kv head kh of batch entry (or page) `entry`, K's or V's.
inline PieceScales entry_scales(const Problem& p, bool is_k, std::int64_t entry, std::int64_t kh, std::int64_t row) {
  const float* base = is_k ? p.k_scale : p.v_scale;
  if (base == nullptr) return {};
  const std::int64_t* st = is_k ? p.k_scale_stride : p.v_scale_stride;
  return {base + entry * st[0] + kh * st[1] + row * st[2], st[2]};
}

// Key s's scales of kv head kh of batch entry b, K's or V's, dense or paged (the ld: within its page).
inline PieceScales key_scales(const Problem& p, const KvPages* pages, bool is_k, std::int64_t b, std::int64_t kh,
                              std::int64_t s) {
  if (pages == nullptr) return entry_scales(p, is_k, b, kh, s);
  return entry_scales(p, is_k, pages->table[s / pages->page_size], kh, s % pages->page_size);
}

// Into L2 (prefetch_l2), line by line: the row_bytes bytes at row.
inline void prefetch_row(const char* row, std::int64_t row_bytes) {
  for (std::int64_t c = 0; c < row_bytes; c += 64) prefetch_l2(row + c);
}

// Packed blocks (flash_decode_packed.cpp). block_pieces: where each 16 keys of the block [s0, s0 + n)
// of `task` lie, K's and V's, into w.k_pieces and w.v_pieces. run_group_packed: rows [r0, r0 + R) of
// the task (head `head` of its group) against those keys (the first n of them), the first group also
// fetching next_task's rows from key next_s (what the thread reads next) into L2.
void block_pieces(const Problem& p, const Plan& plan, const FlashTask& task, std::int64_t s0, std::int64_t n,
                  Workspace& w);
void run_group_packed(const Problem& p, const Plan& plan, std::int64_t head, Workspace& w, std::int64_t r0,
                      std::int64_t R, std::int64_t n, const FlashTask& next_task, std::int64_t next_s);

}  // namespace flashgqa::decode_task
