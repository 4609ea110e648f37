// A decode block's K/V rows as flash_decode.cpp's row groups read them: the runs of keys that lie in
// one page each, the pieces each kernel call takes (dense, a page's, or a block's small pages in one
// call: where they lie, or copied together), and what goes to L2 ahead of them (the rows and int8
// scales of a phase, the next page, the pieces a gather copies next). Internal to flash_decode.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"
#include "core/prefetch.hpp"
#include "core/problem.hpp"
#include "flash/flash_decode_task.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa::decode_task {

// How many pieces ahead a gather prefetches.
constexpr std::int64_t kPrefetchPieces = 2;
// How much of the next page's rows a page's calls prefetch (for_each_piece, pages not gathered).
constexpr std::int64_t kNextPageBytes = 1024;

// How many keys of the other phase's rows a group that reads from DRAM prefetches as each phase starts
// (flash_decode.cpp's run_group), and of the next page's rows as each page's calls start
// (for_each_piece).
constexpr std::int64_t kPhaseAheadKeys = 32;

// f(j, run) for the runs of keys [s, min(s + n, p.S)) that lie in one page each (dense: one run).
template <typename F>
void for_each_run(const Problem& p, const KvPages* pages, std::int64_t s, std::int64_t n, F f) {
  const std::int64_t end = std::min(s + n, p.S);
  for (std::int64_t j = s; j < end;) {
    const std::int64_t run = pages != nullptr ? std::min(end - j, pages->page_size - j % pages->page_size) : end - j;
    f(j, run);
    j += run;
  }
}

// Into L2: rows [s, min(s + n, p.S)) of kv head kh of batch entry b, K (is_k) or V, dense or paged
// (none when n <= 0).
inline void prefetch_rows(const Problem& p, const KvPages* pages, bool is_k, std::int64_t b, std::int64_t kh, std::int64_t s,
                          std::int64_t n) {
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(is_k ? p.k_dtype : p.v_dtype));
  const std::int64_t row_bytes = p.H * elem, ld_bytes = (is_k ? p.k_stride[2] : p.v_stride[2]) * elem;
  for_each_run(p, pages, s, n, [&](std::int64_t j, std::int64_t run) {
    const char* row = key_row(p, pages, is_k, b, kh, j);
    for (std::int64_t i = 0; i < run; ++i) prefetch_row(row + i * ld_bytes, row_bytes);
  });
}

// Into L2: the int8 scales of the same keys, a line (16 scales) at a time where they lie together, as
// quantize_kv writes them (none otherwise). Small pages' scales are a line each, anywhere.
inline void prefetch_scales(const Problem& p, const KvPages* pages, bool is_k, std::int64_t b, std::int64_t kh, std::int64_t s,
                            std::int64_t n) {
  if ((is_k ? p.k_scale : p.v_scale) == nullptr) return;
  for_each_run(p, pages, s, n, [&](std::int64_t j, std::int64_t run) {
    if (const PieceScales scales = key_scales(p, pages, is_k, b, kh, j); scales.ld == 1)
      for (std::int64_t i = 0; i < run; i += 16) prefetch_l2(scales.scale + i);
  });
}

