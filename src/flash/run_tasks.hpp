// The thread driver both flash paths share: every thread gets its own workspace, allocated before the
// parallel region (so an allocation failure reaches the caller as an exception instead of aborting),
// takes tasks dynamically, and once all tasks are done takes the merges of split rows. Which thread
// runs which task never changes a result: tasks write disjoint rows or partial slots, and merges read
// the slots in a fixed order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/problem.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace flashgqa {

// Tasks in groups: for each group g in order, first prepare(g, i) for i < prepare_count(g) (work the
// group's tasks share, such as packing their K/V; spread over the threads), then task(i, workspace)
// for the group's tasks [group_first[g], group_first[g + 1]); after all groups, merge(i, acc) for
// i < nmerges. At most p.threads threads; acc holds p.H floats of per-thread scratch. Once p's
// interrupt flag is set, the remaining steps are skipped and Interrupted is thrown after the region.
template <typename MakeWorkspace, typename PrepareCount, typename Prepare, typename Task, typename Merge>
void run_grouped_tasks_then_merges(const Problem& p, const std::vector<std::int64_t>& group_first,
                                   PrepareCount prepare_count, Prepare prepare, MakeWorkspace make_workspace,
                                   Task task, std::int64_t nmerges, Merge merge) {
  const int threads = p.threads;
  const std::int64_t H = p.H;
  const std::int64_t ngroups = static_cast<std::int64_t>(group_first.size()) - 1;
  const std::int64_t ntasks = ngroups > 0 ? group_first.back() : 0;
  const int nthreads = static_cast<int>(std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(ntasks, 1)));
  using Workspace = decltype(make_workspace());
  std::vector<Workspace> spaces;
  spaces.reserve(static_cast<std::size_t>(nthreads));
  for (int i = 0; i < nthreads; ++i) spaces.push_back(make_workspace());
  std::vector<std::vector<float>> accs(static_cast<std::size_t>(nthreads), std::vector<float>(static_cast<std::size_t>(H)));
#pragma omp parallel num_threads(nthreads)
  {
#ifdef _OPENMP
    const auto id = static_cast<std::size_t>(omp_get_thread_num());
#else
    const std::size_t id = 0;
#endif
    for (std::int64_t g = 0; g < ngroups; ++g) {  // every thread walks the groups in step
      const std::int64_t nprep = prepare_count(g);
#pragma omp for schedule(static)
      for (std::int64_t i = 0; i < nprep; ++i)
        if (!p.interrupted()) prepare(g, i);
      const std::int64_t first = group_first[static_cast<std::size_t>(g)],
                         last = group_first[static_cast<std::size_t>(g + 1)];
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t i = first; i < last; ++i)
        if (!p.interrupted()) task(i, spaces[id]);
    }
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < nmerges; ++i)
      if (!p.interrupted()) merge(i, accs[id].data());
  }
  p.check_interrupt();
}

// One group of tasks, nothing to prepare.
template <typename MakeWorkspace, typename Task, typename Merge>
void run_tasks_then_merges(const Problem& p, std::int64_t ntasks, std::int64_t nmerges, MakeWorkspace make_workspace,
                           Task task, Merge merge) {
  run_grouped_tasks_then_merges(
      p, std::vector<std::int64_t>{0, ntasks}, [](std::int64_t) { return std::int64_t{0}; },
      [](std::int64_t, std::int64_t) {}, make_workspace, task, nmerges, merge);
}

}  // namespace flashgqa
