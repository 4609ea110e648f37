// The decode path of fast flash attention: problems whose query rows per kv head fit one small tile
// (G*T <= kDecodeMaxRows: one or a few new tokens against a long KV cache). Such a problem reads every
// K/V byte once and does ~G FLOPs per byte, so it is bound by the DRAM stream; this path reads K and V
// rows straight from their source in address order (no packed copy) through the kernel set's decode
// kernels (kernels/microkernels.hpp). flash_attention dispatches here when it applies.
#pragma once

#include <vector>

#include "core/key_sums.hpp"
#include "core/problem.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {

// A paged K/V source (the KV-cache API, src/api/kvcache.cpp): key s of kv head kh of the problem's one
// sequence (B = 1) is row s % page_size of page table[s / page_size], at
//   p.k + page * k_page_stride + kh * p.k_stride[1] + (s % page_size) * p.k_stride[2]   (elements; v alike).
// page_size is a multiple of kPageAlign; the table covers the p.S keys.
constexpr std::int64_t kPageAlign = 16;
struct KvPages {
  const std::int32_t* table = nullptr;
  std::int64_t page_size = 0;
  std::int64_t k_page_stride = 0, v_page_stride = 0;
};

// Whether the decode path takes p on kernel set k: k has decode kernels and G*T <= kDecodeMaxRows.
bool flash_decode_applies(const Problem& p, const FlashKernels& k);
// Whether the decode path can take p in row groups (the KV-cache API): k has decode kernels and
// G*T <= kDecodeMaxGroupedRows (T = 16 at G = 8). Every KV block goes through groups of
// decode_positions(p) positions in turn (docs/performance.md, KV cache).
constexpr std::int64_t kDecodeMaxGroupedRows = 128;
bool flash_decode_row_groups_apply(const Problem& p, const FlashKernels& k);
// Whether the decode path converts p's K or V rows of `dtype` to bf16 once per block on k
// (decode_rows_to_bf16, decode_int8_rows_to_bf16; flash_decode.cpp): f16 and f32 rows where p's rows
// take more than one row group (on packed blocks, decode_packs_blocks, f32 rows only: f16 rows are
// packed where they lie), int8 rows where a call has k.decode_int8_convert_rows rows or more (G T; amx
// 16, avx512bf16 32).
bool decode_converts_rows(const Problem& p, const FlashKernels& k, DType dtype);
// Whether the decode path runs p on packed blocks on k (flash_decode.cpp): G T >= k.decode_packed_rows,
// and for int8 K/V where k converts them (decode_int8_rows_to_bf16, G T >= k.decode_int8_convert_rows).
bool decode_packs_blocks(const Problem& p, const FlashKernels& k);
// Positions per row group: k.decode_max_rows / G (at least 1), at most T (T when G*T <= that).
std::int64_t decode_positions(const Problem& p, const FlashKernels& k);

// Attention for p on k's decode kernels (flash_decode_row_groups_apply(p, k) must hold); K/V rows from
// `pages` when not null (then B = 1). Results depend on the shapes, block size and page size only,
// never on the thread count.
void flash_attention_decode(const Problem& p, const FlashKernels& k, const KvPages* pages = nullptr);
// Several problems (the sequences of a KV-cache call; the same H, threads and interrupt flag) in one
// parallel region: every problem's tasks, then every problem's merges, each planned as alone (the
// same bits as one call per problem, with one start-up and one barrier instead of one per problem).
// pages[i] is null or problem i's paged source.
void flash_attention_decode(const std::vector<const Problem*>& problems, const FlashKernels& k,
                            const std::vector<const KvPages*>& pages);

// Head groups (paged caches; flash_decode.cpp): a thread runs the tasks of one sequence's split for up
// to this many of its kv heads together, block by block. At most `heads` (the sequence's K), as many as
// keep their state (M rows of Hp columns each: O in fp32, Q in q_bytes a value) within kHeadStateBytes,
// and few enough that `tasks` (the call's) leave each of `threads` kGroupsPerThread groups; at least 1.
// Which tasks share a group changes no bits, so this may depend on the threads.
constexpr std::int64_t kHeadStateBytes = 512 * 1024;
constexpr std::int64_t kGroupsPerThread = 4;
std::int64_t decode_group_heads(std::int64_t heads, std::int64_t M, std::int64_t Hp, std::int64_t q_bytes,
                                std::int64_t tasks, int threads);
// The number of KV splits per (b, kv head) the decode plan uses (1 = none). For tests.
int flash_decode_kv_splits(const Problem& p, const FlashKernels& k);

// How the decode path sums over keys (TaskPlan::key_sums of its plan).
KeySums flash_decode_key_sums(const Problem& p, const FlashKernels& k, const KvPages* pages = nullptr);

}  // namespace flashgqa
