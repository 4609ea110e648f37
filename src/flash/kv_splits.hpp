// The work of one flash call as tasks, for the packed path (flash_packed.cpp), the decode path
// (flash_decode.cpp) and the backward (backward/flash_backward.cpp) alike: the split planner, the row
// order, and a task's end.
//
// A task is (b, kv head, q block [, KV split]). A q block is bq query positions of all G heads of one
// kv head, M = G * positions rows in position-major order (row r = position t0 + r / G, head r % G),
// so a register tile of rows spans as few positions as possible and a mask's edge cuts few tiles.
// A task covers the keys its rows may see (Problem::visible_keys over its positions).
//
// When there are fewer than kMinTasks q blocks, each q block's keys are split into pieces at whole
// bkv blocks (at least kMinBlocksPerSplit blocks each); every piece keeps its partial (O, m, l) in a
// slot, and the pieces are merged by log-sum-exp in slot order afterwards. The split is a function of
// the shapes, mask and block sizes only, never of the thread count, so results are bitwise the same
// for any number of threads.
#pragma once

#include <cstdint>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/key_sums.hpp"
#include "core/problem.hpp"

namespace flashgqa {

// Below this many q blocks the KV ranges are split, aiming at this many tasks. A constant, not the
// thread count: the split changes rounding, and results must not depend on threads.
constexpr std::int64_t kMinTasks = 16;
// A split covers at least this many KV blocks.
constexpr std::int64_t kMinBlocksPerSplit = 2;

// Row r of a q block that starts at position t0: position t0 + r / G, head r % G.
struct RowOrder {
  std::int64_t G, t0;
  std::int64_t t(std::int64_t r) const { return t0 + r / G; }
  std::int64_t g(std::int64_t r) const { return r % G; }
};

struct FlashTask {
  std::int64_t b, kh, qb;  // batch, kv head, q block
  KeyRange keys;           // the keys this task covers
  std::int64_t slot;       // partial-result slot, or -1: the task finishes its rows itself
  std::int64_t work;       // rows x keys, for scheduling only
};

// The pieces of one split q block: slots [first_slot, first_slot + count), in key order.
struct SplitMerge {
  std::int64_t b, kh, qb, first_slot, count;
};

struct TaskPlan {
  std::int64_t bq = 0, bkv = 0;
  // q block qb is positions [q_start[qb], q_start[qb + 1]): bq at a time, and with packed sequences
  // never across a sequence's boundary (its rows then share one sequence's keys).
  std::vector<std::int64_t> q_start;
  std::vector<FlashTask> tasks;  // (b, kv head, q block) major, split minor
  std::vector<SplitMerge> merges;
  std::int64_t slots = 0;

  // The rows of q block qb: its positions, of all G heads.
  RowOrder row_order(const Problem& p, std::int64_t qb) const {
    return {p.G, q_start[static_cast<std::size_t>(qb)]};
  }
  std::int64_t rows(const Problem& p, std::int64_t qb) const;
  // The most pieces any q block is split into (1: none).
  std::int64_t max_splits() const;
  // The sums over keys of flash run on this plan (reference/tolerance.hpp): softmax_tile and pv_tile
  // carry l and O across a task's blocks, so P·V chains a task's keys in one fp32 accumulator, and the
  // pieces of a split are merged in slot order: depth = keys of the longest task + pieces + 2;
  // rescales = its KV blocks + 2 (a task may start inside a block; the merge's factor).
  KeySums key_sums() const;
};

// Tasks for every (b, kv head, q block of at most bq positions) of p, KV pieces aligned to bkv blocks.
// With packed sequences the q blocks are cut at the sequences' boundaries unless `whole_rows` (the
// backward, whose tasks take every row of a head and one q block of all T positions).
TaskPlan plan_tasks(const Problem& p, std::int64_t bq, std::int64_t bkv, bool whole_rows = false);

// Partial results of split tasks: per slot O [rows][ldo] fp32, m [rows], l [rows].
struct SplitPartials {
  AlignedBuffer o, m, l;
  std::int64_t rows = 0, ldo = 0;
  SplitPartials(const TaskPlan& plan, std::int64_t rows, std::int64_t ldo);
};

// The end of a task with M rows (O [M][ldo] fp32, m and l [M]): finishes its rows (slot < 0; O is
// overwritten) or saves them in its slot.
void finish_task(const Problem& p, const TaskPlan& plan, const FlashTask& task, std::int64_t M, float* o,
                 std::int64_t ldo, const float* m, const float* l, SplitPartials& parts);

// Merges the slots of a split q block in order and finishes its rows; acc: H floats of scratch.
void merge_task(const Problem& p, const TaskPlan& plan, const SplitMerge& mg, const SplitPartials& parts,
                float* acc);

}  // namespace flashgqa