// f(j0, row, n, ld, scales, pieces) for the pieces of keys [s0, s0 + n) of kv head kh that lie in one
// page each (without pages: pieces of dense_piece keys, or the whole block when it is 0): j0 the
// piece's first key relative to s0, row its first row, ld the elements between its rows, scales its
// keys' (int8), pieces null. With `gather` not null (Plan::one_call: pages of fewer than
// kGatherPagesBelow keys (flash_decode.cpp), as per-piece calls on 16 keys cost more than a copy, the
// kernels' fast paths taking whole groups of 32 keys, docs/performance.md, KV cache; and pages whose
// size is not a multiple of the set's decode_pv_step_keys) the pages are one call instead:
//   - bf16 and int8 rows, where the set has decode_row_pieces and `pieces` is not null: row null, and
//     pieces the address of each 16 keys' rows (the kernels read them where they lie, with no copy:
//     docs/performance.md, sessions 19 and 21), int8's scales copied into `gather_scales` (ld = 1);
//   - else the rows copied, as they are, into `gather` and their scales into `gather_scales` (ld = H).
// The same rows in the same order, so the same bits.
template <typename F>
void for_each_piece(const Problem& p, const KvPages* pages, bool is_k, std::int64_t b, std::int64_t kh,
                    std::int64_t s0, std::int64_t n, std::int64_t dense_piece, char* gather, float* gather_scales,
                    const void** pieces, F f) {
  if (pages == nullptr) {
    const std::int64_t step = dense_piece > 0 ? dense_piece : n;
    for (std::int64_t j0 = 0; j0 < n; j0 += step)
      f(j0, key_row(p, nullptr, is_k, b, kh, s0 + j0), std::min(step, n - j0), is_k ? p.k_stride[2] : p.v_stride[2],
        key_scales(p, nullptr, is_k, b, kh, s0 + j0), nullptr);
    return;
  }
  const DType dtype = is_k ? p.k_dtype : p.v_dtype;
  const std::int64_t row_stride = is_k ? p.k_stride[2] : p.v_stride[2];
  const std::int64_t row_bytes = p.H * static_cast<std::int64_t>(dtype_size(dtype));
  const bool gathered = gather != nullptr;
  auto row_at = [&](std::int64_t s) { return key_row(p, pages, is_k, b, kh, s); };
  auto scales_at = [&](std::int64_t s) { return key_scales(p, pages, is_k, b, kh, s); };
  if (gathered && pieces != nullptr && (dtype == DType::bf16 || dtype == DType::i8)) {  // s0: a multiple of 16
    for (std::int64_t j0 = 0; j0 < n; j0 += kDecodePieceKeys) {
      pieces[j0 / kDecodePieceKeys] = row_at(s0 + j0);
      if (const PieceScales scales = scales_at(s0 + j0); scales.scale != nullptr)  // int8: the scales together
        for (std::int64_t j = 0; j < std::min<std::int64_t>(kDecodePieceKeys, n - j0); ++j)
          gather_scales[j0 + j] = scales.scale[j * scales.ld];
    }
    f(0, nullptr, n, row_stride, dtype == DType::i8 ? PieceScales{gather_scales, 1} : PieceScales{}, pieces);
    return;
  }
  for (std::int64_t j0 = 0; j0 < n;) {
    const std::int64_t s = s0 + j0, len = std::min(n - j0, pages->page_size - s % pages->page_size);
    const char* row = row_at(s);
    const PieceScales scales = scales_at(s);
    // Small pages lie anywhere: the hardware prefetchers lose the stream at each one, so fetch the
    // piece kPrefetchPieces ahead (whole rows, line by line) while this one is copied. Into L2, not
    // L1 (locality 2, prefetcht1): on Zen 4 that read page 16 1.27x faster (docs/performance.md,
    // session 10), as the L1's few miss buffers no longer hold the prefetches back.
    const std::int64_t ahead = s + len + (kPrefetchPieces - 1) * pages->page_size;  // a page's first key
    if (gathered && ahead < s0 + n) {
      prefetch_rows(p, pages, is_k, b, kh, ahead, std::min(pages->page_size, s0 + n - ahead));
      // An int8 page's scales are a line of their own elsewhere: without this, a miss per page.
      if (const PieceScales next_scales = scales_at(ahead); next_scales.scale != nullptr)
        for (std::int64_t j = 0; j < std::min(pages->page_size, s0 + n - ahead); j += 16)
          prefetch_l2(next_scales.scale + j * next_scales.ld);
    }
    if (gathered) {
      for (std::int64_t j = 0; j < len; ++j)
        std::memcpy(gather + (j0 + j) * row_bytes, row + j * row_stride * static_cast<std::int64_t>(dtype_size(dtype)),
                    static_cast<std::size_t>(row_bytes));
      if (scales.scale != nullptr)
        for (std::int64_t j = 0; j < len; ++j) gather_scales[j0 + j] = scales.scale[j * scales.ld];
    } else {
      // The next page of the block: its first kPhaseAheadKeys rows (at least kNextPageBytes) and its
      // int8 scales' first line into L2 as this page's calls start, so that its stream does not begin
      // with a miss (page 256 int8 1.04x faster with 1 KiB, docs/performance.md, session 22; 32 int8
      // rows 1.07x faster than 1 KiB on Zen 4, session 33).
      if (s + len < s0 + n) {
        const char* next = row_at(s + len);
        const std::int64_t bytes =
            std::max(kNextPageBytes, std::min(kPhaseAheadKeys, s0 + n - s - len) * row_stride *
                                         static_cast<std::int64_t>(dtype_size(dtype)));
        for (std::int64_t c = 0; c < bytes; c += 64) prefetch_l2(next + c);
        if (const PieceScales next_scales = scales_at(s + len); next_scales.scale != nullptr)
          prefetch_l2(next_scales.scale);
      }
      f(j0, row, len, row_stride, scales, nullptr);
    }
    j0 += len;
  }
  if (gathered)
    f(0, gather, n, p.H, PieceScales{(is_k ? p.k_scale : p.v_scale) != nullptr ? gather_scales : nullptr, 1}, nullptr);
}

}  // namespace flashgqa::decode_task
