// The flash rung (ladder/flash.cpp) as it runs: K and V packed once per kv head into the layouts of
// the register-tile micro-kernels chosen at run time (src/kernels), the online softmax fused per tile,
// tasks over (b, kv head, q block [, KV split]); problems with a few query rows per kv head go to the
// decode path (flash_decode.hpp).
#pragma once

#include "core/key_sums.hpp"
#include "core/problem.hpp"
#include "kernels/cpu_features.hpp"

namespace flashgqa {

// Flash attention on instruction set `isa` (the rung passes active_isa(); tests and benchmarks choose);
// throws Error when unsupported.
void flash_attention(const Problem& p, Isa isa);

// The number of KV splits the plan uses for a problem (1 = none): a function of the shapes and block
// sizes only, never of the thread count, so results do not depend on the thread count. For tests.
int flash_max_kv_splits(const Problem& p, Isa isa);

// How flash_attention(p, isa) sums over keys (decode or packed path; TaskPlan::key_sums of its plan).
KeySums flash_key_sums(const Problem& p, Isa isa);

}  // namespace flashgqa
