// The split planner on its own: every q block's keys covered exactly once by its pieces, in order,
// cut at whole bkv blocks; slots numbered in merge order; the plan a function of the shapes and mask
// only (never of the thread count).
#include "flash/kv_splits.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace flashgqa {
namespace {

Problem shape(std::int64_t B, std::int64_t K, std::int64_t G, std::int64_t T, std::int64_t S) {
  Problem p;
  p.B = B, p.K = K, p.G = G, p.T = T, p.S = S, p.H = 64;
  p.causal_offset = S - T;
  return p;
}

// Checks the plan's invariants for p; returns the most pieces of any q block.
std::int64_t check_plan(const Problem& p, std::int64_t bq, std::int64_t bkv) {
  const TaskPlan plan = plan_tasks(p, bq, bkv);
  std::int64_t next_slot = 0;
  std::size_t i = 0, merges = 0;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh)
      for (std::int64_t qb = 0; qb * bq < p.T; ++qb) {
        EXPECT_EQ(plan.q_start[static_cast<std::size_t>(qb)], qb * bq);
        const KeyRange keys = p.visible_keys(qb * bq, std::min(p.T, (qb + 1) * bq));
        EXPECT_LT(i, plan.tasks.size());
        if (i >= plan.tasks.size()) return 0;
        if (plan.tasks[i].slot < 0) {  // unsplit: the whole range
          EXPECT_EQ(plan.tasks[i].keys.begin, keys.begin);
          EXPECT_EQ(plan.tasks[i].keys.end, keys.end);
          ++i;
          continue;
        }
        const SplitMerge& mg = plan.merges.at(merges++);
        EXPECT_EQ(mg.b, b);
        EXPECT_EQ(mg.kh, kh);
        EXPECT_EQ(mg.qb, qb);
        EXPECT_EQ(mg.first_slot, next_slot);
        std::int64_t at = keys.begin;
        for (std::int64_t s = 0; s < mg.count; ++s, ++i) {
          const FlashTask& t = plan.tasks.at(i);
          EXPECT_EQ(t.slot, next_slot++);
          EXPECT_EQ(t.keys.begin, at);  // contiguous, in key order
          EXPECT_LT(t.keys.begin, t.keys.end);
          if (s + 1 < mg.count) {
            EXPECT_EQ(t.keys.end % bkv, 0);  // cut at whole blocks
          }
          at = t.keys.end;
        }
        EXPECT_EQ(at, keys.end);
      }
  EXPECT_EQ(i, plan.tasks.size());
  EXPECT_EQ(merges, plan.merges.size());
  EXPECT_EQ(next_slot, plan.slots);
  return plan.max_splits();
}

TEST(KvSplits, PiecesCoverEachBlocksKeysOnce) {
  for (bool causal : {false, true})
    for (std::int64_t bkv : {7, 32, 100}) {
      Problem p = shape(1, 2, 3, 37, 1001);
      p.causal = causal;
      EXPECT_GT(check_plan(p, 8, bkv), 1) << "few q blocks: split";
      Problem many = shape(4, 8, 1, 40, 300);
      many.causal = causal;
      EXPECT_EQ(check_plan(many, 8, bkv), 1) << "enough q blocks: no split";
    }
}

TEST(KvSplits, WindowsStartPiecesInsideABlock) {
  Problem p = shape(1, 1, 4, 3, 5000);
  p.window_left = 777;
  p.window_right = 0;
  EXPECT_GT(check_plan(p, 3, 64), 1);
  const TaskPlan plan = plan_tasks(p, 3, 64);
  EXPECT_EQ(plan.tasks.front().keys.begin, 5000 - 3 - 777);  // the window's first key, not a block start
}

TEST(KvSplits, EmptyRangesGiveOneTaskThatFinishesItsRows) {
  Problem p = shape(1, 1, 2, 10, 50);
  p.causal = true;
  p.causal_offset = -20;  // no query sees a key
  const TaskPlan plan = plan_tasks(p, 4, 32);
  for (const FlashTask& t : plan.tasks) {
    EXPECT_TRUE(t.keys.empty());
    EXPECT_EQ(t.slot, -1);
  }
  EXPECT_TRUE(plan.merges.empty());
}

// Packed sequences: q blocks are cut at every sequence's first query, so a block's rows share one
// sequence's keys (decode's rows too); the backward's whole-rows plan keeps one block of all T.
TEST(KvSplits, QBlocksStopAtSequenceBoundaries) {
  Problem p = shape(1, 2, 2, 13, 40);
  p.causal = true;
  // Sequences: queries [0,5) keys [0,10); [5,6) keys [10,30); [6,13) keys [30,40).
  p.sequences = {{0, 5, 0, 10, 5}, {5, 6, 10, 30, 19}, {6, 13, 30, 40, 3}};
  const TaskPlan plan = plan_tasks(p, 4, 8);
  EXPECT_EQ(plan.q_start, (std::vector<std::int64_t>{0, 4, 5, 6, 10, 13}));
  for (const FlashTask& t : plan.tasks) {
    const auto qb = static_cast<std::size_t>(t.qb);
    const Problem::Sequence& s = p.sequence_of(plan.q_start[qb]);
    EXPECT_EQ(&s, &p.sequence_of(plan.q_start[qb + 1] - 1)) << "q block " << qb << " straddles a boundary";
    EXPECT_GE(t.keys.begin, s.k_begin);
    EXPECT_LE(t.keys.end, s.k_end);
  }
  EXPECT_EQ(plan_tasks(p, 13, 8, /*whole_rows=*/true).q_start, (std::vector<std::int64_t>{0, 13}));
  EXPECT_TRUE(plan_tasks(shape(1, 1, 1, 0, 5), 4, 8).q_start.size() == 1) << "T = 0: no q block";
}

TEST(KvSplits, ThePlanDoesNotDependOnTheThreadCount) {
  Problem one = shape(1, 2, 4, 1, 3000), many = one;
  one.threads = 1;
  many.threads = 64;
  const TaskPlan a = plan_tasks(one, 1, 512), b = plan_tasks(many, 1, 512);
  ASSERT_EQ(a.tasks.size(), b.tasks.size());
  for (std::size_t i = 0; i < a.tasks.size(); ++i) {
    EXPECT_EQ(a.tasks[i].keys.begin, b.tasks[i].keys.begin);
    EXPECT_EQ(a.tasks[i].keys.end, b.tasks[i].keys.end);
    EXPECT_EQ(a.tasks[i].slot, b.tasks[i].slot);
  }
}

}  // namespace
}  // namespace flashgqa
