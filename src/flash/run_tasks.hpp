// The thread driver both flash paths share: every thread gets its own workspace, allocated before the
// parallel region (so an allocation failure reaches the caller as an exception instead of aborting),
// takes tasks dynamically, and once all tasks are done takes the merges of split rows. Which thread
// runs which task never changes a result: tasks write disjoint rows or partial slots, and merges read
// the slots in a fixed order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace flashgqa {

// task(i, workspace, tmp) for i < ntasks, then merge(i, tmp) for i < nmerges, on at most `threads`
// threads; tmp holds H floats of per-thread scratch. make_workspace() builds one workspace.
template <typename MakeWorkspace, typename Task, typename Merge>
void run_tasks_then_merges(int threads, std::int64_t H, std::int64_t ntasks, std::int64_t nmerges,
                           MakeWorkspace make_workspace, Task task, Merge merge) {
  const int nthreads = static_cast<int>(std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(ntasks, 1)));
  using Workspace = decltype(make_workspace());
  std::vector<Workspace> spaces;
  spaces.reserve(static_cast<std::size_t>(nthreads));
  for (int i = 0; i < nthreads; ++i) spaces.push_back(make_workspace());
  std::vector<std::vector<float>> tmps(static_cast<std::size_t>(nthreads), std::vector<float>(static_cast<std::size_t>(H)));
#pragma omp parallel num_threads(nthreads)
  {
#ifdef _OPENMP
    const auto id = static_cast<std::size_t>(omp_get_thread_num());
#else
    const std::size_t id = 0;
#endif
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < ntasks; ++i) task(i, spaces[id], tmps[id]);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < nmerges; ++i) merge(i, tmps[id]);
  }
}

}  // namespace flashgqa
