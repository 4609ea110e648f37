#include "flash/kv_splits.hpp"

#include <algorithm>
#include <cstring>

#include "core/int_math.hpp"
#include "core/finish_rows.hpp"

namespace flashgqa {

std::int64_t TaskPlan::rows(const Problem& p, std::int64_t qb) const {
  const auto i = static_cast<std::size_t>(qb);
  return p.G * (q_start[i + 1] - q_start[i]);
}

std::int64_t TaskPlan::max_splits() const {
  std::int64_t most = 1;
  for (const SplitMerge& mg : merges) most = std::max(most, mg.count);
  return most;
}

KeySums TaskPlan::key_sums() const {
  std::int64_t keys = 0;
  for (const FlashTask& t : tasks) keys = std::max(keys, t.keys.size());
  return {keys + max_splits() + 2, ceil_div(keys, std::max<std::int64_t>(bkv, 1)) + 2};
}

TaskPlan plan_tasks(const Problem& p, std::int64_t bq, std::int64_t bkv, bool whole_rows) {
  TaskPlan plan;
  plan.bq = bq;
  plan.bkv = bkv;
  plan.q_start = {0};
  if (p.sequences.empty() || whole_rows) {
    for (std::int64_t t = bq; t < p.T; t += bq) plan.q_start.push_back(t);
  } else {  // each sequence's queries in blocks of its own (sequences hold >= 1 query each)
    for (const Problem::Sequence& s : p.sequences)
      for (std::int64_t t = s.q_begin; t < s.q_end; t += bq)
        if (t > 0) plan.q_start.push_back(t);
  }
  if (p.T > 0) plan.q_start.push_back(p.T);  // (T = 0: no q block)
  const auto nq = static_cast<std::int64_t>(plan.q_start.size()) - 1;
  const std::int64_t q_blocks = p.B * p.K * nq;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh)
      for (std::int64_t qb = 0; qb < nq; ++qb) {
        const auto i = static_cast<std::size_t>(qb);
        const KeyRange keys = p.visible_keys(plan.q_start[i], plan.q_start[i + 1]);
        const std::int64_t rows = plan.rows(p, qb);
        // The whole bkv blocks the keys touch.
        const std::int64_t first = keys.begin / bkv;
        const std::int64_t nblocks = keys.empty() ? 0 : ceil_div(keys.end, bkv) - first;
        std::int64_t nsplit = 1;
        if (q_blocks < kMinTasks)
          nsplit = std::clamp<std::int64_t>(ceil_div(kMinTasks, q_blocks), 1,
                                            std::max<std::int64_t>(nblocks / kMinBlocksPerSplit, 1));
        if (nsplit == 1) {
          plan.tasks.push_back({b, kh, qb, keys, -1, rows * keys.size()});
          continue;
        }
        plan.merges.push_back({b, kh, qb, plan.slots, nsplit});
        for (std::int64_t i = 0; i < nsplit; ++i) {
          const KeyRange piece{std::max(keys.begin, (first + nblocks * i / nsplit) * bkv),
                               std::min(keys.end, (first + nblocks * (i + 1) / nsplit) * bkv)};
          plan.tasks.push_back({b, kh, qb, piece, plan.slots++, rows * piece.size()});
        }
      }
  return plan;
}

SplitPartials::SplitPartials(const TaskPlan& plan, std::int64_t rows_, std::int64_t ldo_)
    : rows(rows_), ldo(ldo_) {
  o.reset(static_cast<std::size_t>(plan.slots * rows * ldo) * sizeof(float));
  m.reset(static_cast<std::size_t>(plan.slots * rows) * sizeof(float));
  l.reset(static_cast<std::size_t>(plan.slots * rows) * sizeof(float));
}

void finish_task(const Problem& p, const TaskPlan& plan, const FlashTask& task, std::int64_t M, float* o,
                 std::int64_t ldo, const float* m, const float* l, SplitPartials& parts) {
  if (task.slot < 0) {
    const RowOrder rows = plan.row_order(p, task.qb);
    for (std::int64_t r = 0; r < M; ++r) finish_row(p, task.b, task.kh, rows.g(r), rows.t(r), o + r * ldo, m[r], l[r]);
    return;
  }
  float* po = parts.o.as<float>() + task.slot * parts.rows * parts.ldo;
  for (std::int64_t r = 0; r < M; ++r)
    std::memcpy(po + r * parts.ldo, o + r * ldo, static_cast<std::size_t>(parts.ldo) * sizeof(float));
  std::memcpy(parts.m.as<float>() + task.slot * parts.rows, m, static_cast<std::size_t>(M) * sizeof(float));
  std::memcpy(parts.l.as<float>() + task.slot * parts.rows, l, static_cast<std::size_t>(M) * sizeof(float));
}

void merge_task(const Problem& p, const TaskPlan& plan, const SplitMerge& mg, const SplitPartials& parts,
                float* acc) {
  const RowOrder rows = plan.row_order(p, mg.qb);
  const std::int64_t M = plan.rows(p, mg.qb);
  for (std::int64_t r = 0; r < M; ++r) {
    const std::int64_t at = mg.first_slot * parts.rows + r;
    merge_row(p, mg.b, mg.kh, rows.g(r), rows.t(r), mg.count, parts.m.as<float>() + at,
              parts.l.as<float>() + at, parts.rows, parts.o.as<float>() + at * parts.ldo,
              parts.rows * parts.ldo, acc);
  }
}

}  // namespace flashgqa
